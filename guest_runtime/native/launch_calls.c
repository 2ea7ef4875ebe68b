/* launch_calls.c: the native guest driver's kernel launches (guest_runtime/forward.py's _launch and _launch_ex in
 * C). A launch's request is its configuration, cuLaunchKernelEx's attributes, then the kernel's parameters as one
 * packed tail: from kernelParams by the function's layout (param_layouts.h), or the buffer an `extra` list names,
 * sent from where it lies. Launches are posted when the table says so: their failures surface at the next
 * synchronising call, as CUDA's asynchronous errors do. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "hand_calls.h"
#include "param_layouts.h"

#define ATTRIBUTE_SIZE ORION_LAUNCH_ATTRIBUTE_SIZE
#define MAX_EXTRA_PAIRS 64  /* an `extra` list longer than this (without END) is not a list */
#define PACKED_ON_STACK 1024
enum { PARAM_END = 0, PARAM_BUFFER_POINTER = 1, PARAM_BUFFER_SIZE = 2 }; /* CU_LAUNCH_PARAM_* */

_Static_assert(sizeof(CUlaunchAttribute) == ATTRIBUTE_SIZE, "CUlaunchAttribute travels as cuda.h lays it out");
/* Every launch request's fixed part is the LAUNCH fields alone; cuLaunchKernelEx's and cuOccupancyMaxActiveClusters'
 * attributes follow (their count first): orion_launch_head() writes all four. */
#define LAUNCH_ONLY(call) (ORION_REQ_##call##_LAUNCH == ORION_LAUNCH_function \
                           && ORION_REQ_##call##_SIZE == ORION_LAUNCH_SIZE)
_Static_assert(LAUNCH_ONLY(cuLaunchKernel) && LAUNCH_ONLY(cuLaunchCooperativeKernel) && LAUNCH_ONLY(cuLaunchKernelEx)
               && LAUNCH_ONLY(cuOccupancyMaxActiveClusters)
               && ORION_REQ_cuLaunchKernelEx_attributes == ORION_LAUNCH_SIZE
               && ORION_REQ_cuOccupancyMaxActiveClusters_attributes == ORION_LAUNCH_SIZE, "one launch head");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32 && offsetof(CUlaunchConfig, attrs) == 40 &&
               offsetof(CUlaunchConfig, numAttrs) == 48, "CUlaunchConfig as cuda.h lays it out");

/* kernel_params.params_from_extra: the packed buffer an `extra` list names (none: *size 0), or
 * CUDA_ERROR_INVALID_VALUE for an unknown key, a buffer without its size or a size without its buffer, a size past
 * the driver's limit, or no CU_LAUNCH_PARAM_END within MAX_EXTRA_PAIRS pairs. */
static int params_from_extra(void *const *extra, const void **buffer, size_t *size) {
    const void *data = NULL;
    const size_t *size_at = NULL;
    int named_data = 0, named_size = 0;
    *buffer = NULL;
    *size = 0;
    for (int pair = 0;; pair++) {
        if (pair == MAX_EXTRA_PAIRS) return CUDA_ERROR_INVALID_VALUE;
        uintptr_t key = (uintptr_t)extra[2 * pair];
        if (key == PARAM_END) break;
        void *value = extra[2 * pair + 1];
        if (key == PARAM_BUFFER_POINTER) {
            data = value;
            named_data = 1;
        } else if (key == PARAM_BUFFER_SIZE) {
            size_at = value;
            named_size = 1;
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (!named_data && !named_size) return CUDA_SUCCESS;
    if (!size_at || *size_at > ORION_MAX_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    if (*size_at && !data) return CUDA_ERROR_INVALID_VALUE;
    *buffer = data;
    *size = *size_at;
    return CUDA_SUCCESS;
}

int orion_params_from_extra(void *const *extra, const void **buffer, size_t *size) {
    return params_from_extra(extra, buffer, size); /* for graph_calls.c's kernel nodes */
}

struct launch {
    uint32_t opcode;
    int posted;
    uint64_t function;
    unsigned int dims[7]; /* grid x y z, block x y z, shared bytes */
    uint64_t stream;
    int with_attributes;  /* cuLaunchKernelEx: its request has the attributes array */
    const CUlaunchAttribute *attributes;
    unsigned int count;
};

size_t orion_launch_head(uint8_t *head, uint64_t function, const unsigned int dims[7], uint64_t stream,
                         const unsigned int *count) {
    orion_put_u64(head + ORION_LAUNCH_function, function);
    orion_put_u32(head + ORION_LAUNCH_grid_x, dims[0]);
    orion_put_u32(head + ORION_LAUNCH_grid_y, dims[1]);
    orion_put_u32(head + ORION_LAUNCH_grid_z, dims[2]);
    orion_put_u32(head + ORION_LAUNCH_block_x, dims[3]);
    orion_put_u32(head + ORION_LAUNCH_block_y, dims[4]);
    orion_put_u32(head + ORION_LAUNCH_block_z, dims[5]);
    orion_put_u32(head + ORION_LAUNCH_shared_bytes, dims[6]);
    orion_put_u64(head + ORION_LAUNCH_stream, stream);
    if (!count) return ORION_LAUNCH_SIZE;
    orion_put_u32(head + ORION_REQ_cuLaunchKernelEx_attributes, *count);
    return ORION_LAUNCH_HEAD_BYTES;
}

static int launch(const struct launch *l, void **params, void **extra) {
    uint8_t head[ORION_LAUNCH_HEAD_BYTES];
    size_t head_len = orion_launch_head(head, l->function, l->dims, l->stream, l->with_attributes ? &l->count : NULL);
    uint8_t small[PACKED_ON_STACK];
    uint8_t *packed = small;
    const void *tail = NULL;
    size_t size = 0;
    int status = CUDA_SUCCESS;
    if (params) {
        status = orion_params_pack(l->function, params, small, sizeof small, &packed, &size);
        tail = packed;
    } else if (extra) {
        orion_graph_kernel_extra_given(); /* a captured launch's node may hold `extra` now (graph_queries.c) */
        status = params_from_extra(extra, &tail, &size);
    }
    if (status != CUDA_SUCCESS) return status;
    struct orion_piece pieces[3] = { { head, head_len } };
    int count = 1;
    if (l->with_attributes && l->count)
        pieces[count++] = (struct orion_piece){ l->attributes, (size_t)l->count * ATTRIBUTE_SIZE };
    if (size) pieces[count++] = (struct orion_piece){ tail, size };
    status = hand_send(l->opcode, l->posted, pieces, count);
    if (packed != small) free(packed);
    return status;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra) {
    ORION_ENTRY("cuLaunchKernel");
    struct launch l = { ORION_OP_cuLaunchKernel, ORION_POSTED_cuLaunchKernel, (uint64_t)(uintptr_t)f,
                        { gx, gy, gz, bx, by, bz, shared }, (uint64_t)(uintptr_t)stream, 0, NULL, 0 };
    return launch(&l, params, extra);
}

/* The same payload as cuLaunchKernel (no `extra`); the host rebuilds a kernelParams array. */
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                   unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,
                                   void **params) {
    ORION_ENTRY("cuLaunchCooperativeKernel");
    struct launch l = { ORION_OP_cuLaunchCooperativeKernel, ORION_POSTED_cuLaunchCooperativeKernel,
                        (uint64_t)(uintptr_t)f, { gx, gy, gz, bx, by, bz, shared }, (uint64_t)(uintptr_t)stream,
                        0, NULL, 0 };
    return launch(&l, params, NULL);
}

/* driver_api.LAUNCH_ATTRIBUTES_PLAIN and _EVENT (generated into orion_calls.h): the attributes that travel as
 * their bytes; an event one carries an event the host checks is the session's. */
static int forwarded_attribute(int id) {
    return id >= 0 && id < 64 && (ORION_LAUNCH_ATTRIBUTES_FORWARDED >> id) & 1;
}

/* Names for orion_not_forwarded, said once each (it keeps the pointer). */
static const char *unforwarded_attribute(const char *caller) {
    return strcmp(caller, "cuLaunchKernelEx") == 0
        ? "cuLaunchKernelEx with a launch attribute other than the plain and event ones "
          "(DEVICE_UPDATABLE_KERNEL_NODE, or one newer than this library)"
        : "cuOccupancyMaxActiveClusters with a launch attribute other than the plain and event ones";
}

static int check_config(const char *caller, const CUlaunchConfig *config) {
    if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < config->numAttrs; i++)
        if (!forwarded_attribute(config->attrs[i].id)) return orion_not_forwarded(unforwarded_attribute(caller));
    return CUDA_SUCCESS;
}

int orion_launch_config_pieces(const char *caller, uint64_t function, const CUlaunchConfig *config, uint8_t *head,
                               struct orion_piece pieces[2], int *count) {
    int status = check_config(caller, config);
    if (status != CUDA_SUCCESS) return status;
    const unsigned int dims[7] = { config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                                   config->blockDimY, config->blockDimZ, config->sharedMemBytes };
    pieces[0] = (struct orion_piece){ head, orion_launch_head(head, function, dims,
                                                              (uint64_t)(uintptr_t)config->hStream,
                                                              &config->numAttrs) };
    *count = 1;
    if (config->numAttrs)
        pieces[(*count)++] = (struct orion_piece){ config->attrs, (size_t)config->numAttrs * ATTRIBUTE_SIZE };
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    ORION_ENTRY("cuLaunchKernelEx");
    int status = check_config("cuLaunchKernelEx", config);
    if (status != CUDA_SUCCESS) return status;
    struct launch l = { ORION_OP_cuLaunchKernelEx, ORION_POSTED_cuLaunchKernelEx, (uint64_t)(uintptr_t)f,
                        { config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                          config->blockDimY, config->blockDimZ, config->sharedMemBytes },
                        (uint64_t)(uintptr_t)config->hStream, 1, config->attrs, config->numAttrs };
    return launch(&l, params, extra);
}

/* param_layouts.c: kernel-parameter layouts asked once per function and kept per process, and the packing of a
 * launch's kernelParams by them (param_layouts.h). Packing lives here because a layout is only valid under this
 * file's lock: an unload on another thread frees them all. */
#include "param_layouts.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hand_calls.h"
#include "handle_map.h"

#define MAX_PARAMS 4096 /* asked no further: a bound on a host that never says "past the last parameter" */

struct param { uint64_t offset, size; };
struct layout {
    size_t count, total; /* parameters, and their packed size: max(offset + size) */
    struct param params[];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle_map layouts;   /* function or kernel handle -> struct layout */
static struct handle_map kernels;   /* CUkernel handles (launchable as functions) -> a non-NULL mark */
static uint64_t forgotten;          /* how many times every layout was forgotten */

void orion_param_layouts_kernel_made(uint64_t kernel) {
    static char mark;
    pthread_mutex_lock(&lock);
    handle_map_put(&kernels, kernel, &mark); /* out of memory: its layout is then a function's query */
    pthread_mutex_unlock(&lock);
}

void orion_param_layouts_forget(void) {
    pthread_mutex_lock(&lock);
    handle_map_clear(&layouts, free);
    forgotten++;
    pthread_mutex_unlock(&lock);
}

static int by_offset(const void *a, const void *b) {
    const struct param *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* kernel_params.check_layout: each parameter inside the limit, none overlapping; sets the packed size. */
static int check(struct layout *l) {
    struct param *sorted = malloc((l->count ? l->count : 1) * sizeof *sorted);
    if (!sorted) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(sorted, l->params, l->count * sizeof *sorted);
    qsort(sorted, l->count, sizeof *sorted, by_offset);
    int status = CUDA_SUCCESS;
    l->total = 0;
    for (size_t i = 0; i < l->count && status == CUDA_SUCCESS; i++) {
        uint64_t offset = sorted[i].offset, size = sorted[i].size;
        if (!size || offset > ORION_MAX_PARAM_BYTES || size > ORION_MAX_PARAM_BYTES - offset)
            status = CUDA_ERROR_INVALID_VALUE;
        else if (i && offset < sorted[i - 1].offset + sorted[i - 1].size)
            status = CUDA_ERROR_INVALID_VALUE; /* overlapping parameters: a lying host */
        else if (offset + size > l->total)
            l->total = (size_t)(offset + size);
    }
    free(sorted);
    return status;
}

/* Ask the host for the layout of `function`, one parameter at a time, until it answers CUDA_ERROR_INVALID_VALUE
 * (past the last one). *keep: whether the answer may be remembered (the host said where the list ends).
 *
 * Unlike param_layouts.py, any other failure is the launch's result and nothing is launched: a launch with a
 * truncated layout would hand the kernel wrong arguments. The queries leave an earlier posted call's failure
 * pending (ORION_CALL_NO_FOLD), as param_layouts.py's do. */
#define PARAM_INFO(payload, field) ORION_##payload##_cuFuncGetParamInfo_##field /* cuKernelGetParamInfo's too */
#define SAME_INFO(payload, field) (ORION_##payload##_cuKernelGetParamInfo_##field == PARAM_INFO(payload, field))
_Static_assert(SAME_INFO(REQ, arg0) && SAME_INFO(REQ, arg1) && SAME_INFO(REQ, SIZE) && SAME_INFO(REP, arg2)
               && SAME_INFO(REP, arg3) && SAME_INFO(REP, SIZE), "ask() packs both");
static int ask(uint64_t function, int is_kernel, struct layout **out, int *keep) {
    uint32_t opcode = is_kernel ? ORION_OP_cuKernelGetParamInfo : ORION_OP_cuFuncGetParamInfo;
    size_t capacity = 8;
    struct layout *l = malloc(sizeof *l + capacity * sizeof l->params[0]);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->count = 0;
    int status = CUDA_SUCCESS;
    while (l->count < MAX_PARAMS) {
        uint8_t request[PARAM_INFO(REQ, SIZE)], reply[PARAM_INFO(REP, SIZE)];
        orion_put_u64(request + PARAM_INFO(REQ, arg0), function);
        orion_put_u64(request + PARAM_INFO(REQ, arg1), l->count);
        struct orion_piece piece = { request, sizeof request };  /* a pending async error stays the program's */
        status = orion_thread_forwardv(opcode, &piece, 1, reply, sizeof reply, NULL, 0, NULL, ORION_CALL_NO_FOLD);
        if (status != CUDA_SUCCESS) break;
        if (l->count == capacity) {
            capacity *= 2;
            struct layout *bigger = realloc(l, sizeof *l + capacity * sizeof l->params[0]);
            if (!bigger) {
                free(l);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            l = bigger;
        }
        l->params[l->count].offset = orion_get_u64(reply + PARAM_INFO(REP, arg2));
        l->params[l->count++].size = orion_get_u64(reply + PARAM_INFO(REP, arg3));
    }
    *keep = status == CUDA_ERROR_INVALID_VALUE;
    if (status == CUDA_ERROR_INVALID_VALUE || status == CUDA_SUCCESS) status = check(l);
    if (status != CUDA_SUCCESS) {
        free(l);
        return status;
    }
    *out = l;
    return CUDA_SUCCESS;
}

static int pack(const struct layout *l, void *const *kernel_params, uint8_t *small, size_t small_cap,
                uint8_t **packed, size_t *size) {
    *packed = small;
    *size = 0;
    if (!l->count) return CUDA_SUCCESS; /* no parameters: kernelParams is not read */
    if (!kernel_params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t *buffer = l->total <= small_cap ? small : malloc(l->total);
    if (!buffer) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(buffer, 0, l->total);
    for (size_t i = 0; i < l->count; i++) {
        if (!kernel_params[i]) {
            if (buffer != small) free(buffer);
            return CUDA_ERROR_INVALID_VALUE;
        }
        memcpy(buffer + l->params[i].offset, kernel_params[i], (size_t)l->params[i].size);
    }
    *packed = buffer;
    *size = l->total;
    return CUDA_SUCCESS;
}

int orion_params_pack(uint64_t function, void *const *kernel_params, uint8_t *small, size_t small_cap,
                      uint8_t **packed, size_t *size) {
    if (!packed || !size) return CUDA_ERROR_INVALID_VALUE;
    *packed = small;
    *size = 0;
    pthread_mutex_lock(&lock);
    const struct layout *known = handle_map_get(&layouts, function);
    int is_kernel = handle_map_get(&kernels, function) != NULL;
    uint64_t generation = forgotten;
    if (known) {
        int status = pack(known, kernel_params, small, small_cap, packed, size);
        pthread_mutex_unlock(&lock);
        return status;
    }
    pthread_mutex_unlock(&lock); /* not held across round trips: other threads launch meanwhile */

    struct layout *fresh = NULL;
    int keep = 0;
    int status = ask(function, is_kernel, &fresh, &keep);
    if (status != CUDA_SUCCESS) return status;
    pthread_mutex_lock(&lock);
    keep = keep && generation == forgotten; /* no unload meanwhile: the answer still names this function */
    known = keep ? handle_map_get(&layouts, function) : NULL; /* another thread asked too */
    if (!known) {
        known = fresh;
        if (keep && handle_map_put(&layouts, function, fresh) == 0) fresh = NULL;
    }
    status = pack(known, kernel_params, small, small_cap, packed, size);
    pthread_mutex_unlock(&lock);
    free(fresh); /* an answer not kept, or a second one */
    return status;
}

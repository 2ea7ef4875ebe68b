/* module_queries.c: module enumeration and names, and the device queries that carry arrays or bytes, for the native
 * guest driver: cuModuleEnumerateFunctions, cuLibraryEnumerateKernels, cuFuncGetName, cuKernelGetName,
 * cuDeviceGetLuid, cuDeviceGetHostAtomicCapabilities and cuDeviceGetP2PAtomicCapabilities (host:
 * host_agent/session/module_queries.py).
 *
 * An enumeration asks for at most as many handles as the caller's array holds and copies what the host sends. A name
 * comes back as its bytes; the driver hands out a pointer to a string it owns, so this library keeps one copy per
 * handle (never freed: a handle's name does not change, and a process names few) and hands out a pointer to it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hand_calls.h"

enum { MAX_ITEMS = 1 << 16 }; /* the most handles or operations one call asks for (else 801, named once) */

/* A reply that is one counted list of `item`-byte entries (at most `asked`): copied into `out`, its count to *got. */
static int counted_list(uint32_t opcode, const uint8_t *request, size_t len, size_t item, size_t asked, void *out,
                        size_t *got) {
    size_t cap = ORION_LENGTH_BYTES + asked * item, tail_len = 0;
    uint8_t *tail = malloc(cap);
    if (!tail) return CUDA_ERROR_OUT_OF_MEMORY;
    struct orion_piece piece = { request, len };
    int status = orion_thread_forwardv(opcode, &piece, 1, NULL, 0, tail, cap, &tail_len, 0);
    if (status == CUDA_SUCCESS) {
        uint32_t n = tail_len >= ORION_LENGTH_BYTES ? orion_get_u32(tail) : UINT32_MAX;
        if (n > asked || tail_len != ORION_LENGTH_BYTES + n * item) {
            status = CUDA_ERROR_UNKNOWN; /* not the reply the table declares */
        } else {
            memcpy(out, tail + ORION_LENGTH_BYTES, n * item);
            *got = n;
        }
    }
    free(tail);
    return status;
}

static int enumerate(uint32_t opcode, const char *call, void *handles, unsigned int count, uint64_t owner) {
    if (!handles && count) return CUDA_ERROR_INVALID_VALUE;
    if (count > MAX_ITEMS) return orion_not_forwarded(call);
    _Static_assert(ORION_REQ_cuModuleEnumerateFunctions_SIZE == ORION_REQ_cuLibraryEnumerateKernels_SIZE &&
                   ORION_REQ_cuModuleEnumerateFunctions_count == ORION_REQ_cuLibraryEnumerateKernels_count,
                   "one request for both");
    uint8_t request[ORION_REQ_cuModuleEnumerateFunctions_SIZE];
    orion_put_u64(request, owner); /* the module or library: the first field of both */
    orion_put_u32(request + ORION_REQ_cuModuleEnumerateFunctions_count, count);
    size_t got = 0;
    return counted_list(opcode, request, sizeof request, sizeof(uint64_t), count, handles, &got);
}

CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned int count, CUmodule module) {
    ORION_ENTRY("cuModuleEnumerateFunctions");
    return enumerate(ORION_OP_cuModuleEnumerateFunctions, "cuModuleEnumerateFunctions of more than 65536 functions",
                     functions, count, (uint64_t)(uintptr_t)module);
}

CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int count, CUlibrary library) {
    ORION_ENTRY("cuLibraryEnumerateKernels");
    return enumerate(ORION_OP_cuLibraryEnumerateKernels, "cuLibraryEnumerateKernels of more than 65536 kernels",
                     kernels, count, (uint64_t)(uintptr_t)library);
}

/* --- names ------------------------------------------------------------------------------------------------------ */

struct name {
    struct name *next;
    uint64_t handle;
    char text[];
};
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static struct name *names;

/* The kept copy of `text` (`len` bytes, no NUL) for `handle`: the one kept before when it reads the same. */
static const char *kept_name(uint64_t handle, const uint8_t *text, size_t len) {
    pthread_mutex_lock(&names_lock);
    struct name *found = names;
    while (found && !(found->handle == handle && strlen(found->text) == len && memcmp(found->text, text, len) == 0))
        found = found->next;
    if (!found && (found = malloc(sizeof *found + len + 1)) != NULL) {
        found->handle = handle;
        memcpy(found->text, text, len);
        found->text[len] = '\0';
        found->next = names;
        names = found;
    }
    pthread_mutex_unlock(&names_lock);
    return found ? found->text : NULL;
}

static int name_of(uint32_t opcode, const char **name, uint64_t handle) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    _Static_assert(ORION_REQ_cuFuncGetName_SIZE == ORION_REQ_cuKernelGetName_SIZE && ORION_REP_cuFuncGetName_SIZE == 0
                   && ORION_REP_cuKernelGetName_SIZE == 0, "a handle, then the name's bytes as the whole reply");
    enum { LONGEST = 1 << 16 }; /* a mangled C++ name is rarely past a few hundred bytes */
    uint8_t request[ORION_REQ_cuFuncGetName_SIZE];
    orion_put_u64(request, handle);
    uint8_t *text = malloc(LONGEST);
    if (!text) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = 0;
    struct orion_piece piece = { request, sizeof request };
    int status = orion_thread_forwardv(opcode, &piece, 1, NULL, 0, text, LONGEST, &len, 0);
    if (status == CUDA_SUCCESS && memchr(text, '\0', len)) status = CUDA_ERROR_UNKNOWN; /* not a name */
    if (status == CUDA_SUCCESS && !(*name = kept_name(handle, text, len))) status = CUDA_ERROR_OUT_OF_MEMORY;
    free(text);
    return status;
}

CUresult cuFuncGetName(const char **name, CUfunction function) {
    ORION_ENTRY("cuFuncGetName");
    return name_of(ORION_OP_cuFuncGetName, name, (uint64_t)(uintptr_t)function);
}

CUresult cuKernelGetName(const char **name, CUkernel kernel) {
    ORION_ENTRY("cuKernelGetName");
    return name_of(ORION_OP_cuKernelGetName, name, (uint64_t)(uintptr_t)kernel);
}

/* --- device queries ----------------------------------------------------------------------------------------------- */

CUresult cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice device) {
    ORION_ENTRY("cuDeviceGetLuid");
    enum { LUID_BYTES = 8 };
    if (!luid || !mask) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[ORION_REQ_cuDeviceGetLuid_SIZE], reply[ORION_REP_cuDeviceGetLuid_SIZE], bytes[LUID_BYTES];
    orion_put_i32(request + ORION_REQ_cuDeviceGetLuid_device, device);
    size_t got = 0;
    struct orion_piece piece = { request, sizeof request };
    int status = orion_thread_forwardv(ORION_OP_cuDeviceGetLuid, &piece, 1, reply, sizeof reply, bytes, sizeof bytes,
                                       &got, 0);
    if (status != CUDA_SUCCESS) return status;
    if (got != LUID_BYTES) return CUDA_ERROR_UNKNOWN;
    memcpy(luid, bytes, LUID_BYTES);
    *mask = orion_get_u32(reply + ORION_REP_cuDeviceGetLuid_mask);
    return CUDA_SUCCESS;
}

/* The request's head (its devices), then the operations as a counted list of i32; the reply one u32 per operation. */
static int atomic_capabilities(uint32_t opcode, const char *call, uint8_t *head, size_t head_len,
                               unsigned int *capabilities, const CUatomicOperation *operations, unsigned int count) {
    if (!capabilities || !operations) return CUDA_ERROR_INVALID_VALUE;
    if (count > MAX_ITEMS) return orion_not_forwarded(call);
    _Static_assert(sizeof(CUatomicOperation) == 4, "an operation travels as its i32");
    uint8_t listed[ORION_LENGTH_BYTES];
    orion_put_u32(listed, count);
    struct orion_piece pieces[3] = { { head, head_len }, { listed, sizeof listed }, { operations, count * 4 } };
    size_t cap = ORION_LENGTH_BYTES + (size_t)count * 4, got = 0;
    uint8_t *tail = malloc(cap);
    if (!tail) return CUDA_ERROR_OUT_OF_MEMORY;
    int status = orion_thread_forwardv(opcode, pieces, 3, NULL, 0, tail, cap, &got, 0);
    if (status == CUDA_SUCCESS && (got != cap || orion_get_u32(tail) != count)) status = CUDA_ERROR_UNKNOWN;
    if (status == CUDA_SUCCESS) memcpy(capabilities, tail + ORION_LENGTH_BYTES, (size_t)count * 4);
    free(tail);
    return status;
}

CUresult cuDeviceGetHostAtomicCapabilities(unsigned int *capabilities, const CUatomicOperation *operations,
                                           unsigned int count, CUdevice device) {
    ORION_ENTRY("cuDeviceGetHostAtomicCapabilities");
    uint8_t head[ORION_REQ_cuDeviceGetHostAtomicCapabilities_SIZE];
    orion_put_i32(head + ORION_REQ_cuDeviceGetHostAtomicCapabilities_device, device);
    return atomic_capabilities(ORION_OP_cuDeviceGetHostAtomicCapabilities,
                               "cuDeviceGetHostAtomicCapabilities of more than 65536 operations", head, sizeof head,
                               capabilities, operations, count);
}

CUresult cuDeviceGetP2PAtomicCapabilities(unsigned int *capabilities, const CUatomicOperation *operations,
                                          unsigned int count, CUdevice source, CUdevice destination) {
    ORION_ENTRY("cuDeviceGetP2PAtomicCapabilities");
    uint8_t head[ORION_REQ_cuDeviceGetP2PAtomicCapabilities_SIZE];
    orion_put_i32(head + ORION_REQ_cuDeviceGetP2PAtomicCapabilities_source, source);
    orion_put_i32(head + ORION_REQ_cuDeviceGetP2PAtomicCapabilities_destination, destination);
    return atomic_capabilities(ORION_OP_cuDeviceGetP2PAtomicCapabilities,
                               "cuDeviceGetP2PAtomicCapabilities of more than 65536 operations", head, sizeof head,
                               capabilities, operations, count);
}

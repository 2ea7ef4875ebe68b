/* function_answers.c: cuFuncGetAttribute and cuKernelGetAttribute answered from what the host said the first time,
 * and the calls that change those answers (cuFuncSetAttribute, cuFuncSetCacheConfig, cuKernelSetAttribute,
 * cuKernelSetCacheConfig), which forget them (answer_cache.h); a kernel's function in the current context and the
 * occupancy queries likewise (the last part of this file).
 *
 * Keys: a function's answers by (function, the calling thread's current context): a CUfunction belongs to one
 * context, but CUDA 12+ also takes a CUkernel where a CUfunction goes, and then answers for the current context's
 * device; keying by the context keeps that right at the price of one question per context. A kernel's answers by
 * (kernel, device), as cuKernelGetAttribute asks.
 *
 * What forgets: a set on a function forgets that function's answers and every kernel's (the function may be a
 * kernel's, or a kernel handle passed as a function); a set on a kernel forgets that kernel's answers and every
 * function's (cuKernelSetAttribute applies to the kernel's functions, which this library does not track); an
 * unload forgets everything (the generated cuModuleUnload/cuLibraryUnload call orion_function_answers_forget:
 * handles are reused by later loads). Only successful answers are kept.
 *
 * A lookup takes the read side of a rwlock (readers never wait for each other); a set or an unload takes the
 * write side. A question that was in flight while a set ran must not store the old answer after the set forgot
 * it: every forget advances `epoch`, and an answer is stored only if the epoch is the one read before asking.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_rwlock_t under -std=c11 */
#include <pthread.h>
#include <stdlib.h>

#include "answer_cache.h"
#include "handle_map.h"

#define FUNCTION_ATTRIBUTES 32 /* CUfunction_attribute values kept (CUDA 13: 0..17) */

struct answers {
    uint64_t scope;   /* the current context (functions) or the device (kernels) */
    uint32_t known;   /* bit a: values[a] holds the host's answer for attribute a */
    int32_t values[FUNCTION_ATTRIBUTES];
    struct answers *next;
};

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct handle_map functions, kernels; /* handle -> its struct answers chain, one per scope */
static _Atomic uint64_t epoch;

static void free_chain(void *head) {
    for (struct answers *a = head, *next; a; a = next) {
        next = a->next;
        free(a);
    }
}

/* 1 and *value when kept; 0 when the host must be asked. */
static int lookup(const struct handle_map *map, uint64_t handle, uint64_t scope, int attribute, int *value) {
    int found = 0;
    pthread_rwlock_rdlock(&lock);
    for (const struct answers *a = handle_map_get(map, handle); a; a = a->next) {
        if (a->scope == scope && (a->known >> attribute & 1)) {
            *value = a->values[attribute];
            found = 1;
            break;
        }
    }
    pthread_rwlock_unlock(&lock);
    return found;
}

static void store(struct handle_map *map, uint64_t handle, uint64_t scope, int attribute, int value, uint64_t seen) {
    pthread_rwlock_wrlock(&lock);
    if (atomic_load(&epoch) == seen) { /* else something was forgotten while the host answered: keep nothing */
        struct answers *head = handle_map_get(map, handle), *a = head;
        while (a && a->scope != scope) a = a->next;
        if (!a && (a = calloc(1, sizeof *a)) != NULL) {
            a->scope = scope;
            a->next = head;
            if (handle_map_put(map, handle, a)) { /* out of memory: not kept */
                free(a);
                a = NULL;
            }
        }
        if (a) {
            a->values[attribute] = value;
            a->known |= (uint32_t)1 << attribute;
        }
    }
    pthread_rwlock_unlock(&lock);
}

/* In the write side: `handle`'s answers in `map` forgotten (all of the map's when handle is 0). */
static void forget_in(struct handle_map *map, uint64_t handle) {
    if (!handle) {
        handle_map_clear(map, free_chain);
        return;
    }
    for (struct answers *a = handle_map_get(map, handle); a; a = a->next) a->known = 0;
}

static void forget_kept(int unloaded);

static void forget(uint64_t function, uint64_t kernel) {
    pthread_rwlock_wrlock(&lock);
    forget_in(&functions, function);
    forget_in(&kernels, kernel);
    forget_kept(function == 0 && kernel == 0);
    atomic_fetch_add(&epoch, 1);
    pthread_rwlock_unlock(&lock);
}

void orion_function_answers_forget(void) { forget(0, 0); }

/* A query with a 4-byte reply, kept under (handle, scope, attribute) when that can be. */
_Static_assert(ORION_REP_cuKernelGetAttribute_SIZE == ORION_REP_cuFuncGetAttribute_SIZE
               && ORION_REP_cuKernelGetAttribute_arg0 == ORION_REP_cuFuncGetAttribute_arg0, "ask() reads both");
static int ask(struct handle_map *map, uint64_t handle, uint64_t scope, int attribute, uint32_t opcode,
               const uint8_t *req, size_t len, int *value) {
    int cacheable = handle && attribute >= 0 && attribute < FUNCTION_ATTRIBUTES && orion_is_initialized();
    if (cacheable && lookup(map, handle, scope, attribute, value)) return CUDA_SUCCESS;
    uint64_t seen = atomic_load(&epoch);
    uint8_t rep[ORION_REP_cuFuncGetAttribute_SIZE];
    int status = orion_thread_forward(opcode, req, len, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    *value = orion_get_i32(rep + ORION_REP_cuFuncGetAttribute_arg0);
    if (cacheable) store(map, handle, scope, attribute, *value, seen);
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction function) {
    ORION_ENTRY("cuFuncGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuFuncGetAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuFuncGetAttribute_arg1, attribute);
    orion_put_u64(req + ORION_REQ_cuFuncGetAttribute_arg2, (uint64_t)(uintptr_t)function);
    return ask(&functions, (uint64_t)(uintptr_t)function, (uint64_t)(uintptr_t)orion_current_context(), attribute,
               ORION_OP_cuFuncGetAttribute, req, sizeof req, value);
}

CUresult cuKernelGetAttribute(int *value, CUfunction_attribute attribute, CUkernel kernel, CUdevice device) {
    ORION_ENTRY("cuKernelGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuKernelGetAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuKernelGetAttribute_arg1, attribute);
    orion_put_u64(req + ORION_REQ_cuKernelGetAttribute_arg2, (uint64_t)(uintptr_t)kernel);
    orion_put_i32(req + ORION_REQ_cuKernelGetAttribute_arg3, device);
    return ask(&kernels, (uint64_t)(uintptr_t)kernel, (uint32_t)device, attribute, ORION_OP_cuKernelGetAttribute, req,
               sizeof req, value);
}

/* The setters: sent as the generated calls send them, then the answers they may change forgotten (whatever the
 * host said: a failed set changed nothing, but forgetting costs one question): the handle's own, and every answer
 * of the other kind (0 to forget(): a function's attributes are its kernel's, and the other way round). */
static CUresult set_then_forget(uint32_t opcode, const uint8_t *req, size_t len, uint64_t function, uint64_t kernel) {
    int status = orion_thread_forward(opcode, req, len, NULL, 0, 0);
    forget(function, kernel);
    return status;
}

/* A handle as forget() takes it: NULL names no kept answer (UINT64_MAX), never "all" (0). */
static uint64_t named(const void *handle) { return handle ? (uint64_t)(uintptr_t)handle : UINT64_MAX; }

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
    ORION_ENTRY("cuFuncSetAttribute");
    uint8_t req[ORION_REQ_cuFuncSetAttribute_SIZE];
    orion_put_u64(req + ORION_REQ_cuFuncSetAttribute_arg0, (uint64_t)(uintptr_t)function);
    orion_put_i32(req + ORION_REQ_cuFuncSetAttribute_arg1, attribute);
    orion_put_i32(req + ORION_REQ_cuFuncSetAttribute_arg2, value);
    return set_then_forget(ORION_OP_cuFuncSetAttribute, req, sizeof req, named(function), 0);
}

CUresult cuFuncSetCacheConfig(CUfunction function, CUfunc_cache config) {
    ORION_ENTRY("cuFuncSetCacheConfig");
    uint8_t req[ORION_REQ_cuFuncSetCacheConfig_SIZE];
    orion_put_u64(req + ORION_REQ_cuFuncSetCacheConfig_arg0, (uint64_t)(uintptr_t)function);
    orion_put_i32(req + ORION_REQ_cuFuncSetCacheConfig_arg1, config);
    return set_then_forget(ORION_OP_cuFuncSetCacheConfig, req, sizeof req, named(function), 0);
}

CUresult cuKernelSetAttribute(CUfunction_attribute attribute, int value, CUkernel kernel, CUdevice device) {
    ORION_ENTRY("cuKernelSetAttribute");
    uint8_t req[ORION_REQ_cuKernelSetAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuKernelSetAttribute_arg0, attribute);
    orion_put_i32(req + ORION_REQ_cuKernelSetAttribute_arg1, value);
    orion_put_u64(req + ORION_REQ_cuKernelSetAttribute_arg2, (uint64_t)(uintptr_t)kernel);
    orion_put_i32(req + ORION_REQ_cuKernelSetAttribute_arg3, device);
    return set_then_forget(ORION_OP_cuKernelSetAttribute, req, sizeof req, 0, named(kernel));
}

CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice device) {
    ORION_ENTRY("cuKernelSetCacheConfig");
    uint8_t req[ORION_REQ_cuKernelSetCacheConfig_SIZE];
    orion_put_u64(req + ORION_REQ_cuKernelSetCacheConfig_arg0, (uint64_t)(uintptr_t)kernel);
    orion_put_i32(req + ORION_REQ_cuKernelSetCacheConfig_arg1, config);
    orion_put_i32(req + ORION_REQ_cuKernelSetCacheConfig_arg2, device);
    return set_then_forget(ORION_OP_cuKernelSetCacheConfig, req, sizeof req, 0, named(kernel));
}

/* --- a kernel's function in the current context, and occupancy --------------------------------------------------
 * cuKernelGetFunction's answer for (kernel, current context) stays the same until the kernel's library is unloaded or
 * the context goes (an unload, cuCtxDestroy and the primary-context calls forget everything: orion_function_answers_
 * forget); an attribute set changes a function's attributes, not which function it is.
 * cuOccupancyMaxActiveBlocksPerMultiprocessor(WithFlags) depends on the function, its attributes and its context's
 * cache and limit settings: kept under (function, context, block size, dynamic shared memory, flags) and
 * forgotten by every set above, and by cuCtxSetCacheConfig, cuCtxSetSharedMemConfig and cuCtxSetLimit
 * (orion_occupancy_changed, the generator's status hooks). A batch-1 ResNet inference in PyTorch asked these 18 to
 * 50 times per image, each a round trip of 14 to 38 us (docs/performance.md, "Where the time goes"). */
struct kept {
    uint64_t context, a, b; /* the question beyond its handle: (0, 0) for a kernel's function; (shared memory,
                               block size << 32 | flags) for occupancy */
    uint64_t value;
    struct kept *next;
};

static struct handle_map kernel_functions; /* kernel -> its struct kept chain: the function, one per context */
static struct handle_map occupancy;        /* function -> its struct kept chain: blocks per multiprocessor */

static void free_kept(void *head) {
    for (struct kept *k = head, *next; k; k = next) {
        next = k->next;
        free(k);
    }
}

/* In the write side: what forget() forgets of these: every occupancy answer (a set may change any), and with
 * `unloaded` (an unload, a context gone) every kernel's function too; a set changes no kernel's function. */
static void forget_kept(int unloaded) {
    if (unloaded) handle_map_clear(&kernel_functions, free_kept);
    handle_map_clear(&occupancy, free_kept);
}

void orion_occupancy_changed(int status) {
    (void)status; /* a failed set changed nothing, but forgetting costs one question */
    pthread_rwlock_wrlock(&lock);
    handle_map_clear(&occupancy, free_kept);
    atomic_fetch_add(&epoch, 1);
    pthread_rwlock_unlock(&lock);
}

/* 1 and *value when the answer to `question` of `handle` is kept; 0 when the host must be asked. */
static int kept_get(const struct handle_map *map, uint64_t handle, const struct kept *question, uint64_t *value) {
    int found = 0;
    pthread_rwlock_rdlock(&lock);
    for (const struct kept *k = handle_map_get(map, handle); k && !found; k = k->next) {
        if (k->context == question->context && k->a == question->a && k->b == question->b) {
            *value = k->value;
            found = 1;
        }
    }
    pthread_rwlock_unlock(&lock);
    return found;
}

/* Keep the host's answer to `question`, unless something was forgotten since `seen` (the epoch before asking). */
static void kept_put(struct handle_map *map, uint64_t handle, const struct kept *question, uint64_t value,
                     uint64_t seen) {
    pthread_rwlock_wrlock(&lock);
    struct kept *k;
    if (atomic_load(&epoch) == seen && (k = malloc(sizeof *k)) != NULL) {
        *k = *question;
        k->value = value;
        k->next = handle_map_get(map, handle);
        if (handle_map_put(map, handle, k)) free(k); /* out of memory: not kept */
    }
    pthread_rwlock_unlock(&lock);
}

/* The question about `handle` in the current context, and whether it may be kept (after cuInit, a context current). */
static int keepable(uint64_t handle, uint64_t a, uint64_t b, struct kept *question) {
    *question = (struct kept){ (uint64_t)(uintptr_t)orion_current_context(), a, b, 0, NULL };
    return handle && question->context && orion_is_initialized();
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    ORION_ENTRY("cuKernelGetFunction");
    if (!pFunc) return CUDA_ERROR_INVALID_VALUE;
    uint64_t handle = (uint64_t)(uintptr_t)kernel, function;
    struct kept question;
    int cacheable = keepable(handle, 0, 0, &question);
    if (cacheable && kept_get(&kernel_functions, handle, &question, &function)) {
        *pFunc = (CUfunction)(uintptr_t)function;
        return CUDA_SUCCESS;
    }
    uint64_t seen = atomic_load(&epoch);
    uint8_t req[ORION_REQ_cuKernelGetFunction_SIZE], rep[ORION_REP_cuKernelGetFunction_SIZE];
    orion_put_u64(req + ORION_REQ_cuKernelGetFunction_arg1, handle);
    CUresult status = orion_thread_forward(ORION_OP_cuKernelGetFunction, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    function = orion_get_u64(rep + ORION_REP_cuKernelGetFunction_arg0);
    *pFunc = (CUfunction)(uintptr_t)function;
    if (cacheable) kept_put(&kernel_functions, handle, &question, function, seen);
    return CUDA_SUCCESS;
}

static CUresult occupancy_of(int *blocks, CUfunction function, int block, size_t smem, unsigned int flags,
                             uint32_t opcode, const uint8_t *req, size_t len) {
    if (!blocks) return CUDA_ERROR_INVALID_VALUE;
    uint64_t handle = (uint64_t)(uintptr_t)function, value;
    struct kept question;
    int cacheable = keepable(handle, smem, (uint64_t)(uint32_t)block << 32 | flags, &question);
    if (cacheable && kept_get(&occupancy, handle, &question, &value)) {
        *blocks = (int)(int32_t)value;
        return CUDA_SUCCESS;
    }
    uint64_t seen = atomic_load(&epoch);
    _Static_assert(ORION_REP_cuOccupancyMaxActiveBlocksPerMultiprocessor_SIZE
                   == ORION_REP_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_SIZE
                   && ORION_REP_cuOccupancyMaxActiveBlocksPerMultiprocessor_arg0
                   == ORION_REP_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_arg0, "one reply for both");
    uint8_t rep[ORION_REP_cuOccupancyMaxActiveBlocksPerMultiprocessor_SIZE];
    CUresult status = orion_thread_forward(opcode, req, len, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    *blocks = orion_get_i32(rep + ORION_REP_cuOccupancyMaxActiveBlocksPerMultiprocessor_arg0);
    if (cacheable) kept_put(&occupancy, handle, &question, (uint64_t)(uint32_t)*blocks, seen);
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize) {
    ORION_ENTRY("cuOccupancyMaxActiveBlocksPerMultiprocessor");
    uint8_t req[ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessor_SIZE];
    orion_put_u64(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessor_arg1, (uint64_t)(uintptr_t)func);
    orion_put_i32(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessor_arg2, blockSize);
    orion_put_u64(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessor_arg3, dynamicSMemSize);
    return occupancy_of(numBlocks, func, blockSize, dynamicSMemSize, 0,
                        ORION_OP_cuOccupancyMaxActiveBlocksPerMultiprocessor, req, sizeof req);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags) {
    ORION_ENTRY("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
    uint8_t req[ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_SIZE];
    orion_put_u64(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_arg1,
                  (uint64_t)(uintptr_t)func);
    orion_put_i32(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_arg2, blockSize);
    orion_put_u64(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_arg3, dynamicSMemSize);
    orion_put_u32(req + ORION_REQ_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_arg4, flags);
    return occupancy_of(numBlocks, func, blockSize, dynamicSMemSize, flags,
                        ORION_OP_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, req, sizeof req);
}

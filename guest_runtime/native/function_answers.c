/* function_answers.c: cuFuncGetAttribute and cuKernelGetAttribute answered from what the host said the first time,
 * and the calls that change those answers (cuFuncSetAttribute, cuFuncSetCacheConfig, cuKernelSetAttribute,
 * cuKernelSetCacheConfig), which forget them (answer_cache.h).
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

static void forget(uint64_t function, uint64_t kernel) {
    pthread_rwlock_wrlock(&lock);
    forget_in(&functions, function);
    forget_in(&kernels, kernel);
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

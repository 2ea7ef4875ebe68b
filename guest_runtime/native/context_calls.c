/* context_calls.c: cuCtxCreate, cuCtxDestroy, cuCtxGetCurrent, cuCtxSetCurrent, cuCtxPushCurrent and
 * cuCtxPopCurrent over the guest's per-thread context stacks (context_stacks.c), exactly as guest_runtime/forward.py
 * writes them: the host is told a context only to check that the session may use it, and before calls. A context
 * this process made (or the host already checked) needs no check: making it current sends nothing
 * (context_answers.c keeps which contexts those are, and each one's device).
 *
 * cuCtxDestroy and cuCtxSetCurrent are generic in the call table; their generated entry points are weak, so these
 * definitions replace them (the stacks must follow what they do).
 */
#include <string.h>

#include "answer_cache.h"


/* CUctxCreateParams {CUexecAffinityParam *, int count, CUctxCigParam *}: only an empty one is forwarded. */
static int names_parameters(const CUctxCreateParams *params) {
    if (!params) return 0;
    uint8_t raw[24];
    memcpy(raw, params, sizeof raw);
    return orion_get_u64(raw) || orion_get_i32(raw + 8) || orion_get_u64(raw + 16);
}

int cuCtxCreate(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    ORION_ENTRY("cuCtxCreate");
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (names_parameters(params)) return orion_not_forwarded("cuCtxCreate with execution-affinity or CIG parameters");
    uint8_t req[ORION_REQ_cuCtxCreate_SIZE], rep[ORION_REP_cuCtxCreate_SIZE];
    orion_put_u32(req + ORION_REQ_cuCtxCreate_flags, flags);
    orion_put_i32(req + ORION_REQ_cuCtxCreate_device, dev);
    orion_turn_take();
    int status = orion_sync_context();
    if (status == CUDA_SUCCESS) status = orion_forward(ORION_OP_cuCtxCreate, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) {
        uint64_t ctx = orion_get_u64(rep + ORION_REP_cuCtxCreate_context);
        *pctx = (CUcontext)(uintptr_t)ctx;
        orion_host_current_is(ctx); /* the new context is current to the calling thread, on the host too */
        orion_context_made(ctx, dev);
        status = orion_stack_push(ctx);
    }
    orion_turn_give();
    return status;
}

int cuCtxDestroy(CUcontext ctx) {
    ORION_ENTRY("cuCtxDestroy");
    uint8_t req[ORION_REQ_cuCtxDestroy_SIZE];
    orion_put_u64(req + ORION_REQ_cuCtxDestroy_arg0, (uint64_t)(uintptr_t)ctx);
    orion_turn_take();
    int status = orion_sync_context();
    if (status == CUDA_SUCCESS) status = orion_forward(ORION_OP_cuCtxDestroy, req, sizeof req, NULL, 0, 0);
    if (status == CUDA_SUCCESS) {
        orion_stack_destroyed((uint64_t)(uintptr_t)ctx);
        orion_context_gone((uint64_t)(uintptr_t)ctx);
        orion_known_forget(ORION_KNOWN_STREAMS); /* its streams and events went with it */
        orion_events_forget();
        orion_host_current_unknown();
    }
    orion_turn_give();
    return status;
}

int cuCtxGetCurrent(CUcontext *pctx) {
    ORION_ENTRY("cuCtxGetCurrent");
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = orion_current_context();
    return CUDA_SUCCESS;
}

int cuCtxSetCurrent(CUcontext ctx) {
    ORION_ENTRY("cuCtxSetCurrent");
    return orion_set_current_context(ctx);
}

int cuCtxPushCurrent(CUcontext ctx) {
    ORION_ENTRY("cuCtxPushCurrent");
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_check_context((uint64_t)(uintptr_t)ctx);
    return status == CUDA_SUCCESS ? orion_stack_push((uint64_t)(uintptr_t)ctx) : status;
}

int cuCtxPopCurrent(CUcontext *pctx) {
    ORION_ENTRY("cuCtxPopCurrent");
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t popped;
    if (!orion_stack_pop(&popped)) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx) *pctx = (CUcontext)(uintptr_t)popped;
    return CUDA_SUCCESS;
}

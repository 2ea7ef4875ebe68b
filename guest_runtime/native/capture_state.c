/* capture_state.c: whether a stream capture may be under way in this process, and the capture query it lets the
 * guest answer.
 *
 * Every capture of the process begins and ends through this library (the generated cuStreamBeginCapture and
 * cuStreamEndCapture, graph_queries.c's cuStreamBeginCaptureToGraph call the hooks below with the driver's status),
 * so a count of captures begun and not yet ended is never below the true number: a begin counts only when it
 * succeeded, an end only with a status that ends a capture (success, or the capture invalidated or unjoined). A
 * capture the program abandons (its stream destroyed) keeps the count up: the queries below are then asked of the
 * host, slower but right.
 *
 * cuStreamIsCapturing and cuStreamGetCaptureInfo (answered_in_guest.c) on a valid stream of an initialised process
 * with a current context, while no capture may be under way, say CU_STREAM_CAPTURE_STATUS_NONE, what the driver
 * answers. A valid stream: a default one (the NULL stream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) or one this
 * process made in the current context and has not destroyed (known_handles.c). PyTorch asks the first before its
 * allocations and copies (3096 round trips of 43 us each, waiting behind posted launches, in 64 decoded tokens), NCCL
 * the second before every collective on each device (2 round trips of 49 us in each all-reduce across two H200s):
 * docs/performance.md. An earlier posted call's failure is still reported first, as a forwarded answer would report
 * it. Any other stream, or a capture that may run, is asked of the host.
 *
 * The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode) is kept here too: it decides
 * only what a thread may call while a capture is under way, so while none may run it is exchanged without a round
 * trip (NCCL exchanges it around its allocations: about 740 round trips at the start of each communicator,
 * docs/performance.md). The host runs every thread's calls on one thread, with one mode; while a capture may run,
 * each call goes out with the calling thread's mode made the host's first (orion_sync_capture_mode, in the turn,
 * as the current context is), so a thread that relaxed its mode is treated as relaxed and the others are not.
 */
#include <stdatomic.h>

#include "orion_guest.h"

enum { CU_STREAM_CAPTURE_STATUS_NONE = 0 };

static atomic_int captures;

void orion_capture_began(int status) {
    if (status == CUDA_SUCCESS) atomic_fetch_add(&captures, 1);
}

void orion_capture_ended(int status) {
    enum { CAPTURE_INVALIDATED = 901, CAPTURE_UNJOINED = 904 }; /* capture ends with these too */
    if (status != CUDA_SUCCESS && status != CAPTURE_INVALIDATED && status != CAPTURE_UNJOINED) return;
    int now = atomic_load(&captures);
    while (now > 0 && !atomic_compare_exchange_weak(&captures, &now, now - 1)) {
    }
}

int orion_captures_may_run(void) { return atomic_load(&captures) > 0; }

int orion_known_not_capturing(uint64_t stream) {
    return !orion_captures_may_run() && orion_is_initialized() && orion_current_context() != NULL
           && (stream <= 2 || orion_known(ORION_KNOWN_STREAMS, stream));
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    ORION_ENTRY("cuStreamIsCapturing");
    if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
    uint64_t stream = (uint64_t)(uintptr_t)hStream;
    if (orion_known_not_capturing(stream)) {
        int pending = orion_pending_async_error();
        if (pending != CUDA_SUCCESS) return pending;
        *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    uint8_t req[ORION_REQ_cuStreamIsCapturing_SIZE], rep[ORION_REP_cuStreamIsCapturing_SIZE];
    orion_put_u64(req + ORION_REQ_cuStreamIsCapturing_arg0, stream);
    CUresult status = orion_thread_forward(ORION_OP_cuStreamIsCapturing, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    *captureStatus = (CUstreamCaptureStatus)orion_get_i32(rep + ORION_REP_cuStreamIsCapturing_arg1);
    return CUDA_SUCCESS;
}

/* --- the thread's capture interaction mode ------------------------------------------------------------------- */

enum { CAPTURE_MODE_GLOBAL = 0, CAPTURE_MODE_RELAXED = 2 };

static _Thread_local int thread_mode = CAPTURE_MODE_GLOBAL; /* CUDA's default for every thread */
static int host_mode = CAPTURE_MODE_GLOBAL;                 /* the host thread's, in the turn */

int orion_sync_capture_mode(void) {
    if (!orion_captures_may_run() || thread_mode == host_mode) return CUDA_SUCCESS;
    uint8_t req[ORION_REQ_cuThreadExchangeStreamCaptureMode_SIZE];
    orion_put_i32(req + ORION_REQ_cuThreadExchangeStreamCaptureMode_arg0, thread_mode);
    int status = orion_forward_post(ORION_OP_cuThreadExchangeStreamCaptureMode, req, sizeof req);
    if (status == CUDA_SUCCESS) host_mode = thread_mode;
    return status;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    ORION_ENTRY("cuThreadExchangeStreamCaptureMode");
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    int wanted = (int)*mode;
    if (orion_is_initialized() && wanted >= CAPTURE_MODE_GLOBAL && wanted <= CAPTURE_MODE_RELAXED) {
        int pending = orion_pending_async_error(); /* an earlier posted call's failure first, as forwarded */
        if (pending != CUDA_SUCCESS) return pending;
        *mode = (CUstreamCaptureMode)thread_mode;
        thread_mode = wanted; /* the host's follows before this thread's next call while a capture may run */
        return CUDA_SUCCESS;
    }
    /* not initialised, or not a mode: the driver's answer */
    uint8_t req[ORION_REQ_cuThreadExchangeStreamCaptureMode_SIZE];
    uint8_t rep[ORION_REP_cuThreadExchangeStreamCaptureMode_SIZE];
    orion_put_i32(req + ORION_REQ_cuThreadExchangeStreamCaptureMode_arg0, wanted);
    CUresult status = orion_thread_forward(ORION_OP_cuThreadExchangeStreamCaptureMode, req, sizeof req, rep,
                                           sizeof rep, 0);
    if (status == CUDA_SUCCESS)
        *mode = (CUstreamCaptureMode)orion_get_i32(rep + ORION_REP_cuThreadExchangeStreamCaptureMode_arg0);
    return status;
}

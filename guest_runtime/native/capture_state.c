/* capture_state.c: whether a stream capture may be under way in this process, and the capture query it lets the
 * guest answer.
 *
 * Every capture of the process begins and ends through this library (cuStreamBeginCapture and cuStreamEndCapture
 * below, graph_queries.c's cuStreamBeginCaptureToGraph call the hooks below with the driver's status),
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
 * docs/performance.md). The host runs every thread's calls on one thread, with one mode, and that thread began every
 * capture. So which guest thread began each capture, and in which mode, is kept here too (`owners`), and while a
 * capture may run each call goes out with the host thread's mode set to what makes the driver's rule the calling
 * thread's (orion_sync_capture_mode, in the turn, as the current context is): cuda.h prohibits a thread's
 * potentially unsafe calls when its mode is GLOBAL and it began a capture not RELAXED or another thread began a
 * GLOBAL one, or its mode is THREAD_LOCAL and it began a capture not RELAXED. Prohibited: the host thread's mode is
 * GLOBAL (the capture behind it is the host thread's too, so the driver prohibits and answers as it would); else
 * RELAXED. A capture that another thread began not RELAXED is ended by this thread with
 * CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, answered here. Past OWNERS_KEPT captures at once, the thread's own mode
 * goes out instead (the behaviour before owners were kept).
 */
#include <pthread.h>
#include <stdatomic.h>

#include "orion_guest.h"

enum { CU_STREAM_CAPTURE_STATUS_NONE = 0 };

enum { CAPTURE_MODE_GLOBAL = 0, CAPTURE_MODE_THREAD_LOCAL = 1, CAPTURE_MODE_RELAXED = 2 };
enum { OWNERS_KEPT = 64 };

static atomic_int captures;

/* Which thread began each capture under way (a thread is known by the address of its own `thread_tag`). */
typedef struct { uint64_t stream; uintptr_t thread; int mode; } capture_owner;
static pthread_mutex_t owners_lock = PTHREAD_MUTEX_INITIALIZER;
static capture_owner owners[OWNERS_KEPT];
static int owners_used, owners_lost; /* lost: a capture under way began past OWNERS_KEPT */
static _Thread_local char thread_tag;
#define THIS_THREAD ((uintptr_t)&thread_tag)

static int owner_of(uint64_t stream) { /* under owners_lock: its index, or -1 */
    for (int i = 0; i < owners_used; i++)
        if (owners[i].stream == stream) return i;
    return -1;
}

void orion_capture_began(int status, uint64_t stream, int mode) {
    if (status != CUDA_SUCCESS) return;
    atomic_fetch_add(&captures, 1);
    pthread_mutex_lock(&owners_lock);
    int i = owner_of(stream);
    if (i < 0 && owners_used < OWNERS_KEPT) i = owners_used++;
    if (i >= 0) owners[i] = (capture_owner){ stream, THIS_THREAD, mode };
    else owners_lost = 1;
    pthread_mutex_unlock(&owners_lock);
}

void orion_capture_ended(int status, uint64_t stream) {
    enum { CAPTURE_INVALIDATED = 901, CAPTURE_UNJOINED = 904 }; /* capture ends with these too */
    if (status != CUDA_SUCCESS && status != CAPTURE_INVALIDATED && status != CAPTURE_UNJOINED) return;
    int now = atomic_load(&captures);
    while (now > 0 && !atomic_compare_exchange_weak(&captures, &now, now - 1)) {
    }
    pthread_mutex_lock(&owners_lock);
    int i = owner_of(stream);
    if (i >= 0) owners[i] = owners[--owners_used];
    if (atomic_load(&captures) == 0) owners_used = owners_lost = 0;
    pthread_mutex_unlock(&owners_lock);
}

/* Whether `stream`'s capture was begun, not RELAXED, by another thread: its end here is the wrong thread's. */
static int begun_elsewhere(uint64_t stream) {
    pthread_mutex_lock(&owners_lock);
    int i = owner_of(stream);
    int elsewhere = i >= 0 && owners[i].thread != THIS_THREAD && owners[i].mode != CAPTURE_MODE_RELAXED;
    pthread_mutex_unlock(&owners_lock);
    return elsewhere;
}

/* The host thread's mode that makes the driver's rule this thread's, for a thread whose own mode is `mode`. */
static int presented_mode(int mode) {
    if (mode == CAPTURE_MODE_RELAXED) return mode;
    pthread_mutex_lock(&owners_lock);
    int own_strict = 0, other_global = 0, lost = owners_lost;
    for (int i = 0; i < owners_used; i++) {
        if (owners[i].thread == THIS_THREAD) own_strict |= owners[i].mode != CAPTURE_MODE_RELAXED;
        else other_global |= owners[i].mode == CAPTURE_MODE_GLOBAL;
    }
    pthread_mutex_unlock(&owners_lock);
    if (lost) return mode;
    int prohibited = own_strict || (mode == CAPTURE_MODE_GLOBAL && other_global);
    return prohibited ? CAPTURE_MODE_GLOBAL : CAPTURE_MODE_RELAXED;
}

CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) {
    ORION_ENTRY("cuStreamBeginCapture");
    uint8_t req[ORION_REQ_cuStreamBeginCapture_SIZE];
    uint64_t stream = (uint64_t)(uintptr_t)hStream;
    orion_put_u64(req + ORION_REQ_cuStreamBeginCapture_arg0, stream);
    orion_put_i32(req + ORION_REQ_cuStreamBeginCapture_arg1, (int32_t)mode);
    CUresult status = orion_thread_forward(ORION_OP_cuStreamBeginCapture, req, sizeof req, NULL, 0, 0);
    orion_capture_began(status, stream, (int)mode);
    return status;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    ORION_ENTRY("cuStreamEndCapture");
    enum { CAPTURE_WRONG_THREAD = 908 };
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    uint64_t stream = (uint64_t)(uintptr_t)hStream;
    if (begun_elsewhere(stream)) {
        int pending = orion_pending_async_error(); /* an earlier posted call's failure first, as forwarded */
        return pending != CUDA_SUCCESS ? pending : CAPTURE_WRONG_THREAD;
    }
    uint8_t req[ORION_REQ_cuStreamEndCapture_SIZE], rep[ORION_REP_cuStreamEndCapture_SIZE];
    orion_put_u64(req + ORION_REQ_cuStreamEndCapture_arg0, stream);
    CUresult status = orion_thread_forward(ORION_OP_cuStreamEndCapture, req, sizeof req, rep, sizeof rep, 0);
    orion_capture_ended(status, stream);
    if (status != CUDA_SUCCESS) return status;
    *phGraph = (CUgraph)(uintptr_t)orion_get_u64(rep + ORION_REP_cuStreamEndCapture_arg1);
    return CUDA_SUCCESS;
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

static _Thread_local int thread_mode = CAPTURE_MODE_GLOBAL; /* CUDA's default for every thread */
static int host_mode = CAPTURE_MODE_GLOBAL;                 /* the host thread's, in the turn */

int orion_sync_capture_mode(void) {
    if (!orion_captures_may_run()) return CUDA_SUCCESS;
    int wanted = presented_mode(thread_mode);
    if (wanted == host_mode) return CUDA_SUCCESS;
    uint8_t req[ORION_REQ_cuThreadExchangeStreamCaptureMode_SIZE];
    orion_put_i32(req + ORION_REQ_cuThreadExchangeStreamCaptureMode_arg0, wanted);
    int status = orion_forward_post(ORION_OP_cuThreadExchangeStreamCaptureMode, req, sizeof req);
    if (status == CUDA_SUCCESS) host_mode = wanted;
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

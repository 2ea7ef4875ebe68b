/* event_pool.c: cuEventCreate without a round trip, and cuEventDestroy posted, for the events a program makes and
 * drops all the time.
 *
 * Why: a round trip waits behind every posted record before it (launches, records, waits), and PyTorch's
 * ProcessGroupNCCL makes two events and destroys one per collective: measured on two H200s, these round trips (43 us
 * each) held a forwarded rank to 77 us per all-reduce where the native one took 25 (docs/performance.md).
 *
 * cuEventCreate: events of one context and one set of flags are made EVENTS_CREATE_MAX at most at a time, in one
 * round trip (EVENTS_CREATE: the host makes them as that many cuEventCreate records would, ledger and all), and
 * handed out one per call. A pooled event has never been recorded, as a fresh one has not: every query of it answers
 * what the fresh one's would. Pooled only where that holds: flags of timing and blocking sync alone (an interprocess
 * event goes to the host each time), an initialised process with a current context, no capture that may be under way,
 * no earlier posted failure to report first. A refill that fails answers what the plain call would: the driver's
 * failure to make the first event, or an earlier posted call's failure, which comes first. The first refill of a
 * pool makes 2 events, each next twice as many up to EVENTS_CREATE_MAX, so a program that makes one event makes at
 * most one more.
 *
 * cuEventDestroy of an event this process made in the current context, and has not destroyed (known_handles.c),
 * cannot fail: it is posted. Any other goes to the host for its answer.
 *
 * A context may have gone (cuCtxDestroy, a primary context's release or reset: orion_events_forget): every pool and
 * every known event is forgotten, since their handles may name other objects later. A pooled event of a context that
 * did not go then stays on the host, unused, until the session ends (at most EVENTS_CREATE_MAX per pool).
 *
 * What does not belong here: event records, waits and queries (generated; posted or on the host's compiled path),
 * IPC event handles (shareable_handles.c).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "orion_guest.h"

enum {
    POOLS = 16,                /* (context, flags) pairs pooled at once; past that, plain calls */
    FIRST_BATCH = 2,
    POOLED_FLAGS = 0x3,        /* CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING */
    EVENT_BYTES = sizeof(uint64_t), /* an event as EVENTS_CREATE's reply lists it */
};

struct pool {
    uint64_t context; /* 0: a free slot */
    unsigned flags, count, batch;
    uint64_t events[ORION_EVENTS_CREATE_MAX];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool pools[POOLS];
static unsigned long generation;  /* contexts may have gone this many times (orion_events_forget) */

static struct pool *pool_of(uint64_t context, unsigned flags) {
    struct pool *free_slot = NULL;
    for (int i = 0; i < POOLS; i++) {
        if (pools[i].context == context && pools[i].flags == flags) return &pools[i];
        if (!pools[i].context && !free_slot) free_slot = &pools[i];
    }
    if (free_slot) *free_slot = (struct pool){.context = context, .flags = flags, .batch = FIRST_BATCH};
    return free_slot;
}

/* One round trip for up to `count` events of `flags` into `events` (their number in `made`). A failure is the
 * driver's for the first of them (or an earlier posted call's, which comes first): what the plain call answers. */
static CUresult create_events(unsigned flags, unsigned count, uint64_t *events, unsigned *made) {
    uint8_t req[ORION_EVENTS_CREATE_REQ_SIZE], rep[EVENT_BYTES * ORION_EVENTS_CREATE_MAX];
    orion_put_u32(req + ORION_EVENTS_CREATE_REQ_flags, flags);
    orion_put_u32(req + ORION_EVENTS_CREATE_REQ_count, count);
    size_t got = 0;
    struct orion_piece piece = {req, sizeof req};
    CUresult status = orion_thread_forwardv(ORION_OP_EVENTS_CREATE, &piece, 1, NULL, 0, rep, sizeof rep, &got, 0);
    if (status != CUDA_SUCCESS) return status;
    if (got == 0 || got % EVENT_BYTES || got / EVENT_BYTES > count)
        return CUDA_ERROR_UNKNOWN; /* not a reply the host sends */
    for (*made = 0; *made < got / EVENT_BYTES; (*made)++)
        events[*made] = orion_get_u64(rep + EVENT_BYTES * *made);
    return CUDA_SUCCESS;
}

static CUresult post_destroy(uint64_t event) {
    uint8_t req[ORION_REQ_cuEventDestroy_SIZE];
    orion_put_u64(req + ORION_REQ_cuEventDestroy_arg0, event);
    return orion_thread_post(ORION_OP_cuEventDestroy, req, sizeof req);
}

/* A pooled event of the current context, made by a refill if the pool is empty; 0 where there is none to give (no
 * pool slot), with the refill's failure in `status`. `lock` is never held across a round trip: the turn's lock is
 * taken inside it, and cuCtxDestroy calls orion_events_forget with the turn held. */
static uint64_t pooled_event(uint64_t context, unsigned flags, CUresult *status) {
    uint64_t event = 0, made_events[ORION_EVENTS_CREATE_MAX];
    unsigned batch = 0, made = 0, surplus = 0;
    int same = 0; /* no context went during the refill */
    pthread_mutex_lock(&lock);
    struct pool *pool = pool_of(context, flags);
    if (pool && pool->count) event = pool->events[--pool->count];
    else if (pool) batch = pool->batch;
    unsigned long seen = generation;
    pthread_mutex_unlock(&lock);
    if (batch && (*status = create_events(flags, batch, made_events, &made)) == CUDA_SUCCESS) {
        event = made_events[0];
        pthread_mutex_lock(&lock);
        same = generation == seen;
        pool = same ? pool_of(context, flags) : NULL;
        for (unsigned i = 1; i < made; i++)
            if (pool && pool->count < ORION_EVENTS_CREATE_MAX) pool->events[pool->count++] = made_events[i];
            else made_events[surplus++] = made_events[i];
        if (pool && pool->batch < ORION_EVENTS_CREATE_MAX) pool->batch *= 2;
        pthread_mutex_unlock(&lock);
    }
    for (unsigned i = 0; i < surplus; i++) /* another thread filled the pool first (or a context went) */
        if (same) (void)post_destroy(made_events[i]);
    if (event) orion_known_made(ORION_KNOWN_EVENTS, event);
    return event;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    ORION_ENTRY("cuEventCreate");
    if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
    uint64_t context = (uint64_t)(uintptr_t)orion_current_context(), event = 0;
    if (!(Flags & ~POOLED_FLAGS) && context && orion_is_initialized() && !orion_captures_may_run()) {
        CUresult status = orion_pending_async_error();
        if (status == CUDA_SUCCESS) event = pooled_event(context, Flags, &status);
        if (status != CUDA_SUCCESS) return status;
    }
    if (!event) {
        uint8_t req[ORION_REQ_cuEventCreate_SIZE], rep[ORION_REP_cuEventCreate_SIZE];
        orion_put_u32(req + ORION_REQ_cuEventCreate_arg1, Flags);
        CUresult status = orion_thread_forward(ORION_OP_cuEventCreate, req, sizeof req, rep, sizeof rep, 0);
        if (status != CUDA_SUCCESS) return status;
        event = orion_get_u64(rep + ORION_REP_cuEventCreate_arg0);
        orion_known_made(ORION_KNOWN_EVENTS, event);
    }
    *phEvent = (CUevent)(uintptr_t)event;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) {
    ORION_ENTRY("cuEventDestroy");
    uint64_t event = (uint64_t)(uintptr_t)hEvent;
    if (orion_known_destroyed(ORION_KNOWN_EVENTS, event) && !orion_captures_may_run()) return post_destroy(event);
    uint8_t req[ORION_REQ_cuEventDestroy_SIZE];
    orion_put_u64(req + ORION_REQ_cuEventDestroy_arg0, event);
    return orion_thread_forward(ORION_OP_cuEventDestroy, req, sizeof req, NULL, 0, 0);
}

void orion_events_forget(void) {
    pthread_mutex_lock(&lock);
    memset(pools, 0, sizeof pools);
    generation++;
    pthread_mutex_unlock(&lock);
    orion_known_forget(ORION_KNOWN_EVENTS);
}

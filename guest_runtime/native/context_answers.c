/* context_answers.c: what the guest knows of each context and of each device's primary context, and the queries
 * answered from it: cuCtxGetDevice, cuCtxGetFlags, cuCtxGetStreamPriorityRange, cuCtxGetApiVersion, cuCtxGetId,
 * cuDevicePrimaryCtxGetState; and the primary-context calls that change it (Retain, Release, Reset, SetFlags).
 *
 * A context's device is known from the call that made it (cuCtxCreate on d, cuDevicePrimaryCtxRetain of d); its
 * flags, priority range, API version and id are the host's first answers. Only this process changes them: its
 * cuCtxSetFlags forgets the current context's answers, and cuDevicePrimaryCtxSetFlags a primary context's.
 * cuCtxDestroy forgets a context; a primary
 * context's Release, Reset and SetFlags forget it too (once released it may come back, same handle, as a new
 * context with a new id), and so does anything unknown: such a context is asked about again.
 *
 * A primary context's (flags, active) is the host's first answer, forgotten by this process's Retain, Release,
 * Reset and SetFlags of that device (whatever they answer: one question more is cheaper than a wrong state).
 * Nothing else changes it: one host worker process serves one guest process's session (region_server.py forks
 * one per claimed channel), primary contexts are per process in CUDA, and the executor never retains or releases
 * one on its own behalf (the quota's refusal of a retain releases what that same retain took).
 *
 * Context answers live in a small table under a rwlock, with a per-thread copy of the last context's answers that
 * stays good while `epoch` does not move (every forget moves it): cuCtxGetDevice, the hottest query, is one
 * thread-local compare and one atomic load. Primary states are atomic words, read without a lock.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_rwlock_t under -std=c11 */
#include <pthread.h>
#include <string.h>

#include "answer_cache.h"

#define SLOTS 256   /* contexts answered from the table; past that, asked every time */
#define DEVICES 64  /* devices whose primary context state is kept */

enum { KNOWN = 1, DEVICE = 2, FLAGS = 4, RANGE = 8, API = 16, ID = 32 };

struct answers {
    uint64_t context; /* 0: a free slot */
    unsigned have;    /* which of the fields below hold answers (KNOWN: may be made current without asking) */
    int device;
    unsigned flags;
    int least, greatest;
    unsigned api;
    unsigned long long id;
};

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct answers slots[SLOTS];              /* in the lock */
static size_t used;                              /* slots[0..used) hold contexts, in the lock */
static uint64_t primaries[DEVICES];              /* the handle each device's primary context was retained as */
static _Atomic uint64_t states[DEVICES];         /* cuDevicePrimaryCtxGetState: FILLED | active << 32 | flags */
static _Atomic uint64_t epoch;                   /* moved by every forget, in the lock */
static _Thread_local struct { uint64_t epoch; struct answers answers; } mine; /* this thread's last lookup */

static int in_table(int device) { return device >= 0 && device < DEVICES; }

/* In the lock: the slot of `ctx`, or NULL. */
static struct answers *slot_of(uint64_t ctx) {
    for (size_t i = 0; i < used; i++)
        if (slots[i].context == ctx) return &slots[i];
    return NULL;
}

/* `ctx`'s answers with every field of `wanted` in *out: 1, or 0 when one of them is not known. */
static int lookup(uint64_t ctx, unsigned wanted, struct answers *out) {
    if (!ctx) return 0;
    uint64_t now = atomic_load_explicit(&epoch, memory_order_acquire);
    if (mine.answers.context == ctx && mine.epoch == now && (mine.answers.have & wanted) == wanted) {
        *out = mine.answers;
        return 1;
    }
    pthread_rwlock_rdlock(&lock);
    const struct answers *a = slot_of(ctx);
    int found = a && (a->have & wanted) == wanted;
    if (a) {
        mine.answers = *a;
        mine.epoch = now; /* a forget after `now` was read moves the epoch past it: this copy is then redone */
    }
    pthread_rwlock_unlock(&lock);
    if (found) *out = mine.answers;
    return found;
}

/* Keep the fields of `fields` named by `have` for `ctx`, unless something was forgotten since `seen` (the epoch
 * read before the host was asked: its answer may predate the change). */
static void store(uint64_t ctx, const struct answers *fields, unsigned have, uint64_t seen) {
    if (!ctx) return;
    pthread_rwlock_wrlock(&lock);
    struct answers *a = atomic_load(&epoch) == seen ? slot_of(ctx) : NULL;
    if (!a && atomic_load(&epoch) == seen && used < SLOTS) {
        a = &slots[used++];
        memset(a, 0, sizeof *a);
        a->context = ctx;
    }
    if (a) {
        if (have & DEVICE) a->device = fields->device;
        if (have & FLAGS) a->flags = fields->flags;
        if (have & RANGE) a->least = fields->least, a->greatest = fields->greatest;
        if (have & API) a->api = fields->api;
        if (have & ID) a->id = fields->id;
        a->have |= have;
    }
    pthread_rwlock_unlock(&lock);
}

/* In the lock: `ctx` forgotten (its slot given back), and the primary state of a device whose primary it is. */
static void forget_locked(uint64_t ctx) {
    atomic_fetch_add(&epoch, 1);
    if (!ctx) return;
    struct answers *a = slot_of(ctx);
    if (a) *a = slots[--used];
    for (int d = 0; d < DEVICES; d++) {
        if (primaries[d] == ctx) {
            primaries[d] = 0;
            atomic_store(&states[d], 0);
        }
    }
}

void orion_context_made(uint64_t ctx, int device) {
    pthread_rwlock_wrlock(&lock);
    forget_locked(ctx); /* a handle seen before names a new context now */
    pthread_rwlock_unlock(&lock);
    store(ctx, &(struct answers){ .device = device }, KNOWN | DEVICE, atomic_load(&epoch));
}

void orion_context_checked(uint64_t ctx) { store(ctx, &(struct answers){ 0 }, KNOWN, atomic_load(&epoch)); }

void orion_context_gone(uint64_t ctx) {
    pthread_rwlock_wrlock(&lock);
    forget_locked(ctx);
    pthread_rwlock_unlock(&lock);
    orion_function_answers_forget(); /* its handle may name another context, whose kernels' functions differ */
}

int orion_context_known(uint64_t ctx) {
    struct answers a;
    return lookup(ctx, KNOWN, &a);
}

/* Forget what a primary-context call of `device` may change: its state, and its context's answers. */
static void primary_changed(int device) {
    pthread_rwlock_wrlock(&lock);
    if (in_table(device)) {
        atomic_store(&states[device], 0);
        if (primaries[device]) forget_locked(primaries[device]);
    }
    atomic_fetch_add(&epoch, 1);
    pthread_rwlock_unlock(&lock);
}

/* --- the queries --------------------------------------------------------------------------------------------- */

/* A query of the current context (no input), its reply of `cap` bytes: NOT_INITIALIZED before cuInit, as the
 * driver; else asked (with no current context the host answers INVALID_CONTEXT, as the driver). */
static int ask_current(uint32_t opcode, uint8_t *rep, size_t cap) {
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    return orion_thread_forward(opcode, NULL, 0, rep, cap, 0);
}

CUresult cuCtxGetDevice(CUdevice *device) {
    ORION_ENTRY("cuCtxGetDevice");
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t ctx = (uint64_t)(uintptr_t)orion_current_context();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT; /* the driver's answer without a current context */
    struct answers a;
    if (lookup(ctx, DEVICE, &a)) {
        *device = a.device;
        return CUDA_SUCCESS;
    }
    uint64_t seen = atomic_load(&epoch);
    uint8_t rep[ORION_REP_cuCtxGetDevice_SIZE];
    int status = ask_current(ORION_OP_cuCtxGetDevice, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    *device = orion_get_i32(rep + ORION_REP_cuCtxGetDevice_arg0);
    store(ctx, &(struct answers){ .device = *device }, DEVICE, seen);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int *flags) {
    ORION_ENTRY("cuCtxGetFlags");
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    uint64_t ctx = (uint64_t)(uintptr_t)orion_current_context();
    struct answers a;
    if (orion_is_initialized() && lookup(ctx, FLAGS, &a)) {
        *flags = a.flags;
        return CUDA_SUCCESS;
    }
    uint64_t seen = atomic_load(&epoch);
    uint8_t rep[ORION_REP_cuCtxGetFlags_SIZE];
    int status = ask_current(ORION_OP_cuCtxGetFlags, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    *flags = orion_get_u32(rep + ORION_REP_cuCtxGetFlags_arg0);
    store(ctx, &(struct answers){ .flags = *flags }, FLAGS, seen);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    ORION_ENTRY("cuCtxGetStreamPriorityRange");
    int unwanted; /* cuda.h: "A NULL may be passed in for *leastPriority or *greatestPriority" */
    if (!least) least = &unwanted;
    if (!greatest) greatest = &unwanted;
    uint64_t ctx = (uint64_t)(uintptr_t)orion_current_context();
    struct answers a;
    if (orion_is_initialized() && lookup(ctx, RANGE, &a)) {
        *least = a.least;
        *greatest = a.greatest;
        return CUDA_SUCCESS;
    }
    uint64_t seen = atomic_load(&epoch);
    uint8_t rep[ORION_REP_cuCtxGetStreamPriorityRange_SIZE];
    int status = ask_current(ORION_OP_cuCtxGetStreamPriorityRange, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    *least = orion_get_i32(rep + ORION_REP_cuCtxGetStreamPriorityRange_arg0);
    *greatest = orion_get_i32(rep + ORION_REP_cuCtxGetStreamPriorityRange_arg1);
    store(ctx, &(struct answers){ .least = *least, .greatest = *greatest }, RANGE, seen);
    return CUDA_SUCCESS;
}

/* cuCtxGetApiVersion and cuCtxGetId name a context (NULL: the current one); the answer is kept for that one. */
_Static_assert(ORION_REQ_cuCtxGetApiVersion_SIZE == ORION_REQ_cuCtxGetId_SIZE
               && ORION_REQ_cuCtxGetApiVersion_arg0 == ORION_REQ_cuCtxGetId_arg0, "one request packs both");
static int ask_named(uint32_t opcode, CUcontext named, unsigned field, struct answers *a, uint8_t *rep, size_t cap) {
    uint64_t ctx = named ? (uint64_t)(uintptr_t)named : (uint64_t)(uintptr_t)orion_current_context();
    if (orion_is_initialized() && lookup(ctx, field, a)) return -1; /* answered */
    uint64_t seen = atomic_load(&epoch);
    uint8_t req[ORION_REQ_cuCtxGetId_SIZE];
    orion_put_u64(req + ORION_REQ_cuCtxGetId_arg0, (uint64_t)(uintptr_t)named);
    int status = orion_thread_forward(opcode, req, sizeof req, rep, cap, 0);
    if (status == CUDA_SUCCESS && orion_is_initialized()) {
        if (field == API) a->api = orion_get_u32(rep + ORION_REP_cuCtxGetApiVersion_arg1);
        else a->id = orion_get_u64(rep + ORION_REP_cuCtxGetId_arg1);
        store(ctx, a, field, seen);
    }
    return status;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    ORION_ENTRY("cuCtxGetApiVersion");
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    struct answers a = { 0 };
    uint8_t rep[ORION_REP_cuCtxGetApiVersion_SIZE];
    int status = ask_named(ORION_OP_cuCtxGetApiVersion, ctx, API, &a, rep, sizeof rep);
    if (status == -1) status = CUDA_SUCCESS;
    else if (status == CUDA_SUCCESS) a.api = orion_get_u32(rep + ORION_REP_cuCtxGetApiVersion_arg1);
    if (status == CUDA_SUCCESS) *version = a.api;
    return status;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
    ORION_ENTRY("cuCtxGetId");
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    struct answers a = { 0 };
    uint8_t rep[ORION_REP_cuCtxGetId_SIZE];
    int status = ask_named(ORION_OP_cuCtxGetId, ctx, ID, &a, rep, sizeof rep);
    if (status == -1) status = CUDA_SUCCESS;
    else if (status == CUDA_SUCCESS) a.id = orion_get_u64(rep + ORION_REP_cuCtxGetId_arg1);
    if (status == CUDA_SUCCESS) *id = a.id;
    return status;
}

/* --- primary contexts ---------------------------------------------------------------------------------------- */

CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active) {
    ORION_ENTRY("cuDevicePrimaryCtxGetState");
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    int cached = in_table(device) && orion_is_initialized();
    if (cached) {
        uint64_t state = atomic_load_explicit(&states[device], memory_order_acquire);
        if (state) {
            *flags = (uint32_t)state;
            *active = (int)(state >> 32 & 1);
            return CUDA_SUCCESS;
        }
    }
    uint64_t seen = atomic_load(&epoch);
    uint8_t req[ORION_REQ_cuDevicePrimaryCtxGetState_SIZE], rep[ORION_REP_cuDevicePrimaryCtxGetState_SIZE];
    orion_put_i32(req + ORION_REQ_cuDevicePrimaryCtxGetState_arg0, device);
    int status = orion_thread_forward(ORION_OP_cuDevicePrimaryCtxGetState, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    *flags = orion_get_u32(rep + ORION_REP_cuDevicePrimaryCtxGetState_arg1);
    *active = orion_get_i32(rep + ORION_REP_cuDevicePrimaryCtxGetState_arg2);
    if (cached) {
        pthread_rwlock_wrlock(&lock);
        if (atomic_load(&epoch) == seen)
            atomic_store_explicit(&states[device], ORION_ANSWER_FILLED | (uint64_t)(*active != 0) << 32 | *flags,
                                  memory_order_release);
        pthread_rwlock_unlock(&lock);
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice device) {
    ORION_ENTRY("cuDevicePrimaryCtxRetain");
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDevicePrimaryCtxRetain_SIZE], rep[ORION_REP_cuDevicePrimaryCtxRetain_SIZE];
    orion_put_i32(req + ORION_REQ_cuDevicePrimaryCtxRetain_arg1, device);
    int status = orion_thread_forward(ORION_OP_cuDevicePrimaryCtxRetain, req, sizeof req, rep, sizeof rep, 0);
    primary_changed(device);
    if (status != CUDA_SUCCESS) return status;
    uint64_t ctx = orion_get_u64(rep + ORION_REP_cuDevicePrimaryCtxRetain_arg0);
    orion_context_made(ctx, device);
    if (in_table(device)) {
        pthread_rwlock_wrlock(&lock);
        primaries[device] = ctx;
        pthread_rwlock_unlock(&lock);
    }
    *pctx = (CUcontext)(uintptr_t)ctx;
    return CUDA_SUCCESS;
}

/* Release, Reset and SetFlags: sent as the generated calls send them, then the device's primary answers forgotten. */
_Static_assert(ORION_REQ_cuDevicePrimaryCtxRelease_SIZE == ORION_REQ_cuDevicePrimaryCtxReset_SIZE
               && ORION_REQ_cuDevicePrimaryCtxRelease_arg0 == ORION_REQ_cuDevicePrimaryCtxReset_arg0
               && ORION_REQ_cuDevicePrimaryCtxRelease_arg0 == ORION_REQ_cuDevicePrimaryCtxSetFlags_arg0,
               "one request packs all three: the device, then SetFlags's flags");
static int primary_call(uint32_t opcode, CUdevice device, const unsigned int *flags) {
    uint8_t req[ORION_REQ_cuDevicePrimaryCtxSetFlags_SIZE];
    orion_put_i32(req + ORION_REQ_cuDevicePrimaryCtxSetFlags_arg0, device);
    if (flags) orion_put_u32(req + ORION_REQ_cuDevicePrimaryCtxSetFlags_arg1, *flags);
    int status = orion_thread_forward(opcode, req, flags ? ORION_REQ_cuDevicePrimaryCtxSetFlags_SIZE
                                      : ORION_REQ_cuDevicePrimaryCtxRelease_SIZE, NULL, 0, 0);
    primary_changed(device);
    orion_function_answers_forget(); /* a released or reset primary context takes its functions along */
    if (!flags) { /* and, released for the last time or reset, its streams and events */
        orion_known_forget(ORION_KNOWN_STREAMS);
        orion_events_forget();
    }
    return status;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
    ORION_ENTRY("cuDevicePrimaryCtxRelease");
    return primary_call(ORION_OP_cuDevicePrimaryCtxRelease, device, NULL);
}

CUresult cuDevicePrimaryCtxReset(CUdevice device) {
    ORION_ENTRY("cuDevicePrimaryCtxReset");
    return primary_call(ORION_OP_cuDevicePrimaryCtxReset, device, NULL);
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice device, unsigned int flags) {
    ORION_ENTRY("cuDevicePrimaryCtxSetFlags");
    return primary_call(ORION_OP_cuDevicePrimaryCtxSetFlags, device, &flags);
}

/* cuCtxSetFlags changes the current context's flags (and a primary context's state): sent as the generated call
 * sends it, then that context's answers forgotten, whatever it answered, so the next query asks again. */
CUresult cuCtxSetFlags(unsigned int flags) {
    ORION_ENTRY("cuCtxSetFlags");
    uint8_t req[ORION_REQ_cuCtxSetFlags_SIZE];
    orion_put_u32(req + ORION_REQ_cuCtxSetFlags_arg0, flags);
    uint64_t ctx = (uint64_t)(uintptr_t)orion_current_context();
    int status = orion_thread_forward(ORION_OP_cuCtxSetFlags, req, sizeof req, NULL, 0, 0);
    orion_context_gone(ctx);
    return status;
}

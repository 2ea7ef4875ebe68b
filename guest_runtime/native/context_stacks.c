/* context_stacks.c: CUDA's per-thread context stacks, kept in the guest (guest_runtime/contexts.py in C).
 *
 * A process has one channel and the host runs its calls on one thread, which has one current context. CUDA's
 * contexts are current per thread, so each thread's stack lives here: cuCtxGetCurrent, Push and Pop are answered
 * without a round trip, and so are SetCurrent and Push of a context the host knows is this session's (made here,
 * or checked once: context_answers.c). Before a call goes out the host's current context is made the calling
 * thread's (one posted cuCtxSetCurrent, only when threads with different contexts take turns:
 * Forwarder._sync_context). The "turn" lock makes that set and the call one step, so another thread's set cannot
 * slip in between; the same holds the thread's capture interaction mode while a capture may run (capture_state.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "answer_cache.h"

#define HOST_UNKNOWN UINT64_MAX /* the host's current context may have changed: set it before the next call */
#define MAX_DEPTH ((size_t)1 << 20)

struct stack { uint64_t *items; size_t depth, cap; };

static _Thread_local struct stack mine;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key; /* its value: the thread's items, freed when the thread exits */
static pthread_mutex_t turn = PTHREAD_MUTEX_INITIALIZER;
static uint64_t host_current; /* in the turn */
static atomic_int initialized;

static void free_items(void *items) { free(items); }
static void make_key(void) { (void)pthread_key_create(&key, free_items); }

void orion_initialized(void) { atomic_store(&initialized, 1); }
int orion_is_initialized(void) { return atomic_load(&initialized); }

CUcontext orion_current_context(void) {
    return mine.depth ? (CUcontext)(uintptr_t)mine.items[mine.depth - 1] : NULL;
}

int orion_stack_push(uint64_t ctx) {
    if (mine.depth == mine.cap) {
        size_t cap = mine.cap ? mine.cap * 2 : 8;
        uint64_t *items = cap <= MAX_DEPTH ? realloc(mine.items, cap * sizeof *items) : NULL;
        if (!items) return CUDA_ERROR_OUT_OF_MEMORY;
        (void)pthread_once(&key_once, make_key);
        (void)pthread_setspecific(key, items);
        mine.items = items;
        mine.cap = cap;
    }
    mine.items[mine.depth++] = ctx;
    return CUDA_SUCCESS;
}

int orion_stack_pop(uint64_t *ctx) {
    if (!mine.depth) return 0;
    *ctx = mine.items[--mine.depth];
    return 1;
}

int orion_stack_replace_top(uint64_t ctx) {
    if (mine.depth) mine.depth--;
    return ctx ? orion_stack_push(ctx) : CUDA_SUCCESS;
}

void orion_stack_destroyed(uint64_t ctx) {
    if (mine.depth && mine.items[mine.depth - 1] == ctx) mine.depth--;
}

void orion_turn_take(void) { pthread_mutex_lock(&turn); }
void orion_turn_give(void) { pthread_mutex_unlock(&turn); }
void orion_host_current_is(uint64_t ctx) { host_current = ctx; }
void orion_host_current_unknown(void) { host_current = HOST_UNKNOWN; }

int orion_sync_context(void) {
    uint64_t wanted = (uint64_t)(uintptr_t)orion_current_context();
    if (wanted == host_current) return CUDA_SUCCESS;
    uint8_t req[ORION_REQ_cuCtxSetCurrent_SIZE];
    orion_put_u64(req + ORION_REQ_cuCtxSetCurrent_arg0, wanted);
    int status = orion_forward_post(ORION_OP_cuCtxSetCurrent, req, sizeof req);
    if (status == CUDA_SUCCESS) host_current = wanted;
    return status;
}

int orion_make_current_on_host(uint64_t ctx) {
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t req[ORION_REQ_cuCtxSetCurrent_SIZE];
    orion_put_u64(req + ORION_REQ_cuCtxSetCurrent_arg0, ctx);
    orion_turn_take();
    int status = orion_forward(ORION_OP_cuCtxSetCurrent, req, sizeof req, NULL, 0, ORION_CALL_NO_FOLD);
    host_current = status == CUDA_SUCCESS ? ctx : HOST_UNKNOWN;
    orion_turn_give();
    return status;
}

int orion_check_context(uint64_t ctx) {
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (orion_context_known(ctx)) return CUDA_SUCCESS; /* the host's current one follows before the next call */
    int status = orion_make_current_on_host(ctx);
    if (status == CUDA_SUCCESS) orion_context_checked(ctx);
    return status;
}

int orion_set_current_context(CUcontext ctx) {
    uint64_t wanted = (uint64_t)(uintptr_t)ctx;
    int status = wanted ? orion_check_context(wanted)
                        : (orion_is_initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED);
    return status == CUDA_SUCCESS ? orion_stack_replace_top(wanted) : status;
}

int orion_thread_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap,
                          void *tail, size_t tail_cap, size_t *tail_len, int flags) {
    if (tail_len) *tail_len = 0;
    orion_turn_take();
    int status = orion_sync_context();
    if (status == CUDA_SUCCESS) status = orion_sync_capture_mode();
    if (status == CUDA_SUCCESS)
        status = orion_forwardv(opcode, req, nreq, rep, cap, tail, tail_cap, tail_len, flags);
    else if (flags & ORION_CALL_INIT)
        status = CUDA_ERROR_NO_DEVICE;
    orion_turn_give();
    return status;
}

int orion_thread_forward(uint32_t opcode, const void *req, size_t len, void *rep, size_t cap, int flags) {
    struct orion_piece piece = { req, len };
    return orion_thread_forwardv(opcode, &piece, 1, rep, cap, NULL, 0, NULL, flags);
}

int orion_thread_postv(uint32_t opcode, const struct orion_piece *req, int nreq) {
    orion_turn_take();
    int status = orion_sync_context();
    if (status == CUDA_SUCCESS) status = orion_sync_capture_mode();
    if (status == CUDA_SUCCESS) status = orion_forward_postv(opcode, req, nreq);
    orion_turn_give();
    return status;
}

int orion_thread_post(uint32_t opcode, const void *req, size_t len) {
    struct orion_piece piece = { req, len };
    return orion_thread_postv(opcode, &piece, 1);
}

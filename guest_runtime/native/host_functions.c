/* host_functions.c: cuLaunchHostFunc, cuLaunchHostFunc_v2 and cuStreamAddCallback for the native guest driver. A host
 * function (or a stream callback) is guest code, so it runs here, in stream order, with no round trip per call
 * (docs/native-driver.md, "Host functions and stream memory operations"):
 *
 *   - a page-locked block from this channel's pool (page_locked_calls.c) holds, per slot, a "reached" and a
 *     "release" word; the GPU reaches both through the block's device pointer, this process through its own;
 *   - cuLaunchHostFunc(stream, fn, data) takes the stream's slot and its next sequence number `seq`, queues
 *     (seq, fn, data) for the slot and posts two stream memory operations: cuStreamWriteValue32(reached, seq) then
 *     cuStreamWaitValue32(release, seq, GEQ). The stream's earlier work is done when the write lands; its later work
 *     waits until the release word reaches seq;
 *   - on a relayed session the GPU cannot reach the block (the first use asks, and waits: probe_words), so the pair
 *     is one HOST_FUNCTION record instead, which the relaying oriond serves: it writes `seq` to the reached word
 *     once the stream's earlier work is done, and forwards nothing more until the release word reaches `seq`;
 *   - a watcher thread (started at the first call) polls the reached words of slots with queued functions, runs
 *     each function whose seq was reached, in order, and then stores release = seq (a release store: what fn
 *     wrote is visible before the stream goes on). It spins briefly after activity, then backs off with sleeps, and
 *     sleeps on a condition variable while nothing is queued; while a cuLaunchHostFunc_v2 function queued with
 *     CU_HOST_TASK_SPINWAIT waits, it spins without sleeping (CU_HOST_TASK_BLOCKING: the usual backoff);
 *   - cuStreamAddCallback queues a callback the same way, called as callback(stream, status, data): the stream as the
 *     caller named it and CUDA_SUCCESS. Its stream is first asked of the host (cuStreamQuery, synchronously), so a
 *     stream the session does not own answers CUDA_ERROR_INVALID_HANDLE, and a capturing one the capture's error
 *     (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture invalidated), as the driver refuses a callback there.
 *
 * A failed stream: the guest learns that the process's CUDA has ended when any forwarded call answers an error that
 * ends it (cuda.h: "the process must be terminated and relaunched": ILLEGAL_ADDRESS, LAUNCH_FAILED, LAUNCH_TIMEOUT...,
 * or DEVICE_UNAVAILABLE when the session's GPU is gone; orion_host_functions_saw, told of every answer by
 * cuda_client.c). A stream's own work fails that way, and its next synchronising call (or any other call) answers it.
 * From then on every queued callback is called with that error, whether or not its stream reached it, and every
 * queued host function is dropped (cuda.h: "will not be called in the event of an error in the CUDA context"); a
 * later cuLaunchHostFunc or cuStreamAddCallback answers the error itself. Until some call answers it, a callback
 * queued behind work that failed waits, as the guest cannot ask the host while another thread holds the channel.
 *
 * Host nodes (graph_calls.c's cuGraphAddHostNode and its setters) and a host function while a stream capture may be
 * under way (which the capture must record as a host node) cannot be a pair of memory operations: a graph's
 * operations carry fixed values, and a replay would find its sequence number already released. They are tokens
 * instead: one per (function, data) pair, a pair of words in the same block (TOKEN_BYTES each, after the slots'). The
 * node the host makes calls oriond's trampoline (host_agent/session/host_nodes.py) with the token's words: each run adds one
 * to `reached` and waits until `release` reaches the new count. The watcher runs the token's function once for each
 * count `reached` moved past the last it ran (`ran`), and then stores that count in `release`; so every run of every
 * node holding the token runs the function once, in the order the host's driver runs them, and the stream waits for
 * it. Tokens are never reused (the guest cannot know when the last node holding one went); TOKENS of them at most
 * (a new pair beyond answers CUDA_ERROR_OUT_OF_MEMORY, said once). A relayed session's GPU host cannot reach the
 * guest's words: host nodes answer CUDA_ERROR_NOT_SUPPORTED there (said once), and a host function while a capture may
 * be under way keeps the path below (a capturing stream refuses it).
 *
 * A host function may not call CUDA (as the driver documents); cuLaunchHostFunc from inside one answers
 * CUDA_ERROR_NOT_PERMITTED. A slot belongs to one stream at a time (the NULL and legacy streams: per context). Sequence numbers only grow
 * within a slot (compared cyclically, as GEQ does), so a slot whose queue is empty may pass to another stream: the
 * last wait of its previous stream is already satisfied. A stream the session does not own: the posted write fails
 * on the host and the error surfaces at the next synchronising call, as the driver's would; its function never
 * runs (and holds its slot). At exit every slot is released, so no stream stays blocked on a function that will
 * not run; in a fork child, the parent's queue is dropped (CUDA does not carry over a fork).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "orion_guest.h"

#define SLOTS 256       /* streams with host functions at once: one page of words */
#define SLOT_BYTES 16   /* reached (u32), release (u32), padding */
#define TOKENS 512      /* (function, data) pairs run as host nodes: one page of words after the slots' */
#define TOKEN_BYTES 8   /* reached (u32, counted by oriond's trampoline), release (u32, counted here) */
#define BLOCK_BYTES (SLOTS * SLOT_BYTES + TOKENS * TOKEN_BYTES)
#define SPINS 2000      /* polls without sleeping after a function ran or was queued */
#define MAX_SLEEP_NS 1000000L
#define WAIT_GEQ 0      /* CU_STREAM_WAIT_VALUE_GEQ */
#define STREAM_PER_THREAD 2 /* CU_STREAM_PER_THREAD; 0 (NULL) and 1 (CU_STREAM_LEGACY) are the legacy stream */
#define DEINITIALIZED 4     /* CUDA_ERROR_DEINITIALIZED: the process is exiting */
#define NOT_PERMITTED 800   /* CUDA_ERROR_NOT_PERMITTED: an API call from inside a host function */
#define NOT_READY 600       /* CUDA_ERROR_NOT_READY: cuStreamQuery of a stream with work to do */
enum { HOST_TASK_BLOCKING = 0, HOST_TASK_SPINWAIT = 1 }; /* CUhostTaskSyncMode (cuda.h 13.2, cuda-bindings 13.5) */

/* CUresults after which "any further CUDA work will return the same error" (cuda.h: the process must be relaunched),
 * and Orion's answer once the session's GPU is gone (every later call answers it). */
enum {
    DEVICE_UNAVAILABLE = 46, CONTAINED = 226, ILLEGAL_ADDRESS = 700, LAUNCH_TIMEOUT = 702, ASSERT = 710,
    HARDWARE_STACK_ERROR = 714, ILLEGAL_INSTRUCTION = 715, MISALIGNED_ADDRESS = 716, INVALID_ADDRESS_SPACE = 717,
    INVALID_PC = 718, LAUNCH_FAILED = 719, TENSOR_MEMORY_LEAK = 721, MPS_CLIENT_TERMINATED = 810,
    EXTERNAL_DEVICE = 911,
};

typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *data); /* cuda.h's */

struct call {
    struct call *next;
    uint32_t seq;
    CUhostFn fn;               /* a host function (cuLaunchHostFunc, cuLaunchHostFunc_v2), or else */
    CUstreamCallback callback; /* a stream callback (cuStreamAddCallback): given its stream and the stream's status */
    CUstream stream;           /* the stream as the caller named it: the callback's first argument */
    void *data;
    int spin;                  /* CU_HOST_TASK_SPINWAIT: the watcher does not sleep while this one waits */
};

struct slot {
    uint64_t stream, context; /* the stream it serves; the context too for the NULL/legacy/per-thread ones */
    int used;
    uint32_t seq;             /* the last sequence number given out */
    struct call *head, *tail; /* queued, in order */
};

struct token {
    CUhostFn fn;
    void *data;
    uint32_t ran; /* the runs whose function ran: release's value (the watcher's alone) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER;
static struct slot slots[SLOTS];
static uint8_t *block;          /* this process's view of the words (NULL: not allocated yet) */
static uint64_t block_device;   /* the device pointer of the same words */
static int watching;            /* the watcher thread runs */
static int relayed;             /* the GPU cannot reach the words (a relayed session): the relay runs the stream's
                                   side of each function (HOST_FUNCTION) */
static struct token tokens[TOKENS];
static unsigned token_count;    /* tokens[0 .. token_count) are made (never unmade): the watcher polls them all */
static atomic_uint pending_calls; /* queued functions and callbacks whose run has not ended, over all slots
                                   (orion_host_functions_may_run reads it without the lock) */
static unsigned spinning;       /* queued functions whose sync mode is CU_HOST_TASK_SPINWAIT */
static atomic_int exiting;
static atomic_int failed;       /* the error that ended the process's CUDA (0: none): orion_host_functions_saw */
static _Thread_local int in_host_function; /* the watcher thread: functions run there */

static _Atomic uint32_t *reached_word(int i) { return (_Atomic uint32_t *)(block + (size_t)i * SLOT_BYTES); }
static _Atomic uint32_t *release_word(int i) { return (_Atomic uint32_t *)(block + (size_t)i * SLOT_BYTES + 4); }

static uint8_t *token_words(unsigned t) { return block + SLOTS * SLOT_BYTES + (size_t)t * TOKEN_BYTES; }
static _Atomic uint32_t *token_reached(unsigned t) { return (_Atomic uint32_t *)token_words(t); }
static _Atomic uint32_t *token_release(unsigned t) { return (_Atomic uint32_t *)(token_words(t) + 4); }

/* (int32_t)(word - seq) >= 0: the cyclic comparison CU_STREAM_WAIT_VALUE_GEQ makes. */
static int reached(uint32_t word, uint32_t seq) { return (int32_t)(word - seq) >= 0; }

/* Run every queued function whose sequence number its stream reached, in order; whether one ran. Once the process's
 * CUDA has failed, every queued call is taken: a callback is called with the error, a host function dropped. Called
 * by the watcher only; `lock` is dropped around each function, which may queue more (even on its own stream). */
static int run_reached(void) {
    int ran = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[i];
        while (s->head && !atomic_load(&exiting)) {
            int error = atomic_load(&failed);
            if (!error && !reached(atomic_load_explicit(reached_word(i), memory_order_acquire), s->head->seq)) break;
            struct call *c = s->head;
            s->head = c->next;
            if (!s->head) s->tail = NULL;
            if (c->spin) spinning--;
            pthread_mutex_unlock(&lock);
            if (c->callback) c->callback(c->stream, error, c->data);
            else if (!error) c->fn(c->data);
            atomic_store_explicit(release_word(i), c->seq, memory_order_release); /* the stream goes on */
            atomic_fetch_sub(&pending_calls, 1);
            free(c);
            ran = 1;
            pthread_mutex_lock(&lock);
        }
    }
    for (unsigned t = 0; t < token_count && !atomic_load(&exiting); t++) {
        struct token *k = &tokens[t]; /* its fn and data never change; `ran` is this thread's */
        while (k->ran != atomic_load_explicit(token_reached(t), memory_order_acquire) && !atomic_load(&exiting)) {
            uint32_t run = k->ran + 1;
            pthread_mutex_unlock(&lock);
            if (!atomic_load(&failed)) k->fn(k->data); /* dropped once the process's CUDA failed, as queued ones are */
            atomic_store_explicit(token_release(t), run, memory_order_release); /* the trampoline returns */
            k->ran = run;
            ran = 1;
            pthread_mutex_lock(&lock);
        }
    }
    pthread_mutex_unlock(&lock);
    return ran;
}

static void *watch(void *unused) {
    (void)unused;
    in_host_function = 1;
    long sleep_ns = 0;
    int spins = 0;
    while (!atomic_load(&exiting)) {
        if (run_reached()) {
            spins = sleep_ns = 0;
            continue;
        }
        pthread_mutex_lock(&lock);
        while (!pending_calls && !token_count && !atomic_load(&exiting)) { /* nothing to watch: no polling at all */
            pthread_cond_wait(&queued, &lock);
            spins = sleep_ns = 0;
        }
        int spin = spinning > 0;
        pthread_mutex_unlock(&lock);
        if (spins < SPINS || spin) { /* a SPINWAIT function waits: no sleeping until it has run */
            if (spins < SPINS) spins++;
            sched_yield();
            continue;
        }
        sleep_ns = sleep_ns ? (sleep_ns * 2 > MAX_SLEEP_NS ? MAX_SLEEP_NS : sleep_ns * 2) : 20000L;
        struct timespec pause = { 0, sleep_ns };
        nanosleep(&pause, NULL);
    }
    return NULL;
}

/* At exit: functions no longer run, and every slot is released up to its last sequence number, so no stream on the
 * host stays blocked waiting for one (the session's teardown then finds no stuck stream). Never waits. */
static void release_all(void) {
    atomic_store(&exiting, 1);
    if (!block) return;
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].used) atomic_store_explicit(release_word(i), slots[i].seq, memory_order_release);
    for (unsigned t = 0; t < token_count; t++) /* the runs begun so far return */
        atomic_store_explicit(token_release(t), atomic_load(token_reached(t)), memory_order_release);
}

/* In a fork child: the parent's functions are the parent's; start afresh (lock and all). */
static void forget_in_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    lock = fresh;
    queued = fresh_cond;
    for (int i = 0; i < SLOTS; i++) {
        for (struct call *c = slots[i].head, *next; c; c = next) {
            next = c->next;
            free(c);
        }
        slots[i] = (struct slot){ 0 };
    }
    memset(tokens, 0, sizeof tokens);
    token_count = 0;
    block = NULL;
    block_device = 0;
    relayed = 0;
    watching = 0;
    atomic_store(&pending_calls, 0);
    spinning = 0;
    atomic_store(&failed, 0);
}

int orion_host_functions_may_run(void) {
    if (in_host_function) return 0; /* (a function that calls the driver, which it must not: never a wait on itself) */
    return atomic_load(&pending_calls) > 0 || __atomic_load_n(&token_count, __ATOMIC_ACQUIRE) > 0;
}

static void take_lock(void) { pthread_mutex_lock(&lock); }
static void give_lock(void) { pthread_mutex_unlock(&lock); }

static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static void install_hooks(void) {
    (void)pthread_atfork(take_lock, give_lock, forget_in_child);
    (void)atexit(release_all);
}

static int post_value(uint32_t opcode, uint64_t stream, uint64_t address, uint32_t value, uint32_t flags);
/* cuStreamWriteValue32's request, which cuStreamWaitValue32's is too */
#define VALUE_REQ(field) ORION_REQ_cuStreamWriteValue32_##field
#define SAME_VALUE(field) (ORION_REQ_cuStreamWaitValue32_##field == VALUE_REQ(field))
_Static_assert(SAME_VALUE(arg0) && SAME_VALUE(arg1) && SAME_VALUE(arg2) && SAME_VALUE(arg3) && SAME_VALUE(SIZE),
               "put_value() packs both");
static void put_value(uint8_t request[VALUE_REQ(SIZE)], uint64_t stream, uint64_t address, uint32_t value,
                      uint32_t flags);

/* Whether the session's GPU can reach the block's words by stream memory operations, asked once and waited for (a
 * write of the word's own 0): on a relayed session it cannot (CUDA_ERROR_NOT_SUPPORTED, docs/remote.md), and the
 * relay then runs the stream's side of each function instead (HOST_FUNCTION). */
static int probe_words(unsigned long long device) {
    uint8_t request[VALUE_REQ(SIZE)];
    put_value(request, 0, device, 0, 0);
    return orion_thread_forward(ORION_OP_cuStreamWriteValue32, request, sizeof request, NULL, 0, 0);
}

/* Under `lock`: the block and the watcher, at first use. A CUresult. */
static int start(void) {
    if (!block) {
        void *words = NULL;
        unsigned long long device = 0;
        int status = orion_pool_alloc(&words, BLOCK_BYTES); /* the GPU must reach it: never the fallback */
        if (status == CUDA_SUCCESS) status = cuMemHostGetDevicePointer(&device, words, 0);
        if (status == CUDA_SUCCESS) {
            status = probe_words(device);
            relayed = status == CUDA_ERROR_NOT_SUPPORTED;
            if (relayed) status = CUDA_SUCCESS;
        }
        if (status != CUDA_SUCCESS) {
            if (words) (void)cuMemFreeHost(words);
            return status;
        }
        block = words; /* zeroed: the host clears a session's pool when it maps it */
        block_device = device;
    }
    if (!watching) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attributes, watch, NULL);
        pthread_attr_destroy(&attributes);
        if (failed) return CUDA_ERROR_OUT_OF_MEMORY;
        watching = 1;
    }
    return CUDA_SUCCESS;
}

/* Under `lock`: the slot of (stream, context), a new one, or one whose queue is empty passed on; -1 if none. */
static int slot_of(uint64_t stream, uint64_t context) {
    int free_slot = -1, idle = -1;
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[i];
        if (s->used && s->stream == stream && s->context == context) return i;
        if (!s->used && free_slot < 0) free_slot = i;
        if (s->used && !s->head && idle < 0) idle = i;
    }
    int i = free_slot >= 0 ? free_slot : idle;
    if (i >= 0) {
        slots[i].used = 1;
        slots[i].stream = stream;
        slots[i].context = context;
    }
    return i;
}

static void put_value(uint8_t request[VALUE_REQ(SIZE)], uint64_t stream, uint64_t address, uint32_t value,
                      uint32_t flags) {
    orion_put_u64(request + VALUE_REQ(arg0), stream);
    orion_put_u64(request + VALUE_REQ(arg1), address);
    orion_put_u32(request + VALUE_REQ(arg2), value);
    orion_put_u32(request + VALUE_REQ(arg3), flags);
}

static int post_value(uint32_t opcode, uint64_t stream, uint64_t address, uint32_t value, uint32_t flags) {
    uint8_t request[VALUE_REQ(SIZE)];
    put_value(request, stream, address, value, flags);
    return orion_thread_post(opcode, request, sizeof request);
}

/* A relayed session's function: the relay writes `seq` to the slot's reached word once the stream's earlier work
 * is done, and holds the session's later work until the release word reaches `seq` (HOST_FUNCTION). */
static int post_host_function(uint64_t stream, uint64_t words, uint32_t seq) {
    uint8_t request[ORION_HOST_FUNCTION_REQ_SIZE];
    orion_put_u64(request + ORION_HOST_FUNCTION_REQ_stream, stream);
    orion_put_u64(request + ORION_HOST_FUNCTION_REQ_reached, words);
    orion_put_u64(request + ORION_HOST_FUNCTION_REQ_release, words + 4); /* the slot's release word */
    orion_put_u32(request + ORION_HOST_FUNCTION_REQ_seq, seq);
    orion_put_u32(request + ORION_HOST_FUNCTION_REQ_reserved, 0);
    return orion_thread_post(ORION_OP_HOST_FUNCTION, request, sizeof request);
}

void orion_host_functions_saw(int status) {
    switch (status) {
    case DEVICE_UNAVAILABLE: case CONTAINED: case ILLEGAL_ADDRESS: case LAUNCH_TIMEOUT: case ASSERT:
    case HARDWARE_STACK_ERROR: case ILLEGAL_INSTRUCTION: case MISALIGNED_ADDRESS: case INVALID_ADDRESS_SPACE:
    case INVALID_PC: case LAUNCH_FAILED: case TENSOR_MEMORY_LEAK: case MPS_CLIENT_TERMINATED: case EXTERNAL_DEVICE: {
        int none = 0;
        (void)atomic_compare_exchange_strong(&failed, &none, status); /* the first stays, as the driver's does */
        return; /* the watcher (polling: something is queued) takes the queued calls at its next poll */
    }
    default:
        return;
    }
}

/* Why nothing can be queued now (a CUresult), or CUDA_SUCCESS. */
static int refused_now(void) {
    /* From inside a host function: CUDA forbids API calls there ("may return CUDA_ERROR_NOT_PERMITTED"), and here
     * one could never go out while another thread waits in a synchronising call for this function's stream (that
     * call holds the channel): refused rather than deadlocked. */
    if (in_host_function) return NOT_PERMITTED;
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!orion_current_context()) return CUDA_ERROR_INVALID_CONTEXT;
    if (atomic_load(&exiting)) return DEINITIALIZED;
    return atomic_load(&failed); /* the process's CUDA has ended: every call answers that, as the driver's would */
}

/* Queue `proto` (its function or callback, data and sync mode) on hStream's slot, and post the stream's side of it. */
static CUresult enqueue(CUstream hStream, struct call proto) {
    int refused = refused_now();
    if (refused != CUDA_SUCCESS) return refused;
    (void)pthread_once(&hooks_once, install_hooks);
    uint64_t stream = (uint64_t)(uintptr_t)hStream;
    uint64_t context = stream <= STREAM_PER_THREAD ? (uint64_t)(uintptr_t)orion_current_context() : 0;
    if (stream == 1) stream = 0; /* CU_STREAM_LEGACY is the NULL stream of a legacy-default program */
    struct call *c = malloc(sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int status = start();
    int i = status == CUDA_SUCCESS ? slot_of(stream, context) : -1;
    if (status == CUDA_SUCCESS && i < 0) {
        fprintf(stderr, "orion: cuLaunchHostFunc: %d streams have host functions pending; no slot is free\n", SLOTS);
        status = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (status == CUDA_SUCCESS) {
        uint32_t seq = slots[i].seq + 1;
        uint64_t words = block_device + (uint64_t)i * SLOT_BYTES;
        /* Both in one step under `lock`: another thread's pair for the same slot cannot come in between. */
        if (relayed) {
            status = post_host_function(stream, words, seq);
        } else {
            status = post_value(ORION_OP_cuStreamWriteValue32, stream, words, seq, 0);
            if (status == CUDA_SUCCESS)
                status = post_value(ORION_OP_cuStreamWaitValue32, stream, words + 4, seq, WAIT_GEQ);
        }
        if (status == CUDA_SUCCESS) {
            slots[i].seq = seq;
            *c = proto;
            c->next = NULL;
            c->seq = seq;
            if (slots[i].tail) slots[i].tail->next = c;
            else slots[i].head = c;
            slots[i].tail = c;
            pending_calls++;
            if (c->spin) spinning++;
            pthread_cond_signal(&queued);
            c = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
    free(c);
    return status;
}

/* --- stream capture: a host function as a host node -------------------------------------------------------------
 * The pair of stream memory operations a host function is made of would be captured as two memory-operation nodes,
 * and a replay of the graph would find its sequence number already released: the function would run at most once.
 * So while any capture may be under way in this process (capture_state.c), a local session's host function runs as a
 * host node does (its token through oriond's trampoline, which a capture records as a host node, as the driver's
 * would be); a relayed session's stream is asked first, as a callback's always is: a capturing stream answers
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and its capture is invalidated (an error, never a graph that is wrong). No
 * capture under way costs nothing. */

/* The stream asked of the host (cuStreamQuery, its answer not folded with earlier posted calls' errors, which stay
 * for the next call): NOT_READY and SUCCESS let a function or callback queue; a stream the session does not own, or
 * one capturing (the query invalidates the capture), answers the host's error. */
static int stream_takes_host_work(CUstream hStream) {
    uint64_t stream = (uint64_t)(uintptr_t)hStream;
    uint8_t request[ORION_REQ_cuStreamQuery_SIZE];
    orion_put_u64(request + ORION_REQ_cuStreamQuery_arg0, stream == 1 ? 0 : stream); /* as enqueue() posts it */
    int status = orion_thread_forward(ORION_OP_cuStreamQuery, request, sizeof request, NULL, 0, ORION_CALL_NO_FOLD);
    return status == NOT_READY ? CUDA_SUCCESS : status;
}

/* Under `lock`, the block started: the token of (fn, data), made at first use; -1 when TOKENS are made. */
static int token_of(CUhostFn fn, void *data) {
    for (unsigned t = 0; t < token_count; t++)
        if (tokens[t].fn == fn && tokens[t].data == data) return (int)t;
    if (token_count == TOKENS) return -1;
    tokens[token_count] = (struct token){ .fn = fn, .data = data, .ran = atomic_load(token_reached(token_count)) };
    token_count++;
    pthread_cond_signal(&queued); /* the watcher polls tokens from now on */
    return (int)token_count - 1;
}

int orion_host_node_words(CUhostFn fn, void *data, uint64_t *words) {
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    if (in_host_function) return NOT_PERMITTED;
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    (void)pthread_once(&hooks_once, install_hooks);
    pthread_mutex_lock(&lock);
    int status = start(), t = -1;
    if (status == CUDA_SUCCESS && relayed) status = CUDA_ERROR_NOT_SUPPORTED;
    if (status == CUDA_SUCCESS && (t = token_of(fn, data)) < 0) status = CUDA_ERROR_OUT_OF_MEMORY;
    if (status == CUDA_SUCCESS) *words = (uint64_t)(uintptr_t)token_words((unsigned)t);
    int was_relayed = relayed;
    pthread_mutex_unlock(&lock);
    if (status == CUDA_ERROR_NOT_SUPPORTED && was_relayed)
        return orion_not_forwarded("a graph host node on a relayed session (the GPU host cannot reach the guest)");
    if (status == CUDA_ERROR_OUT_OF_MEMORY && t < 0)
        fprintf(stderr, "orion: %d (function, data) pairs run as host nodes already; no more can be made\n", TOKENS);
    return status;
}

int orion_host_node_function(uint64_t words, CUhostFn *fn, void **data) {
    pthread_mutex_lock(&lock);
    int found = 0;
    for (unsigned t = 0; t < token_count && !found; t++) {
        if ((uint64_t)(uintptr_t)token_words(t) != words) continue;
        *fn = tokens[t].fn;
        *data = tokens[t].data;
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/* A host function while a capture may be under way, on a local session: run as a host node runs it (its token, on
 * `hStream` through oriond's trampoline: HOST_NODE_FUNCTION), so that a capturing stream records a host node; asked
 * synchronously, so the host's answer (a stream not the session's, a capture that refuses it) is the call's. */
static CUresult host_node_function(CUstream hStream, CUhostFn fn, void *data) {
    uint64_t words = 0;
    int status = orion_host_node_words(fn, data, &words);
    if (status != CUDA_SUCCESS) return status;
    uint8_t request[ORION_HOST_NODE_FUNCTION_REQ_SIZE];
    orion_put_u64(request + ORION_HOST_NODE_FUNCTION_REQ_stream, (uint64_t)(uintptr_t)hStream);
    orion_put_u64(request + ORION_HOST_NODE_FUNCTION_REQ_words, words);
    return orion_thread_forward(ORION_OP_HOST_NODE_FUNCTION, request, sizeof request, NULL, 0, 0);
}

/* A host function: while a capture may be under way, a local session's runs as a host node runs it; a relayed
 * session's stream is asked first (a capturing one refuses it). No capture under way costs nothing. */
static CUresult enqueue_function(CUstream hStream, struct call proto) {
    if (orion_captures_may_run()) {
        int status = refused_now();
        if (status == CUDA_SUCCESS) {
            pthread_mutex_lock(&lock);
            status = start();
            int local = !relayed;
            pthread_mutex_unlock(&lock);
            if (status == CUDA_SUCCESS && local) return host_node_function(hStream, proto.fn, proto.data);
        }
        if (status == CUDA_SUCCESS) status = stream_takes_host_work(hStream);
        if (status != CUDA_SUCCESS) return status;
    }
    return enqueue(hStream, proto);
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *data) {
    ORION_ENTRY("cuLaunchHostFunc");
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    return enqueue_function(hStream, (struct call){ .fn = fn, .data = data });
}

/* CUDA 13.2's: the mode says how the driver's thread waits for the function's turn (blocked, or spinning), which is
 * how this library's watcher waits too; a mode this library does not know answers 801, named once. */
CUresult cuLaunchHostFunc_v2(CUstream hStream, CUhostFn fn, void *data, unsigned int syncMode) {
    ORION_ENTRY("cuLaunchHostFunc_v2");
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    if (syncMode != HOST_TASK_BLOCKING && syncMode != HOST_TASK_SPINWAIT)
        return orion_not_forwarded("cuLaunchHostFunc_v2 with a sync mode other than CU_HOST_TASK_BLOCKING and "
                                   "CU_HOST_TASK_SPINWAIT");
    return enqueue_function(hStream, (struct call){ .fn = fn, .data = data, .spin = syncMode == HOST_TASK_SPINWAIT });
}

/* A callback's stream is always asked first (stream_takes_host_work): the driver refuses a callback on a capturing
 * stream, and the query invalidates the capture, as such a call does. */
CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *data, unsigned int flags) {
    ORION_ENTRY("cuStreamAddCallback");
    if (!callback || flags) return CUDA_ERROR_INVALID_VALUE; /* flags: "Reserved for future use, must be 0" */
    int status = refused_now();
    if (status == CUDA_SUCCESS) status = stream_takes_host_work(hStream);
    if (status != CUDA_SUCCESS) return status;
    return enqueue(hStream, (struct call){ .callback = callback, .stream = hStream, .data = data });
}

/* cuGetProcAddress's answer for a caller built against `version` that asks for cuLaunchHostFunc: from CUDA 13.2 on,
 * the name's ABI is cuLaunchHostFunc_v2's (a sync mode; cuda-bindings asks for it so), else NULL (the name's own). */
void *orion_host_function_entry(const char *symbol, int version) {
    return version >= 13020 && strcmp(symbol, "cuLaunchHostFunc") == 0 ? (void *)cuLaunchHostFunc_v2 : NULL;
}

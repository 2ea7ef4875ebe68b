/* copy_helper.c: one helper thread that copies half of each large staging chunk (copy_helper.h).
 *
 * Why: a pageable copy passes through one guest core's memcpy into or out of the staging chunks (7-13 GB/s on the
 * GPU machine), where the driver natively copies through its own staging at 10-18 GB/s (docs/performance.md,
 * "Pageable bulk"). Two cores copy each chunk's halves at once; the host's GPU copy of the chunk is unchanged.
 *
 * The hand-over is one word, `state`: the owner posts a half (IDLE -> POSTED), the helper takes it (POSTED ->
 * RUNNING) and says DONE; the owner, its own half done, either takes a half the helper has not begun back (POSTED ->
 * IDLE, by compare-and-swap, so exactly one of them runs it) or waits for DONE. So a helper that was asleep never
 * makes a copy slower than one core's. Between chunks the helper spins (a chunk comes every few tens of
 * microseconds during a copy); after SPIN_NS without work it sleeps on a futex until the next post.
 *
 * What does not belong here: anything about rings, chunks or records (orion_wire.c decides what to split and keeps
 * the order); the helper only runs a function on an argument.
 *
 * On by default where the process may run on at least MIN_CPUS CPUs; ORION_COPY_THREADS=1 turns it off, =2 on
 * (docs/configuration.md). A fork child starts with no helper (its parent's thread is not in it) and starts its own
 * when it first needs one. Every signal is blocked in the helper: it must never run a program's handler. */
#define _GNU_SOURCE
#include "copy_helper.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { IDLE = 0, POSTED = 1, RUNNING = 2, DONE = 3 };
enum { OFF = 0, ON = 1, FAILED = 2 };
#define MIN_CPUS 4
#define SPIN_NS 200000  /* how long the helper waits for the next half before it sleeps */

static _Atomic uint32_t state;
static _Atomic uint32_t sleeping;  /* the helper is in (or about to enter) its futex wait */
static atomic_flag held = ATOMIC_FLAG_INIT;
static _Atomic uint64_t helped;  /* halves the helper ran (orion_copy_helper_halves) */
static void (*job_run)(void *);
static void *job_arg;
static int mode = -1;  /* -1 until decided: OFF, ON (running), FAILED (could not start) */
static pthread_mutex_t starting = PTHREAD_MUTEX_INITIALIZER;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void futex(uint32_t op, uint32_t value) { syscall(SYS_futex, (uint32_t *)&state, op, value, NULL, NULL, 0); }

/* The helper: wait for a posted half (spinning, then asleep), take it, run it, say DONE; for ever. */
static void *helper_main(void *unused) {
    (void)unused;
    for (;;) {
        uint64_t spin_until = now_ns() + SPIN_NS;
        for (unsigned i = 1; atomic_load_explicit(&state, memory_order_acquire) != POSTED; i++) {
            relax();
            if (i % 64 || now_ns() < spin_until) continue;
            atomic_store(&sleeping, 1);  /* seq_cst with the owner's post: one of us sees the other's store */
            uint32_t seen = atomic_load(&state);
            if (seen != POSTED) futex(FUTEX_WAIT_PRIVATE, seen);  /* returns at once if it is no longer `seen` */
            atomic_store(&sleeping, 0);
            spin_until = now_ns() + SPIN_NS;
        }
        uint32_t posted = POSTED;
        if (!atomic_compare_exchange_strong(&state, &posted, RUNNING)) continue;  /* the owner took it back */
        job_run(job_arg);
        atomic_fetch_add_explicit(&helped, 1, memory_order_relaxed);
        atomic_store_explicit(&state, DONE, memory_order_release);  /* the half's bytes before DONE */
    }
    return NULL;
}

/* OFF, or ON by ORION_COPY_THREADS (1 or 2), else by how many CPUs this process may run on. */
static int wanted(void) {
    const char *asked = getenv("ORION_COPY_THREADS");
    if (asked && *asked) {
        if (!strcmp(asked, "1")) return OFF;
        if (!strcmp(asked, "2")) return ON;
        fprintf(stderr, "orion: ORION_COPY_THREADS=%s is not 1 or 2; using the default (a second copying core "
                "when this process may use %d CPUs or more)\n", asked, MIN_CPUS);
    }
    cpu_set_t cpus;
    return !sched_getaffinity(0, sizeof cpus, &cpus) && CPU_COUNT(&cpus) >= MIN_CPUS ? ON : OFF;
}

static int start(void) {
    pthread_attr_t attr;
    sigset_t all, before;
    pthread_t thread;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);  /* the thread inherits a mask with every signal blocked */
    int ok = !pthread_attr_init(&attr) && !pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED)
             && !pthread_create(&thread, &attr, helper_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (ok) pthread_setname_np(thread, "orion-copy");
    return ok ? ON : FAILED;
}

static void forked_child(void) {
    mode = -1;  /* the parent's helper is not in this process */
    atomic_store(&state, IDLE);
    atomic_store(&sleeping, 0);
    atomic_store(&helped, 0);
    atomic_flag_clear(&held);
    pthread_mutex_init(&starting, NULL);
}

static int available(void) {
    if (__atomic_load_n(&mode, __ATOMIC_ACQUIRE) >= 0) return __atomic_load_n(&mode, __ATOMIC_ACQUIRE) == ON;
    pthread_mutex_lock(&starting);
    if (mode < 0) {
        static int registered;
        if (!registered) registered = !pthread_atfork(NULL, NULL, forked_child);
        int decided = wanted() == ON ? start() : OFF;
        __atomic_store_n(&mode, decided, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&starting);
    return mode == ON;
}

int orion_copy_helper_claim(void) {
    if (!available()) return 0;
    return !atomic_flag_test_and_set_explicit(&held, memory_order_acquire);
}

void orion_copy_helper_release(void) { atomic_flag_clear_explicit(&held, memory_order_release); }

void orion_copy_halves(void (*run)(void *), void *mine, void *theirs) {
    job_run = run;
    job_arg = theirs;
    atomic_store(&state, POSTED);  /* seq_cst: the job before it, and before the look at `sleeping` */
    if (atomic_load(&sleeping)) futex(FUTEX_WAKE_PRIVATE, 1);
    run(mine);
    uint32_t posted = POSTED;
    if (atomic_compare_exchange_strong(&state, &posted, IDLE)) {
        run(theirs);  /* the helper had not begun it: ours now */
        return;
    }
    while (atomic_load_explicit(&state, memory_order_acquire) != DONE) relax();
    atomic_store_explicit(&state, IDLE, memory_order_relaxed);
}

uint64_t orion_copy_helper_halves(void) { return atomic_load_explicit(&helped, memory_order_relaxed); }

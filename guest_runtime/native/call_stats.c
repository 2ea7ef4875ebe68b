/* call_stats.c: ORION_STATS (call_stats.h says what is counted).
 *
 *   ORION_STATS=1        the table goes to stderr when the process exits
 *   ORION_STATS=PATH     to PATH instead (a "%p" in it becomes the process id), created or truncated
 *
 * Counters are per entry point, added atomically (any thread may call); an entry point's index is given at its
 * first call under a lock. The agent's side comes from one STATS record at exit (ivshmem/record.py STATS_REPLY,
 * laid out in the generated orion_region.h:
 * per opcode, the records its compiled hot path served, those Python served, Python's time, the compiled path's time
 * and its driver's part of it), asked only of a
 * channel the program opened; an agent that does not answer it is said in the table's last line. A relayed session's
 * answer adds the relaying host's rows (opcode | ORION_WIRE_STATS_RELAYED: its compiled pump's records and its
 * Python's), shown as "(relayed NAME)" rows after the GPU host's.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "orion_guest.h"

#define MAX_ENTRIES 1024
#define MAX_HOST_ROWS 4096

__attribute__((visibility("hidden"))) int orion_stats_on;

struct account {
    const char *name;
    _Atomic uint64_t calls, guest, posted, round_trip, replies, records, ns;
};

static struct account accounts[MAX_ENTRIES];
static _Atomic int registered;
static pthread_mutex_t registering = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local struct orion_stat_scope *current; /* the outermost entry point under way on this thread */
static uint64_t first_ns;
static pid_t owner; /* the process the account is of: a fork child that exits through exit() reports nothing, and
                       never touches the parent's channel */
static char destination[4096];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void orion_stat_enter(struct orion_stat_scope *scope, const char *name, int *id) {
    if (current != NULL) return; /* the library's own use of an entry point: the outer call's */
    int index = __atomic_load_n(id, __ATOMIC_ACQUIRE);
    if (index < 0) {
        pthread_mutex_lock(&registering);
        index = *id;
        if (index < 0) {
            int n = atomic_load(&registered);
            for (index = 0; index < n && strcmp(accounts[index].name, name) != 0; index++) {}
            if (index == n && n < MAX_ENTRIES) {
                accounts[n].name = name;
                atomic_store(&registered, n + 1);
            }
            if (index < MAX_ENTRIES) __atomic_store_n(id, index, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&registering);
        if (index >= MAX_ENTRIES) return;
    }
    scope->id = index;
    scope->start_ns = now_ns();
    current = scope;
}

void orion_stat_finish(struct orion_stat_scope *scope) {
    struct account *a = &accounts[scope->id];
    atomic_fetch_add(&a->ns, now_ns() - scope->start_ns);
    atomic_fetch_add(&a->calls, 1);
    if (scope->round_trips) {
        atomic_fetch_add(&a->round_trip, 1);
        atomic_fetch_add(&a->replies, scope->round_trips);
    } else if (scope->posts) {
        atomic_fetch_add(&a->posted, 1);
    } else {
        atomic_fetch_add(&a->guest, 1);
    }
    atomic_fetch_add(&a->records, scope->round_trips + scope->posts);
    current = NULL;
}

void orion_stat_wire(int posted) {
    if (current == NULL) return;
    if (posted) current->posts++;
    else current->round_trips++;
}

void orion_stats_initialized(void) {
    static atomic_int asked;
    if (orion_stats_on && !atomic_exchange(&asked, 1))
        (void)orion_forward_post(ORION_WIRE_OP_STATS, NULL, 0); /* its answer, posted and fine, never comes back */
}

/* --- at exit: the agent's side, and the table ------------------------------------------------------------------ */
struct host_row { uint32_t opcode; uint64_t compiled, python, python_ns, compiled_ns, driver_ns; int shown; };

static int host_rows(struct host_row *rows, int max, char *why, size_t why_len) {
    if (!orion_connected()) {
        snprintf(why, why_len, "the program opened no channel");
        return 0;
    }
    static uint8_t reply[ORION_STATS_REP_calls + ORION_LENGTH_BYTES + MAX_HOST_ROWS * ORION_STATS_REP_calls_ITEM];
    size_t got = 0;
    int status = orion_forwardv(ORION_WIRE_OP_STATS, NULL, 0, NULL, 0, reply, sizeof reply, &got, ORION_CALL_NO_FOLD);
    if (status != CUDA_SUCCESS || got < ORION_STATS_REP_calls + ORION_LENGTH_BYTES) {
        snprintf(why, why_len, "the agent did not answer STATS (status %d; an oriond older than this library answers none)", status);
        return 0;
    }
    uint32_t count = orion_get_u32(reply + ORION_STATS_REP_calls);
    if ((size_t)count * ORION_STATS_REP_calls_ITEM + ORION_STATS_REP_calls + ORION_LENGTH_BYTES > got) {
        snprintf(why, why_len, "the agent's STATS answer was malformed");
        return 0;
    }
    int n = 0;
    for (uint32_t i = 0; i < count && n < max; i++) {
        const uint8_t *item = reply + ORION_STATS_REP_calls + ORION_LENGTH_BYTES + (size_t)i * ORION_STATS_REP_calls_ITEM;
        rows[n++] = (struct host_row){ orion_get_u32(item + ORION_STATS_REP_calls_ITEM_0),
                                       orion_get_u64(item + ORION_STATS_REP_calls_ITEM_1),
                                       orion_get_u64(item + ORION_STATS_REP_calls_ITEM_2),
                                       orion_get_u64(item + ORION_STATS_REP_calls_ITEM_3),
                                       orion_get_u64(item + ORION_STATS_REP_calls_ITEM_4),
                                       orion_get_u64(item + ORION_STATS_REP_calls_ITEM_5), 0 };
    }
    return n;
}

static const char *opcode_name(uint32_t opcode) {
    for (const struct orion_opcode_name *o = orion_opcode_names; o->name; o++)
        if (o->opcode == opcode) return o->name;
    return NULL;
}

static struct host_row *host_row_of(struct host_row *rows, int n, const char *name) {
    for (int i = 0; i < n; i++) {
        const char *known = opcode_name(rows[i].opcode);
        if (known && strcmp(known, name) == 0) return &rows[i];
    }
    return NULL;
}

/* The label of a row no entry point is named after: "(record OPCODE NAME)" (the wire's own, the pool's; a copy's
 * page-locked variant, its call's opcode + ORION_PINNED_COPY, under its call's name), or "(relayed NAME)" for the
 * relaying host's. */
static void row_label(uint32_t row, char *label, size_t size) {
    uint32_t opcode = row & ~ORION_WIRE_STATS_RELAYED;
    const char *name = opcode_name(opcode);
    int pinned = 0;
    if (!name && (opcode & ORION_PINNED_COPY)) pinned = (name = opcode_name(opcode - ORION_PINNED_COPY)) != NULL;
    const char *variant = pinned ? " page-locked" : "";
    if (!(row & ORION_WIRE_STATS_RELAYED))
        snprintf(label, size, "(record %#x%s%s%s)", opcode, name ? " " : "", name ? name : "", variant);
    else if (name)
        snprintf(label, size, "(relayed %s%s)", name, variant);
    else
        snprintf(label, size, "(relayed record %#x)", opcode);
}

/* A mean in microseconds, or "-" where nothing was counted or timed. */
static void mean_us(FILE *out, uint64_t ns, uint64_t n, int width) {
    if (n && ns) fprintf(out, " %*.2f", width, (double)ns * 1e-3 / (double)n);
    else fprintf(out, " %*s", width, "-");
}

/* The agent's columns of one row: its compiled path's records, their mean time there and in the driver, Python's
 * records and their mean time. */
static void host_columns(FILE *out, const struct host_row *h) {
    fprintf(out, " %10llu", (unsigned long long)h->compiled);
    mean_us(out, h->compiled_ns, h->compiled, 11);
    mean_us(out, h->driver_ns, h->compiled, 9);
    fprintf(out, " %10llu", (unsigned long long)h->python);
    mean_us(out, h->python_ns, h->python, 9);
    fputc('\n', out);
}

static int by_time(const void *a, const void *b) {
    uint64_t x = atomic_load(&((const struct account *)a)->ns), y = atomic_load(&((const struct account *)b)->ns);
    return x < y ? 1 : x > y ? -1 : 0;
}

static void report(void) {
    if (getpid() != owner) return;
    if (current != NULL) return; /* exit() from inside an entry point (a callback): the account is not whole */
    FILE *out = stderr;
    if (destination[0]) {
        out = fopen(destination, "w");
        if (out == NULL) {
            fprintf(stderr, "orion-stats: cannot write %s; the table follows here\n", destination);
            out = stderr;
        }
    }
    static struct host_row rows[MAX_HOST_ROWS];
    char why[160] = "";
    int nrows = host_rows(rows, MAX_HOST_ROWS, why, sizeof why);
    int n = atomic_load(&registered);
    static struct account sorted[MAX_ENTRIES];
    memcpy(sorted, accounts, sizeof(struct account) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof sorted[0], by_time);
    uint64_t calls = 0, guest = 0, posted = 0, round_trip = 0, ns = 0;
    for (int i = 0; i < n; i++) {
        calls += sorted[i].calls; guest += sorted[i].guest; posted += sorted[i].posted;
        round_trip += sorted[i].round_trip; ns += sorted[i].ns;
    }
    fprintf(out, "orion-stats: pid %d, %.3f s since the driver loaded, %llu calls (%llu in the guest, %llu posted, "
            "%llu round trips), %.3f s in them\n", (int)getpid(), first_ns ? (double)(now_ns() - first_ns) * 1e-9 : 0.0,
            (unsigned long long)calls, (unsigned long long)guest, (unsigned long long)posted,
            (unsigned long long)round_trip, (double)ns * 1e-9);
    fprintf(out, "%-36s %10s %10s %10s %10s %10s %9s | %10s %11s %9s %10s %9s\n", "call", "calls", "guest", "posted",
            "round trip", "total ms", "mean us", "compiled", "compiled us", "driver us", "python", "python us");
    for (int i = 0; i < n; i++) {
        const struct account *a = &sorted[i];
        struct host_row *h = host_row_of(rows, nrows, a->name);
        fprintf(out, "%-36s %10llu %10llu %10llu %10llu %10.3f %9.2f |", a->name, (unsigned long long)a->calls,
                (unsigned long long)a->guest, (unsigned long long)a->posted, (unsigned long long)a->round_trip,
                (double)a->ns * 1e-6, a->calls ? (double)a->ns * 1e-3 / (double)a->calls : 0.0);
        if (h) {
            h->shown = 1;
            host_columns(out, h);
        } else {
            fprintf(out, " %10s %11s %9s %10s %9s\n", "-", "-", "-", "-", "-");
        }
    }
    for (int i = 0; i < nrows; i++) { /* records no entry point above is named after (the wire's own, pool calls),
                                        * and the relaying host's */
        if (rows[i].shown) continue;
        char label[64];
        row_label(rows[i].opcode, label, sizeof label);
        fprintf(out, "%-36s %10s %10s %10s %10s %10s %9s |", label, "", "", "", "", "", "");
        host_columns(out, &rows[i]);
    }
    fprintf(out, "orion-stats: guest = answered in this process; posted = sent without waiting; round trip = waited "
            "for the agent. compiled/python = the agent's records served by its hot path or in Python (relayed: the "
            "relaying host's, by its compiled pump or in Python), each with its mean time on the agent; driver us = "
            "the part of a compiled record's in the CUDA driver%s%s\n",
            why[0] ? "; agent columns empty: " : "", why);
    if (out != stderr) fclose(out);
}

__attribute__((constructor)) static void stats_from_environment(void) {
    const char *setting = getenv("ORION_STATS");
    if (setting == NULL || !setting[0] || strcmp(setting, "0") == 0) return;
    if (strcmp(setting, "1") != 0) { /* a path; "%p": the process id */
        size_t at = 0;
        for (const char *c = setting; *c && at + 16 < sizeof destination; c++) {
            if (c[0] == '%' && c[1] == 'p') {
                at += (size_t)snprintf(destination + at, sizeof destination - at, "%d", (int)getpid());
                c++;
            } else {
                destination[at++] = *c;
            }
        }
        destination[at] = '\0';
    }
    first_ns = now_ns();
    owner = getpid();
    orion_stats_on = 1;
    atexit(report);
}

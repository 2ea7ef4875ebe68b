/* call_stats.h: ORION_STATS, the native guest driver's account of a program's driver calls (docs/performance.md,
 * "Where the time goes").
 *
 * Every entry point of the library begins with ORION_ENTRY("cuXxx") (the generator writes it into the generated ones;
 * tests/unit/test_native_layouts.py holds the hand-written ones to it). With ORION_STATS set, each call the program
 * makes is counted under its name with its time, and classed by how it was served: in the guest (nothing crossed
 * the wire), posted (records sent, none waited for), or round trip (at least one reply waited for). A call made from
 * inside another entry point (the library's own use of its API) is the outer call's, never counted twice. After
 * cuInit the library asks the agent to count too, and at exit how it served each opcode (its compiled hot path or
 * Python, and Python's time: the wire's STATS record); then it prints one table (call_stats.c). Without ORION_STATS an entry point pays one load and
 * one branch.
 */
#ifndef ORION_CALL_STATS_H
#define ORION_CALL_STATS_H

#include <stdint.h>

struct orion_stat_scope {
    int id;               /* the entry point's index in the account; -1: not counted (stats off, or nested) */
    uint32_t round_trips; /* replies waited for during the call */
    uint32_t posts;       /* records posted during the call */
    uint64_t start_ns;
};

extern __attribute__((visibility("hidden"))) int orion_stats_on; /* ORION_STATS is set: read when the library loads */

void orion_stat_enter(struct orion_stat_scope *scope, const char *name, int *id);
void orion_stat_finish(struct orion_stat_scope *scope);
/* The wire functions (cuda_client.c): the call under way sent a record (posted: no reply waited for). */
void orion_stat_wire(int posted);
/* cuInit succeeded (the generated cuInit): with ORION_STATS, a STATS record is posted so that the agent that serves
 * the session (the route is known by now, a relayed one's included) counts its Python path from here; an agent
 * never asked times nothing. */
void orion_stats_initialized(void);

static inline void orion_stat_leave(struct orion_stat_scope *scope) {
    if (scope->id >= 0) orion_stat_finish(scope);
}

/* The first statement of every entry point: `name` is its API name (a string literal). */
#define ORION_ENTRY(name)                                                                                         \
    static int orion_entry_id_ = -1;                                                                              \
    struct orion_stat_scope orion_entry_scope_ __attribute__((cleanup(orion_stat_leave))) = { -1, 0, 0, 0 };     \
    if (orion_stats_on) orion_stat_enter(&orion_entry_scope_, name, &orion_entry_id_)

#endif

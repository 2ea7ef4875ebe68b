/* copy_helper.h: a second guest core for a large staged copy's chunks (copy_helper.c; docs/performance.md,
 * "Pageable bulk"). The wire client (orion_wire.c) splits each large chunk it copies into or out of a staging
 * arena in two halves, runs one on the calling thread and hands the other to the helper, and publishes or releases
 * the chunk once both are done: the ring keeps one producer and its order; only the copying is shared. */
#ifndef ORION_COPY_HELPER_H
#define ORION_COPY_HELPER_H

#include <stddef.h>
#include <stdint.h>

/* A chunk at least this long is split (each half then takes tens of microseconds, well above a hand-over). */
#define ORION_COPY_SPLIT_MIN (128u << 10)

/* Whether this thread now holds the helper for its copy (1), or copies alone (0: the helper is off, see
 * ORION_COPY_THREADS in docs/configuration.md, could not start, or another thread holds it). Release what you hold. */
int orion_copy_helper_claim(void);
void orion_copy_helper_release(void);

/* With the helper held: run(theirs) on the helper and run(mine) here, at once; both are done on return. When the
 * helper has not yet taken `theirs` once `mine` is done (it was asleep), this thread runs it too. */
void orion_copy_halves(void (*run)(void *), void *mine, void *theirs);

/* How many halves the helper thread has run in this process (a test's proof that it copied). */
uint64_t orion_copy_helper_halves(void);

#endif

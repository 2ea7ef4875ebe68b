/* answer_cache.h: the hot queries answered from guest-side state (device_answers.c, context_answers.c,
 * function_answers.c; docs/native-driver.md "Queries answered in the guest").
 *
 * A forwarded query is a full round trip to the host agent (12.42 µs for cuDeviceGetAttribute on the H100, 0.39 µs
 * native), and CUDA runtimes ask the same questions thousands of times. What cannot change while this process runs
 * (a device's attributes) is kept in once-filled tables read with one atomic load; what can (a context's or a
 * function's answers, a primary context's state) is kept with the calls that change it, which all go through this
 * library, and is forgotten when they run. Nothing is cached before cuInit (the host would answer for a driver the
 * guest has not initialised) and no error is cached but the ones that name a fact of the session (see each file).
 */
#ifndef ORION_ANSWER_CACHE_H
#define ORION_ANSWER_CACHE_H

#include <stdatomic.h>
#include <stdint.h>

#include "orion_guest.h"

#define CUDA_ERROR_INVALID_DEVICE 101

/* One scalar answer in one atomic word: bit 63 set once filled, the CUresult in bits 32..62, the int32 value in
 * bits 0..31. 0: not known yet (ask the host). */
#define ORION_ANSWER_FILLED ((uint64_t)1 << 63)

static inline uint64_t orion_answer_pack(int status, int32_t value) {
    return ORION_ANSWER_FILLED | ((uint64_t)(uint32_t)status << 32) | (uint32_t)value;
}
static inline int orion_answer_status(uint64_t answer) { return (int)((answer >> 32) & 0x7FFFFFFF); }
static inline int32_t orion_answer_value(uint64_t answer) { return (int32_t)(uint32_t)answer; }

/* --- context_answers.c: what the guest knows of each context (context_calls.c keeps it current) -------------- */

/* `ctx` was made on guest device `device` (cuCtxCreate, cuDevicePrimaryCtxRetain): known to the host as this
 * session's, so making it current needs no check. */
void orion_context_made(uint64_t ctx, int device);
/* The host accepted `ctx` as current (cuCtxSetCurrent, cuCtxPushCurrent of a context not made here). */
void orion_context_checked(uint64_t ctx);
/* cuCtxDestroy succeeded: every answer about `ctx` is forgotten (its handle may come back as another context). */
void orion_context_gone(uint64_t ctx);
/* Whether `ctx` may be made current without asking the host (made or checked, not gone since). */
int orion_context_known(uint64_t ctx);

/* --- function_answers.c ------------------------------------------------------------------------------------- */

/* A module or library was unloaded: every function's and kernel's answers are forgotten (their handles may name
 * other functions later). Called by the generated cuModuleUnload and cuLibraryUnload (effect `unloads`). */
void orion_function_answers_forget(void);

#endif

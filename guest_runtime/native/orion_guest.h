/* orion_guest.h: the state the native guest driver keeps in the guest, shared by its hand-written calls.
 *
 * Private to guest_runtime/native/ (not a CUDA header). The Python guest runtime keeps the same state in
 * guest_runtime/contexts.py (per-thread context stacks), device_ranges.py (what unified addressing treats as
 * device memory) and pinned_pool.py (the channel's slice of the region's page-locked pool); each part here has
 * one C file: context_stacks.c, device_ranges.c, pinned_pool.c.
 *
 * Every forwarded call must go out through orion_thread_forward* / orion_thread_post*: they first make the calling
 * thread's current context the host's (Forwarder._sync_context), under one lock, so two threads with different
 * contexts never run a call under each other's context.
 */
#ifndef ORION_GUEST_H
#define ORION_GUEST_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_client.h"
#include "orion_wire.h"

#include "orion_calls.h" /* generated: cuda.h's types, every table call's opcode (ORION_OP_<name>) and prototype */
/* generated: where each field of every payload lies (ORION_REQ_<call>_<field>, ORION_REP_..., their _SIZE; the
 * embedded structs and the forwarding layer's payloads): the hand-written C never spells an offset */
#include "orion_layouts.h"

/* The forwarding layer's own opcodes: the pool's mapping, a relayed host function, a host function run as a host node
 * runs it, an NVML question for the GPU host, cuMem memory's export and import between sessions, legacy IPC between
 * sessions, events made ahead (event_pool.c), and a pinned copy (its call's opcode + ORION_PINNED_COPY). */
enum {
    ORION_OP_POOL_MAP = 0x1000, ORION_OP_HOST_FUNCTION = 0x1002, ORION_OP_HOST_NODE_FUNCTION = 0x1003,
    ORION_OP_NVML_QUERY = 0x1004, ORION_OP_SHARE_EXPORT = 0x1005, ORION_OP_SHARE_IMPORT = 0x1006,
    ORION_OP_IPC_EXPORT = 0x1007, ORION_OP_IPC_OPEN = 0x1008, ORION_OP_IPC_CLOSE = 0x1009,
    ORION_OP_EVENTS_CREATE = 0x100A,
    ORION_PINNED_COPY = 0x2000,
};


/* --- context_stacks.c: the calling thread's contexts and the host's ------------------------------------------- */

/* The calling thread's current context (the top of its stack; NULL for none), without a round trip. */
CUcontext orion_current_context(void);
/* Make `ctx` the calling thread's current context, as cuCtxSetCurrent does (a non-NULL one is checked by the host,
 * synchronously; NULL pops the thread's top). A CUresult. */
int orion_set_current_context(CUcontext ctx);

/* cuInit succeeded (the generated cuInit calls it: effect `initializes`), and whether it has. */
void orion_initialized(void);
int orion_is_initialized(void);

/* Forward a call as the calling thread: its context made the host's first (one posted cuCtxSetCurrent when it is
 * not already), then cuda_client.h's orion_forward / orion_forwardv / orion_forward_post / _postv. */
int orion_thread_forward(uint32_t opcode, const void *req, size_t len, void *rep, size_t cap, int flags);
int orion_thread_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap,
                          void *tail, size_t tail_cap, size_t *tail_len, int flags);
int orion_thread_post(uint32_t opcode, const void *req, size_t len);
int orion_thread_postv(uint32_t opcode, const struct orion_piece *req, int nreq);

/* For context_calls.c: one call with its stack change as one step (the lock the forwards above take). */
void orion_turn_take(void);
void orion_turn_give(void);
/* Check `ctx` is the session's by making it the host's current context (synchronously): a CUresult. */
int orion_make_current_on_host(uint64_t ctx);
/* The same, without a round trip for a context made here or checked before (context_answers.c): a CUresult. */
int orion_check_context(uint64_t ctx);
int orion_sync_context(void);               /* in the turn: the calling thread's context made the host's */
void orion_host_current_is(uint64_t ctx);   /* in the turn: what the host thread now has current */
void orion_host_current_unknown(void);      /* in the turn: it may have changed (set before the next call) */
int orion_stack_push(uint64_t ctx);         /* CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY */
int orion_stack_pop(uint64_t *ctx);         /* 1 and the popped top, or 0 for an empty stack */
int orion_stack_replace_top(uint64_t ctx);  /* cuCtxSetCurrent: the top replaced (NULL pops it) */
void orion_stack_destroyed(uint64_t ctx);   /* cuCtxDestroy: popped if it is the calling thread's top */

/* --- function_answers.c (answer_cache.h): an unload forgets every function's and kernel's kept answers, a context's
 * cache or limit settings the kept occupancy answers (the generator's status hooks) ----------------------------- */
void orion_function_answers_forget(void);
void orion_occupancy_changed(int status);

/* --- device_ranges.c: device memory this process got (cuMemcpy with unified addressing) ---------------------- */
void orion_range_add(uint64_t base, uint64_t size);
void orion_range_reserve(uint64_t base, uint64_t size); /* a reserved range, a graph's allocation: not allocated */
void orion_range_remove(uint64_t base);
int orion_range_contains(uint64_t pointer);
/* Whether [pointer, pointer + size) lies in one allocated range (copy_calls.c posts a small pageable copy there). */
int orion_range_allocated(uint64_t pointer, uint64_t size);

/* --- known_handles.c: streams and events this process made, each with its context (the generated cuStreamCreate*
 * and cuStreamDestroy, event_pool.c) ------------------------------------------------------------------------------ */
enum { ORION_KNOWN_STREAMS, ORION_KNOWN_EVENTS, ORION_KNOWN_KINDS };
void orion_known_made(int kind, uint64_t handle);      /* made in the current context */
int orion_known_destroyed(int kind, uint64_t handle);  /* marked gone; whether it was known in the current context */
void orion_known_forget(int kind);                     /* a context may have gone: no handle of the kind is known */
int orion_known(int kind, uint64_t handle);            /* made here, in the current context, and not destroyed */

/* --- event_pool.c: events made ahead and handed out without a round trip ------------------------------------ */
void orion_events_forget(void);        /* a context may have gone: no pooled or known event any more */

/* --- pinned_pool.c: this channel's slice of the region's page-locked pool -------------------------------------- */
int orion_pool_ready(void);                            /* agree on the slice's address with the host (once) */
int orion_pool_contains(uint64_t pointer, uint64_t size); /* [pointer, pointer+size) lies in the slice */
int orion_pool_overlaps(uint64_t pointer, uint64_t size); /* [pointer, pointer+size) shares a byte with the slice */
uint64_t orion_pool_size(void);
/* The region file and the offset in it of [pointer, pointer+size) of the slice: 1, or 0 where it is not all there. */
int orion_pool_file(uint64_t pointer, uint64_t size, int *fd, uint64_t *offset);

/* --- page_locked_calls.c: guest memory answered for as page-locked, outside the pool -------------------------- */
/* A fallback allocation (owned 1: cuMemAllocHost/cuMemHostAlloc when the pool could not serve it; cuMemFreeHost
 * unmaps it) or a cuMemHostRegister'ed range (owned 0: cuMemHostUnregister only forgets it). Copies with either
 * are pageable (staged); the GPU cannot reach them. An allocation in the pool (owned 2) is listed apart, for its
 * pointer attributes only. Each keeps the context current at its allocation or registration, and its device (-1:
 * not known), which the driver answers as its CONTEXT and DEVICE_ORDINAL attributes. */
struct orion_host_range {
    uint64_t base, size; unsigned flags; int owned; uint64_t context; int device;
    uint64_t pool; /* a registered range moved into the pool (moved_ranges.c): where its pages are there (0: not) */
};
/* moved_ranges.c: a registered range of whole pages moved into the pool (1, and its pool address) or not (0); and
 * given back at its cuMemHostUnregister (a CUresult). */
int orion_move_into_pool(uint64_t base, uint64_t size, unsigned flags, uint64_t *pool);
int orion_move_back(uint64_t base);
/* 1 and the range outside the pool holding `pointer`, or 0 (one atomic load when none is listed). */
int orion_host_range_find(uint64_t pointer, struct orion_host_range *range);
/* 1 and this process's pool allocation holding `pointer`, or 0. */
int orion_pool_range_find(uint64_t pointer, struct orion_host_range *range);
/* --- graph_calls.c: cuGetProcAddress's answer for a graph entry point whose ABI changed (or NULL) --------------- */
void *orion_graph_versioned_entry(const char *symbol, int version);
/* A graph or node the host destroyed (the generated destroy calls' hook): what the guest kept for it goes. */
void orion_graph_node_destroyed(CUgraphNode node);
void orion_graph_destroyed(CUgraph graph);
/* graph_queries.c: a launch or a kernel node was given `extra` (launch_calls.c, graph_calls.c), so a kernel node's
 * parameters can no longer be told apart from one given kernelParams (cuGraphKernelNodeGetParams then answers 801). */
void orion_graph_kernel_extra_given(void);

/* `size` bytes of the pool itself, never the fallback (memory the GPU must reach: host_functions.c): a CUresult. */
int orion_pool_alloc(void **pp, size_t size);

/* --- answered_in_guest.c ------------------------------------------------------------------------------------------ */
/* A PCI bus id in the forms the driver and NVML read ("domain:bus:device.function", "domain:bus:device",
 * "bus:device.function"; hex, any case, the domain in any number of digits): whether it reads as one. */
int orion_parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *slot);

/* --- host_functions.c: host functions and stream callbacks, run in the guest ----------------------------------- */
/* Every forwarded call's CUresult (cuda_client.c): one that ends the process's CUDA fails the queued callbacks. */
void orion_host_functions_saw(int status);
/* cuGetProcAddress's cuLaunchHostFunc for a caller built against `version` (13.2 on: the _v2 ABI), or NULL. */
void *orion_host_function_entry(const char *symbol, int version);
/* Whether a host function or callback this process queued may still run, or a graph's host node may (a copy that
 * the driver makes after syncing its stream must wait for them: copy_calls.c). */
int orion_host_functions_may_run(void);
/* --- copy_calls.c: before this process reads host memory a copy takes (a pageable source, a staged side) --------- */
/* What the driver would have waited for first: a synchronous copy syncs its stream before it reads, and page-locked
 * memory (`pool`) is read in stream order, so where earlier work may write the bytes (a host function of this
 * process; the GPU, in the pool) the copy's stream (NULL: synchronous, the legacy stream) is waited for; an async
 * copy from pageable memory takes its bytes at once, as the driver's. A CUresult. */
int orion_before_host_read(const CUstream *stream, int pool);
/* --- capture_state.c: whether a stream capture may be under way in this process --------------------------------- */
/* A stream capture of `stream` began (in capture mode `mode`, on the calling thread) or ended with `status`
 * (cuStreamBeginCapture, cuStreamEndCapture and cuStreamBeginCaptureToGraph call them): while one may be under way,
 * a host function's stream is asked first and cuStreamIsCapturing is the host's to answer. */
void orion_capture_began(int status, uint64_t stream, int mode);
void orion_capture_ended(int status, uint64_t stream);
int orion_captures_may_run(void);
/* In the turn, while a capture may run: the host thread given the capture interaction mode under which the driver's
 * rule is the calling thread's (capture_state.c). */
int orion_sync_capture_mode(void);
/* Whether `stream` is known here not to be capturing (none may run, and it is a valid handle in the current context
 * of an initialised process): cuStreamIsCapturing and cuStreamGetCaptureInfo then answer NONE without asking. */
int orion_known_not_capturing(uint64_t stream);
/* The guest's address of the page-locked words that stand for (fn, data) in a host node (made at first use), which
 * oriond's trampoline counts runs in: a CUresult (NOT_SUPPORTED on a relayed session). */
int orion_host_node_words(CUhostFn fn, void *data, uint64_t *words);
/* The (fn, data) that `words` stand for: whether they are this process's. */
int orion_host_node_function(uint64_t words, CUhostFn *fn, void **data);

#endif

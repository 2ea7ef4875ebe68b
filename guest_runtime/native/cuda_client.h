/* cuda_client.h: what the generated entry points of the native guest driver (gen_libcuda.py) call.
 *
 * One channel per process, opened at the first forwarded call from $ORION_SHM (a region file) and introduced
 * with the call table's digest (HELLO), exactly as the Python guest runtime does; calls are serialised on it.
 * A process the agent cannot serve gets CUDA_ERROR_NO_DEVICE from cuInit and CUDA_ERROR_NOT_INITIALIZED from the
 * rest, with one line on stderr saying why.
 */
#ifndef ORION_CUDA_CLIENT_H
#define ORION_CUDA_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "call_stats.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_DEVICE_UNAVAILABLE 46
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

enum {
    ORION_CALL_INIT = 1,    /* cuInit: an unreachable agent is CUDA_ERROR_NO_DEVICE, not NOT_INITIALIZED */
    ORION_CALL_NO_FOLD = 2, /* a call of the library's own (a context switch, an error text, the pool): an earlier
                               posted call's failure stays pending for the program's next call */
    ORION_CALL_BY_DIGEST = 4, /* a load by image digest: ORION_IMAGE_NOT_CACHED comes back as itself */
};
/* driver_api.IMAGE_NOT_CACHED: the wire status of a load by digest whose image the agent does not hold. */
#define ORION_IMAGE_NOT_CACHED (-16)

struct orion_entry { const char *name; void *function; };
extern const struct orion_entry orion_entries[]; /* every table call, by its API name (generated) */
struct orion_opcode_name { uint32_t opcode; const char *name; };
extern const struct orion_opcode_name orion_opcode_names[]; /* every table call's opcode (generated; NULL name ends) */
extern const char orion_table_digest[];          /* driver_api.table_digest() (generated) */

/* Send one call and wait: its CUresult; on success the reply (exactly `cap` bytes) is in `rep`. */
int orion_forward(uint32_t opcode, const void *req, size_t len, void *rep, size_t cap, int flags);
/* The same with the request in pieces (a packed head, then a tail where it lies) and the reply split: its first
 * `cap` bytes (exactly) into `rep`, the rest (at most `tail_cap`) into `tail`, their count in *tail_len. */
struct orion_piece;
int orion_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap, void *tail,
                   size_t tail_cap, size_t *tail_len, int flags);
int orion_forward_postv(uint32_t opcode, const struct orion_piece *req, int nreq);
/* Send a posted call (no wait): CUDA_SUCCESS, or the error that keeps it from being sent. */
int orion_forward_post(uint32_t opcode, const void *req, size_t len);
/* ORION_NATIVE_TRACE=1: the library says on stderr what it answers besides success (development aid). */
int orion_tracing(void);
/* CUDA_ERROR_NOT_SUPPORTED for a call this library does not forward yet, named once on stderr. */
/* Whether `name` (a string literal: the pointer is what is kept) is told for the first time: each is said once. */
int orion_first_time(const char *name);
int orion_not_forwarded(const char *name);
int orion_nvml_not_supported(const char *name); /* nvml.c: an NVML entry point it does not answer (3, named once) */

static inline void orion_put_u8(uint8_t *p, uint8_t v) { *p = v; }
static inline void orion_put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void orion_put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void orion_put_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void orion_put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void orion_put_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }
static inline uint8_t orion_get_u8(const uint8_t *p) { return *p; }
static inline uint16_t orion_get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t orion_get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t orion_get_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t orion_get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline float orion_get_f32(const uint8_t *p) { float v; memcpy(&v, p, 4); return v; }

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the Orion wire is little-endian; this library packs values in host order"
#endif

/* The process's one channel (connected at the first call, as a forwarded call would): NULL when the agent cannot
 * be reached. For read-only questions about the region (orion_pool_slice); records go through orion_forward*. */
struct orion_channel;
struct orion_channel *orion_process_channel(void);
/* Whether the process's channel is open (without opening it: call_stats.c asks at exit). */
int orion_connected(void);
/* A call answered in the guest first reports an earlier posted call's failure, as a forwarded one would: that
 * error (taken), or CUDA_SUCCESS when none came back. */
int orion_pending_async_error(void);
/* Whether a call answered CUDA_ERROR_DEVICE_UNAVAILABLE: the GPU is gone for this process (copy_calls.c). */
int orion_device_unavailable(void);

#endif

/* orion_wire.h: the Orion wire client in C (issue 13's first brick: no CUDA here).
 *
 * It speaks exactly the wire of docs/wire-protocol.md as ivshmem/ implements it in Python: it opens a host or
 * container region file (ivshmem/region.py, layout.py), claims a channel as ClientChannel.claim does (an OFD
 * lock on the channel's first byte, the control words in the same order, liveness mode LOCK), says HELLO, and
 * moves records over the SPSC rings of ivshmem/ring.py. A payload larger than a ring slot is STAGED as
 * ivshmem/channel.py's Endpoint does it (docs/wire-protocol.md, "Staging arena"): the record (flag STAGED, length =
 * payload size, no inline payload) first, then the payload chunk by chunk through the direction's staging arena,
 * copied once, from the caller's pieces into the chunks and from the chunks into the caller's reply buffers.
 * Payloads are at most ORION_MAX_PAYLOAD (1 GiB) each way.
 *
 * Every wait (room in a ring, a free chunk, a record, the next chunk) spins briefly, then sleeps with back-off,
 * and checks the host (ClientChannel._check_host) every 0.1 s, so an agent that died or stopped is an error
 * within the agent timeout, never a hang, even in the middle of a staged payload.
 *
 * Threads: one channel is used by one thread at a time (the caller serialises); two channels (two
 * orion_open calls) are independent, even in one process.
 *
 * Errors: functions return ORION_OK (0) or a negative ORION_E_* code. orion_open writes its reason into `err`;
 * once a channel exists, orion_error(channel) holds the last reason, one line. After ORION_E_PEER_GONE,
 * ORION_E_DEVICE_LOST or ORION_E_PROTOCOL the channel is broken: every later call returns the same code (close it and open another).
 */
#ifndef ORION_WIRE_H
#define ORION_WIRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    ORION_OK = 0,
    ORION_E_ARG = -1,        /* a bad argument (NULL pointer, opcode out of range) */
    ORION_E_REGION = -2,     /* the path is not a usable Orion region (missing, link, foreign, bad header) */
    ORION_E_PEER_GONE = -3,  /* no host agent serves us (never, stopped, died, session ended) */
    ORION_E_NO_CHANNEL = -4, /* every channel is held by a live process */
    ORION_E_TOO_LARGE = -5,  /* a request beyond ORION_MAX_PAYLOAD, or a reply beyond the caller's buffers */
    ORION_E_PROTOCOL = -6,   /* the peer broke the ring or arena protocol (impossible indices, a bad record) */
    ORION_E_REFUSED = -7,    /* the agent refused our HELLO (another protocol or call table) */
    ORION_E_CLOSED = -8,     /* the channel was closed */
    ORION_E_SYSTEM = -9,     /* a system call failed (the text names it) */
    ORION_E_DEVICE_LOST = -10 /* as PEER_GONE, and why: the GPU (or a relayed session's GPU host) was lost mid-reply */
};

/* Wire-control opcodes (ivshmem/record.py Op), record flags, the protocol and ORION_MAX_PAYLOAD: spelled here so that
 * this header stays the whole API for a program that includes it; orion_wire.c holds each one equal to the generated
 * orion_region.h's ORION_WIRE_* (_Static_assert), so they cannot drift from record.py and channel.py. */
enum { ORION_OP_HELLO = 1, ORION_OP_ECHO = 2, ORION_OP_NOP = 3, ORION_OP_DRAIN = 4, ORION_OP_FILL = 5 };
enum { ORION_FLAG_NO_REPLY = 1, ORION_FLAG_STAGED = 2, ORION_FLAG_ASYNC_ERROR = 4 };
#define ORION_PROTOCOL 3u

typedef struct orion_channel orion_channel;

/* Open the region at `path` and claim the first free channel, waiting up to 2 s for the host agent to accept it
 * (agent timeout: 5 s, ClientChannel's defaults). `path` is a region file (an absolute path: O_RDWR|O_NOFOLLOW,
 * a regular file) or, in a QEMU guest, the PCI address of an ivshmem device (0000:00:04.0), whose BAR2 is mapped
 * from sysfs as ivshmem/region.py does; either must hold a valid header. */
int orion_open(const char *path, orion_channel **channel, char *err, size_t errlen);
/* Where a process's region is when ORION_SHM does not say (Region.discover): the first ivshmem PCI device, else
 * the lowest-numbered /dev/shm/orionsock<N>. Writes it into `out`; 0 when there is none. */
int orion_discover(char *out, size_t len);

/* The same with explicit bounds, in seconds (accept_timeout: the wait for the accept; agent_timeout: how long
 * a silent host heartbeat is tolerated during any wait). */
int orion_open_ex(const char *path, double accept_timeout, double agent_timeout, orion_channel **channel,
                  char *err, size_t errlen);

/* HELLO: protocol ORION_PROTOCOL, this pid, this host name and `calls` (the forwarded-call table's digest, "" for the wire
 * alone). `session` (may be NULL) receives the agent's session number. ORION_E_REFUSED carries the agent's
 * reason in orion_error(). */
int orion_hello(orion_channel *channel, const char *calls, uint64_t *session);

/* Send `opcode` with `len` bytes of `req` (inline or staged) and wait for its reply: its wire/CUDA status in
 * *status, its payload copied into `reply` (capacity `cap`), its length in *reply_len. A reply longer than `cap` is
 * consumed (a staged one's chunks drained, so the channel stays usable), its length reported and ORION_E_TOO_LARGE
 * returned. Async errors that arrive meanwhile are kept (see below). */
int orion_call(orion_channel *channel, uint32_t opcode, const void *req, size_t len, int32_t *status,
               void *reply, size_t cap, size_t *reply_len);

/* A request payload in pieces, sent back to back as one record (a head the caller packed, then a tail where it
 * lies: a copy's bytes, an image), so nothing is copied first. */
struct orion_piece { const void *data; size_t len; };
#define ORION_MAX_PAYLOAD ((size_t)1 << 30) /* docs/wire-protocol.md: MAX_PAYLOAD */

/* orion_call with the request in `nreq` pieces and the reply split: its first `cap` bytes into `reply`, the rest
 * into `tail` (capacity `tail_cap`; NULL for none). A staged request is streamed from the pieces where they lie, a
 * staged reply straight into `reply` then `tail`. *reply_len is the whole payload's length; one longer than
 * cap + tail_cap is consumed (what fits is copied, the rest drained) and ORION_E_TOO_LARGE returned. */
int orion_callv(orion_channel *channel, uint32_t opcode, const struct orion_piece *req, int nreq, int32_t *status,
                void *reply, size_t cap, void *tail, size_t tail_cap, size_t *reply_len);

/* Send `opcode` with NO_REPLY: no wait for the agent; a failure comes back later as an async error, named by
 * the call id orion_last_call_id() gives right after this call (ids count 1, 2, ... per channel). */
int orion_post(orion_channel *channel, uint32_t opcode, const void *req, size_t len);
int orion_postv(orion_channel *channel, uint32_t opcode, const struct orion_piece *req, int nreq);
uint64_t orion_last_call_id(const orion_channel *channel);

/* The oldest async error (a failed posted record) not yet taken: returns 1 and fills the non-NULL outputs, or
 * 0 when there is none. `opcode` is the completion's as the agent wrote it (today's agent writes 0); the call
 * id names the post. The queue keeps the first 256; later ones are counted in orion_async_dropped(). */
int orion_take_async_error(orion_channel *channel, uint64_t *call_id, uint32_t *opcode, int32_t *status);
uint64_t orion_async_dropped(const orion_channel *channel);

/* Release the channel (CLIENT_ACTIVE 0, the lock dropped) and unmap the region; NULL is fine. */
void orion_close(orion_channel *channel);

const char *orion_error(const orion_channel *channel);
int orion_channel_index(const orion_channel *channel);
uint32_t orion_generation(const orion_channel *channel);
size_t orion_inline_capacity(const orion_channel *channel);

/* Read-only, for the page-locked pool (guest_runtime/pinned_pool.py): where this process maps the region (its
 * first byte, its length), the region file's descriptor (to map part of it again at another address) and this
 * channel's slice of the pool as layout.Geometry.pool_slice computes it (offset from the region's start, size; a
 * size of 0: the region has no pool). Any output may be NULL. ORION_OK, ORION_E_ARG (no channel) or
 * ORION_E_PROTOCOL (the header's pool no longer lies inside the mapping). */
int orion_pool_slice(const orion_channel *channel, uint8_t **map, size_t *mapped, int *fd, uint64_t *offset,
                     uint64_t *size);

#ifdef __cplusplus
}
#endif

#endif

/* orion_wire.c: the Orion wire client in C; see orion_wire.h for the API and docs/wire-protocol.md for the wire.
 *
 * Each function mirrors a piece of ivshmem/: header checks (layout.unpack_header, Geometry.check), opening
 * (region.open_region_file), claim and accept (channel.ClientChannel.claim/_accept), host checks
 * (ClientChannel._check_host), rings and staging arenas (ring._Spsc), records inline and staged (channel.Endpoint
 * send/_send_staged/_stream_out, receive/_stream_in) and waiting (wait.WaitPolicy). Python relies on x86-64 TSO
 * for the order of its plain stores and loads; here every index and control word that orders other memory is
 * a C11 atomic with release (store) / acquire (load), so the order holds on any architecture.
 */
#define _GNU_SOURCE
#include "orion_wire.h"
#include "orion_region.h" /* generated (gen_libcuda.generate_region): every offset and constant of the wire below */
#include "copy_helper.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* --- region.py: where a region is ------------------------------------------------------------------------ */
#define PCI_ROOT "/sys/bus/pci/devices"
#define IVSHMEM_VENDOR "0x1af4"
#define IVSHMEM_DEVICE "0x1110"
#define GUEST_LOCK_DIR "/dev/shm"
#define SHM_DIR "/dev/shm"
#define SHM_PREFIX "orionsock"
#define STR_(x) #x
#define STR(x) STR_(x) /* a generated number inside a message's text */

/* --- orion_wire.h's wire values are record.py's and channel.py's (orion_region.h) ----------------------------- */
_Static_assert(ORION_OP_HELLO == ORION_WIRE_OP_HELLO && ORION_OP_ECHO == ORION_WIRE_OP_ECHO &&
               ORION_OP_NOP == ORION_WIRE_OP_NOP && ORION_OP_DRAIN == ORION_WIRE_OP_DRAIN &&
               ORION_OP_FILL == ORION_WIRE_OP_FILL, "orion_wire.h's opcodes are not record.Op's");
_Static_assert(ORION_FLAG_NO_REPLY == ORION_WIRE_FLAG_NO_REPLY && ORION_FLAG_STAGED == ORION_WIRE_FLAG_STAGED &&
               ORION_FLAG_ASYNC_ERROR == ORION_WIRE_FLAG_ASYNC_ERROR, "orion_wire.h's flags are not record.Flag's");
_Static_assert(ORION_PROTOCOL == ORION_WIRE_PROTOCOL, "orion_wire.h's protocol is not record.PROTOCOL");
_Static_assert(ORION_MAX_PAYLOAD == ORION_WIRE_MAX_PAYLOAD, "orion_wire.h's limit is not channel.MAX_PAYLOAD");

/* --- liveness.py ---------------------------------------------------------------------------------------------- */
#define HEARTBEAT_PERIOD_S 0.5

/* --- wait.py WaitPolicy defaults ------------------------------------------------------------------------ */
#define SPIN_S 200e-6
#define BUSY_SPIN_S 2e-3
#define MIN_SLEEP_S 20e-6
#define MAX_SLEEP_S 1e-3
#define CHECK_EVERY_S 0.1
#define AGENT_SETTLE_S 0.3
#define ASYNC_KEEP 256u

typedef struct {
    uint8_t *base;      /* the block: its head, its tail, its cells (ORION_RING_*, ORION_STAGING_*) */
    uint8_t *data;
    uint32_t cell, capacity, mask;
    uint32_t own;       /* private copy of the index this side writes (tail producing, head consuming) */
    uint32_t seen;      /* producing: the consumer's head as last read */
    int marked;         /* a ring (not an arena): its slots carry publish marks (record.SEQ_AT). Producing, the mark is
                         * stored after the tail, and the head is read again only when `seen` says "full", so a send
                         * does not wait for the line the host last wrote (a stale value only understates the room);
                         * consuming, the mark is watched instead of the tail, which is read only while a wait sleeps
                         * (spsc_readable). The arenas read the other side's index at every chunk, where a read costs
                         * nothing beside the chunk's copy, so a broken host's index is seen at once. */
} spsc;

typedef struct { uint64_t call_id; uint32_t opcode; int32_t status; } async_error;

typedef struct {
    uint64_t call_id;
    uint32_t opcode, flags, length, generation;
    int32_t status;
    uint32_t seq;
} record_header;

/* Where a reply's payload goes: its first `head_cap` bytes into `head`, the rest into `tail` (orion_callv). */
typedef struct { void *head; size_t head_cap; void *tail; size_t tail_cap; } reply_dest;

struct orion_channel {
    char where[256];
    char error[512];
    int fd, lock_fd, index, broken;
    uint8_t *map;
    size_t size;
    uint8_t *ctrl;
    uint64_t features;
    uint32_t slot_size, capacity, generation;
    spsc out, in;            /* request ring (we produce), completion ring (we consume) */
    spsc out_st, in_st;      /* request staging arena (we produce), completion staging arena (we consume) */
    uint64_t next_id;
    double agent_timeout;
    uint64_t agent_seen;  double agent_since;
    uint64_t worker_seen; double worker_since;
    int busy;
    int sleeping;  /* the wait under way is past its spin: a marked ring's probe reads the tail too (spsc_readable) */
    async_error async_q[ASYNC_KEEP];
    uint32_t async_head, async_count;
    uint64_t async_dropped;
    /* The call in flight (0: none) and where its reply goes, for a drain that meets its reply early. */
    uint64_t call_id;
    const reply_dest *call_dest;
    int answered;
    record_header answer;
    /* A guest's liveness (ORION_LIVENESS_HEARTBEAT_MODE): its locks live in the guest, where the host cannot see
     * them, so a thread counts the client_heartbeat word up every HEARTBEAT_PERIOD_S while the channel is open
     * (liveness.Heartbeat). */
    int beating, beat_stop;
    pthread_t beat_thread;
    pthread_mutex_t beat_lock;
    pthread_cond_t beat_wake;
};

/* --- small helpers -------------------------------------------------------------------------------------- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline uint32_t load32(const uint8_t *p) { return atomic_load_explicit((_Atomic uint32_t *)p, memory_order_acquire); }
static inline uint64_t load64(const uint8_t *p) { return atomic_load_explicit((_Atomic uint64_t *)p, memory_order_acquire); }
static inline void store32(uint8_t *p, uint32_t v) { atomic_store_explicit((_Atomic uint32_t *)p, v, memory_order_release); }
static inline void store64(uint8_t *p, uint64_t v) { atomic_store_explicit((_Atomic uint64_t *)p, v, memory_order_release); }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void say(char *buf, size_t len, const char *fmt, ...) {
    if (buf == NULL || len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

#define FAIL(ch, code, ...) (say((ch)->error, sizeof (ch)->error, __VA_ARGS__), (code))

static int broken(orion_channel *ch, int code) {
    ch->broken = code;
    return code;
}

/* zlib's CRC-32 (the header checksum layout.py computes with zlib.crc32). */
static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static int pow2(uint64_t n) { return n && !(n & (n - 1)); }

/* --- the header (layout.unpack_header + Geometry.check) ---------------------------------------------------- */
typedef struct {
    uint64_t features, region_size, channel_offset, channel_stride, pool_offset, pool_size;
    uint32_t channels, entries, slot, chunk, chunks;
    uint32_t o_ctrl, o_req, o_cpl, o_reqst, o_cplst, o_head, o_tail, o_slots, o_chunks;
} geometry;

static int check_header(const uint8_t *h, size_t mapped, const char *where, geometry *g, char *err, size_t el) {
    static const char *redo = "recreate the region with 'orion-shm create' or restart the host agent to reformat it";
    if (mapped < ORION_REGION_HEADER_SIZE) {
        say(err, el, "%s: %zu bytes is too small to be an Orion region (at least %u bytes of header); create one "
            "with 'orion-shm create'", where, mapped, ORION_REGION_HEADER_SIZE);
        return ORION_E_REGION;
    }
    if (memcmp(h + ORION_REGION_HEADER_magic, ORION_REGION_MAGIC, sizeof ORION_REGION_MAGIC - 1) != 0) {
        size_t i = 0;
        while (i < ORION_REGION_CRC_SPAN && h[i] == 0) i++;
        if (i == ORION_REGION_CRC_SPAN)
            say(err, el, "%s: the region holds no header yet (all zeros); start the host agent (oriond) on this "
                "host, it formats the region when it starts serving", where);
        else
            say(err, el, "%s: not an Orion region (bad magic, expected " ORION_REGION_MAGIC ")", where);
        return ORION_E_REGION;
    }
    if (rd32(h + ORION_REGION_HEADER_version) != ORION_REGION_VERSION) {
        say(err, el, "%s: region protocol version %u, this software speaks %u; use the same Orion release on both "
            "sides", where, rd32(h + ORION_REGION_HEADER_version), ORION_REGION_VERSION);
        return ORION_E_REGION;
    }
    if (rd32(h + ORION_REGION_HEADER_header_size) != ORION_REGION_HEADER_SIZE) {
        say(err, el, "%s: header_size %u, expected %u", where, rd32(h + ORION_REGION_HEADER_header_size),
            ORION_REGION_HEADER_SIZE);
        return ORION_E_REGION;
    }
    uint8_t copy[ORION_REGION_CRC_SPAN];
    memcpy(copy, h, ORION_REGION_CRC_SPAN);
    memset(copy + ORION_REGION_CRC_OFFSET, 0, sizeof(uint32_t));
    if (crc32_of(copy, ORION_REGION_CRC_SPAN) != rd32(h + ORION_REGION_CRC_OFFSET)) {
        say(err, el, "%s: header checksum mismatch (the header was overwritten); restart the host agent to "
            "reformat the region", where);
        return ORION_E_REGION;
    }
#define H(field) (h + ORION_REGION_HEADER_##field)
    g->features = rd64(H(features)); g->region_size = rd64(H(region_size));
    g->channels = rd32(H(channel_count)); g->entries = rd32(H(ring_entries)); g->slot = rd32(H(slot_size));
    g->chunk = rd32(H(chunk_size)); g->chunks = rd32(H(chunk_count));
    g->channel_offset = rd64(H(channel_offset)); g->channel_stride = rd64(H(channel_stride));
    g->pool_offset = rd64(H(pool_offset)); g->pool_size = rd64(H(pool_size));
    g->o_ctrl = rd32(H(off_ctrl)); g->o_req = rd32(H(off_req_ring)); g->o_cpl = rd32(H(off_cpl_ring));
    g->o_reqst = rd32(H(off_req_staging)); g->o_cplst = rd32(H(off_cpl_staging)); g->o_head = rd32(H(off_ring_head));
    g->o_tail = rd32(H(off_ring_tail)); g->o_slots = rd32(H(off_ring_slots)); g->o_chunks = rd32(H(off_staging_chunks));
#undef H

#define BAD(...) do { char what_[256]; say(what_, sizeof what_, __VA_ARGS__); \
        say(err, el, "%s: %s; %s", where, what_, redo); return ORION_E_REGION; } while (0)
    if (g->region_size > mapped)
        BAD("header says the region is %llu bytes but only %zu are mapped", (unsigned long long)g->region_size, mapped);
    if (g->channels < 1 || g->channels > ORION_REGION_MAX_CHANNELS)
        BAD("channel_count %u outside [1, %u]", g->channels, ORION_REGION_MAX_CHANNELS);
    if (!pow2(g->entries) || g->entries < ORION_REGION_RING_ENTRIES_MIN || g->entries > ORION_REGION_RING_ENTRIES_MAX)
        BAD("ring_entries %u is not a power of two in [" STR(ORION_REGION_RING_ENTRIES_MIN) ", "
            STR(ORION_REGION_RING_ENTRIES_MAX) "]", g->entries);
    if (!pow2(g->slot) || g->slot < ORION_REGION_SLOT_SIZE_MIN || g->slot > ORION_REGION_SLOT_SIZE_MAX)
        BAD("slot_size %u is not a power of two in [" STR(ORION_REGION_SLOT_SIZE_MIN) ", "
            STR(ORION_REGION_SLOT_SIZE_MAX) "]", g->slot);
    if (!pow2(g->chunks) || g->chunks < ORION_REGION_CHUNK_COUNT_MIN || g->chunks > ORION_REGION_CHUNK_COUNT_MAX)
        BAD("chunk_count %u is not a power of two in [" STR(ORION_REGION_CHUNK_COUNT_MIN) ", "
            STR(ORION_REGION_CHUNK_COUNT_MAX) "]", g->chunks);
    if (g->chunk == 0 || g->chunk % ORION_REGION_PAGE || g->chunk > ORION_REGION_MAX_CHUNK_SIZE)
        BAD("chunk_size %u is not a multiple of %u up to %u", g->chunk, ORION_REGION_PAGE, ORION_REGION_MAX_CHUNK_SIZE);
    if (g->o_head != ORION_RING_head || g->o_tail != ORION_RING_tail || g->o_slots != ORION_RING_slots ||
        g->o_chunks != ORION_STAGING_chunks)
        BAD("offsets table (off_ring_head %u, off_ring_tail %u, off_ring_slots %u, off_staging_chunks %u) differs "
            "from protocol version " STR(ORION_REGION_VERSION) " (%u, %u, %u, %u)", g->o_head, g->o_tail, g->o_slots,
            g->o_chunks, ORION_RING_head, ORION_RING_tail, ORION_RING_slots, ORION_STAGING_chunks);
    if (g->channel_offset < ORION_REGION_HEADER_SIZE || g->channel_offset % ORION_REGION_PAGE ||
        g->channel_stride % ORION_REGION_PAGE)
        BAD("channel_offset %llu or channel_stride %llu is not page-aligned after the %u-byte header",
            (unsigned long long)g->channel_offset, (unsigned long long)g->channel_stride, ORION_REGION_HEADER_SIZE);
    uint64_t ring = ((uint64_t)ORION_RING_slots + (uint64_t)g->entries * g->slot + ORION_REGION_PAGE - 1) /
                    ORION_REGION_PAGE * ORION_REGION_PAGE;
    uint64_t staging = (uint64_t)ORION_STAGING_chunks + (uint64_t)g->chunk * g->chunks;
    struct { uint64_t start, size; const char *name; } b[5] = {
        { g->o_ctrl, ORION_REGION_PAGE, "control block" }, { g->o_req, ring, "request ring" },
        { g->o_cpl, ring, "completion ring" }, { g->o_reqst, staging, "request staging" },
        { g->o_cplst, staging, "completion staging" } };
    for (int i = 1; i < 5; i++)  /* sort by start (Python sorts the tuples: start, then size, then name) */
        for (int j = i; j > 0 && (b[j].start < b[j - 1].start ||
                                  (b[j].start == b[j - 1].start && b[j].size < b[j - 1].size)); j--) {
            __typeof__(b[0]) t = b[j]; b[j] = b[j - 1]; b[j - 1] = t;
        }
    uint64_t end = 0;
    for (int i = 0; i < 5; i++) {
        if (b[i].start < end || b[i].start % ORION_REGION_CACHE_LINE)
            BAD("%s at %llu overlaps the block before it or is misaligned", b[i].name, (unsigned long long)b[i].start);
        end = b[i].start + b[i].size;
    }
    if (end > g->channel_stride)
        BAD("channel blocks end at %llu, beyond channel_stride %llu", (unsigned long long)end,
            (unsigned long long)g->channel_stride);
    uint64_t channels_end = g->channel_offset + (uint64_t)g->channels * g->channel_stride;
    if (channels_end > g->region_size)
        BAD("%u channels end at %llu, beyond region_size %llu", g->channels, (unsigned long long)channels_end,
            (unsigned long long)g->region_size);
    if (g->pool_size && (g->pool_offset < channels_end || g->pool_offset % ORION_REGION_PAGE ||
                         g->pool_offset + g->pool_size > g->region_size))
        BAD("pool_offset %llu / pool_size %llu overlaps the channels (which end at %llu) or leaves the region",
            (unsigned long long)g->pool_offset, (unsigned long long)g->pool_size, (unsigned long long)channels_end);
#undef BAD
    return ORION_OK;
}

/* --- rings (ring._Spsc) ----------------------------------------------------------------------------------- */
static void spsc_init(spsc *r, uint8_t *block, uint32_t cells_at, uint32_t cell, uint32_t capacity) {
    r->base = block;
    r->data = block + cells_at;
    r->cell = cell;
    r->capacity = capacity;
    r->mask = capacity - 1;
    r->own = 0;
    r->seen = 0;
    r->marked = 0;
}

/* record.publish_mark: the tail that covers a slot, with the top bit set (a zeroed word is never a mark) */
static uint32_t seq_mark(uint32_t tail) { return ORION_WIRE_SEQ_MARK | (tail & ORION_WIRE_SEQ_INDEX); }
static uint8_t *spsc_cell(const spsc *r, uint32_t index) { return r->data + (size_t)(index & r->mask) * r->cell; }

/* Producer: the next free cell, NULL when full; -1 in *bad when the indices are impossible. */
static uint8_t *spsc_writable(spsc *r, int *bad) {
    if (!r->marked || r->own - r->seen >= r->capacity) {
        r->seen = load32(r->base + ORION_RING_head);  /* acquire: the consumer is done with the cells it passed */
        uint32_t fill = r->own - r->seen;
        if (fill >= r->capacity) {
            if (fill > r->capacity) *bad = 1;
            return NULL;
        }
    }
    return spsc_cell(r, r->own);
}

static void spsc_publish(spsc *r) {
    uint8_t *cell = spsc_cell(r, r->own);
    r->own += 1;
    store32(r->base + ORION_RING_tail, r->own);  /* release: the cell's bytes are visible before the tail */
    if (r->marked) store32(cell + ORION_RECORD_seq, seq_mark(r->own));  /* and the tail before the mark */
}

/* Consumer: the oldest published cell, NULL when empty. A marked ring's cell is seen by its mark, in the line its
 * record is read from; its tail only when `tail_too` (a sleeping wait): reading the tail's line while the host is
 * about to store it would make that store, and the mark after it, wait for our copy's invalidation. A record
 * published without its mark (not by this project's hosts) is taken that way, later. */
static uint8_t *spsc_readable(spsc *r, int *bad, int tail_too) {
    if (r->marked) {
        uint8_t *cell = spsc_cell(r, r->own);
        if (load32(cell + ORION_RECORD_seq) == seq_mark(r->own + 1)) return cell;  /* acquire: the record after it */
        if (!tail_too) return NULL;
    }
    uint32_t fill = load32(r->base + ORION_RING_tail) - r->own;  /* acquire: the cell's bytes after the tail */
    if (fill == 0) return NULL;
    if (fill > r->capacity) { *bad = 1; return NULL; }
    return spsc_cell(r, r->own);
}

static void spsc_release(spsc *r) {
    r->own += 1;
    store32(r->base + ORION_RING_head, r->own);  /* release: our reads of the cell are done before its reuse */
}

/* --- host checks (ClientChannel._check_host) ------------------------------------------------------------ */
static const char *reason_text(uint32_t reason) {
    switch (reason) {
    case ORION_HOST_REASON_CLIENT_DIED: return "the host saw this client's lock go away";
    case ORION_HOST_REASON_HEARTBEAT_LOST: return "the host stopped seeing this client's heartbeat";
    case ORION_HOST_REASON_WORKER_DIED: return "the host worker serving this session died";
    case ORION_HOST_REASON_AGENT_RESTARTED: return "the host agent restarted and lost this session";
    case ORION_HOST_REASON_PROTOCOL_VIOLATION: return "the host saw a broken ring protocol on this channel";
    case ORION_HOST_REASON_AGENT_STOPPED: return "the host agent stopped";
    case ORION_HOST_REASON_GPU_HOST_LOST:
        return "the GPU host serving this relayed session is gone, in the middle of a reply";
    case ORION_HOST_REASON_REPLY_FAILED: return "the GPU failed in the middle of a reply";
    case ORION_HOST_REASON_GRANT_ENDED:
        return "the process whose vGPUs this one shared ended, and its vGPUs with it";
    default: return NULL;
    }
}

static int check_host(orion_channel *ch) {
    uint32_t host_gen = load32(ch->ctrl + ORION_CONTROL_host_gen);
    uint32_t status = load32(ch->ctrl + ORION_CONTROL_host_status);
    if (host_gen != ch->generation)
        return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host serves this channel for generation "
                               "%u, not ours (%u): its control words were overwritten; restart this program",
                               ch->where, ch->index, host_gen, ch->generation));
    if (status == ORION_HOST_STATUS_FAILED || status == ORION_HOST_STATUS_RECLAIMED) {
        uint32_t reason = load32(ch->ctrl + ORION_CONTROL_host_reason);
        const char *text = reason_text(reason);
        if (text)
            say(ch->error, sizeof ch->error, "%s channel %d: the host ended this session (%s)", ch->where, ch->index, text);
        else
            say(ch->error, sizeof ch->error, "%s channel %d: the host ended this session (reason %u)", ch->where, ch->index, reason);
        return broken(ch, reason == ORION_HOST_REASON_GPU_HOST_LOST || reason == ORION_HOST_REASON_REPLY_FAILED
                              || reason == ORION_HOST_REASON_GRANT_ENDED
                              ? ORION_E_DEVICE_LOST : ORION_E_PEER_GONE);  /* channel.DEVICE_LOST_REASONS */
    }
    if (status != ORION_HOST_STATUS_SERVING)
        return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host ended this session (it saw the "
                               "channel released: its control words were overwritten); restart this program",
                               ch->where, ch->index));
    double now = now_s();
    if (ch->features & ORION_REGION_FEATURE_HOST_HEARTBEAT) {
        uint64_t beat = load64(ch->ctrl + ORION_CONTROL_host_heartbeat);
        if (beat != ch->worker_seen) {
            ch->worker_seen = beat;
            ch->worker_since = now;
        } else if (now - ch->worker_since > ch->agent_timeout) {
            return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host worker serving this session has "
                                   "shown no heartbeat for %g s; is oriond still running?", ch->where, ch->index,
                                   ch->agent_timeout));
        }
        return ORION_OK;
    }
    uint64_t beat = load64(ch->map + ORION_REGION_AGENT_heartbeat);
    if (load32(ch->map + ORION_REGION_AGENT_state) == ORION_REGION_AGENT_STOPPED)
        return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host agent stopped; restart oriond and "
                               "this program", ch->where, ch->index));
    if (beat != ch->agent_seen) {
        ch->agent_seen = beat;
        ch->agent_since = now;
    } else if (now - ch->agent_since > ch->agent_timeout) {
        return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host agent has shown no heartbeat for "
                               "%g s; is oriond still running?", ch->where, ch->index, ch->agent_timeout));
    }
    return ORION_OK;
}

/* --- waiting (wait.WaitPolicy.wait_for) ------------------------------------------------------------------ */
typedef uint8_t *(*probe_fn)(orion_channel *ch, int *bad);

/* Spin, then sleep with back-off; the host is checked from the sleeping phase every 0.1 s, and `timeout`
 * (< 0: none) bounds the whole wait; the accept wait checks nothing but its timeout (as in Python). Returns the probe's cell, or NULL with ch->error set and *code. */
static uint8_t *wait_for(orion_channel *ch, probe_fn probe, int check, double timeout, const char *what, int *code) {
    int bad = 0;
    ch->sleeping = 0;  /* until this wait's spin is over (probe_in) */
    uint8_t *cell = probe(ch, &bad);
    if (cell && !bad) { /* there at once: no wait to time, and the peer is active */
        ch->busy = 1;
        return cell;
    }
    double start = now_s();
    if (bad) goto done;
    double spin_until = start + (ch->busy ? BUSY_SPIN_S : SPIN_S);
    for (;;) {
        for (int i = 0; i < 64; i++) {
            cell = probe(ch, &bad);
            if (cell || bad) goto done;
            cpu_relax();
        }
        if (now_s() >= spin_until) break;
    }
    double sleep = MIN_SLEEP_S, next_check = start;
    ch->sleeping = 1;
    for (;;) {
        cell = probe(ch, &bad);
        if (cell || bad) break;
        double t = now_s();
        if (t >= next_check) {
            int rc = check ? check_host(ch) : ORION_OK;
            if (rc) { *code = rc; return NULL; }
            if (timeout >= 0 && t - start > timeout) {
                *code = FAIL(ch, ORION_E_PEER_GONE, "no answer from %s within %g s", what, timeout);
                return NULL;
            }
            next_check = t + CHECK_EVERY_S;
        }
        sleep_s(sleep);
        sleep = sleep * 2 < MAX_SLEEP_S ? sleep * 2 : MAX_SLEEP_S;
    }
done:
    /* Endpoint._wait: a wait that ended within the busy spin, in whichever phase, means the peer is active. */
    ch->busy = now_s() - start < BUSY_SPIN_S;
    if (bad == 2) {
        *code = ch->broken;
        return NULL;
    }
    if (bad) {
        *code = broken(ch, FAIL(ch, ORION_E_PROTOCOL, "%s channel %d: waiting for %s: its head and tail are further "
                                "apart than it has cells; the peer broke the protocol", ch->where, ch->index, what));
        return NULL;
    }
    return cell;
}

static uint8_t *probe_in(orion_channel *ch, int *bad) { return spsc_readable(&ch->in, bad, ch->sleeping); }

static uint8_t *probe_accept(orion_channel *ch, int *bad) {
    (void)bad;
    if (load32(ch->ctrl + ORION_CONTROL_host_gen) == ch->generation &&
        load32(ch->ctrl + ORION_CONTROL_host_status) != ORION_HOST_STATUS_IDLE)
        return ch->ctrl;
    return NULL;
}

/* --- records ---------------------------------------------------------------------------------------------- */
static void async_keep(orion_channel *ch, const record_header *r) {
    if (ch->async_count == ASYNC_KEEP) { ch->async_dropped++; return; }
    async_error *e = &ch->async_q[(ch->async_head + ch->async_count++) % ASYNC_KEEP];
    e->call_id = r->call_id;
    e->opcode = r->opcode;
    e->status = r->status;
}

static size_t smaller(size_t a, size_t b) { return a < b ? a : b; }

/* A reply's bytes out of the staging chunks into the program's memory. From BULK_COPY bytes on x86-64, with
 * non-temporal stores: a large copy's destination is not read again soon, so writing past the caches spares each
 * line's read for ownership. Measured (1 MiB chunks over 256 MiB, docs/performance.md): out of chunks 1.4x (CI
 * machine) to 1.8x (the GPU machine) memcpy's rate; into chunks 0.9x, so a request's bytes keep memcpy. The stores
 * are fenced before the caller reads on or hands the chunk back. */
#define BULK_COPY (64u << 10)
static void bulk_copy(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
    if (n >= BULK_COPY) {
        uint8_t *d = dst;
        const uint8_t *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head, s += head, n -= head;
        for (; n >= 64; n -= 64, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        memcpy(d, s, n);
        _mm_sfence();
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* Copy `n` payload bytes that start at payload offset `at` into the parts of head and tail they fall in; what
 * lies beyond head_cap + tail_cap is dropped (orion_callv then reports ORION_E_TOO_LARGE). */
static void deliver_at(const reply_dest *d, size_t at, const uint8_t *src, size_t n) {
    if (at < d->head_cap) {
        size_t take = smaller(n, d->head_cap - at);
        bulk_copy((uint8_t *)d->head + at, src, take);
        at += take;
        src += take;
        n -= take;
    }
    if (n == 0) return;
    size_t in_tail = at - d->head_cap;  /* at >= head_cap here */
    if (in_tail < d->tail_cap) bulk_copy((uint8_t *)d->tail + in_tail, src, smaller(n, d->tail_cap - in_tail));
}

/* Half of a chunk's delivery (copy_helper.c runs one half on a second core). */
typedef struct { const reply_dest *dest; size_t at; const uint8_t *src; size_t n; } delivery;
static void deliver_half(void *job) {
    const delivery *d = job;
    deliver_at(d->dest, d->at, d->src, d->n);
}

/* Where a chunk of `n` bytes is split between two cores: a cache-line boundary near its middle. */
static size_t half_of(size_t n) { return (n / 2) & ~(size_t)63; }

/* Whether a staged transfer of `length` bytes through chunks of `chunk` bytes takes the copy helper: its chunks are
 * split (ORION_COPY_SPLIT_MIN or more) and the helper is free; release it after the transfer. */
static int helper_for(size_t length, size_t chunk) {
    return length >= ORION_COPY_SPLIT_MIN && chunk >= ORION_COPY_SPLIT_MIN && orion_copy_helper_claim();
}

static uint8_t *probe_in_chunk(orion_channel *ch, int *bad) { return spsc_readable(&ch->in_st, bad, 1); }

/* Take a staged payload of `length` bytes chunk by chunk (channel.Endpoint._stream_in), into `dest` when there is
 * one, else dropped: either way every chunk is released, so the chunk stream stays in step with the records. A
 * large chunk is copied out by two cores, when the copy helper is free (copy_helper.h); it is released once both
 * halves are done. */
static int stream_in(orion_channel *ch, size_t length, const reply_dest *dest) {
    size_t size = ch->in_st.cell;
    int helped = dest && helper_for(length, size);
    int code = ORION_OK;
    for (size_t at = 0; at < length; at += size) {
        int bad = 0;
        uint8_t *chunk = spsc_readable(&ch->in_st, &bad, 1);
        if (!chunk) {
            chunk = wait_for(ch, probe_in_chunk, 1, -1, "the next chunk on the completion staging arena", &code);
            if (!chunk) break;
        }
        size_t n = smaller(length - at, size);
        if (helped && n >= ORION_COPY_SPLIT_MIN) {
            size_t half = half_of(n);
            delivery mine = { dest, at, chunk, half }, theirs = { dest, at + half, chunk + half, n - half };
            orion_copy_halves(deliver_half, &mine, &theirs);
        } else if (dest) {
            deliver_at(dest, at, chunk, n);
        }
        spsc_release(&ch->in_st);
    }
    if (helped) orion_copy_helper_release();
    return code;
}

/* Known flags, an opcode in range, and a length its slot holds (inline) or the wire allows (staged:
 * checked before any chunk is touched, as record.check_header does). */
static int well_formed(const orion_channel *ch, const record_header *r) {
    if ((r->flags & ~ORION_WIRE_KNOWN_FLAGS) || r->opcode > ORION_WIRE_MAX_OPCODE) return 0;
    if (r->flags & ORION_FLAG_STAGED) return r->length <= ORION_MAX_PAYLOAD;
    return r->length <= ch->capacity;
}

/* Take the next completion (waiting for one when `wait`). *got says it is a reply of this generation; its payload
 * goes to `out` when it is the one `want` names (0: none), async errors are kept, anything else is dropped. */
static int receive(orion_channel *ch, int wait, uint64_t want, record_header *r, const reply_dest *out, int *got) {
    int code = ORION_OK, bad = 0;
    *got = 0;
    /* a look without a wait (the async errors after a call, room for a send) sees a record by its mark alone: a read
     * of the tail's line here, after every call, would make the host's next tail store, and the mark of the next
     * reply after it, wait for our copy's invalidation */
    uint8_t *cell = spsc_readable(&ch->in, &bad, 0);
    if (!cell && !bad && !wait) return ORION_OK;
    if (!cell) {
        cell = wait_for(ch, probe_in, 1, -1, "a record on the completion ring", &code);
        if (!cell) return code;
    }
    memcpy(&r->call_id, cell + ORION_RECORD_call_id, sizeof r->call_id);
    r->opcode = rd32(cell + ORION_RECORD_opcode); r->flags = rd32(cell + ORION_RECORD_flags);
    r->length = rd32(cell + ORION_RECORD_length); r->generation = rd32(cell + ORION_RECORD_generation);
    memcpy(&r->status, cell + ORION_RECORD_status, sizeof r->status); r->seq = rd32(cell + ORION_RECORD_seq);
    if (!well_formed(ch, r)) {
        spsc_release(&ch->in);
        return broken(ch, FAIL(ch, ORION_E_PROTOCOL, "%s channel %d: completion %llu (flags %#x, %u bytes) is "
                               "malformed", ch->where, ch->index, (unsigned long long)r->call_id, r->flags,
                               r->length));
    }
    int ours = r->generation == ch->generation;  /* else left over from an earlier owner: never delivered */
    if (ours && (r->flags & ORION_FLAG_ASYNC_ERROR)) async_keep(ch, r);
    *got = ours && !(r->flags & ORION_FLAG_ASYNC_ERROR);
    const reply_dest *dest = *got && want && r->call_id == want ? out : NULL;
    if (!(r->flags & ORION_FLAG_STAGED)) {
        if (dest && r->length) deliver_at(dest, 0, cell + ORION_RECORD_SIZE, r->length);
        spsc_release(&ch->in);
        return ORION_OK;
    }
    spsc_release(&ch->in);  /* a staged record's slot holds no payload: the host may reuse it meanwhile */
    return stream_in(ch, r->length, dest);
}

/* Move waiting completions aside (async errors kept) so a full request ring or arena never deadlocks the host.
 * The reply to the call in flight, should the host answer before taking all of a staged request, is kept. */
static void drain_completions(orion_channel *ch) {
    record_header r;
    int got;
    while (receive(ch, 0, ch->call_id, &r, ch->call_dest, &got) == ORION_OK && got) {
        if (ch->call_id && r.call_id == ch->call_id) {
            ch->answer = r;
            ch->answered = 1;
        }
    }
}

/* The next free cell of `r`, draining completions once when it is full; *bad = 2 when the drain broke the channel. */
static uint8_t *room_or_drain(orion_channel *ch, spsc *r, int *bad) {
    uint8_t *cell = spsc_writable(r, bad);
    if (cell || *bad) return cell;
    drain_completions(ch);
    if (ch->broken) { *bad = 2; return NULL; }  /* the drain met a broken record: already reported */
    return spsc_writable(r, bad);
}

static uint8_t *probe_out_or_drain(orion_channel *ch, int *bad) { return room_or_drain(ch, &ch->out, bad); }
static uint8_t *probe_chunk_or_drain(orion_channel *ch, int *bad) { return room_or_drain(ch, &ch->out_st, bad); }

/* A free cell of `r` now, or after a bounded wait (host checked, completions drained); NULL with *code. */
static uint8_t *wait_room(orion_channel *ch, spsc *r, probe_fn probe, const char *what, int *code) {
    int bad = 0;
    uint8_t *cell = spsc_writable(r, &bad);
    if (cell) return cell;
    cell = wait_for(ch, probe, 1, -1, what, code);  /* impossible indices: its first probe reports them */
    if (!cell && ch->broken) *code = ch->broken;
    return cell;
}

/* Walks the request's pieces in step with where their bytes go (a slot's payload, then chunk after chunk), so a
 * request in pieces is copied once, from where it lies. */
typedef struct { const struct orion_piece *parts; int index; size_t at; } piece_cursor;

/* Copy the next `n` bytes of the pieces to `to`; the caller never asks for more than the pieces hold. */
static void cursor_copy(piece_cursor *c, uint8_t *to, size_t n) {
    while (n) {
        const struct orion_piece *p = &c->parts[c->index];
        size_t take = smaller(p->len - c->at, n);
        if (take) memcpy(to, (const uint8_t *)p->data + c->at, take);
        to += take;
        n -= take;
        c->at += take;
        if (c->at == p->len) { c->index++; c->at = 0; }
    }
}

/* Advance the cursor by `n` bytes without copying them. */
static void cursor_skip(piece_cursor *c, size_t n) {
    while (n) {
        size_t take = smaller(c->parts[c->index].len - c->at, n);
        n -= take;
        c->at += take;
        if (c->at == c->parts[c->index].len) { c->index++; c->at = 0; }
    }
}

/* Half of a chunk's filling (copy_helper.c runs one half on a second core). */
typedef struct { piece_cursor from; uint8_t *to; size_t n; } filling;
static void fill_half(void *job) {
    filling *f = job;
    cursor_copy(&f->from, f->to, f->n);
}

/* Stream `len` bytes from the pieces through the request staging arena, one chunk at a time, in order
 * (channel.Endpoint._stream_out). A large chunk is filled by two cores, when the copy helper is free
 * (copy_helper.h); it is published once both halves are done. */
static int stream_out(orion_channel *ch, piece_cursor *from, size_t len) {
    size_t size = ch->out_st.cell;
    int helped = helper_for(len, size);
    int code = ORION_OK;
    for (size_t at = 0; at < len; at += size) {
        uint8_t *chunk = wait_room(ch, &ch->out_st, probe_chunk_or_drain, "a free chunk in the request staging "
                                   "arena", &code);
        if (!chunk) break;
        size_t n = smaller(len - at, size);
        if (helped && n >= ORION_COPY_SPLIT_MIN) {
            size_t half = half_of(n);
            filling mine = { *from, chunk, half }, theirs = { *from, chunk + half, n - half };
            cursor_skip(&theirs.from, half);
            orion_copy_halves(fill_half, &mine, &theirs);
            *from = theirs.from;
        } else {
            cursor_copy(from, chunk, n);
        }
        spsc_publish(&ch->out_st);
    }
    if (helped) orion_copy_helper_release();
    return code;
}

/* The six u32 words after the call id, in the cell's order, as one copy. */
_Static_assert(ORION_RECORD_flags == ORION_RECORD_opcode + 4 && ORION_RECORD_length == ORION_RECORD_flags + 4 &&
               ORION_RECORD_generation == ORION_RECORD_length + 4 &&
               ORION_RECORD_status == ORION_RECORD_generation + 4 && ORION_RECORD_seq == ORION_RECORD_status + 4 &&
               ORION_RECORD_SIZE == ORION_RECORD_seq + 4,
               "record.HEADER: after the call id come opcode, flags, length, generation, status, seq (u32 each)");

/* HELLO's protocol and pid are copied as one pair of u32 words; a length before a variable field is a u32. */
_Static_assert(ORION_HELLO_REQ_pid == ORION_HELLO_REQ_protocol + 4 && ORION_HELLO_REQ_SIZE == ORION_HELLO_REQ_pid + 4,
               "record.HELLO_REQUEST: protocol and pid are not its two leading u32 words");
_Static_assert(ORION_LENGTH_BYTES == sizeof(uint32_t), "codec.LENGTH is not a u32");

static void write_header(uint8_t *cell, uint64_t call_id, uint32_t opcode, uint32_t flags, uint32_t length,
                         uint32_t generation) {
    uint32_t words[6] = { opcode, flags, length, generation, 0, 0 };  /* status 0, seq 0 until published */
    memcpy(cell + ORION_RECORD_call_id, &call_id, sizeof call_id);
    memcpy(cell + ORION_RECORD_opcode, words, sizeof words);
}

/* Publish one record (channel.Endpoint.send): inline when the payload fits its slot, else staged: the record
 * (flag STAGED, length = payload size, no inline payload) first, so the host starts on the chunks while we fill
 * the next ones, then the payload through the arena. `len` <= ORION_MAX_PAYLOAD (usable() checked it). */
static int send_record(orion_channel *ch, uint64_t call_id, uint32_t opcode, uint32_t flags,
                       const struct orion_piece *parts, size_t len) {
    int code = ORION_OK;
    uint8_t *cell = wait_room(ch, &ch->out, probe_out_or_drain, "room in the request ring", &code);
    if (!cell) return code;
    piece_cursor from = { parts, 0, 0 };
    if (len <= ch->capacity) {
        write_header(cell, call_id, opcode, flags, (uint32_t)len, ch->generation);
        cursor_copy(&from, cell + ORION_RECORD_SIZE, len);
        spsc_publish(&ch->out);
        return ORION_OK;
    }
    write_header(cell, call_id, opcode, flags | ORION_FLAG_STAGED, (uint32_t)len, ch->generation);
    spsc_publish(&ch->out);
    return stream_out(ch, &from, len);
}

/* The payload's size, or an error when the channel cannot send, an argument is bad or the payload is beyond
 * ORION_MAX_PAYLOAD (the sum is checked piece by piece, so lengths that would wrap around are refused too). */
static int usable(orion_channel *ch, uint32_t opcode, const struct orion_piece *parts, int nparts, size_t *len) {
    if (ch->broken) return ch->broken;
    if (ch->fd < 0) return FAIL(ch, ORION_E_CLOSED, "%s: this channel was released; open another", ch->where);
    if (opcode > ORION_WIRE_MAX_OPCODE || nparts < 0 || (nparts > 0 && parts == NULL))
        return FAIL(ch, ORION_E_ARG, "opcode %#x beyond %#x, or no pieces for a request of %d", opcode,
                    ORION_WIRE_MAX_OPCODE, nparts);
    *len = 0;
    for (int i = 0; i < nparts; i++) {
        if (parts[i].len && parts[i].data == NULL) return FAIL(ch, ORION_E_ARG, "a NULL payload piece");
        if (parts[i].len > ORION_MAX_PAYLOAD - *len)
            return FAIL(ch, ORION_E_TOO_LARGE, "%s channel %d: a request payload beyond the %zu-byte record limit; "
                        "split it", ch->where, ch->index, ORION_MAX_PAYLOAD);
        *len += parts[i].len;
    }
    return ORION_OK;
}

/* The reply to call `id` (drained early, or the next record that names it); its payload already lies in `dest`. */
static int await_reply(orion_channel *ch, uint64_t id, const reply_dest *dest, record_header *r) {
    if (ch->answered) {
        *r = ch->answer;
        return ORION_OK;
    }
    for (;;) {
        int got;
        int rc = receive(ch, 1, id, r, dest, &got);
        if (rc) return rc;
        if (got && r->call_id == id) return ORION_OK;  /* an earlier call's reply cannot be pending: calls wait */
    }
}

/* --- the API ------------------------------------------------------------------------------------------------ */
int orion_callv(orion_channel *ch, uint32_t opcode, const struct orion_piece *req, int nreq, int32_t *status,
                void *reply, size_t cap, void *tail, size_t tail_cap, size_t *reply_len) {
    if (ch == NULL) return ORION_E_ARG;
    size_t len;
    int rc = usable(ch, opcode, req, nreq, &len);
    if (rc) return rc;
    uint64_t id = ch->next_id++;
    reply_dest dest = { reply, reply ? cap : 0, tail, tail ? tail_cap : 0 };
    ch->call_id = id;
    ch->call_dest = &dest;
    ch->answered = 0;
    record_header r;
    rc = send_record(ch, id, opcode, 0, req, len);
    if (rc == ORION_OK) rc = await_reply(ch, id, &dest, &r);
    ch->call_id = 0;
    ch->call_dest = NULL;
    if (rc) return rc;
    if (status) *status = r.status;
    if (reply_len) *reply_len = r.length;
    if (r.length > dest.head_cap + dest.tail_cap)  /* its chunks were consumed: the channel goes on */
        return FAIL(ch, ORION_E_TOO_LARGE, "%s channel %d: a reply of %u bytes does not fit the %zu-byte buffer",
                    ch->where, ch->index, r.length, dest.head_cap + dest.tail_cap);
    return ORION_OK;
}

int orion_call(orion_channel *ch, uint32_t opcode, const void *req, size_t len, int32_t *status, void *reply,
               size_t cap, size_t *reply_len) {
    struct orion_piece piece = { req, len };
    return orion_callv(ch, opcode, &piece, 1, status, reply, cap, NULL, 0, reply_len);
}

int orion_postv(orion_channel *ch, uint32_t opcode, const struct orion_piece *req, int nreq) {
    if (ch == NULL) return ORION_E_ARG;
    size_t len;
    int rc = usable(ch, opcode, req, nreq, &len);
    if (rc) return rc;
    return send_record(ch, ch->next_id++, opcode, ORION_FLAG_NO_REPLY, req, len);
}

int orion_post(orion_channel *ch, uint32_t opcode, const void *req, size_t len) {
    struct orion_piece piece = { req, len };
    return orion_postv(ch, opcode, &piece, 1);
}

int orion_hello(orion_channel *ch, const char *calls, uint64_t *session) {
    if (ch == NULL) return ORION_E_ARG;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    if (calls == NULL) calls = "";
    size_t hl = strlen(host), cl = strlen(calls);
    /* record.HELLO_REQUEST: protocol, pid, then hostname and calls, each a u32 length and its bytes; HELLO_REPLY:
     * session, then agent (a u32 length and its bytes) */
    enum { HOSTNAME = ORION_HELLO_REQ_hostname, AGENT = ORION_HELLO_REP_agent, LENGTH = ORION_LENGTH_BYTES };
    size_t len = HOSTNAME + LENGTH + hl + LENGTH + cl;
    if (len > ch->capacity)
        return FAIL(ch, ORION_E_TOO_LARGE, "HELLO of %zu bytes exceeds the %u-byte inline capacity", len,
                    ch->capacity);
    uint8_t *req = malloc(2 * (size_t)ch->capacity), *reply = req ? req + ch->capacity : NULL;  /* not the stack */
    if (req == NULL) return FAIL(ch, ORION_E_SYSTEM, "HELLO: out of memory");
    uint32_t words[2] = { ORION_WIRE_PROTOCOL, (uint32_t)getpid() }, n;  /* protocol, pid */
    memcpy(req + ORION_HELLO_REQ_protocol, words, sizeof words);
    n = (uint32_t)hl; memcpy(req + HOSTNAME, &n, LENGTH); memcpy(req + HOSTNAME + LENGTH, host, hl);
    n = (uint32_t)cl; memcpy(req + HOSTNAME + LENGTH + hl, &n, LENGTH);  /* calls: after the hostname's bytes */
    memcpy(req + HOSTNAME + 2 * LENGTH + hl, calls, cl);
    int32_t status = 0;
    size_t got = 0;
    int rc = orion_call(ch, ORION_WIRE_OP_HELLO, req, len, &status, reply, ch->capacity, &got);
    if (rc == ORION_OK && status != 0) {
        int shown = (int)(got < 300 ? got : 300);
        /* an agent of protocol 2 refuses a slot's publish mark as a malformed record */
        const char *older = status == ORION_WIRE_STATUS_MALFORMED ? ORION_WIRE_OLDER_AGENT : "";
        if (shown)
            rc = FAIL(ch, ORION_E_REFUSED, "%s: the host agent refused this client: %.*s%s", ch->where, shown,
                      (const char *)reply, older);
        else
            rc = FAIL(ch, ORION_E_REFUSED, "%s: the host agent refused this client: status %d%s", ch->where, status,
                      older);
    } else if (rc == ORION_OK && (got < AGENT + LENGTH || AGENT + LENGTH + (size_t)rd32(reply + AGENT) != got)) {
        rc = FAIL(ch, ORION_E_PROTOCOL, "%s: malformed HELLO reply of %zu bytes", ch->where, got);
    } else if (rc == ORION_OK && session) {
        *session = rd64(reply + ORION_HELLO_REP_session);
    }
    free(req);
    return rc;
}

int orion_take_async_error(orion_channel *ch, uint64_t *call_id, uint32_t *opcode, int32_t *status) {
    if (ch == NULL) return 0;
    if (ch->async_count == 0 && !ch->broken && ch->fd >= 0) {  /* pick up what already arrived */
        record_header r;
        int got;
        while (receive(ch, 0, 0, &r, NULL, &got) == ORION_OK && got) {}
    }
    if (ch->async_count == 0) return 0;
    async_error *e = &ch->async_q[ch->async_head];
    ch->async_head = (ch->async_head + 1) % ASYNC_KEEP;
    ch->async_count--;
    if (call_id) *call_id = e->call_id;
    if (opcode) *opcode = e->opcode;
    if (status) *status = e->status;
    return 1;
}

uint64_t orion_last_call_id(const orion_channel *ch) { return ch && ch->next_id ? ch->next_id - 1 : 0; }
uint64_t orion_async_dropped(const orion_channel *ch) { return ch ? ch->async_dropped : 0; }
const char *orion_error(const orion_channel *ch) { return ch ? ch->error : "no channel"; }
int orion_channel_index(const orion_channel *ch) { return ch ? ch->index : -1; }
uint32_t orion_generation(const orion_channel *ch) { return ch ? ch->generation : 0; }
size_t orion_inline_capacity(const orion_channel *ch) { return ch ? ch->capacity : 0; }

/* --- opening and claiming ------------------------------------------------------------------------------------ */
static int open_region_file(const char *path, char *err, size_t el) {
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            say(err, el, "%s does not exist; create it with 'orion-shm create -i N'", path);
        else if (errno == ELOOP)
            say(err, el, "%s is a symbolic link; a region must be a regular file (remove the link and create the "
                "region with 'orion-shm create')", path);
        else
            say(err, el, "cannot open %s: %s; run as root or as the region's owner (see 'orion-shm inspect')",
                path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        say(err, el, "%s is not a regular file; remove it and create the region with 'orion-shm create'", path);
        return -1;
    }
    return fd;
}

/* A QEMU guest's region: BAR2 of the ivshmem-plain PCI device `bdf` (1af4:1110), enabled and mapped from sysfs
 * `resource2`, as ivshmem/region.py's Region.open_pci does (no guest kernel driver). Its channel locks live in a
 * file of GUEST_LOCK_DIR named after the device, shared by every process of the guest (mode 0666: any of them may
 * take a channel). Returns the resource's descriptor and sets *lock_fd, or -1 with the reason in err. */
static int open_region_pci(const char *bdf, int *lock_fd, char *err, size_t el) {
#if !defined(__x86_64__)
    (void)bdf; (void)lock_fd;
    say(err, el, "the Orion rings rely on x86-64 memory ordering; this machine is not x86-64");
    return -1;
#else
    char path[256];
    if (strchr(bdf, '/') || strlen(bdf) > 64) {
        say(err, el, "ORION_SHM=%s is neither a region file (an absolute path) nor a PCI address such as "
            "0000:00:04.0", bdf);
        return -1;
    }
    snprintf(path, sizeof path, PCI_ROOT "/%s/enable", bdf);
    int enable = open(path, O_WRONLY | O_CLOEXEC);
    if (enable >= 0) {  /* already enabled, or a kernel that does not need it: mapping tells us for sure */
        if (write(enable, "1", 1) < 0) { /* ignored, as region.py does */ }
        close(enable);
    }
    snprintf(path, sizeof path, PCI_ROOT "/%s/resource2", bdf);
    int fd = open(path, O_RDWR | O_SYNC | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            say(err, el, "no ivshmem PCI device at %s; attach a region to this guest on the host (docs/kvm.md)", bdf);
        else
            say(err, el, "ivshmem %s: cannot open %s: %s; run as root or give the user read/write access to it", bdf,
                path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, GUEST_LOCK_DIR "/orion-lock-%s", bdf);
    *lock_fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (*lock_fd < 0) {
        say(err, el, "ivshmem %s: cannot open its lock file %s: %s", bdf, path, strerror(errno));
        close(fd);
        return -1;
    }
    (void)fchmod(*lock_fd, 0666);  /* our umask may have narrowed it; only its creator can widen it */
    return fd;
#endif
}

static int is_ivshmem(const char *dev) {
    char path[512], id[16] = "";
    const char *files[2] = {"vendor", "device"}, *want[2] = {IVSHMEM_VENDOR, IVSHMEM_DEVICE};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, PCI_ROOT "/%s/%s", dev, files[i]);
        FILE *f = fopen(path, "re");
        if (!f) return 0;
        int ok = fgets(id, sizeof id, f) != NULL;
        fclose(f);
        id[strcspn(id, "\n")] = 0;
        if (!ok || strcmp(id, want[i]) != 0) return 0;
    }
    return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int orion_discover(char *out, size_t len) {
    struct dirent **names;
    int n = scandir(PCI_ROOT, &names, NULL, by_name), found = 0;
    for (int i = 0; i < n; i++) {
        if (!found && names[i]->d_name[0] != '.' && is_ivshmem(names[i]->d_name)) {
            snprintf(out, len, "%s", names[i]->d_name);
            found = 1;
        }
        free(names[i]);
    }
    if (n >= 0) free(names);
    if (found) return 1;
    long best = -1;
    DIR *dir = opendir(SHM_DIR);
    struct dirent *entry;
    while (dir && (entry = readdir(dir)) != NULL) {  /* orionsock<N>, N in canonical decimal: the lowest */
        const char *digits = entry->d_name + strlen(SHM_PREFIX);
        if (strncmp(entry->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0 || !*digits || strlen(digits) > 9 ||
            (digits[0] == '0' && digits[1]) || strspn(digits, "0123456789") != strlen(digits))
            continue;
        long index = strtol(digits, NULL, 10);
        if (best < 0 || index < best) best = index;
    }
    if (dir) closedir(dir);
    if (best < 0) return 0;
    snprintf(out, len, SHM_DIR "/" SHM_PREFIX "%ld", best);
    return 1;
}

/* The agent's state word, trusting a moving heartbeat over a stray write (channel._agent_state). */
static uint32_t agent_state(const uint8_t *map) {
    uint64_t beat = load64(map + ORION_REGION_AGENT_heartbeat);
    uint32_t state = load32(map + ORION_REGION_AGENT_state);
    double deadline = now_s() + AGENT_SETTLE_S;
    while (state != ORION_REGION_AGENT_SERVING && now_s() < deadline) {
        sleep_s(0.02);
        state = load32(map + ORION_REGION_AGENT_state);
        if (load64(map + ORION_REGION_AGENT_heartbeat) != beat) return ORION_REGION_AGENT_SERVING;
    }
    return state;
}

static int try_lock(int fd, uint64_t offset) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)offset;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 1;
    return (errno == EAGAIN || errno == EACCES) ? 0 : -1;
}

static void *beat(void *arg) {
    orion_channel *ch = arg;
    pthread_mutex_lock(&ch->beat_lock);
    while (!ch->beat_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(HEARTBEAT_PERIOD_S * 1e9);
        if (until.tv_nsec >= 1000000000L) { until.tv_sec += 1; until.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&ch->beat_wake, &ch->beat_lock, &until);
        if (!ch->beat_stop)
            store64(ch->ctrl + ORION_CONTROL_client_heartbeat, load64(ch->ctrl + ORION_CONTROL_client_heartbeat) + 1);
    }
    pthread_mutex_unlock(&ch->beat_lock);
    return NULL;
}

static int start_heartbeat(orion_channel *ch) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&ch->beat_wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&ch->beat_lock, NULL);
    ch->beating = pthread_create(&ch->beat_thread, NULL, beat, ch) == 0;
    return ch->beating;
}

static void stop_heartbeat(orion_channel *ch) {
    if (!ch->beating) return;
    pthread_mutex_lock(&ch->beat_lock);
    ch->beat_stop = 1;
    pthread_cond_signal(&ch->beat_wake);
    pthread_mutex_unlock(&ch->beat_lock);
    pthread_join(ch->beat_thread, NULL);
    ch->beating = 0;
}

static void release_region(orion_channel *ch) {
    stop_heartbeat(ch);
    if (ch->map) munmap(ch->map, ch->size);
    if (ch->lock_fd >= 0) close(ch->lock_fd);
    if (ch->fd >= 0) close(ch->fd);
    ch->map = NULL;
    ch->lock_fd = ch->fd = -1;
}

int orion_open_ex(const char *path, double accept_timeout, double agent_timeout, orion_channel **out, char *err,
                  size_t el) {
    if (out) *out = NULL;
    if (path == NULL || out == NULL) {
        say(err, el, "orion_open: path and channel must not be NULL");
        return ORION_E_ARG;
    }
    orion_channel *ch = calloc(1, sizeof *ch);
    if (ch == NULL) {
        say(err, el, "orion_open: out of memory");
        return ORION_E_SYSTEM;
    }
    ch->fd = ch->lock_fd = -1;
    ch->index = -1;
    snprintf(ch->where, sizeof ch->where, "%s", path);
    ch->agent_timeout = agent_timeout;
    int rc = ORION_E_REGION;
    int pci = path[0] != '/';
    if (pci) snprintf(ch->where, sizeof ch->where, "ivshmem %s", path);
    ch->fd = pci ? open_region_pci(path, &ch->lock_fd, err, el) : open_region_file(path, err, el);
    if (ch->fd < 0) goto fail;
    path = ch->where;  /* what every later message names */
    struct stat st;
    if (fstat(ch->fd, &st) != 0 || (size_t)st.st_size < ORION_REGION_HEADER_SIZE) {
        say(err, el, "%s: %lld bytes is too small to be an Orion region; recreate it with 'orion-shm create'",
            path, (long long)st.st_size);
        goto fail;
    }
    ch->size = (size_t)st.st_size;
    void *map = mmap(NULL, ch->size, PROT_READ | PROT_WRITE, MAP_SHARED, ch->fd, 0);
    if (map == MAP_FAILED) {
        say(err, el, "%s: cannot map %zu bytes: %s", path, ch->size, strerror(errno));
        goto fail;
    }
    ch->map = map;
    geometry g;
    rc = check_header(ch->map, ch->size, path, &g, err, el);
    if (rc) goto fail;
    ch->features = g.features;
    ch->slot_size = g.slot;
    ch->capacity = g.slot - ORION_RECORD_SIZE;
    uint32_t state = agent_state(ch->map);
    if (state != ORION_REGION_AGENT_SERVING) {
        say(err, el, "%s: no host agent is serving this region (%s); start oriond on the host", path,
            state == ORION_REGION_AGENT_STOPPED ? "it stopped" : "it was never served");
        rc = ORION_E_PEER_GONE;
        goto fail;
    }
    /* Our own open file description (a lock never conflicts with its own), so two opens take two channels. */
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", ch->fd);
    if (!pci) ch->lock_fd = open(self, O_RDWR | O_CLOEXEC);
    if (ch->lock_fd < 0) {
        say(err, el, "%s: cannot reopen the region for its lock: %s", path, strerror(errno));
        rc = ORION_E_SYSTEM;
        goto fail;
    }
    for (uint32_t i = 0; i < g.channels && ch->index < 0; i++) {
        int got = try_lock(ch->lock_fd, g.channel_offset + (uint64_t)i * g.channel_stride);
        if (got < 0) {
            say(err, el, "%s: cannot lock channel %u: %s", path, i, strerror(errno));
            rc = ORION_E_SYSTEM;
            goto fail;
        }
        if (got) ch->index = (int)i;
    }
    if (ch->index < 0) {
        say(err, el, "%s: all %u channels are in use by live processes; end one, or create the region with more "
            "channels", path, g.channels);
        rc = ORION_E_NO_CHANNEL;
        goto fail;
    }
    uint8_t *base = ch->map + g.channel_offset + (uint64_t)ch->index * g.channel_stride;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14; older kernels refuse it and the first pass stays slower */
#endif
    (void)madvise(base, g.channel_stride, MADV_POPULATE_WRITE);  /* Region.prefault */
    ch->ctrl = base + g.o_ctrl;
    /* spsc_* use the ring's head and tail words for a staging arena too: they lie at the same places */
    _Static_assert(ORION_STAGING_head == ORION_RING_head && ORION_STAGING_tail == ORION_RING_tail,
                   "layout.py: a staging arena's head and tail are not where a ring's are");
    spsc_init(&ch->out, base + g.o_req, ORION_RING_slots, g.slot, g.entries);
    spsc_init(&ch->in, base + g.o_cpl, ORION_RING_slots, g.slot, g.entries);
    spsc_init(&ch->out_st, base + g.o_reqst, ORION_STAGING_chunks, g.chunk, g.chunks);
    spsc_init(&ch->in_st, base + g.o_cplst, ORION_STAGING_chunks, g.chunk, g.chunks);
    ch->next_id = 1;
    ch->agent_seen = load64(ch->map + ORION_REGION_AGENT_heartbeat);
    ch->agent_since = now_s();

    /* ClientChannel._accept, word for word: reset the indices we own (request ring and staging tails,
     * completion ring and staging heads), then pid, liveness, heartbeat, active, and the generation last. */
    uint8_t *c = ch->ctrl;
    for (uint32_t k = 0; k < g.entries; k++)  /* Ring.reset_owned: our slots' marks, then our tail */
        store32(base + g.o_req + ORION_RING_slots + (size_t)k * g.slot + ORION_RECORD_seq, 0);
    store32(base + g.o_req + ORION_RING_tail, 0);
    store32(base + g.o_reqst + ORION_STAGING_tail, 0);
    store32(base + g.o_cpl + ORION_RING_head, 0);
    store32(base + g.o_cplst + ORION_STAGING_head, 0);
    store32(c + ORION_CONTROL_client_pid, (uint32_t)getpid());
    store32(c + ORION_CONTROL_liveness, pci ? ORION_LIVENESS_HEARTBEAT_MODE : ORION_LIVENESS_LOCK_MODE);
    store64(c + ORION_CONTROL_client_heartbeat, 0);
    if (pci && !start_heartbeat(ch)) {
        say(err, el, "%s: cannot start the heartbeat thread: %s", path, strerror(errno));
        rc = ORION_E_SYSTEM;
        goto fail;
    }
    store32(c + ORION_CONTROL_client_active, 1);
    uint32_t generation = load32(c + ORION_CONTROL_client_gen) + 1;
    if (generation == 0) generation = 1;
    ch->generation = generation;
    store32(c + ORION_CONTROL_client_gen, generation);  /* published last: the host acts on it */
    int code = ORION_OK;
    if (!wait_for(ch, probe_accept, 0, accept_timeout, "the host agent", &code)) {
        ch->broken = 0;
        store32(c + ORION_CONTROL_client_active, 0);
        say(err, el, "%s channel %d: the host agent did not accept the channel (%s); check that oriond is running "
            "and serves this region", path, ch->index, ch->error);
        rc = ORION_E_PEER_GONE;
        goto fail;
    }
    ch->worker_seen = load64(c + ORION_CONTROL_host_heartbeat);
    ch->worker_since = now_s();
    code = check_host(ch);
    if (code) {
        store32(c + ORION_CONTROL_client_active, 0);
        say(err, el, "%s channel %d: the host agent did not accept the channel (%s); check that oriond is running "
            "and serves this region", path, ch->index, ch->error);
        rc = ORION_E_PEER_GONE;
        goto fail;
    }
    /* resync: the private copies of our indices from shared memory (both zero after the accept) */
    ch->out.own = load32(ch->out.base + ORION_RING_tail);
    ch->out.seen = load32(ch->out.base + ORION_RING_head);
    ch->out.marked = ch->in.marked = 1;
    ch->in.own = load32(ch->in.base + ORION_RING_head);
    ch->out_st.own = load32(ch->out_st.base + ORION_STAGING_tail);
    ch->in_st.own = load32(ch->in_st.base + ORION_STAGING_head);
    ch->busy = 0;
    *out = ch;
    return ORION_OK;
fail:
    release_region(ch);
    free(ch);
    return rc;
}

int orion_open(const char *path, orion_channel **out, char *err, size_t errlen) {
    return orion_open_ex(path, 2.0, 5.0, out, err, errlen);
}

void orion_close(orion_channel *ch) {
    if (ch == NULL) return;
    if (ch->ctrl && ch->fd >= 0) store32(ch->ctrl + ORION_CONTROL_client_active, 0);
    release_region(ch);  /* closing the lock's description drops the lock */
    free(ch);
}

int orion_pool_slice(const orion_channel *ch, uint8_t **map, size_t *mapped, int *fd, uint64_t *offset,
                     uint64_t *size) {
    if (ch == NULL || ch->map == NULL || ch->index < 0) return ORION_E_ARG;
    uint64_t pool_offset = rd64(ch->map + ORION_REGION_HEADER_pool_offset);
    uint64_t pool_size = rd64(ch->map + ORION_REGION_HEADER_pool_size);
    uint32_t channels = rd32(ch->map + ORION_REGION_HEADER_channel_count);
    if (channels < 1 || channels > ORION_REGION_MAX_CHANNELS || (uint32_t)ch->index >= channels)
        return ORION_E_PROTOCOL;
    uint64_t share = pool_size / channels / ORION_REGION_PAGE * ORION_REGION_PAGE;
    uint64_t start = pool_offset + (uint64_t)ch->index * share;
    if (share && (start < pool_offset || start % ORION_REGION_PAGE || start > ch->size || share > ch->size - start))
        return ORION_E_PROTOCOL;
    if (map) *map = ch->map;
    if (mapped) *mapped = ch->size;
    if (fd) *fd = ch->fd;
    if (offset) *offset = share ? start : 0;
    if (size) *size = share;
    return ORION_OK;
}

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

/* --- layout.py ---------------------------------------------------------------------------------------- */
#define PCI_ROOT "/sys/bus/pci/devices"
#define IVSHMEM_VENDOR "0x1af4"
#define IVSHMEM_DEVICE "0x1110"
#define GUEST_LOCK_DIR "/dev/shm"
#define SHM_DIR "/dev/shm"
#define SHM_PREFIX "orionsock"
#define HEADER_SIZE 4096u
#define PAGE 4096u
#define CACHE_LINE 64u
#define CRC_SPAN 256u
#define CRC_OFFSET 52u
#define VERSION 1u
#define AGENT_HEARTBEAT 1024u
#define AGENT_STATE 1036u
#define AGENT_NEVER 0u
#define AGENT_SERVING 1u
#define AGENT_STOPPED 2u
#define RING_HEAD 0u
#define RING_TAIL 64u
#define RING_SLOTS 128u
#define STAGING_HEAD 0u
#define STAGING_TAIL 64u
#define STAGING_CHUNKS 4096u
#define MAX_CHANNELS 256u
#define MAX_CHUNK_SIZE (64u << 20)
#define RECORD_HEADER 32u
#define FEATURE_HOST_HEARTBEAT (1u << 2)
#define MAX_OPCODE 0xFFFFu
#define KNOWN_FLAGS 7u

/* --- channel.py Ctrl, HostStatus, HostReason, liveness.py ---------------------------------------------- */
enum { CLIENT_GEN = 0, CLIENT_ACTIVE = 4, CLIENT_PID = 8, LIVENESS = 12, CLIENT_HEARTBEAT = 16,
       HOST_GEN = 64, HOST_STATUS = 68, HOST_REASON = 72, HOST_WORKER = 76, HOST_HEARTBEAT = 80 };
enum { HOST_IDLE = 0, HOST_SERVING = 1, HOST_FAILED = 2, HOST_RECLAIMED = 3 };
#define LOCK_MODE 1u
#define HEARTBEAT_MODE 2u
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
    uint8_t *base;      /* the block: head at +0, tail at +64, cells at +128 (ring) or +4096 (staging arena) */
    uint8_t *data;
    uint32_t cell, capacity, mask;
    uint32_t own;       /* private copy of the index this side writes (tail producing, head consuming) */
} spsc;

typedef struct { uint64_t call_id; uint32_t opcode; int32_t status; } async_error;

typedef struct {
    uint64_t call_id;
    uint32_t opcode, flags, length, generation;
    int32_t status;
    uint32_t reserved;
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
    async_error async_q[ASYNC_KEEP];
    uint32_t async_head, async_count;
    uint64_t async_dropped;
    /* The call in flight (0: none) and where its reply goes, for a drain that meets its reply early. */
    uint64_t call_id;
    const reply_dest *call_dest;
    int answered;
    record_header answer;
    /* A guest's liveness (HEARTBEAT_MODE): its locks live in the guest, where the host cannot see them, so a
     * thread counts CLIENT_HEARTBEAT up every HEARTBEAT_PERIOD_S while the channel is open (liveness.Heartbeat). */
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
    if (mapped < HEADER_SIZE) {
        say(err, el, "%s: %zu bytes is too small to be an Orion region (at least %u bytes of header); create one "
            "with 'orion-shm create'", where, mapped, HEADER_SIZE);
        return ORION_E_REGION;
    }
    if (memcmp(h, "ORIONSHM", 8) != 0) {
        size_t i = 0;
        while (i < CRC_SPAN && h[i] == 0) i++;
        if (i == CRC_SPAN)
            say(err, el, "%s: the region holds no header yet (all zeros); start the host agent (oriond) on this "
                "host, it formats the region when it starts serving", where);
        else
            say(err, el, "%s: not an Orion region (bad magic, expected ORIONSHM)", where);
        return ORION_E_REGION;
    }
    if (rd32(h + 8) != VERSION) {
        say(err, el, "%s: region protocol version %u, this software speaks %u; use the same Orion release on both "
            "sides", where, rd32(h + 8), VERSION);
        return ORION_E_REGION;
    }
    if (rd32(h + 12) != HEADER_SIZE) {
        say(err, el, "%s: header_size %u, expected %u", where, rd32(h + 12), HEADER_SIZE);
        return ORION_E_REGION;
    }
    uint8_t copy[CRC_SPAN];
    memcpy(copy, h, CRC_SPAN);
    memset(copy + CRC_OFFSET, 0, 4);
    if (crc32_of(copy, CRC_SPAN) != rd32(h + CRC_OFFSET)) {
        say(err, el, "%s: header checksum mismatch (the header was overwritten); restart the host agent to "
            "reformat the region", where);
        return ORION_E_REGION;
    }
    g->features = rd64(h + 16); g->region_size = rd64(h + 24);
    g->channels = rd32(h + 32); g->entries = rd32(h + 36); g->slot = rd32(h + 40);
    g->chunk = rd32(h + 44); g->chunks = rd32(h + 48);
    g->channel_offset = rd64(h + 56); g->channel_stride = rd64(h + 64);
    g->pool_offset = rd64(h + 72); g->pool_size = rd64(h + 80);
    g->o_ctrl = rd32(h + 88); g->o_req = rd32(h + 92); g->o_cpl = rd32(h + 96);
    g->o_reqst = rd32(h + 100); g->o_cplst = rd32(h + 104); g->o_head = rd32(h + 108);
    g->o_tail = rd32(h + 112); g->o_slots = rd32(h + 116); g->o_chunks = rd32(h + 120);

#define BAD(...) do { char what_[256]; say(what_, sizeof what_, __VA_ARGS__); \
        say(err, el, "%s: %s; %s", where, what_, redo); return ORION_E_REGION; } while (0)
    if (g->region_size > mapped)
        BAD("header says the region is %llu bytes but only %zu are mapped", (unsigned long long)g->region_size, mapped);
    if (g->channels < 1 || g->channels > MAX_CHANNELS)
        BAD("channel_count %u outside [1, %u]", g->channels, MAX_CHANNELS);
    if (!pow2(g->entries) || g->entries < 2 || g->entries > 4096)
        BAD("ring_entries %u is not a power of two in [2, 4096]", g->entries);
    if (!pow2(g->slot) || g->slot < 64 || g->slot > 65536)
        BAD("slot_size %u is not a power of two in [64, 65536]", g->slot);
    if (!pow2(g->chunks) || g->chunks < 2 || g->chunks > 1024)
        BAD("chunk_count %u is not a power of two in [2, 1024]", g->chunks);
    if (g->chunk == 0 || g->chunk % PAGE || g->chunk > MAX_CHUNK_SIZE)
        BAD("chunk_size %u is not a multiple of %u up to %u", g->chunk, PAGE, MAX_CHUNK_SIZE);
    if (g->o_head != RING_HEAD || g->o_tail != RING_TAIL || g->o_slots != RING_SLOTS || g->o_chunks != STAGING_CHUNKS)
        BAD("offsets table (off_ring_head %u, off_ring_tail %u, off_ring_slots %u, off_staging_chunks %u) differs "
            "from protocol version 1 (%u, %u, %u, %u)", g->o_head, g->o_tail, g->o_slots, g->o_chunks,
            RING_HEAD, RING_TAIL, RING_SLOTS, STAGING_CHUNKS);
    if (g->channel_offset < HEADER_SIZE || g->channel_offset % PAGE || g->channel_stride % PAGE)
        BAD("channel_offset %llu or channel_stride %llu is not page-aligned after the %u-byte header",
            (unsigned long long)g->channel_offset, (unsigned long long)g->channel_stride, HEADER_SIZE);
    uint64_t ring = ((uint64_t)RING_SLOTS + (uint64_t)g->entries * g->slot + PAGE - 1) / PAGE * PAGE;
    uint64_t staging = (uint64_t)STAGING_CHUNKS + (uint64_t)g->chunk * g->chunks;
    struct { uint64_t start, size; const char *name; } b[5] = {
        { g->o_ctrl, PAGE, "control block" }, { g->o_req, ring, "request ring" },
        { g->o_cpl, ring, "completion ring" }, { g->o_reqst, staging, "request staging" },
        { g->o_cplst, staging, "completion staging" } };
    for (int i = 1; i < 5; i++)  /* sort by start (Python sorts the tuples: start, then size, then name) */
        for (int j = i; j > 0 && (b[j].start < b[j - 1].start ||
                                  (b[j].start == b[j - 1].start && b[j].size < b[j - 1].size)); j--) {
            __typeof__(b[0]) t = b[j]; b[j] = b[j - 1]; b[j - 1] = t;
        }
    uint64_t end = 0;
    for (int i = 0; i < 5; i++) {
        if (b[i].start < end || b[i].start % CACHE_LINE)
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
    if (g->pool_size && (g->pool_offset < channels_end || g->pool_offset % PAGE ||
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
}

/* Producer: the next free cell, NULL when full; -1 in *bad when the indices are impossible. */
static uint8_t *spsc_writable(spsc *r, int *bad) {
    uint32_t head = load32(r->base + RING_HEAD);
    uint32_t fill = r->own - head;
    if (fill >= r->capacity) {
        if (fill > r->capacity) *bad = 1;
        return NULL;
    }
    return r->data + (size_t)(r->own & r->mask) * r->cell;
}

static void spsc_publish(spsc *r) {
    r->own += 1;
    store32(r->base + RING_TAIL, r->own);  /* release: the cell's bytes are visible before the tail */
}

/* Consumer: the oldest published cell, NULL when empty. */
static uint8_t *spsc_readable(spsc *r, int *bad) {
    uint32_t fill = load32(r->base + RING_TAIL) - r->own;  /* acquire: the cell's bytes after the tail */
    if (fill == 0) return NULL;
    if (fill > r->capacity) { *bad = 1; return NULL; }
    return r->data + (size_t)(r->own & r->mask) * r->cell;
}

static void spsc_release(spsc *r) {
    r->own += 1;
    store32(r->base + RING_HEAD, r->own);  /* release: our reads of the cell are done before the producer reuses it */
}

/* --- host checks (ClientChannel._check_host) ------------------------------------------------------------ */
static const char *reason_text(uint32_t reason) {
    switch (reason) {
    case 2: return "the host saw this client's lock go away";
    case 3: return "the host stopped seeing this client's heartbeat";
    case 4: return "the host worker serving this session died";
    case 5: return "the host agent restarted and lost this session";
    case 6: return "the host saw a broken ring protocol on this channel";
    case 7: return "the host agent stopped";
    case 8: return "the GPU host serving this relayed session is gone, in the middle of a reply";
    case 9: return "the GPU failed in the middle of a reply";
    default: return NULL;
    }
}

static int check_host(orion_channel *ch) {
    uint32_t host_gen = load32(ch->ctrl + HOST_GEN), status = load32(ch->ctrl + HOST_STATUS);
    if (host_gen != ch->generation)
        return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host serves this channel for generation "
                               "%u, not ours (%u): its control words were overwritten; restart this program",
                               ch->where, ch->index, host_gen, ch->generation));
    if (status == HOST_FAILED || status == HOST_RECLAIMED) {
        uint32_t reason = load32(ch->ctrl + HOST_REASON);
        const char *text = reason_text(reason);
        if (text)
            say(ch->error, sizeof ch->error, "%s channel %d: the host ended this session (%s)", ch->where, ch->index, text);
        else
            say(ch->error, sizeof ch->error, "%s channel %d: the host ended this session (reason %u)", ch->where, ch->index, reason);
        return broken(ch, reason == 8 || reason == 9 ? ORION_E_DEVICE_LOST : ORION_E_PEER_GONE);
    }
    if (status != HOST_SERVING)
        return broken(ch, FAIL(ch, ORION_E_PEER_GONE, "%s channel %d: the host ended this session (it saw the "
                               "channel released: its control words were overwritten); restart this program",
                               ch->where, ch->index));
    double now = now_s();
    if (ch->features & FEATURE_HOST_HEARTBEAT) {
        uint64_t beat = load64(ch->ctrl + HOST_HEARTBEAT);
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
    uint64_t beat = load64(ch->map + AGENT_HEARTBEAT);
    if (load32(ch->map + AGENT_STATE) == AGENT_STOPPED)
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
    double start = now_s();
    uint8_t *cell = probe(ch, &bad);
    if (cell || bad) goto done;
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

static uint8_t *probe_in(orion_channel *ch, int *bad) { return spsc_readable(&ch->in, bad); }

static uint8_t *probe_accept(orion_channel *ch, int *bad) {
    (void)bad;
    if (load32(ch->ctrl + HOST_GEN) == ch->generation && load32(ch->ctrl + HOST_STATUS) != HOST_IDLE)
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

/* Copy `n` payload bytes that start at payload offset `at` into the parts of head and tail they fall in; what
 * lies beyond head_cap + tail_cap is dropped (orion_callv then reports ORION_E_TOO_LARGE). */
static void deliver_at(const reply_dest *d, size_t at, const uint8_t *src, size_t n) {
    if (at < d->head_cap) {
        size_t take = smaller(n, d->head_cap - at);
        memcpy((uint8_t *)d->head + at, src, take);
        at += take;
        src += take;
        n -= take;
    }
    if (n == 0) return;
    size_t in_tail = at - d->head_cap;  /* at >= head_cap here */
    if (in_tail < d->tail_cap) memcpy((uint8_t *)d->tail + in_tail, src, smaller(n, d->tail_cap - in_tail));
}

static uint8_t *probe_in_chunk(orion_channel *ch, int *bad) { return spsc_readable(&ch->in_st, bad); }

/* Take a staged payload of `length` bytes chunk by chunk (channel.Endpoint._stream_in), into `dest` when there is
 * one, else dropped: either way every chunk is released, so the chunk stream stays in step with the records. */
static int stream_in(orion_channel *ch, size_t length, const reply_dest *dest) {
    size_t size = ch->in_st.cell;
    for (size_t at = 0; at < length; at += size) {
        int bad = 0, code = ORION_OK;
        uint8_t *chunk = spsc_readable(&ch->in_st, &bad);
        if (!chunk) {
            chunk = wait_for(ch, probe_in_chunk, 1, -1, "the next chunk on the completion staging arena", &code);
            if (!chunk) return code;
        }
        if (dest) deliver_at(dest, at, chunk, smaller(length - at, size));
        spsc_release(&ch->in_st);
    }
    return ORION_OK;
}

/* Known flags, reserved 0, an opcode in range, and a length its slot holds (inline) or the wire allows (staged:
 * checked before any chunk is touched, as record.check_header does). */
static int well_formed(const orion_channel *ch, const record_header *r) {
    if (r->reserved || (r->flags & ~KNOWN_FLAGS) || r->opcode > MAX_OPCODE) return 0;
    if (r->flags & ORION_FLAG_STAGED) return r->length <= ORION_MAX_PAYLOAD;
    return r->length <= ch->capacity;
}

/* Take the next completion (waiting for one when `wait`). *got says it is a reply of this generation; its payload
 * goes to `out` when it is the one `want` names (0: none), async errors are kept, anything else is dropped. */
static int receive(orion_channel *ch, int wait, uint64_t want, record_header *r, const reply_dest *out, int *got) {
    int code = ORION_OK, bad = 0;
    *got = 0;
    uint8_t *cell = spsc_readable(&ch->in, &bad);
    if (!cell && !bad && !wait) return ORION_OK;
    if (!cell) {
        cell = wait_for(ch, probe_in, 1, -1, "a record on the completion ring", &code);
        if (!cell) return code;
    }
    memcpy(&r->call_id, cell, 8);
    r->opcode = rd32(cell + 8); r->flags = rd32(cell + 12); r->length = rd32(cell + 16);
    r->generation = rd32(cell + 20); memcpy(&r->status, cell + 24, 4); r->reserved = rd32(cell + 28);
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
        if (dest && r->length) deliver_at(dest, 0, cell + RECORD_HEADER, r->length);
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

/* Stream `len` bytes from the pieces through the request staging arena, one chunk at a time, in order
 * (channel.Endpoint._stream_out). */
static int stream_out(orion_channel *ch, piece_cursor *from, size_t len) {
    size_t size = ch->out_st.cell;
    for (size_t at = 0; at < len; at += size) {
        int code = ORION_OK;
        uint8_t *chunk = wait_room(ch, &ch->out_st, probe_chunk_or_drain, "a free chunk in the request staging "
                                   "arena", &code);
        if (!chunk) return code;
        cursor_copy(from, chunk, smaller(len - at, size));
        spsc_publish(&ch->out_st);
    }
    return ORION_OK;
}

static void write_header(uint8_t *cell, uint64_t call_id, uint32_t opcode, uint32_t flags, uint32_t length,
                         uint32_t generation) {
    uint32_t words[6] = { opcode, flags, length, generation, 0, 0 };  /* status 0, reserved 0 */
    memcpy(cell, &call_id, 8);
    memcpy(cell + 8, words, sizeof words);
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
        cursor_copy(&from, cell + RECORD_HEADER, len);
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
    if (opcode > MAX_OPCODE || nparts < 0 || (nparts > 0 && parts == NULL))
        return FAIL(ch, ORION_E_ARG, "opcode %#x beyond %#x, or no pieces for a request of %d", opcode, MAX_OPCODE,
                    nparts);
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
    size_t len = 8 + 4 + hl + 4 + cl;
    if (len > ch->capacity)
        return FAIL(ch, ORION_E_TOO_LARGE, "HELLO of %zu bytes exceeds the %u-byte inline capacity", len,
                    ch->capacity);
    uint8_t *req = malloc(2 * (size_t)ch->capacity), *reply = req ? req + ch->capacity : NULL;  /* not the stack */
    if (req == NULL) return FAIL(ch, ORION_E_SYSTEM, "HELLO: out of memory");
    uint32_t words[2] = { ORION_PROTOCOL, (uint32_t)getpid() }, n;
    memcpy(req, words, 8);
    n = (uint32_t)hl; memcpy(req + 8, &n, 4); memcpy(req + 12, host, hl);
    n = (uint32_t)cl; memcpy(req + 12 + hl, &n, 4); memcpy(req + 16 + hl, calls, cl);
    int32_t status = 0;
    size_t got = 0;
    int rc = orion_call(ch, ORION_OP_HELLO, req, len, &status, reply, ch->capacity, &got);
    if (rc == ORION_OK && status != 0) {
        int shown = (int)(got < 300 ? got : 300);
        if (shown)
            rc = FAIL(ch, ORION_E_REFUSED, "%s: the host agent refused this client: %.*s", ch->where, shown,
                      (const char *)reply);
        else
            rc = FAIL(ch, ORION_E_REFUSED, "%s: the host agent refused this client: status %d", ch->where, status);
    } else if (rc == ORION_OK && (got < 12 || 12 + (size_t)rd32(reply + 8) != got)) {
        rc = FAIL(ch, ORION_E_PROTOCOL, "%s: malformed HELLO reply of %zu bytes", ch->where, got);
    } else if (rc == ORION_OK && session) {
        *session = rd64(reply);
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
    uint64_t beat = load64(map + AGENT_HEARTBEAT);
    uint32_t state = load32(map + AGENT_STATE);
    double deadline = now_s() + AGENT_SETTLE_S;
    while (state != AGENT_SERVING && now_s() < deadline) {
        sleep_s(0.02);
        state = load32(map + AGENT_STATE);
        if (load64(map + AGENT_HEARTBEAT) != beat) return AGENT_SERVING;
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
        if (!ch->beat_stop) store64(ch->ctrl + CLIENT_HEARTBEAT, load64(ch->ctrl + CLIENT_HEARTBEAT) + 1);
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
    if (fstat(ch->fd, &st) != 0 || (size_t)st.st_size < HEADER_SIZE) {
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
    ch->capacity = g.slot - RECORD_HEADER;
    uint32_t state = agent_state(ch->map);
    if (state != AGENT_SERVING) {
        say(err, el, "%s: no host agent is serving this region (%s); start oriond on the host", path,
            state == AGENT_STOPPED ? "it stopped" : "it was never served");
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
    spsc_init(&ch->out, base + g.o_req, RING_SLOTS, g.slot, g.entries);
    spsc_init(&ch->in, base + g.o_cpl, RING_SLOTS, g.slot, g.entries);
    spsc_init(&ch->out_st, base + g.o_reqst, STAGING_CHUNKS, g.chunk, g.chunks);
    spsc_init(&ch->in_st, base + g.o_cplst, STAGING_CHUNKS, g.chunk, g.chunks);
    ch->next_id = 1;
    ch->agent_seen = load64(ch->map + AGENT_HEARTBEAT);
    ch->agent_since = now_s();

    /* ClientChannel._accept, word for word: reset the indices we own (request ring and staging tails,
     * completion ring and staging heads), then pid, liveness, heartbeat, active, and the generation last. */
    uint8_t *c = ch->ctrl;
    store32(base + g.o_req + RING_TAIL, 0);
    store32(base + g.o_reqst + STAGING_TAIL, 0);
    store32(base + g.o_cpl + RING_HEAD, 0);
    store32(base + g.o_cplst + STAGING_HEAD, 0);
    store32(c + CLIENT_PID, (uint32_t)getpid());
    store32(c + LIVENESS, pci ? HEARTBEAT_MODE : LOCK_MODE);
    store64(c + CLIENT_HEARTBEAT, 0);
    if (pci && !start_heartbeat(ch)) {
        say(err, el, "%s: cannot start the heartbeat thread: %s", path, strerror(errno));
        rc = ORION_E_SYSTEM;
        goto fail;
    }
    store32(c + CLIENT_ACTIVE, 1);
    uint32_t generation = load32(c + CLIENT_GEN) + 1;
    if (generation == 0) generation = 1;
    ch->generation = generation;
    store32(c + CLIENT_GEN, generation);  /* published last: the host acts on it */
    int code = ORION_OK;
    if (!wait_for(ch, probe_accept, 0, accept_timeout, "the host agent", &code)) {
        ch->broken = 0;
        store32(c + CLIENT_ACTIVE, 0);
        say(err, el, "%s channel %d: the host agent did not accept the channel (%s); check that oriond is running "
            "and serves this region", path, ch->index, ch->error);
        rc = ORION_E_PEER_GONE;
        goto fail;
    }
    ch->worker_seen = load64(c + HOST_HEARTBEAT);
    ch->worker_since = now_s();
    code = check_host(ch);
    if (code) {
        store32(c + CLIENT_ACTIVE, 0);
        say(err, el, "%s channel %d: the host agent did not accept the channel (%s); check that oriond is running "
            "and serves this region", path, ch->index, ch->error);
        rc = ORION_E_PEER_GONE;
        goto fail;
    }
    /* resync: the private copies of our indices from shared memory (both zero after the accept) */
    ch->out.own = load32(ch->out.base + RING_TAIL);
    ch->in.own = load32(ch->in.base + RING_HEAD);
    ch->out_st.own = load32(ch->out_st.base + STAGING_TAIL);
    ch->in_st.own = load32(ch->in_st.base + STAGING_HEAD);
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
    if (ch->ctrl && ch->fd >= 0) store32(ch->ctrl + CLIENT_ACTIVE, 0);
    release_region(ch);  /* closing the lock's description drops the lock */
    free(ch);
}

int orion_pool_slice(const orion_channel *ch, uint8_t **map, size_t *mapped, int *fd, uint64_t *offset,
                     uint64_t *size) {
    if (ch == NULL || ch->map == NULL || ch->index < 0) return ORION_E_ARG;
    uint64_t pool_offset = rd64(ch->map + 72), pool_size = rd64(ch->map + 80);
    uint32_t channels = rd32(ch->map + 32);
    if (channels < 1 || channels > MAX_CHANNELS || (uint32_t)ch->index >= channels) return ORION_E_PROTOCOL;
    uint64_t share = pool_size / channels / PAGE * PAGE;
    uint64_t start = pool_offset + (uint64_t)ch->index * share;
    if (share && (start < pool_offset || start % PAGE || start > ch->size || share > ch->size - start))
        return ORION_E_PROTOCOL;
    if (map) *map = ch->map;
    if (mapped) *mapped = ch->size;
    if (fd) *fd = ch->fd;
    if (offset) *offset = share ? start : 0;
    if (size) *size = share;
    return ORION_OK;
}

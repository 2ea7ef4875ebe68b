/* hot_dispatch.c: the session worker's hot records, served in C (CPython extension `_orion_hot_dispatch`).
 *
 * Why: a forwarded call spent ~4 us in the worker's Python (receive 0.8, the generic dispatch 2.6, send 0.7 us,
 * docs/performance.md) on top of cuda-python's wrapper, against a driver call of ~1 us. This module takes the
 * records that dominate a CUDA program's steady state (launches with and without attributes, async
 * memsets/copies, stream/event record, query and synchronise, the stream memory operations that carry a guest's
 * host functions) straight from the request ring, checks them against the session's ledger and calls the
 * driver function (cuda.bindings.cydriver's C pointer, no Python wrapper), and writes the reply.
 *
 * It never refuses anything itself. A record it is not *sure* the Python path would run as it does -- another
 * opcode, flags other than NO_REPLY, a payload of another length, another generation, a handle or pointer not
 * found in the ledger, a full completion ring, a ring whose indices make no sense -- is left at the head of the
 * ring and serve() returns so that the Python path (region_server.py, executor.py: the reference) answers it,
 * errors and messages included. So what C accepts is a subset of what Python accepts, and every refusal a
 * hostile guest can see is Python's. The ledger is not mirrored: its Python sets and dicts are consulted
 * directly (under the GIL, a few set lookups), so nothing can drift out of sync. What C remembers of it is only
 * which handles it allowed (a stream, an event, a context, a function launched before) and in which of its ranges
 * a pointer lay (an allocation, a global, a reserved range, a page-locked allocation), and only while the ledger's
 * epoch stands still, which every removal from those sets and tables advances (session_ledger.WatchedSet,
 * range_table.RangeTable): a record naming only such handles and memory is served without the GIL, about half a
 * microsecond less a record on a GPU machine.
 *
 * Threads: the worker has a heartbeat thread in Python, so the GIL is released while waiting for a record and
 * during the driver call (a cuCtxSynchronize may last seconds); it is held only for the ledger lookups.
 * Memory order: indices are loaded with acquire and stored with release, as in guest_runtime/native/orion_wire.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "native_common.h"


#define MAX_PARAMS 32768u /* the executor's launch parameter buffer (the driver's limit is 32764 bytes) */
#define LAUNCH_FIXED 44u  /* <QIIIIIIIQ: function, grid x3, block x3, shared memory, stream */
#define ATTRIBUTE_SIZE 72u /* a CUlaunchAttribute (<i4x64s): its ID, padding, its 64-byte value */
#define MAX_ATTRIBUTES 64u /* launch_extras.MAX_LAUNCH_ATTRIBUTES: more is MALFORMED, Python's answer */
#define CUDA_SUCCESS 0
#define SOCKET_INLINE 65536u /* the largest request served from a relay connection here (stream_endpoint.SINK_ABOVE) */
#define SOCKET_REPLY 4096u /* the largest device-to-host copy answered from here (as from a ring) */
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* serve()'s answers: why it gave control back to Python. */
enum { RET_PYTHON = 0, RET_CHECK = 1, RET_POSTED_FAILED = 2, RET_IDLE = 3 };

/* What a hot opcode is; set_call() names it. The payload layouts are driver_api's request structs (hot_path.py
 * checks each against the table before registering it). */
enum {
    K_NONE = 0, K_NOP, K_VOID, K_STREAM, K_EVENT, K_CONTEXT, K_EVENT_STREAM, K_STREAM_EVENT_FLAGS,
    K_EVENT_STREAM_FLAGS,
    K_MEMSET8, K_MEMSET16, K_MEMSET32, K_DTOD, K_LAUNCH, K_HTOD, K_HTOD_ASYNC, K_DTOH, K_DTOH_ASYNC,
    K_STREAM_VALUE, K_LAUNCH_EX, K_PINNED_HTOD, K_PINNED_HTOD_ASYNC, K_PINNED_DTOH, K_PINNED_DTOH_ASYNC, K_COUNT
};
static const uint32_t payload_size[K_COUNT] = {
    [K_NOP] = UINT32_MAX, [K_VOID] = 0, [K_STREAM] = 8, [K_EVENT] = 8, [K_CONTEXT] = 8, [K_EVENT_STREAM] = 16,
    [K_STREAM_EVENT_FLAGS] = 20, [K_EVENT_STREAM_FLAGS] = 20, [K_MEMSET8] = 25, [K_MEMSET16] = 26, [K_MEMSET32] = 28,
    [K_DTOD] = 32,
    [K_LAUNCH] = UINT32_MAX, [K_HTOD] = UINT32_MAX, [K_HTOD_ASYNC] = UINT32_MAX, [K_DTOH] = 16, [K_DTOH_ASYNC] = 24,
    [K_STREAM_VALUE] = 24, [K_LAUNCH_EX] = UINT32_MAX, [K_PINNED_HTOD] = 24, [K_PINNED_DTOH] = 24,
    [K_PINNED_HTOD_ASYNC] = 32, [K_PINNED_DTOH_ASYNC] = 32,
};
/* the fixed part of a copy's request: device pointer, size[, stream]; a host-to-device copy's bytes follow it */
#define COPY_FIXED(kind) ((kind) == K_HTOD_ASYNC || (kind) == K_DTOH_ASYNC ? 24u : 16u)

typedef int (*fn_void)(void);
typedef int (*fn_handle)(void *);
typedef int (*fn_handle2)(void *, void *);
typedef int (*fn_handle2_flags)(void *, void *, unsigned int);
typedef int (*fn_memset8)(unsigned long long, unsigned char, size_t, void *);
typedef int (*fn_memset16)(unsigned long long, unsigned short, size_t, void *);
typedef int (*fn_memset32)(unsigned long long, unsigned int, size_t, void *);
typedef int (*fn_dtod)(unsigned long long, unsigned long long, size_t, void *);
typedef int (*fn_htod)(unsigned long long, const void *, size_t);
typedef int (*fn_dtoh)(void *, unsigned long long, size_t);
typedef int (*fn_htod_async)(unsigned long long, const void *, size_t, void *);
typedef int (*fn_dtoh_async)(void *, unsigned long long, size_t, void *);
typedef int (*fn_is_capturing)(void *, int *);
typedef int (*fn_launch)(void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                         unsigned int, unsigned int, void *, void **, void **);
typedef int (*fn_stream_value)(void *, unsigned long long, unsigned int, unsigned int);
/* cuda.h's CUlaunchConfig (cuLaunchKernelEx's first argument) */
typedef struct {
    unsigned int grid[3], block[3], shared;
    void *stream;
    void *attrs;
    unsigned int count;
} launch_config;
typedef int (*fn_launch_ex)(const launch_config *, void *, void **, void **);


/* What the ledger allowed (allowed()'s facts): a handle as a stream, an event, a context, or a function the session
 * may launch (its CUfunction or CUkernel, launched once); a device range as lying in one of the session's ranges (an
 * allocation, a module global, a reserved range), and a page-locked one in one of its pool allocations. */
enum { FACT_STREAM, FACT_EVENT, FACT_CONTEXT, FACT_LAUNCHABLE, FACT_MEMORY, FACT_PINNED, FACTS };
#define MEMO_SLOTS 1024u
#define MEMO_PAGE_SHIFT 16 /* a range fact is kept under its pointer's 64 KiB page */
/* Direct-mapped: a slot holds one key (a handle, or a pointer's page), the range that held it (a range fact), and
 * its stamp, (epoch + 1) * FACTS + fact, so an empty slot matches nothing and a slot of another epoch is dead without
 * being cleared. */
typedef struct {
    const uint64_t *epoch; /* NULL: nothing is remembered (a ledger without one) */
    struct { uint64_t key, stamp, base, end; } slot[MEMO_SLOTS];
} remembered;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int have_view;
    ring in, out; /* request ring (we consume), completion ring (we produce) */
    uint32_t generation, inline_capacity;
    double spin_s, busy_spin_s, min_sleep, max_sleep, check_every_s;
    uint8_t kind[65536];
    void *fn[65536];
    uint64_t count[65536]; /* records of each opcode served here (the wire's STATS, session_loop.py) */
    /* with `timing` (set_timing: from the session's first STATS on, when `count` starts again), each opcode's
     * nanoseconds here, from the record taken to its reply sent, and those of them in the driver's function: three
     * clock reads a record, none before */
    int timing;
    uint64_t ns[65536], driver_ns[65536];
    PyObject *ledger; /* SessionLedger or None */
    /* the handles and ranges the ledger allowed, remembered while its epoch (SessionLedger.epoch: advanced by every
     * removal) stands still, so that a record naming only what was seen before is checked without the GIL */
    Py_buffer epoch_view;
    int have_epoch;
    remembered memo;
    fn_handle stream_sync; /* cuStreamSynchronize: an async copy from the device first waits for its stream */
    fn_is_capturing is_capturing; /* cuStreamIsCapturing: an async copy to a capturing stream waits too (_htod) */
    uint8_t *own; /* the payload of the ring record being served, copied out of its slot before anything in it is
                   * checked: the guest may rewrite its slot meanwhile, and a size or count checked there and read again
                   * for the call could be another (a frame is read into `frame`, ours already). A host-to-device copy's
                   * bytes go to the driver from here: pageable memory of this process's (never registered), which the
                   * driver stages before it returns, as the guest's own (executor._htod) */
    fn_launch launch_kernel; /* cuLaunchKernel: a cuLaunchKernelEx without attributes is one (executor._launch) */
    uint64_t plain_attributes, event_attributes; /* launch attribute IDs C forwards: none until set */
    /* the wait in progress, kept across serve() calls so that a liveness check does not restart the spin */
    int waiting, busy;
    double wait_start, sleep, next_check;
    unsigned long long served, failed_call_id;
    int failed_status;
    /* a relayed session (set_socket): records come from the relay connection `fd` instead of the request ring, and
     * replies go back on it under `lock`; `frame` holds the one being served, `heard` when one last came */
    int fd;
    PyObject *lock; /* a relay/frames.FrameLock, kept alive while its mutex is used */
    pthread_mutex_t *mutex;
    uint8_t *frame;
    double heard;
    /* launch parameters: copied here (the driver copies them again before cuLaunchKernel returns) */
    size_t launch_size;
    void *launch_extra[5];
    _Alignas(16) uint8_t launch_params[MAX_PARAMS];
    launch_config config; /* cuLaunchKernelEx's, with its attributes copied here */
    _Alignas(16) uint8_t launch_attributes[MAX_ATTRIBUTES * ATTRIBUTE_SIZE];
} Dispatcher;


/* --- the ledger (SessionLedger), read under the GIL ------------------------------------------------------ */
typedef struct {
    PyObject *handles, *launched, *ranges, *pool;
    PyObject *epoch; /* the ledger's: a range found in a table that advances it may be remembered */
    PyObject *pool_allocations; /* the pool's {offset in its slice: size} (a RangeTable), or NULL */
    uint64_t pool_guest_base, pool_host_base; /* where its slice lies for the guest and here (0: not mapped) */
} ledger_view;

static int in_set(PyObject *set, uint64_t value) {
    if (set == NULL || !PyAnySet_Check(set)) return 0;
    PyObject *key = PyLong_FromUnsignedLongLong(value);
    if (key == NULL) { PyErr_Clear(); return 0; }
    int found = PySet_Contains(set, key);
    Py_DECREF(key);
    if (found < 0) { PyErr_Clear(); return 0; }
    return found;
}

static int owns_handle(const ledger_view *l, const char *kind, uint64_t value) {
    PyObject *set = PyDict_GetItemString(l->handles, kind); /* borrowed */
    return in_set(set, value);
}

/* The greatest of a RangeTable's sorted `bases` at or below `pointer` (range_table.py), -1 for none or an error. */
static int range_candidate(PyObject *bases, uint64_t pointer, unsigned long long *found) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(bases); /* the first base above `pointer` lies in [lo, hi] */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        unsigned long long base = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(bases, mid));
        if (PyErr_Occurred()) { PyErr_Clear(); return -1; }
        if (base <= pointer) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return -1;
    *found = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(bases, lo - 1));
    return 0;
}

/* The range a pointer was found in: [base, end), and whether its table advances the ledger's epoch when a range goes
 * (so that it may be remembered). */
typedef struct { uint64_t base, end; int watched; } span;

static void found_in(const ledger_view *l, PyObject *table, uint64_t base, unsigned long long length, span *found) {
    unsigned __int128 end = (unsigned __int128)base + length;
    found->base = base;
    found->end = end > UINT64_MAX ? UINT64_MAX : (uint64_t)end;
    PyObject *epoch = PyObject_GetAttrString(table, "epoch");
    found->watched = epoch != NULL && epoch == l->epoch;
    Py_XDECREF(epoch);
    PyErr_Clear();
}

/* One of SessionLedger.ranges()' tables (base -> size): a RangeTable searched by its sorted bases (its ranges never
 * overlap, so only the nearest base at or below `pointer` can hold it), any other dict scanned; the range in
 * `found`. */
static int owns_range(const ledger_view *l, PyObject *table, uint64_t pointer, unsigned __int128 size, span *found) {
    if (table == NULL || !PyDict_Check(table)) return 0;
    PyObject *bases = PyObject_GetAttrString(table, "bases");
    if (bases == NULL) PyErr_Clear();
    if (bases != NULL && PyList_Check(bases) && PyList_GET_SIZE(bases) == PyDict_GET_SIZE(table)) {
        unsigned long long base = 0, length = 0;
        int held = 0;
        if (range_candidate(bases, pointer, &base) == 0) {
            PyObject *key = PyLong_FromUnsignedLongLong(base);
            PyObject *value = key != NULL ? PyDict_GetItemWithError(table, key) : NULL; /* borrowed */
            length = value != NULL ? PyLong_AsUnsignedLongLong(value) : 0;
            Py_XDECREF(key);
            if (PyErr_Occurred()) PyErr_Clear();
            else held = value != NULL && (unsigned __int128)pointer + size <= (unsigned __int128)base + length;
        }
        Py_DECREF(bases);
        if (held) found_in(l, table, base, length, found);
        return held;
    }
    Py_XDECREF(bases);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(table, &pos, &key, &value)) {
        unsigned long long base = PyLong_AsUnsignedLongLong(key);
        unsigned long long length = PyLong_AsUnsignedLongLong(value);
        if (PyErr_Occurred()) { PyErr_Clear(); continue; }
        if (base <= pointer && (unsigned __int128)pointer + size <= (unsigned __int128)base + length) {
            found->base = found->end = 0;
            found->watched = 0; /* a plain dict: its removals are not seen */
            return 1;
        }
    }
    return 0;
}

/* SessionLedger.owns: its range tables read here, then the page-locked pool's own answer (pinned_pool.py,
 * a method call under the GIL), only for memory in none of them (not remembered: `found` unwatched). */
static int owns_memory(const ledger_view *l, uint64_t pointer, unsigned __int128 size, span *found) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(l->ranges); i++)
        if (owns_range(l, PyTuple_GET_ITEM(l->ranges, i), pointer, size, found)) return 1;
    found->watched = 0;
    if (l->pool == NULL || l->pool == Py_None || size > UINT64_MAX) return 0;
    PyObject *answer = PyObject_CallMethod(l->pool, "owns_device", "KK", (unsigned long long)pointer,
                                           (unsigned long long)size);
    int owned = answer != NULL && PyObject_IsTrue(answer) == 1;
    Py_XDECREF(answer);
    if (PyErr_Occurred()) PyErr_Clear();
    return owned;
}

static void ledger_release(ledger_view *l) {
    Py_CLEAR(l->handles); Py_CLEAR(l->launched); Py_CLEAR(l->ranges); Py_CLEAR(l->pool); Py_CLEAR(l->pool_allocations);
    Py_CLEAR(l->epoch);
}

/* The pool's tables (pinned_host): only a dict of allocations and two mapped bases count; anything else, none. */
static void pool_fetch(ledger_view *l) {
    if (l->pool == NULL || l->pool == Py_None) return;
    PyObject *allocations = PyObject_GetAttrString(l->pool, "allocations");
    PyObject *guest = PyObject_GetAttrString(l->pool, "guest_base");
    PyObject *host = PyObject_GetAttrString(l->pool, "host_base");
    if (allocations != NULL && PyDict_Check(allocations) && guest != NULL && PyLong_Check(guest) && host != NULL
        && PyLong_Check(host)) {
        l->pool_guest_base = PyLong_AsUnsignedLongLong(guest);
        l->pool_host_base = PyLong_AsUnsignedLongLong(host);
        if (!PyErr_Occurred()) l->pool_allocations = Py_NewRef(allocations);
    }
    Py_XDECREF(allocations); Py_XDECREF(guest); Py_XDECREF(host);
    if (PyErr_Occurred()) { PyErr_Clear(); Py_CLEAR(l->pool_allocations); }
}

/* The ledger's tables as they are now (the Python path may have replaced or changed them since last time). */
static int ledger_fetch(Dispatcher *self, ledger_view *l) {
    memset(l, 0, sizeof *l);
    if (self->ledger == NULL || self->ledger == Py_None) return 0;
    l->handles = PyObject_GetAttrString(self->ledger, "handles");
    l->launched = PyObject_GetAttrString(self->ledger, "launched");
    l->ranges = PyObject_CallMethod(self->ledger, "ranges", NULL);
    l->pool = PyObject_GetAttrString(self->ledger, "pool");
    l->epoch = PyObject_GetAttrString(self->ledger, "epoch");
    if (l->epoch == NULL) PyErr_Clear(); /* nothing is remembered then (set_ledger) */
    if (PyErr_Occurred() || !PyDict_Check(l->handles) || !PyTuple_Check(l->ranges)) {
        PyErr_Clear();
        ledger_release(l);
        return 0;
    }
    pool_fetch(l);
    return 1;
}

/* Whether `id` is in a mask of attribute IDs (set_launch_attributes: driver_api's sets, one bit per ID). */
static int attribute_in(uint64_t mask, int id) { return id >= 0 && id < 64 && (mask >> id) & 1; }

/* How allowed() learns what the ledger holds: from what was remembered at `epoch` (read before the check), else, when
 * `asking` (the GIL held), from the ledger `l`, whose yes is remembered then. Not asking, only what was remembered
 * counts: the record then goes to the check under the GIL. Every removal advances the epoch after it
 * (session_ledger.WatchedSet, range_table.RangeTable), so a fact remembered before a removal is dead after it, and one
 * checked after it was checked against the ledger without what was removed. */
typedef struct {
    const ledger_view *l; /* NULL: no ledger; its plain fields (the pool's bases) may be read without the GIL */
    int asking;
    remembered *memo;
    uint64_t epoch;
    uint64_t plain_attributes, event_attributes; /* the dispatcher's (set_launch_attributes) */
} checker;

static uint64_t epoch_now(const remembered *m) { return m->epoch ? __atomic_load_n(m->epoch, __ATOMIC_ACQUIRE) : 0; }

/* The slot `key` of `fact` lives in, and the stamp it carries when it was remembered at the checker's epoch. */
static size_t memo_at(uint64_t key, int fact) {
    return (size_t)(((key * FACTS + (uint64_t)fact) * 0x9E3779B97F4A7C15ull) >> 54) % MEMO_SLOTS;
}
static uint64_t memo_stamp(const checker *c, int fact) { return (c->epoch + 1) * FACTS + (uint64_t)fact; }

static int ledger_fact(const ledger_view *l, int fact, uint64_t value) {
    switch (fact) {
    case FACT_STREAM: return owns_handle(l, "CUstream", value);
    case FACT_EVENT: return owns_handle(l, "CUevent", value);
    case FACT_CONTEXT: return owns_handle(l, "CUcontext", value);
    default: /* a first launch is the Python path's: it tells the quota (lazy loading) and records the function */
        return (owns_handle(l, "CUfunction", value) || owns_handle(l, "CUkernel", value)) && in_set(l->launched, value);
    }
}

/* Whether handle `value` is the session's as `fact`. */
static int holds(const checker *c, int fact, uint64_t value) {
    remembered *m = c->memo;
    size_t at = memo_at(value, fact);
    uint64_t stamp = memo_stamp(c, fact);
    if (m->epoch && m->slot[at].key == value && m->slot[at].stamp == stamp) return 1;
    if (!c->asking || !ledger_fact(c->l, fact, value)) return 0;
    if (m->epoch) {
        m->slot[at].key = value;
        m->slot[at].stamp = stamp;
    }
    return 1;
}

/* Whether [pointer, pointer + size) lies in one range of `fact`: the session's device ranges (FACT_MEMORY), or its
 * page-locked pool's allocations, `pointer` an offset in its slice (FACT_PINNED). A range is remembered under the
 * pointer's page, and found again for any part of it. */
static int in_range(const checker *c, int fact, uint64_t pointer, unsigned __int128 size) {
    if (size == 0) size = 1;
    remembered *m = c->memo;
    uint64_t key = pointer >> MEMO_PAGE_SHIFT, stamp = memo_stamp(c, fact);
    size_t at = memo_at(key, fact);
    if (m->epoch && m->slot[at].key == key && m->slot[at].stamp == stamp && m->slot[at].base <= pointer
        && (unsigned __int128)pointer + size <= m->slot[at].end)
        return 1;
    if (!c->asking) return 0;
    span found = { 0, 0, 0 };
    int held = fact == FACT_MEMORY ? owns_memory(c->l, pointer, size, &found)
                                   : owns_range(c->l, c->l->pool_allocations, pointer, size, &found);
    if (held && found.watched && m->epoch) {
        m->slot[at].key = key;
        m->slot[at].stamp = stamp;
        m->slot[at].base = found.base;
        m->slot[at].end = found.end;
    }
    return held;
}

/* session_ledger.DEFAULT_STREAMS: NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD need no creating */
static int stream_ok(const checker *c, uint64_t stream) { return stream <= 2 || holds(c, FACT_STREAM, stream); }

static int memory_ok(const checker *c, uint64_t pointer, unsigned __int128 size) {
    return in_range(c, FACT_MEMORY, pointer, size);
}

/* HostPool.host_address (pinned_pool.py): where the host maps `size` bytes of the guest's page-locked allocation at
 * `pointer`, if they lie in one allocation (searched). */
static int pinned_ok(const checker *c, uint64_t pointer, uint64_t size, uint64_t *host) {
    const ledger_view *l = c->l;
    if (l == NULL || l->pool_allocations == NULL || !l->pool_guest_base || !l->pool_host_base || size == 0
        || pointer < l->pool_guest_base)
        return 0;
    uint64_t offset = pointer - l->pool_guest_base;
    if (!in_range(c, FACT_PINNED, offset, size)) return 0;
    *host = l->pool_host_base + offset;
    return 1;
}

/* Whether the session may make this call: the checks of SessionLedger.check/launchable (and, for a page-locked copy,
 * executor._pinned_copy's, with the host's address of its pool memory in `host`), as far as C can be sure. 0 sends
 * the record to Python, which answers (and refuses) it. */
static int allowed(const checker *c, int kind, const uint8_t *p, uint64_t *host) {
    switch (kind) {
    case K_STREAM: return stream_ok(c, rd64(p));
    case K_EVENT: return holds(c, FACT_EVENT, rd64(p));
    case K_CONTEXT: return rd64(p) == 0 || holds(c, FACT_CONTEXT, rd64(p));
    case K_EVENT_STREAM: case K_EVENT_STREAM_FLAGS:
        return holds(c, FACT_EVENT, rd64(p)) && stream_ok(c, rd64(p + 8));
    case K_STREAM_EVENT_FLAGS: return stream_ok(c, rd64(p)) && holds(c, FACT_EVENT, rd64(p + 8));
    case K_MEMSET8: case K_MEMSET16: case K_MEMSET32: {
        unsigned width = kind == K_MEMSET8 ? 1 : kind == K_MEMSET16 ? 2 : 4;
        const uint8_t *rest = p + 8 + width;
        return memory_ok(c, rd64(p), (unsigned __int128)rd64(rest) * width) && stream_ok(c, rd64(rest + 8));
    }
    case K_DTOD:
        return memory_ok(c, rd64(p), rd64(p + 16)) && memory_ok(c, rd64(p + 8), rd64(p + 16))
               && stream_ok(c, rd64(p + 24));
    case K_HTOD: case K_HTOD_ASYNC: case K_DTOH: case K_DTOH_ASYNC: {
        int async = kind == K_HTOD_ASYNC || kind == K_DTOH_ASYNC;
        return memory_ok(c, rd64(p), rd64(p + 8)) && (!async || stream_ok(c, rd64(p + 16)));
    }
    case K_LAUNCH: case K_LAUNCH_EX: {
        if (!(holds(c, FACT_LAUNCHABLE, rd64(p)) && stream_ok(c, rd64(p + 36)))) return 0;
        if (kind == K_LAUNCH) return 1;
        /* launch_extras.launch_config_for: attributes of the plain kinds travel as they are, an event one only
         * with one of the session's events */
        uint32_t count = rd32(p + LAUNCH_FIXED);
        for (uint32_t i = 0; i < count; i++) {
            const uint8_t *a = p + LAUNCH_FIXED + 4 + (size_t)i * ATTRIBUTE_SIZE;
            int id = (int)rd32(a);
            if (attribute_in(c->event_attributes, id)) { /* an event in the value's first 8 bytes */
                if (!holds(c, FACT_EVENT, rd64(a + 8))) return 0;
            } else if (!attribute_in(c->plain_attributes, id)) {
                return 0;
            }
        }
        return 1;
    }
    case K_STREAM_VALUE: return memory_ok(c, rd64(p + 8), 4) && stream_ok(c, rd64(p));
    case K_PINNED_HTOD: case K_PINNED_HTOD_ASYNC: case K_PINNED_DTOH: case K_PINNED_DTOH_ASYNC: {
        int async = kind == K_PINNED_HTOD_ASYNC || kind == K_PINNED_DTOH_ASYNC;
        uint64_t size = rd64(p + 8); /* a copy of nothing is Python's */
        return size && memory_ok(c, rd64(p), size) && (!async || stream_ok(c, rd64(p + 16)))
               && pinned_ok(c, rd64(p + (async ? 24 : 16)), size, host);
    }
    default: return 0;
    }
}

/* allowed(), first from what was remembered without the GIL, then (`saved` the thread state to take it back with)
 * from the ledger under the GIL. */
static int allowed_now(Dispatcher *self, const ledger_view *l, int have_ledger, int kind, const uint8_t *p,
                       uint64_t *host, PyThreadState **saved) {
    if (!have_ledger) return 0;
    checker c = { l, 0, &self->memo, epoch_now(&self->memo), self->plain_attributes, self->event_attributes };
    if (self->memo.epoch && allowed(&c, kind, p, host)) return 1;
    PyEval_RestoreThread(*saved);
    c.asking = 1;
    int ok = allowed(&c, kind, p, host);
    *saved = PyEval_SaveThread();
    return ok;
}

static int needs_ledger(int kind) { return kind != K_NOP && kind != K_VOID; }
static int is_copy(int kind) { return kind >= K_HTOD && kind <= K_DTOH_ASYNC; }
static int is_htod(int kind) { return kind == K_HTOD || kind == K_HTOD_ASYNC; }

/* A copy C runs as executor._htod/_dtoh would: its bytes travel inline (a host-to-device copy carries exactly the
 * size it declares, posted or not; a device-to-host one fits a completion slot, is at most the 4 KiB the executor
 * sends from one buffer, and wants its reply), and it moves at least one byte (a copy of nothing is Python's). */
static int copy_is_plain(const Dispatcher *self, int kind, const uint8_t *p, uint32_t length, int wants_reply) {
    uint32_t fixed = COPY_FIXED(kind);
    if (length < fixed || (!wants_reply && !is_htod(kind))) return 0;
    if ((kind == K_DTOH_ASYNC && self->stream_sync == NULL) || (kind == K_HTOD_ASYNC && self->is_capturing == NULL))
        return 0;
    uint64_t size = rd64(p + 8);
    if (size == 0) return 0;
    if (is_htod(kind)) return size == length - fixed;
    return length == fixed && size <= 4096 && size <= self->out.cell - RECORD_HEADER;
}

/* executor._capturing: whether an async copy to the device goes to a stream that may be capturing (NULL and
 * CU_STREAM_LEGACY never are), which the Python path serves as before (it waits for the stream, then copies). */
static int may_capture(const Dispatcher *self, int kind, const uint8_t *p) {
    if (kind != K_HTOD_ASYNC) return 0;
    uint64_t stream = rd64(p + 16);
    int status = 0;
    return stream > 1 && (self->is_capturing((void *)(uintptr_t)stream, &status) != CUDA_SUCCESS || status != 0);
}

/* A cuLaunchKernelEx record C can lay out: the fixed part, an attribute count the executor takes, the attributes
 * whole, and parameters that fit its buffer. */
static int launch_ex_fits(const Dispatcher *self, const uint8_t *p, uint32_t length) {
    if (length < LAUNCH_FIXED + 4) return 0;
    uint32_t count = rd32(p + LAUNCH_FIXED);
    if (count > MAX_ATTRIBUTES || (count == 0 && self->launch_kernel == NULL)) return 0;
    size_t head = LAUNCH_FIXED + 4 + (size_t)count * ATTRIBUTE_SIZE;
    return length >= head && length - head <= MAX_PARAMS;
}

/* --- the driver call, without the GIL ---------------------------------------------------------------------- */
static int call_driver(Dispatcher *self, int kind, void *fn, const uint8_t *p, uint32_t length, uint8_t *reply,
                       uint64_t host) {
    void *stream = (void *)(uintptr_t)rd64(p + 16); /* an async copy's */
    switch (kind) {
    case K_HTOD: case K_HTOD_ASYNC: {
        /* executor._htod: the bytes in our own pageable buffer (`p`: own or frame), which the driver stages before it
         * returns (an async copy so goes in stream order without waiting for the stream) */
        uint64_t size = rd64(p + 8);
        if (kind == K_HTOD) return ((fn_htod)fn)(rd64(p), p + COPY_FIXED(kind), size);
        return ((fn_htod_async)fn)(rd64(p), p + COPY_FIXED(kind), size, stream);
    }
    case K_DTOH: case K_DTOH_ASYNC:
        /* executor._dtoh: an async copy waits for its stream, then runs synchronously, so the completion slot it
         * writes into may be sent as soon as it returns */
        if (kind == K_DTOH_ASYNC) {
            int err = self->stream_sync(stream);
            if (err != CUDA_SUCCESS) return err;
        }
        return ((fn_dtoh)fn)(reply, rd64(p), rd64(p + 8));
    /* executor._pinned_copy: the guest's page-locked pages, mapped here at `host` */
    case K_PINNED_HTOD: return ((fn_htod)fn)(rd64(p), (const void *)(uintptr_t)host, rd64(p + 8));
    case K_PINNED_DTOH: return ((fn_dtoh)fn)((void *)(uintptr_t)host, rd64(p), rd64(p + 8));
    case K_PINNED_HTOD_ASYNC: return ((fn_htod_async)fn)(rd64(p), (const void *)(uintptr_t)host, rd64(p + 8), stream);
    case K_PINNED_DTOH_ASYNC: return ((fn_dtoh_async)fn)((void *)(uintptr_t)host, rd64(p), rd64(p + 8), stream);
    case K_NOP: return CUDA_SUCCESS;
    case K_VOID: return ((fn_void)fn)();
    case K_STREAM: case K_EVENT: case K_CONTEXT: return ((fn_handle)fn)((void *)(uintptr_t)rd64(p));
    case K_EVENT_STREAM: return ((fn_handle2)fn)((void *)(uintptr_t)rd64(p), (void *)(uintptr_t)rd64(p + 8));
    case K_STREAM_EVENT_FLAGS: case K_EVENT_STREAM_FLAGS:  /* (stream, event) or (event, stream), then flags */
        return ((fn_handle2_flags)fn)((void *)(uintptr_t)rd64(p), (void *)(uintptr_t)rd64(p + 8), rd32(p + 16));
    case K_MEMSET8: return ((fn_memset8)fn)(rd64(p), p[8], rd64(p + 9), (void *)(uintptr_t)rd64(p + 17));
    case K_MEMSET16: return ((fn_memset16)fn)(rd64(p), rd16(p + 8), rd64(p + 10), (void *)(uintptr_t)rd64(p + 18));
    case K_MEMSET32: return ((fn_memset32)fn)(rd64(p), rd32(p + 8), rd64(p + 12), (void *)(uintptr_t)rd64(p + 20));
    case K_DTOD: return ((fn_dtod)fn)(rd64(p), rd64(p + 8), rd64(p + 16), (void *)(uintptr_t)rd64(p + 24));
    case K_LAUNCH:
        self->launch_size = length - LAUNCH_FIXED;
        memcpy(self->launch_params, p + LAUNCH_FIXED, self->launch_size);
        return ((fn_launch)fn)((void *)(uintptr_t)rd64(p), rd32(p + 8), rd32(p + 12), rd32(p + 16), rd32(p + 20),
                               rd32(p + 24), rd32(p + 28), rd32(p + 32), (void *)(uintptr_t)rd64(p + 36), NULL,
                               self->launch_extra);
    case K_LAUNCH_EX: {
        uint32_t count = rd32(p + LAUNCH_FIXED);
        size_t attributes = (size_t)count * ATTRIBUTE_SIZE, params = LAUNCH_FIXED + 4 + attributes;
        memcpy(self->launch_attributes, p + LAUNCH_FIXED + 4, attributes);
        self->launch_size = length - params;
        memcpy(self->launch_params, p + params, self->launch_size);
        if (count == 0)
            return self->launch_kernel((void *)(uintptr_t)rd64(p), rd32(p + 8), rd32(p + 12), rd32(p + 16),
                                       rd32(p + 20), rd32(p + 24), rd32(p + 28), rd32(p + 32),
                                       (void *)(uintptr_t)rd64(p + 36), NULL, self->launch_extra);
        launch_config *c = &self->config;
        for (int i = 0; i < 3; i++) {
            c->grid[i] = rd32(p + 8 + 4 * i);
            c->block[i] = rd32(p + 20 + 4 * i);
        }
        c->shared = rd32(p + 32);
        c->stream = (void *)(uintptr_t)rd64(p + 36);
        c->attrs = count ? self->launch_attributes : NULL;
        c->count = count;
        return ((fn_launch_ex)fn)(c, (void *)(uintptr_t)rd64(p), NULL, self->launch_extra);
    }
    case K_STREAM_VALUE:
        return ((fn_stream_value)fn)((void *)(uintptr_t)rd64(p), rd64(p + 8), rd32(p + 16), rd32(p + 20));
    default: return -4; /* not reached: set_call() accepts known kinds only */
    }
}

/* --- rings --------------------------------------------------------------------------------------------------- */

static void forget_epoch(Dispatcher *self) {
    if (self->have_epoch) PyBuffer_Release(&self->epoch_view);
    self->have_epoch = 0;
    self->memo.epoch = NULL;
}

static int Dispatcher_init(Dispatcher *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"buffer", "requests", "completions", "generation", "policy", NULL};
    PyObject *buffer, *requests, *completions;
    unsigned int generation;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOI(ddddd)", names, &buffer, &requests, &completions, &generation,
                                     &self->spin_s, &self->busy_spin_s, &self->min_sleep, &self->max_sleep,
                                     &self->check_every_s))
        return -1;
    if (self->have_view) { PyBuffer_Release(&self->view); self->have_view = 0; }
    self->fd = -1;
    if (buffer == Py_None) { /* a relayed session: set_socket() says where its records come from */
        self->out.cell = RECORD_HEADER + SOCKET_REPLY;
        self->inline_capacity = SOCKET_INLINE;
    } else {
        if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) return -1;
        self->have_view = 1;
        if (ring_from(&self->view, &self->in, requests) < 0 || ring_from(&self->view, &self->out, completions) < 0) return -1;
        self->inline_capacity = self->in.cell - RECORD_HEADER;
    }
    free(self->own);
    if ((self->own = malloc(self->inline_capacity)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->generation = generation;
    memset(self->kind, 0, sizeof self->kind);
    memset(self->fn, 0, sizeof self->fn);
    memset(self->count, 0, sizeof self->count);
    memset(self->ns, 0, sizeof self->ns);
    memset(self->driver_ns, 0, sizeof self->driver_ns);
    self->timing = 0;
    self->launch_extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    self->launch_extra[1] = self->launch_params;
    self->launch_extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    self->launch_extra[3] = &self->launch_size;
    self->launch_extra[4] = CU_LAUNCH_PARAM_END;
    forget_epoch(self);
    Py_XSETREF(self->ledger, Py_NewRef(Py_None));
    return 0;
}

static void Dispatcher_dealloc(Dispatcher *self) {
    if (self->have_view) PyBuffer_Release(&self->view);
    forget_epoch(self);
    Py_XDECREF(self->lock);
    free(self->frame);
    Py_XDECREF(self->ledger);
    free(self->own);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Dispatcher_set_call(Dispatcher *self, PyObject *args) {
    unsigned int opcode;
    int kind;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "IiK", &opcode, &kind, &address)) return NULL;
    if (opcode > 0xFFFF || kind <= K_NONE || kind >= K_COUNT || (kind != K_NOP && address == 0)) {
        PyErr_SetString(PyExc_ValueError, "bad opcode, kind or function address");
        return NULL;
    }
    self->kind[opcode] = (uint8_t)kind;
    self->fn[opcode] = (void *)(uintptr_t)address;
    if (kind == K_LAUNCH) self->launch_kernel = (fn_launch)(uintptr_t)address;
    Py_RETURN_NONE;
}

static PyObject *Dispatcher_set_ledger(Dispatcher *self, PyObject *ledger) {
    forget_epoch(self);
    Py_XSETREF(self->ledger, Py_NewRef(ledger));
    /* its epoch, one aligned 64-bit word read without the GIL: without one, nothing is remembered */
    PyObject *epoch = ledger == Py_None ? NULL : PyObject_GetAttrString(ledger, "epoch");
    if (epoch != NULL && PyObject_GetBuffer(epoch, &self->epoch_view, PyBUF_FORMAT) == 0) {
        self->have_epoch = 1;
        const char *format = self->epoch_view.format;
        if (self->epoch_view.len == 8 && self->epoch_view.itemsize == 8 && format != NULL
            && (strcmp(format, "Q") == 0 || strcmp(format, "L") == 0) && (uintptr_t)self->epoch_view.buf % 8 == 0) {
            memset(self->memo.slot, 0, sizeof self->memo.slot);
            self->memo.epoch = self->epoch_view.buf;
        } else {
            forget_epoch(self);
        }
    }
    Py_XDECREF(epoch);
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *Dispatcher_set_copies(Dispatcher *self, PyObject *args) {
    unsigned long long stream_sync, is_capturing;
    if (!PyArg_ParseTuple(args, "KK", &stream_sync, &is_capturing)) return NULL;
    self->stream_sync = (fn_handle)(uintptr_t)stream_sync;
    self->is_capturing = (fn_is_capturing)(uintptr_t)is_capturing;
    Py_RETURN_NONE;
}

static PyObject *Dispatcher_set_launch_attributes(Dispatcher *self, PyObject *args) {
    unsigned long long plain, event;
    if (!PyArg_ParseTuple(args, "KK", &plain, &event)) return NULL;
    self->plain_attributes = plain;
    self->event_attributes = event;
    Py_RETURN_NONE;
}

static PyObject *Dispatcher_close(Dispatcher *self, PyObject *unused) {
    (void)unused;
    if (self->have_view) { PyBuffer_Release(&self->view); self->have_view = 0; }
    Py_RETURN_NONE;
}

/* One record served: counted, and with `timing` its time here (`taken` on) and in the driver's function. */
static void tally(Dispatcher *self, uint32_t opcode, uint64_t taken, uint64_t called, uint64_t returned) {
    self->served += 1;
    self->count[opcode] += 1;
    if (!taken) return;
    self->ns[opcode] += now_ns() - taken;
    self->driver_ns[opcode] += returned - called;
}

static PyObject *answer(int code, unsigned long long call_id, int status) {
    return Py_BuildValue("(iKi)", code, call_id, status);
}

/* Serve hot records until Python must act: (RET_PYTHON, 0, 0) a record the Python path answers is at the head
 * of the request ring; (RET_CHECK, 0, 0) a liveness check is due (the wait goes on at the next call);
 * (RET_POSTED_FAILED, call_id, status) a posted call failed (it was consumed; Python reports it);
 * (RET_IDLE, 0, 0) with block=False, no record is there. */
static PyObject *serve_socket(Dispatcher *self, int block);

static PyObject *Dispatcher_serve(Dispatcher *self, PyObject *args) {
    int block = 1;
    if (!PyArg_ParseTuple(args, "|p", &block)) return NULL;
    if (self->fd >= 0) return serve_socket(self, block);
    if (!self->have_view) { PyErr_SetString(PyExc_ValueError, "closed"); return NULL; }
    ledger_view l;
    int have_ledger = ledger_fetch(self, &l);
    uint32_t head = load32(self->in.head), tail_out = load32(self->out.tail); /* ours: Python may have moved them */
    /* the guest's completion head, read again only when it says the ring is full: a reply then does not wait for
     * the line the guest last wrote (a stale value only understates the room) */
    uint32_t out_head = load32(self->out.head);
    int code = RET_PYTHON, status = 0;
    unsigned long long failed_id = 0;
    PyThreadState *saved = PyEval_SaveThread();
    for (;;) {
        /* The next record is seen by its mark, in the line it is read from; a record that comes while we spin is
         * taken within a probe, not a probe plus a clock read. The tail's line is read only by a non-blocking call and
         * once the spin is over: a read while we spin would make the guest's next tail store wait for our copy's
         * invalidation, and its mark with it. A record published without its mark is served then. */
        uint32_t fill = ring_marked(&self->in, head);
        for (int probes = 0; !fill && block && probes < 64; probes++) {
            cpu_relax();
            fill = ring_marked(&self->in, head);
        }
        if (!fill && !block) fill = load32(self->in.tail) - head;
        double t = 0.0;
        if (fill == 0) {
            t = now_s();
            if (!block) { code = RET_IDLE; break; }
            if (!self->waiting) {
                self->waiting = 1;
                self->wait_start = t;
                self->sleep = 0.0;
            }
            double spin = self->busy ? self->busy_spin_s : self->spin_s;
            if (t - self->wait_start < spin) { cpu_relax(); continue; }
            fill = load32(self->in.tail) - head; /* past the spin */
        }
        if (fill == 0) {
            if (t >= self->next_check) { /* WaitPolicy.wait_for: checks from the sleeping phase only */
                self->next_check = t + self->check_every_s;
                code = RET_CHECK;
                break;
            }
            self->sleep = self->sleep == 0.0 ? self->min_sleep
                          : (self->sleep * 2 < self->max_sleep ? self->sleep * 2 : self->max_sleep);
            sleep_s(self->sleep);
            continue;
        }
        if (self->waiting) {
            self->waiting = 0;
            self->busy = now_s() - self->wait_start < self->busy_spin_s;
        }
        uint64_t taken = self->timing ? now_ns() : 0;
        if (fill > self->in.capacity) break; /* a broken peer: Python's receive says so (ChannelCorrupt) */
        const uint8_t *slot = ring_slot(&self->in, head);
        uint64_t call_id = rd64(slot);
        uint32_t opcode = rd32(slot + 8), flags = rd32(slot + 12), length = rd32(slot + 16);
        uint32_t generation = rd32(slot + 20);
        if ((flags & ~FLAG_NO_REPLY) || generation != self->generation || opcode > 0xFFFF
            || length > self->inline_capacity)
            break;
        int kind = self->kind[opcode];
        if (kind == K_NONE) break;
        const uint8_t *payload = self->own; /* checked and used from our copy: the slot is the guest's to rewrite */
        memcpy(self->own, slot + RECORD_HEADER, length);
        if (kind == K_LAUNCH ? (length < LAUNCH_FIXED || length - LAUNCH_FIXED > MAX_PARAMS)
            : kind == K_LAUNCH_EX ? !launch_ex_fits(self, payload, length)
            : (payload_size[kind] != UINT32_MAX && length != payload_size[kind]))
            break;
        int wants_reply = !(flags & FLAG_NO_REPLY);
        if (is_copy(kind) && !copy_is_plain(self, kind, payload, length, wants_reply)) break;
        if (wants_reply && tail_out - out_head >= self->out.capacity
            && tail_out - (out_head = load32(self->out.head)) >= self->out.capacity)
            break; /* Python waits for room */
        uint64_t host = 0;
        if (needs_ledger(kind) && !allowed_now(self, &l, have_ledger, kind, payload, &host, &saved)) break;
        if (may_capture(self, kind, payload)) break;
        uint8_t *out = ring_slot(&self->out, tail_out);
        uint64_t called = taken ? now_ns() : 0;
        int result = call_driver(self, kind, self->fn[opcode], payload, length, out + RECORD_HEADER, host);
        uint64_t returned = taken ? now_ns() : 0;
        head += 1;
        store32(self->in.head, head);
        if (wants_reply) {
            /* a device-to-host copy's bytes are in the completion slot already; its length says they count */
            uint32_t sent = is_copy(kind) && !is_htod(kind) && result == CUDA_SUCCESS ? (uint32_t)rd64(payload + 8) : 0;
            uint32_t words[6] = { 0, 0, sent, self->generation, (uint32_t)result, 0 }; /* opcode, flags, length */
            memcpy(out, &call_id, 8);
            memcpy(out + 8, words, sizeof words);
            ring_publish(&self->out, &tail_out);
        }
        tally(self, opcode, taken, called, returned);
        if (!wants_reply && result != CUDA_SUCCESS) {
            code = RET_POSTED_FAILED;
            failed_id = call_id;
            status = result;
            break;
        }
    }
    PyEval_RestoreThread(saved);
    if (have_ledger) ledger_release(&l);
    if (PyErr_Occurred()) PyErr_Clear(); /* a driver stub (cydriver) that raised: its status already says so */
    return answer(code, failed_id, status);
}

/* --- a relayed session's hot records, from its relay connection ------------------------------------------------
 * The same records, checks and driver calls as from a ring, with a frame in place of a slot: a frame is peeked
 * (MSG_PEEK) and taken only when C serves it, so whatever Python answers (another opcode, a BEAT, a frame not
 * whole yet, an end of stream) it reads from the connection itself, from a frame boundary. */
static PyObject *serve_socket(Dispatcher *self, int block) {
    ledger_view l;
    int have_ledger = ledger_fetch(self, &l);
    int code = RET_PYTHON, status = 0;
    unsigned long long failed_id = 0;
    uint8_t *frame = self->frame, reply[RECORD_HEADER + SOCKET_REPLY];
    PyThreadState *saved = PyEval_SaveThread();
    for (;;) {
        ssize_t n = recv(self->fd, frame, RECORD_HEADER + SOCKET_INLINE, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            double t = now_s();
            if (!block) { code = RET_IDLE; break; }
            if (!self->waiting) { self->waiting = 1; self->wait_start = t; }
            if (t - self->wait_start < (self->busy ? self->busy_spin_s : self->spin_s)) { cpu_relax(); continue; }
            if (t >= self->next_check) { self->next_check = t + self->check_every_s; code = RET_CHECK; break; }
            wait_readable(self->fd, self->next_check - t); /* a frame wakes it */
            continue;
        }
        if (n < (ssize_t)RECORD_HEADER) break; /* an end, an error, a frame begun: Python reads it */
        if (self->waiting) {
            self->waiting = 0;
            self->busy = now_s() - self->wait_start < self->busy_spin_s;
        }
        uint64_t taken = self->timing ? now_ns() : 0;
        uint64_t call_id = rd64(frame);
        uint32_t opcode = rd32(frame + 8), flags = rd32(frame + 12), length = rd32(frame + 16);
        uint32_t generation = rd32(frame + 20), reserved = rd32(frame + 28);
        if (reserved || (flags & ~FLAG_NO_REPLY) || generation != self->generation || opcode > 0xFFFF
            || length > SOCKET_INLINE || (size_t)n < RECORD_HEADER + length)
            break;
        int kind = self->kind[opcode];
        if (kind == K_NONE) break;
        const uint8_t *payload = frame + RECORD_HEADER;
        if (kind == K_LAUNCH ? (length < LAUNCH_FIXED || length - LAUNCH_FIXED > MAX_PARAMS)
            : kind == K_LAUNCH_EX ? !launch_ex_fits(self, payload, length)
            : (payload_size[kind] != UINT32_MAX && length != payload_size[kind]))
            break;
        int wants_reply = !(flags & FLAG_NO_REPLY);
        if (is_copy(kind) && !copy_is_plain(self, kind, payload, length, wants_reply)) break;
        uint64_t host = 0;
        if (needs_ledger(kind) && !allowed_now(self, &l, have_ledger, kind, payload, &host, &saved)) break;
        if (may_capture(self, kind, payload)) break;
        if (recv(self->fd, frame, RECORD_HEADER + length, MSG_DONTWAIT) != (ssize_t)(RECORD_HEADER + length))
            break; /* not reached: what was peeked is there */
        self->heard = now_s();
        uint64_t called = taken ? now_ns() : 0;
        int result = call_driver(self, kind, self->fn[opcode], payload, length, reply + RECORD_HEADER, host);
        uint64_t returned = taken ? now_ns() : 0;
        int gone = 0;
        if (wants_reply) {
            uint32_t sent = is_copy(kind) && !is_htod(kind) && result == CUDA_SUCCESS ? (uint32_t)rd64(payload + 8) : 0;
            uint32_t words[6] = { 0, 0, sent, self->generation, (uint32_t)result, 0 }; /* opcode, flags, length */
            memcpy(reply, &call_id, 8);
            memcpy(reply + 8, words, sizeof words);
            struct iovec iov = { reply, RECORD_HEADER + sent };
            gone = send_locked(self->fd, self->mutex, &iov, 1);
        }
        tally(self, opcode, taken, called, returned);
        if (gone) break; /* Python's next write says the peer is gone */
        if (!wants_reply && result != CUDA_SUCCESS) {
            code = RET_POSTED_FAILED;
            failed_id = call_id;
            status = result;
            break;
        }
    }
    PyEval_RestoreThread(saved);
    if (have_ledger) ledger_release(&l);
    if (PyErr_Occurred()) PyErr_Clear();
    return answer(code, failed_id, status);
}

static PyObject *Dispatcher_set_socket(Dispatcher *self, PyObject *args) {
    int fd;
    PyObject *lock;
    if (!PyArg_ParseTuple(args, "iO", &fd, &lock)) return NULL;
    pthread_mutex_t *mutex = lock_mutex(lock);
    if (mutex == NULL) return NULL;
    if (self->have_view) { PyErr_SetString(PyExc_ValueError, "this dispatcher serves a ring"); return NULL; }
    if (self->frame == NULL && (self->frame = malloc(RECORD_HEADER + SOCKET_INLINE)) == NULL) return PyErr_NoMemory();
    Py_XSETREF(self->lock, Py_NewRef(lock));
    self->mutex = mutex;
    self->fd = fd;
    self->heard = now_s();
    Py_RETURN_NONE;
}

static PyObject *Dispatcher_heard(Dispatcher *self, void *closure) {
    (void)closure;
    return PyFloat_FromDouble(self->heard);
}

static PyObject *Dispatcher_served(Dispatcher *self, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->served);
}

static PyObject *Dispatcher_counts(Dispatcher *self, PyObject *unused) {
    (void)unused;
    PyObject *counts = PyDict_New();
    if (counts == NULL) return NULL;
    for (Py_ssize_t opcode = 0; opcode < 65536; opcode++) {
        if (!self->count[opcode]) continue;
        PyObject *key = PyLong_FromSsize_t(opcode);
        PyObject *value = Py_BuildValue("(KKK)", self->count[opcode], self->ns[opcode], self->driver_ns[opcode]);
        int bad = key == NULL || value == NULL || PyDict_SetItem(counts, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (bad) { Py_DECREF(counts); return NULL; }
    }
    return counts;
}

static PyObject *Dispatcher_set_timing(Dispatcher *self, PyObject *unused) {
    (void)unused;
    if (!self->timing) memset(self->count, 0, sizeof self->count); /* counted from now on too, as timed */
    self->timing = 1;
    Py_RETURN_NONE;
}

static PyMethodDef Dispatcher_methods[] = {
    {"counts", (PyCFunction)Dispatcher_counts, METH_NOARGS,
     "counts() -> {opcode: (records of it served here, their ns here, their ns in the driver)}: times since "
     "set_timing(), else 0."},
    {"set_timing", (PyCFunction)Dispatcher_set_timing, METH_NOARGS,
     "set_timing(): count and time each record from now on (three clock reads a record)."},
    {"set_call", (PyCFunction)Dispatcher_set_call, METH_VARARGS,
     "set_call(opcode, kind, address): serve `opcode` as `kind` by the C function at `address`."},
    {"set_ledger", (PyCFunction)Dispatcher_set_ledger, METH_O,
     "set_ledger(ledger): the SessionLedger whose tables the checks consult (None: only unchecked calls), and whose "
     "epoch says when what it allowed may be taken as allowed again without them."},
    {"serve", (PyCFunction)Dispatcher_serve, METH_VARARGS,
     "serve(block=True) -> (code, call_id, status): serve hot records until Python must act."},
    {"set_launch_attributes", (PyCFunction)Dispatcher_set_launch_attributes, METH_VARARGS,
     "set_launch_attributes(plain, event): the launch attribute IDs forwarded as their bytes, and those whose value "
     "names an event, as bit masks (driver_api's sets); any other attribute is the Python path's."},
    {"set_copies", (PyCFunction)Dispatcher_set_copies, METH_VARARGS,
     "set_copies(cuStreamSynchronize address, cuStreamIsCapturing address): what copies need besides their own "
     "function."},
    {"close", (PyCFunction)Dispatcher_close, METH_NOARGS, "Release the region's buffer."},
    {"set_socket", (PyCFunction)Dispatcher_set_socket, METH_VARARGS,
     "set_socket(fd, lock): serve a relayed session's records from its relay connection (written under `lock`)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Dispatcher_getset[] = {
    {"served", (getter)Dispatcher_served, NULL, "records answered here", NULL},
    {"heard", (getter)Dispatcher_heard, NULL, "when a frame was last taken here (CLOCK_MONOTONIC seconds)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_orion_hot_dispatch.Dispatcher",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One session's hot records, served from its request ring (host_agent/session/hot_path.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Dispatcher_init,
    .tp_dealloc = (destructor)Dispatcher_dealloc,
    .tp_methods = Dispatcher_methods,
    .tp_getset = Dispatcher_getset,
};


static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_orion_hot_dispatch", "The session worker's hot records in C.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__orion_hot_dispatch(void) {
    if (PyType_Ready(&DispatcherType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Dispatcher", (PyObject *)&DispatcherType) < 0) { Py_DECREF(m); return NULL; }
    static const struct { const char *name; int value; } constants[] = {
        {"PYTHON", RET_PYTHON}, {"CHECK", RET_CHECK}, {"POSTED_FAILED", RET_POSTED_FAILED}, {"IDLE", RET_IDLE},
        {"K_NOP", K_NOP}, {"K_VOID", K_VOID}, {"K_STREAM", K_STREAM}, {"K_EVENT", K_EVENT},
        {"K_CONTEXT", K_CONTEXT}, {"K_EVENT_STREAM", K_EVENT_STREAM}, {"K_STREAM_EVENT_FLAGS", K_STREAM_EVENT_FLAGS},
        {"K_EVENT_STREAM_FLAGS", K_EVENT_STREAM_FLAGS},
        {"K_MEMSET8", K_MEMSET8}, {"K_MEMSET16", K_MEMSET16}, {"K_MEMSET32", K_MEMSET32}, {"K_DTOD", K_DTOD},
        {"K_LAUNCH", K_LAUNCH}, {"K_HTOD", K_HTOD}, {"K_HTOD_ASYNC", K_HTOD_ASYNC}, {"K_DTOH", K_DTOH},
        {"K_DTOH_ASYNC", K_DTOH_ASYNC}, {"K_STREAM_VALUE", K_STREAM_VALUE}, {"K_LAUNCH_EX", K_LAUNCH_EX},
        {"K_PINNED_HTOD", K_PINNED_HTOD}, {"K_PINNED_HTOD_ASYNC", K_PINNED_HTOD_ASYNC},
        {"K_PINNED_DTOH", K_PINNED_DTOH}, {"K_PINNED_DTOH_ASYNC", K_PINNED_DTOH_ASYNC},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) { Py_DECREF(m); return NULL; }
    return m;
}

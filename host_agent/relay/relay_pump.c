/* relay_pump.c: a relayed session's records between its ring and its relay connection, on the relaying host
 * (CPython extension `_orion_relay_pump`, loaded by relay/compiled_pump.py for relay/relayed_session.py).
 *
 * Why: a relayed call crossed two Python threads on the relaying host (the ring thread forwarding, the answers
 * thread writing the completion ring), each record paying a Python ring read, a frame write, a select wake-up and
 * a GIL hand-over between them. The pump does both directions in one loop without the GIL: a ring record it is
 * sure of (not staged, flags NO_REPLY at most, an opcode the relay forwards as it is, a payload in its slot) is
 * written to the socket as its frame; an answer frame already whole in the socket (small, a plain answer or a BEAT)
 * is written to the completion ring. The small page-locked copies are served here as relay/pool.py's rewrite does:
 * a DtoH of at most a completion slot, synchronous or posted, is sent as the plain DtoH the GPU host serves (always
 * answered), its answer's bytes landing in the pool (LANDS_IN_POOL, pool_address: a posted one's success is said to
 * nobody, its failure is Python's to report); an HtoD of at most a slot, synchronous or posted, is sent as the
 * plain HtoD with the pool's bytes, while no copy into the pool is in flight (SENT_FROM_POOL).
 * While page-locked memory is mirrored on the GPU host (relay/mirror.py), a launch that names no pool memory is still
 * forwarded here as long as the CPU has changed no mirrored byte since the two sides last agreed (set_mirrored).
 * Anything else -- a staged record, the pool's other calls, a malformed header, a large answer, a posted or large
 * page-locked copy, a full completion ring, an error on the socket -- is left where it
 * is (the record at the ring's head, the frame unread in the socket) and pump() returns, so the relay's Python path
 * (the reference) handles it. Frames are peeked (MSG_PEEK) before they are taken, so Python reads the socket from a
 * frame boundary. Socket writes hold the connection's write lock (relay/frames.FrameLock), which FrameStream's
 * writers (the beat thread) hold too. The call ids still waiting for an answer are kept here, for both paths
 * (expect / take / take_pending). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "native_common.h"

/* pump()'s answers: why it gave control back to Python */
enum { PUMP_RING = 0, PUMP_SOCKET = 1, PUMP_CHECK = 2, PUMP_LOST = 3 };

/* A call waiting for its answer: the guest's flags; `python`: its answer is the relay's Python path's; a
 * page-locked DtoH sent from here: where its bytes land (land_size > 0), its flags the guest's (NO_REPLY: posted). */
typedef struct { uint64_t call_id; uint32_t flags, python; uint64_t land_at; uint32_t land_size; } pending_call;

/* forward[]'s codes of the page-locked copies served here (compiled_pump.LANDS_IN_POOL, SENT_FROM_POOL) */
enum { LANDS_IN_POOL = 5, SENT_FROM_POOL = 6 };
/* A page-locked cuMemcpy{HtoD,DtoH}[Async] is its plain request's fixed part, (device, size[, stream]), then the pool
 * pointer (u64 each): PINNED_SIZE or PINNED_ASYNC_SIZE bytes, both directions alike (compiled_pump.py holds them to
 * the call table). */
#define PINNED_SIZE 24
#define PINNED_ASYNC_SIZE 32

typedef struct {
    PyObject_HEAD
    PyObject *buffer; /* the region: exported only while pump() runs, so the ring's owner can close it between */
    void *base;
    Py_ssize_t base_len;
    int fd, lost_errno;
    ring in, out;
    uint32_t ring_generation, remote_generation, inline_capacity;
    double spin_s, busy_spin_s, min_sleep, max_sleep, check_every_s;
    double wait_start, sleep, next_check, heard;
    int waiting, busy;
    PyObject *lock; /* a relay/frames.FrameLock, kept alive while its mutex is used */
    pthread_mutex_t *mutex;
    uint8_t forward[65536]; /* opcodes forwarded as they are: 1; 2 (3): unless the u64 at payload offset 0 (or 8)
                               lies in the page-locked pool, whose calls relay/uva.py serves; 4: unless any u64 at a
                               4-byte aligned offset of the payload does (a launch: relay/mirror.py), or mirrored
                               memory changed (set_mirrored); 5: a
                               synchronous page-locked DtoH landing in the pool (LANDS_IN_POOL); 6: a page-locked
                               HtoD sent with the pool's bytes (SENT_FROM_POOL); 0: never */
    uint64_t pool_base, pool_size; /* the guest's page-locked pool (set_pool), or size 0 */
    PyObject *host_address; /* HostPool.host_address (set_landing), or NULL: every page-locked copy is Python's */
    uint32_t pinned_copy;   /* the opcode bit of a page-locked copy (driver_api.PINNED_COPY; set_landing) */
    uint64_t landing_base, landing_size; /* the pool's mapping in this process (HostPool.host_base, size: a mapping
                                          * at the guest's address, apart from the region's): copies use it alone */
    Py_buffer *agreed; /* a mirrored allocation's bytes both sides last agreed on (set_mirrored), one per allocation */
    const uint8_t **mirrored; /* where each of those allocations lies in the pool here */
    size_t nmirrored;
    pending_call *pending;
    size_t npending, cap;
    unsigned long long pumped;
    uint64_t *counted; /* ring records forwarded here by the guest's opcode, once counting began (count()); or NULL */
    uint8_t *frame; /* a peeked frame: header and an inline payload */
    uint8_t *own;   /* the payload of the ring record being forwarded, copied out of its slot before anything in it is
                     * checked: the guest may rewrite its slot meanwhile (as hot_dispatch.c's `own`) */
} Pump;

static int pending_add(Pump *self, uint64_t call_id, uint32_t flags, uint32_t python) {
    for (size_t i = 0; i < self->npending; i++)
        if (self->pending[i].call_id == call_id) {
            self->pending[i] = (pending_call){ call_id, flags, python, 0, 0 };
            return 0;
        }
    if (self->npending == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 64;
        pending_call *grown = realloc(self->pending, cap * sizeof *grown);
        if (grown == NULL) return -1;
        self->pending = grown;
        self->cap = cap;
    }
    self->pending[self->npending++] = (pending_call){ call_id, flags, python, 0, 0 };
    return 0;
}

static pending_call *pending_find(Pump *self, uint64_t call_id) {
    for (size_t i = 0; i < self->npending; i++)
        if (self->pending[i].call_id == call_id) return &self->pending[i];
    return NULL;
}

static void pending_drop(Pump *self, pending_call *entry) {
    *entry = self->pending[--self->npending];
}

/* Where a page-locked copy's `size` bytes at the guest's `pointer` lie here: HostPool.host_address asked under the
 * GIL (the pool's bookkeeping is Python's: a pointer in no allocation is refused there), and held to lie in the
 * pool's mapping set_landing was told of. */
static int pool_address(Pump *self, PyThreadState **save, uint64_t pointer, uint64_t size, uint64_t *host) {
    if (self->host_address == NULL) return 0;
    PyEval_RestoreThread(*save);
    PyObject *answer = PyObject_CallFunction(self->host_address, "KK", (unsigned long long)pointer,
                                             (unsigned long long)size);
    int found = answer != NULL && PyLong_Check(answer);
    if (found) *host = PyLong_AsUnsignedLongLong(answer);
    Py_XDECREF(answer);
    if (PyErr_Occurred()) { PyErr_Clear(); found = 0; }
    *save = PyEval_SaveThread();
    return found && *host - self->landing_base < self->landing_size
           && size <= self->landing_size - (*host - self->landing_base);
}

/* A page-locked copy (LANDS_IN_POOL, SENT_FROM_POOL) of at most a completion slot: its size and where its bytes lie
 * in the pool here (1), or 0 when it is Python's (larger, a device side in the pool, a pointer in no allocation,
 * malformed). */
static int pinned_copy(Pump *self, PyThreadState **save, const uint8_t *payload, uint32_t length, uint64_t *size,
                       uint64_t *host) {
    if (length != PINNED_SIZE && length != PINNED_ASYNC_SIZE) return 0;
    uint64_t device = rd64(payload), pointer = rd64(payload + length - 8);
    *size = rd64(payload + 8);
    if (*size == 0 || *size > self->out.cell - RECORD_HEADER) return 0;
    if (self->pool_size && device - self->pool_base < self->pool_size) return 0; /* relay/uva.py's */
    return pool_address(self, save, pointer, *size, host);
}

/* Whether the guest's CPU left every mirrored allocation as both sides last agreed (relay/mirror.py): then a launch
 * that names no pool memory has nothing to bring to the mirror first, and goes as it is. */
static int mirrors_agree(const Pump *self) {
    for (size_t i = 0; i < self->nmirrored; i++)
        if (memcmp(self->mirrored[i], self->agreed[i].buf, (size_t)self->agreed[i].len) != 0) return 0;
    return 1;
}

static void mirrored_clear(Pump *self) {
    for (size_t i = 0; i < self->nmirrored; i++) PyBuffer_Release(&self->agreed[i]);
    free(self->agreed);
    free(self->mirrored);
    self->agreed = NULL, self->mirrored = NULL, self->nmirrored = 0;
}

/* Whether a copy into the pool is on its way (its bytes not yet landed): a page-locked DtoH, here or Python's. */
static int landing_in_flight(const Pump *self) {
    for (size_t i = 0; i < self->npending; i++)
        if (self->pending[i].python || self->pending[i].land_size) return 1;
    return 0;
}

/* One ring record forwarded: 1, 0 when it is Python's, -1 when the socket failed (lost_errno). */
static int forward_record(Pump *self, uint32_t *head, PyThreadState **save) {
    const uint8_t *slot = ring_slot(&self->in, *head);
    uint64_t call_id = rd64(slot);
    uint32_t opcode = rd32(slot + 8), flags = rd32(slot + 12), length = rd32(slot + 16);
    if ((flags & ~FLAG_NO_REPLY) || opcode > 0xFFFF || !self->forward[opcode]
        || length > self->inline_capacity)
        return 0;
    uint8_t how = self->forward[opcode];
    const uint32_t guest_opcode = opcode; /* (a page-locked copy goes out as the plain one) */
    const uint8_t *payload = self->own; /* checked and sent from our copy: the slot is the guest's to rewrite */
    memcpy(self->own, slot + RECORD_HEADER, length);
    uint64_t pool_bytes = 0; /* an HtoD's bytes in the pool, `tail` of them, after the payload */
    uint32_t tail = 0;
    if (how == LANDS_IN_POOL || how == SENT_FROM_POOL) { /* sent as the plain copy: its fixed part, no pointer */
        uint64_t size = 0, host = 0;
        if (!(self->pinned_copy && (opcode & self->pinned_copy))
            || (how == LANDS_IN_POOL && length == PINNED_SIZE && (flags & FLAG_NO_REPLY)) /* a synchronous one posted */
            || (how == SENT_FROM_POOL && landing_in_flight(self)) /* it must read what lands: Relay._pool_written */
            || !pinned_copy(self, save, payload, length, &size, &host))
            return 0;
        if (how == LANDS_IN_POOL) { /* always answered, its bytes landing at `host` (take_frame), the guest's flags kept */
            if (pending_add(self, call_id, flags, 0) < 0) return 0;
            pending_call *entry = pending_find(self, call_id);
            entry->land_at = host;
            entry->land_size = (uint32_t)size;
            flags = 0;
        } else {
            pool_bytes = host, tail = (uint32_t)size;
        }
        opcode -= self->pinned_copy, length -= 8;
    } else if (how == 4 && self->pool_size) { /* a launch naming pool memory anywhere: Python's (relay/mirror.py) */
        for (uint32_t at = 0; at + 8 <= length; at += 4)
            if (rd64(payload + at) - self->pool_base < self->pool_size) return 0;
        /* while memory is mirrored: Python's too when the CPU changed mirrored bytes (they go to the mirror first,
         * after every copy into the pool on its way has landed: Relay._push) */
        if (self->nmirrored && (landing_in_flight(self) || !mirrors_agree(self))) return 0;
    } else if (how >= 2 && self->pool_size) { /* a device side in the pool: Python's (relay/uva.py) */
        if (length < 8u * (how - 1)) return 0;
        for (uint32_t i = 0; i + 1 < how; i++)
            if (rd64(payload + 8u * i) - self->pool_base < self->pool_size) return 0;
    }
    if (how != LANDS_IN_POOL && !(flags & FLAG_NO_REPLY) && pending_add(self, call_id, flags, 0) < 0) return 0;
    uint32_t words[6] = { opcode, flags, length + tail, self->remote_generation, 0, 0 };
    uint8_t header[RECORD_HEADER];
    memcpy(header, &call_id, 8);
    memcpy(header + 8, words, sizeof words);
    struct iovec iov[3] = { { header, RECORD_HEADER }, { (void *)payload, length },
                            { (void *)(uintptr_t)pool_bytes, tail } };
    int err = send_locked(self->fd, self->mutex, iov, tail ? 3 : length ? 2 : 1);
    *head += 1;
    store32(self->in.head, *head);
    if (err) { self->lost_errno = err; return -1; }
    if (self->counted) self->counted[guest_opcode]++;
    return 1;
}

/* Whether the peer has closed its end: a frame cut short by it stays short, and a peek (which sees its bytes, not
 * the end behind them) would wait for the rest for ever. */
static int peer_closed(int fd) {
    struct pollfd p = { fd, POLLRDHUP, 0 };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* One frame taken from the socket: 1, 0 when none is whole there yet, -1 when it is Python's. */
static int take_frame(Pump *self, uint32_t *tail_out) {
    size_t want = RECORD_HEADER + (self->out.cell - RECORD_HEADER);
    ssize_t n = recv(self->fd, self->frame, want, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (n == 0) return -1; /* the end of the stream: Python says so */
    if ((size_t)n < RECORD_HEADER) return 0;
    uint64_t call_id = rd64(self->frame);
    uint32_t opcode = rd32(self->frame + 8), flags = rd32(self->frame + 12), length = rd32(self->frame + 16);
    if ((flags & ~FLAG_ASYNC_ERROR) || length > self->out.cell - RECORD_HEADER
        || (opcode != 0 && !(opcode == OP_BEAT && length == 0)))
        return -1;
    if ((size_t)n < RECORD_HEADER + length) return peer_closed(self->fd) ? -1 : 0; /* closed mid-frame: Python says so */
    uint64_t land_at = 0;
    uint32_t land_size = 0, posted = 0;
    if (opcode == 0) {
        pending_call *entry = pending_find(self, call_id);
        if (entry != NULL && entry->python) return -1; /* a pinned DtoH of Python's: its bytes land in the pool */
        if (entry == NULL && !(flags & FLAG_ASYNC_ERROR)) return -1; /* answers nothing asked: Python refuses it */
        if (*tail_out - load32(self->out.head) >= self->out.capacity) return -1; /* Python waits for room */
        if (entry != NULL) {
            posted = entry->flags & FLAG_NO_REPLY;
            if (posted && rd32(self->frame + 24) != 0) return -1; /* a posted copy's failure: Python reports it */
            land_at = entry->land_at, land_size = entry->land_size;
            pending_drop(self, entry);
        }
    }
    if (recv(self->fd, self->frame, RECORD_HEADER + length, MSG_DONTWAIT) != (ssize_t)(RECORD_HEADER + length))
        return -1; /* not reached: what was peeked is there */
    self->heard = now_s();
    if (opcode == OP_BEAT) return 1;
    uint8_t *out = ring_slot(&self->out, *tail_out);
    int32_t status = (int32_t)rd32(self->frame + 24);
    if (land_size) { /* a page-locked DtoH sent from here: its bytes into the pool (all, or none: relay/pool.py's
                      * landing_for), the guest answered with its status alone, as the relay's _deliver does */
        if (status == 0 && length == land_size) memcpy((void *)(uintptr_t)land_at, self->frame + RECORD_HEADER, length);
        if (posted) return 1; /* (a success: nothing to say) */
        flags = 0, length = 0;
    }
    uint32_t words[6] = { 0, flags & FLAG_ASYNC_ERROR, length, self->ring_generation, (uint32_t)status, 0 };
    memcpy(out + RECORD_HEADER, self->frame + RECORD_HEADER, length);
    memcpy(out, &call_id, 8);
    memcpy(out + 8, words, sizeof words);
    ring_publish(&self->out, tail_out);
    return 1;
}

/* Something moved (a record forwarded or answered here, or one handed to Python): a wait that was under way ends,
 * and the next one starts with its spin again. A hand-over to Python counts too: without it the pump came back
 * still "waiting" since before the hand-over, past its spin, and slept up to max_sleep before it looked at the ring
 * again, so a relayed page-locked DtoH (its answer is Python's) took about 1.2 ms instead of a round trip. */
static void moved_now(Pump *self, double t) {
    if (self->waiting) { self->waiting = 0; self->busy = t - self->wait_start < self->busy_spin_s; }
}

static PyObject *Pump_pump(Pump *self, PyObject *unused) {
    (void)unused;
    Py_buffer view;
    if (self->buffer == NULL) { PyErr_SetString(PyExc_ValueError, "closed"); return NULL; }
    if (PyObject_GetBuffer(self->buffer, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (view.buf != self->base) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the region moved");
        return NULL;
    }
    uint32_t head = load32(self->in.head), tail_out = load32(self->out.tail);
    int code;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        int moved = 0, r;
        uint32_t fill = load32(self->in.tail) - head;
        if (fill > self->in.capacity) { code = PUMP_RING; break; } /* a broken peer: Python's receive says so */
        if (fill) {
            r = forward_record(self, &head, &_save);
            if (r < 0) { code = PUMP_LOST; break; }
            if (r == 0) { moved_now(self, now_s()); code = PUMP_RING; break; }
            moved = 1;
            self->pumped += 1;
        }
        r = take_frame(self, &tail_out);
        if (r < 0) { moved_now(self, now_s()); code = PUMP_SOCKET; break; }
        moved |= r;
        self->pumped += (unsigned long long)r; /* each record and each frame counts: one pass may move both */
        double t = now_s();
        if (moved) {
            moved_now(self, t);
            continue;
        }
        if (!self->waiting) { self->waiting = 1; self->wait_start = t; self->sleep = 0.0; }
        if (t - self->wait_start < (self->busy ? self->busy_spin_s : self->spin_s)) { cpu_relax(); continue; }
        if (t >= self->next_check) { self->next_check = t + self->check_every_s; code = PUMP_CHECK; break; }
        self->sleep = self->sleep == 0.0 ? self->min_sleep
                      : (self->sleep * 2 < self->max_sleep ? self->sleep * 2 : self->max_sleep);
        wait_readable(self->fd, self->sleep); /* a frame wakes it; a ring record waits for the sleep, as a ring wait does */
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromLong(code);
}

static int Pump_init(Pump *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"buffer", "requests", "completions", "generations", "fd", "lock", "policy", NULL};
    PyObject *buffer, *requests, *completions, *lock;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O!(II)iO(ddddd)", names, &buffer, &PyTuple_Type, &requests,
                                     &PyTuple_Type, &completions, &self->ring_generation, &self->remote_generation,
                                     &self->fd, &lock, &self->spin_s, &self->busy_spin_s,
                                     &self->min_sleep, &self->max_sleep, &self->check_every_s))
        return -1;
    pthread_mutex_t *mutex = lock_mutex(lock);
    if (mutex == NULL) return -1;
    Py_buffer view; /* ring_from() reads its bounds only */
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0) return -1;
    int bad = ring_from(&view, &self->in, requests) < 0 || ring_from(&view, &self->out, completions) < 0;
    self->base = view.buf;
    self->base_len = view.len;
    PyBuffer_Release(&view);
    if (bad) return -1;
    Py_XSETREF(self->buffer, Py_NewRef(buffer));
    self->inline_capacity = self->in.cell - RECORD_HEADER;
    free(self->frame);
    free(self->own);
    self->frame = malloc(self->out.cell);
    self->own = malloc(self->inline_capacity ? self->inline_capacity : 1);
    if (self->frame == NULL || self->own == NULL) { PyErr_NoMemory(); return -1; }
    Py_XSETREF(self->lock, Py_NewRef(lock));
    self->mutex = mutex;
    self->heard = now_s();
    return 0;
}

static void Pump_dealloc(Pump *self) {
    mirrored_clear(self);
    Py_XDECREF(self->buffer);
    Py_XDECREF(self->host_address);
    Py_XDECREF(self->lock);
    free(self->pending);
    free(self->frame);
    free(self->own);
    free(self->counted);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pump_set_forward(Pump *self, PyObject *arg) {
    Py_buffer table;
    if (PyObject_GetBuffer(arg, &table, PyBUF_SIMPLE) < 0) return NULL;
    int ok = table.len == (Py_ssize_t)sizeof self->forward;
    if (ok) memcpy(self->forward, table.buf, sizeof self->forward);
    PyBuffer_Release(&table);
    if (!ok) { PyErr_SetString(PyExc_ValueError, "one byte per opcode (65536)"); return NULL; }
    Py_RETURN_NONE;
}

static PyObject *Pump_set_pool(Pump *self, PyObject *args) {
    unsigned long long base, size;
    if (!PyArg_ParseTuple(args, "KK", &base, &size)) return NULL;
    self->pool_base = base;
    self->pool_size = size;
    Py_RETURN_NONE;
}

/* set_mirrored([(host address, agreed bytearray), ...]): the mirrored allocations, as relay/mirror.py's MirrorRelay
 * keeps them (its `agreed` bytearrays, changed in place and never resized while held here). */
static PyObject *Pump_set_mirrored(Pump *self, PyObject *arg) {
    PyObject *items = PySequence_Fast(arg, "a list of (address, bytearray)");
    if (items == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    Py_buffer *agreed = calloc((size_t)n + 1, sizeof *agreed);
    const uint8_t **mirrored = calloc((size_t)n + 1, sizeof *mirrored);
    Py_ssize_t held = 0;
    int ok = agreed != NULL && mirrored != NULL;
    for (; ok && held < n; held++) {
        unsigned long long address;
        PyObject *bytes;
        ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, held), "KO", &address, &bytes)
             && PyObject_GetBuffer(bytes, &agreed[held], PyBUF_SIMPLE) == 0;
        if (!ok) break;
        mirrored[held] = (const uint8_t *)(uintptr_t)address;
        ok = address - self->landing_base < self->landing_size
             && (uint64_t)agreed[held].len <= self->landing_size - (address - self->landing_base);
        if (!ok) { PyBuffer_Release(&agreed[held]); PyErr_SetString(PyExc_ValueError, "outside the pool's mapping"); }
    }
    Py_DECREF(items);
    if (!ok) {
        for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&agreed[i]);
        free(agreed);
        free(mirrored);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    mirrored_clear(self);
    self->agreed = agreed, self->mirrored = mirrored, self->nmirrored = (size_t)n;
    Py_RETURN_NONE;
}

static PyObject *Pump_set_landing(Pump *self, PyObject *args) {
    PyObject *host_address;
    unsigned int pinned_copy;
    unsigned long long mapped_at, mapped_size;
    if (!PyArg_ParseTuple(args, "OIKK", &host_address, &pinned_copy, &mapped_at, &mapped_size)) return NULL;
    if (host_address != Py_None && !PyCallable_Check(host_address)) {
        PyErr_SetString(PyExc_TypeError, "host_address: HostPool.host_address or None");
        return NULL;
    }
    Py_XSETREF(self->host_address, host_address == Py_None ? NULL : Py_NewRef(host_address));
    self->pinned_copy = pinned_copy;
    self->landing_base = mapped_at, self->landing_size = mapped_size;
    Py_RETURN_NONE;
}

static PyObject *Pump_expect(Pump *self, PyObject *args) {
    unsigned long long call_id;
    unsigned int flags;
    int python;
    if (!PyArg_ParseTuple(args, "KIp", &call_id, &flags, &python)) return NULL;
    if (pending_add(self, call_id, flags, (uint32_t)python) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Pump_take(Pump *self, PyObject *arg) {
    unsigned long long call_id = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    pending_call *entry = pending_find(self, call_id);
    if (entry == NULL) Py_RETURN_NONE; /* nobody waits for it */
    pending_call taken = *entry;
    pending_drop(self, entry);
    return Py_BuildValue("(IKI)", (unsigned int)taken.flags, (unsigned long long)taken.land_at,
                         (unsigned int)taken.land_size);
}

static PyObject *Pump_take_pending(Pump *self, PyObject *unused) {
    (void)unused;
    PyObject *list = PyList_New((Py_ssize_t)self->npending);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < self->npending; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i, Py_BuildValue("(KI)", (unsigned long long)self->pending[i].call_id,
                                                           (unsigned int)self->pending[i].flags));
    self->npending = 0;
    return list;
}

static PyObject *Pump_close(Pump *self, PyObject *unused) {
    (void)unused;
    Py_CLEAR(self->buffer);
    Py_RETURN_NONE;
}

static PyObject *Pump_get_heard(Pump *self, void *closure) { (void)closure; return PyFloat_FromDouble(self->heard); }
static PyObject *Pump_get_pumped(Pump *self, void *closure) { (void)closure; return PyLong_FromUnsignedLongLong(self->pumped); }
static PyObject *Pump_get_waiting_since(Pump *self, void *closure) {
    (void)closure;
    if (!self->waiting) Py_RETURN_NONE;
    return PyFloat_FromDouble(self->wait_start);
}
static PyObject *Pump_get_landing(Pump *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(landing_in_flight(self));
}
static PyObject *Pump_get_lost(Pump *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(self->lost_errno ? strerror(self->lost_errno) : "");
}

/* count(): from now on, count the ring records forwarded here by opcode; {opcode: records} so far. */
static PyObject *Pump_count(Pump *self, PyObject *unused) {
    (void)unused;
    if (self->counted == NULL && (self->counted = calloc(65536, sizeof *self->counted)) == NULL) return PyErr_NoMemory();
    PyObject *counts = PyDict_New();
    for (uint32_t opcode = 0; counts != NULL && opcode < 65536; opcode++) {
        if (!self->counted[opcode]) continue;
        PyObject *key = PyLong_FromUnsignedLong(opcode), *value = PyLong_FromUnsignedLongLong(self->counted[opcode]);
        if (key == NULL || value == NULL || PyDict_SetItem(counts, key, value) < 0) Py_CLEAR(counts);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    return counts;
}

static PyMethodDef Pump_methods[] = {
    {"pump", (PyCFunction)Pump_pump, METH_NOARGS,
     "pump() -> code: move records both ways until Python must act (RING, SOCKET, CHECK or LOST)."},
    {"set_forward", (PyCFunction)Pump_set_forward, METH_O,
     "set_forward(table): per opcode (65536 bytes), whether a ring record of it is forwarded here as it is."},
    {"set_pool", (PyCFunction)Pump_set_pool, METH_VARARGS,
     "set_pool(base, size): the guest's page-locked pool, whose addresses as a device side are Python's."},
    {"set_landing", (PyCFunction)Pump_set_landing, METH_VARARGS,
     "set_landing(host_address, pinned_copy, mapped_at, mapped_size): the pool's HostPool.host_address (None: none), "
     "the opcode bit of a page-locked copy and the pool's mapping here (HostPool.host_base, size), for the page-locked "
     "copies served here (forward codes 5 and 6): one outside that mapping is Python's."},
    {"set_mirrored", (PyCFunction)Pump_set_mirrored, METH_O,
     "set_mirrored([(host address, agreed bytearray), ...]): the mirrored allocations (in the pool's mapping, "
     "set_landing) and what both sides last agreed they hold: a launch naming no pool memory is forwarded here while "
     "the pool's bytes are those (forward code 4)."},
    {"expect", (PyCFunction)Pump_expect, METH_VARARGS,
     "expect(call_id, flags, python): a record sent by Python waits for its answer (python: Python takes it)."},
    {"take", (PyCFunction)Pump_take, METH_O,
     "take(call_id) -> (the guest's flags, landing address, landing size) of a waiting call, forgotten (None: nobody "
     "waits for it); a landing size of 0: none (a page-locked DtoH sent from here lands its bytes there)."},
    {"take_pending", (PyCFunction)Pump_take_pending, METH_NOARGS, "Every waiting (call_id, flags), forgotten."},
    {"count", (PyCFunction)Pump_count, METH_NOARGS,
     "count() -> {opcode: ring records forwarded here}: counting begins at the first call (the wire's STATS)."},
    {"close", (PyCFunction)Pump_close, METH_NOARGS, "Forget the region (pump() then refuses)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pump_getset[] = {
    {"heard", (getter)Pump_get_heard, NULL, "when the pump last took a frame (CLOCK_MONOTONIC seconds)", NULL},
    {"pumped", (getter)Pump_get_pumped, NULL, "records and frames moved here", NULL},
    {"lost", (getter)Pump_get_lost, NULL, "why the last socket write failed ('' : none did)", NULL},
    {"landing", (getter)Pump_get_landing, NULL,
     "whether a page-locked DtoH is on its way, its bytes not yet in the pool (the pump's or Python's)", NULL},
    {"waiting_since", (getter)Pump_get_waiting_since, NULL,
     "when the wait under way began (CLOCK_MONOTONIC seconds; None: none is)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PumpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_orion_relay_pump.Pump",
    .tp_basicsize = sizeof(Pump),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A relayed session's records between its ring and its relay connection (relay/relayed_session.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pump_init,
    .tp_dealloc = (destructor)Pump_dealloc,
    .tp_methods = Pump_methods,
    .tp_getset = Pump_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_orion_relay_pump", "A relayed session's records between its ring and its connection.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__orion_relay_pump(void) {
    if (PyType_Ready(&PumpType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Pump", (PyObject *)&PumpType) < 0) { Py_DECREF(m); return NULL; }
    static const struct { const char *name; int value; } constants[] = {
        {"PUMP_RING", PUMP_RING}, {"PUMP_SOCKET", PUMP_SOCKET}, {"PUMP_CHECK", PUMP_CHECK}, {"PUMP_LOST", PUMP_LOST},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) { Py_DECREF(m); return NULL; }
    return m;
}

/* native_common.h: what the host's compiled modules share (session/hot_dispatch.c, relay/relay_pump.c).
 *
 * The ring's shape, its index words (loaded with acquire, stored with release, as guest_runtime/native/orion_wire.c
 * does) and its slots' publish marks, the clock and the waits, and writes to a relay connection under its write lock.
 * The lock is a pthread mutex that relay/frames.py's FrameLock owns and Python's writers take too; C is given its
 * address. Nothing here knows a CUDA call or a relay's bookkeeping. Included once per module, after Python.h.
 */
#ifndef ORION_NATIVE_COMMON_H
#define ORION_NATIVE_COMMON_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#define RECORD_HEADER 32u
#define FLAG_NO_REPLY 1u
#define FLAG_ASYNC_ERROR 4u
#define OP_BEAT 0x82u /* relay/frames.BEAT */

typedef struct {
    uint8_t *head, *tail, *data; /* index words and first slot */
    uint32_t cell, mask, capacity;
} ring;

static inline uint32_t load32(const uint8_t *p) { return atomic_load_explicit((_Atomic uint32_t *)p, memory_order_acquire); }
static inline void store32(uint8_t *p, uint32_t v) { atomic_store_explicit((_Atomic uint32_t *)p, v, memory_order_release); }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* A slot's publish mark (record.SEQ_AT, record.publish_mark): the tail that covers it, with the top bit set; stored
 * after the tail, so whoever sees the mark sees the record and the tail. */
#define SEQ_AT 28u
static inline uint32_t seq_mark(uint32_t tail) { return 0x80000000u | (tail & 0x7FFFFFFFu); }

static inline uint8_t *ring_slot(const ring *r, uint32_t index) { return r->data + (size_t)(index & r->mask) * r->cell; }

/* Producer: the record at *tail is written; publish it (the tail, then its mark) and move *tail on. */
static inline void ring_publish(ring *r, uint32_t *tail) {
    uint8_t *slot = ring_slot(r, *tail);
    *tail += 1;
    store32(r->tail, *tail);
    store32(slot + SEQ_AT, seq_mark(*tail));
}

/* Consumer: whether the record at `head` is published, from its mark alone (the line the record is read from: the
 * tail's line is left to the producer, which stores it before every mark). */
static inline int ring_marked(const ring *r, uint32_t head) {
    return load32(ring_slot(r, head) + SEQ_AT) == seq_mark(head + 1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint64_t now_ns(void) { /* the same clock in nanoseconds: the hot path's record timing */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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

/* The ring described by `spec` (head word, tail word, first slot, slot size, slots: byte offsets in the region that
 * `view` maps), checked to lie inside it; -1 with a Python error otherwise. */
static int ring_from(const Py_buffer *view, ring *r, PyObject *spec) {
    unsigned long long head, tail, data, cell, capacity;
    if (!PyTuple_Check(spec)) { PyErr_SetString(PyExc_TypeError, "a ring is a tuple"); return -1; }
    if (!PyArg_ParseTuple(spec, "KKKKK", &head, &tail, &data, &cell, &capacity)) return -1;
    uint64_t size = (uint64_t)view->len;
    if (capacity == 0 || (capacity & (capacity - 1)) || cell < RECORD_HEADER || head + 4 > size || tail + 4 > size
        || head % 4 || tail % 4 || data > size || capacity * cell > size - data) {
        PyErr_SetString(PyExc_ValueError, "ring outside the region or of a bad shape");
        return -1;
    }
    uint8_t *base = (uint8_t *)view->buf;
    r->head = base + head; r->tail = base + tail; r->data = base + data;
    r->cell = (uint32_t)cell; r->capacity = (uint32_t)capacity; r->mask = (uint32_t)capacity - 1;
    return 0;
}

/* The mutex of a relay connection's write lock (relay/frames.FrameLock: its `address`); NULL with a Python error. */
static pthread_mutex_t *lock_mutex(PyObject *lock) {
    PyObject *address = PyObject_GetAttrString(lock, "address");
    if (address == NULL) return NULL;
    void *mutex = PyLong_AsVoidPtr(address);
    Py_DECREF(address);
    if (mutex == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a write lock at address 0");
    return (pthread_mutex_t *)mutex;
}

/* The whole of `iov` to socket `fd` (blocking), under `lock`; 0, or an errno. A peer that takes nothing for the
 * socket's SO_SNDTIMEO (relay_frames.FrameStream sets it to its stall bound) is ETIMEDOUT: the connection is lost. */
static int send_locked(int fd, pthread_mutex_t *mutex, struct iovec *iov, int count) {
    int err = 0;
    pthread_mutex_lock(mutex);
    while (count > 0) {
        struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)count };
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno == EAGAIN || errno == EWOULDBLOCK ? ETIMEDOUT : errno;
            break;
        }
        while (count > 0 && (size_t)n >= iov->iov_len) { n -= (ssize_t)iov->iov_len; iov++; count--; }
        if (count > 0) { iov->iov_base = (uint8_t *)iov->iov_base + n; iov->iov_len -= (size_t)n; }
    }
    pthread_mutex_unlock(mutex);
    return err;
}

/* Wait up to `s` seconds for `fd` to be readable. */
static void wait_readable(int fd, double s) {
    struct pollfd p = { fd, POLLIN, 0 };
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    ppoll(&p, 1, &ts, NULL);
}

#endif

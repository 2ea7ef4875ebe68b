/* device_answers.c: cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute, cuDeviceGetName,
 * cuDeviceGetUuid, cuDeviceTotalMem and cuDeviceCanAccessPeer answered from once-filled tables after the first
 * forwarded answer (answer_cache.h).
 *
 * Why they cannot change while the process runs: the host answers them from its driver (a device's attributes,
 * name and UUID are fixed for the driver's lifetime) and from the session's vGPUs (host_agent/session/executor.py's POLICY
 * handlers: the count, which guest ordinals exist, total memory as the quota caps it). The vGPUs change only at a
 * controller BIND, which the host refuses after the session's first context or allocation, and which the native
 * library never sends (the capsule path sends it right after HELLO, guest_runtime/activate.py); a BIND added
 * here must likewise come before the first query, or empty these tables.
 *
 * Errors cached: CUDA_ERROR_INVALID_DEVICE (an ordinal outside the session's devices: the count is fixed) and, for
 * attributes, CUDA_ERROR_INVALID_VALUE (an attribute the host's driver does not know: the driver and its enum do
 * not change under a running session; frameworks probe attributes newer than the driver, and each probe would
 * otherwise travel every time). Any other error (the channel, NOT_INITIALIZED) travels again next time.
 *
 * Reads are one acquire load of an atomic word; a miss asks the host and stores its answer, so two threads that
 * miss together both ask and store the same answer. Names and UUIDs are filled once under a mutex.
 */
#include <pthread.h>
#include <string.h>

#include "answer_cache.h"

#define DEVICES 64     /* guest ordinals answered from the tables; others are asked every time */
#define ATTRIBUTES 256 /* CUdevice_attribute values kept (CUDA 13's highest is 162) */
#define NAME_BYTES 256 /* what the host asks its driver for at most (executor._device_get_name) */

static _Atomic uint64_t version, count;
static _Atomic uint64_t ordinals[DEVICES];                 /* cuDeviceGet */
static _Atomic uint64_t attributes[DEVICES][ATTRIBUTES];
static _Atomic uint64_t peers[DEVICES][DEVICES];
static _Atomic uint64_t total_state[DEVICES];              /* the status; the value in total_bytes */
static _Atomic uint64_t total_bytes[DEVICES];

struct text_answer { _Atomic uint64_t state; size_t length; char bytes[NAME_BYTES]; };
static struct text_answer names[DEVICES], uuids[DEVICES];
static pthread_mutex_t fill = PTHREAD_MUTEX_INITIALIZER;

static int in_table(int device) { return device >= 0 && device < DEVICES; }

/* Whether a device query's error is a fact of the session (see the file comment). */
static int lasting(int status, int attribute_query) {
    return status == CUDA_SUCCESS || status == CUDA_ERROR_INVALID_DEVICE ||
           (attribute_query && status == CUDA_ERROR_INVALID_VALUE);
}

/* A scalar query with a 4-byte reply: from `slot` (NULL: not cacheable), else asked and kept. Every query it serves
 * replies as cuDeviceGetAttribute does (one i32). */
#define LIKE_ATTRIBUTE(call) (ORION_REP_##call##_SIZE == ORION_REP_cuDeviceGetAttribute_SIZE \
                              && ORION_REP_##call##_arg0 == ORION_REP_cuDeviceGetAttribute_arg0)
_Static_assert(LIKE_ATTRIBUTE(cuDriverGetVersion) && LIKE_ATTRIBUTE(cuDeviceGetCount) && LIKE_ATTRIBUTE(cuDeviceGet)
               && LIKE_ATTRIBUTE(cuDeviceCanAccessPeer), "scalar() reads one reply layout");
static int scalar(_Atomic uint64_t *slot, int attribute_query, uint32_t opcode, const void *req, size_t len,
                  int *value) {
    if (slot && orion_is_initialized()) {
        uint64_t answer = atomic_load_explicit(slot, memory_order_acquire);
        if (answer) {
            int status = orion_answer_status(answer);
            if (status == CUDA_SUCCESS) *value = orion_answer_value(answer);
            return status;
        }
    }
    uint8_t rep[ORION_REP_cuDeviceGetAttribute_SIZE];
    int status = orion_thread_forward(opcode, req, len, rep, sizeof rep, 0);
    int32_t got = status == CUDA_SUCCESS ? orion_get_i32(rep + ORION_REP_cuDeviceGetAttribute_arg0) : 0;
    if (slot && orion_is_initialized() && lasting(status, attribute_query))
        atomic_store_explicit(slot, orion_answer_pack(status, got), memory_order_release);
    if (status == CUDA_SUCCESS) *value = got;
    return status;
}

CUresult cuDriverGetVersion(int *value) {
    ORION_ENTRY("cuDriverGetVersion");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    return scalar(&version, 0, ORION_OP_cuDriverGetVersion, NULL, 0, value);
}

CUresult cuDeviceGetCount(int *value) {
    ORION_ENTRY("cuDeviceGetCount");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    return scalar(&count, 0, ORION_OP_cuDeviceGetCount, NULL, 0, value);
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ORION_ENTRY("cuDeviceGet");
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceGet_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceGet_arg1, ordinal);
    return scalar(in_table(ordinal) ? &ordinals[ordinal] : NULL, 0, ORION_OP_cuDeviceGet, req, sizeof req, device);
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
    ORION_ENTRY("cuDeviceGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceGetAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceGetAttribute_arg1, attribute);
    orion_put_i32(req + ORION_REQ_cuDeviceGetAttribute_arg2, device);
    _Atomic uint64_t *slot = in_table(device) && attribute >= 0 && attribute < ATTRIBUTES
                                 ? &attributes[device][attribute] : NULL;
    return scalar(slot, 1, ORION_OP_cuDeviceGetAttribute, req, sizeof req, value);
}

CUresult cuDeviceCanAccessPeer(int *value, CUdevice device, CUdevice peer) {
    ORION_ENTRY("cuDeviceCanAccessPeer");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceCanAccessPeer_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceCanAccessPeer_arg1, device);
    orion_put_i32(req + ORION_REQ_cuDeviceCanAccessPeer_arg2, peer);
    _Atomic uint64_t *slot = in_table(device) && in_table(peer) ? &peers[device][peer] : NULL;
    return scalar(slot, 0, ORION_OP_cuDeviceCanAccessPeer, req, sizeof req, value);
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice device) {
    ORION_ENTRY("cuDeviceTotalMem");
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    int cached = in_table(device) && orion_is_initialized();
    if (cached) {
        uint64_t answer = atomic_load_explicit(&total_state[device], memory_order_acquire);
        if (answer) {
            int status = orion_answer_status(answer);
            if (status == CUDA_SUCCESS) *bytes = (size_t)atomic_load_explicit(&total_bytes[device],
                                                                              memory_order_relaxed);
            return status;
        }
    }
    uint8_t req[ORION_REQ_cuDeviceTotalMem_SIZE], rep[ORION_REP_cuDeviceTotalMem_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceTotalMem_arg1, device);
    int status = orion_thread_forward(ORION_OP_cuDeviceTotalMem, req, sizeof req, rep, sizeof rep, 0);
    uint64_t got = status == CUDA_SUCCESS ? orion_get_u64(rep + ORION_REP_cuDeviceTotalMem_arg0) : 0;
    if (cached && lasting(status, 0)) {
        atomic_store_explicit(&total_bytes[device], got, memory_order_relaxed);
        atomic_store_explicit(&total_state[device], orion_answer_pack(status, 0), memory_order_release);
    }
    if (status == CUDA_SUCCESS) *bytes = (size_t)got;
    return status;
}

/* A device's name or UUID (a `tail` reply of at most NAME_BYTES): kept in `answer`, asked at most once while
 * cacheable (under `fill`, so its bytes are written once, before its state says they are there). */
static int text(struct text_answer *answer, uint32_t opcode, const uint8_t *req, size_t len) {
    if (answer && orion_is_initialized()) {
        uint64_t state = atomic_load_explicit(&answer->state, memory_order_acquire);
        if (state) return orion_answer_status(state);
        pthread_mutex_lock(&fill);
        state = atomic_load_explicit(&answer->state, memory_order_acquire);
        int status = state ? orion_answer_status(state) : CUDA_SUCCESS;
        if (!state) {
            size_t got = 0;
            status = orion_thread_forwardv(opcode, &(struct orion_piece){ req, len }, 1, NULL, 0, answer->bytes,
                                           sizeof answer->bytes, &got, 0);
            answer->length = got;
            if (lasting(status, 0))
                atomic_store_explicit(&answer->state, orion_answer_pack(status, 0), memory_order_release);
        }
        pthread_mutex_unlock(&fill);
        return status;
    }
    return -1; /* not cacheable: the caller asks the host itself */
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    ORION_ENTRY("cuDeviceGetName");
    if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceGetName_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceGetName_device, device);
    if (in_table(device)) {
        /* the whole name once; each caller gets it cut to its length */
        orion_put_i32(req + ORION_REQ_cuDeviceGetName_length, NAME_BYTES);
        int status = text(&names[device], ORION_OP_cuDeviceGetName, req, sizeof req);
        if (status >= 0) {
            if (status == CUDA_SUCCESS) {
                size_t n = names[device].length < (size_t)length - 1 ? names[device].length : (size_t)length - 1;
                memcpy(name, names[device].bytes, n);
                name[n] = '\0';
            }
            return status;
        }
    }
    orion_put_i32(req + ORION_REQ_cuDeviceGetName_length, length);
    size_t got = 0;
    int status = orion_thread_forwardv(ORION_OP_cuDeviceGetName, &(struct orion_piece){ req, sizeof req }, 1, NULL, 0,
                                       name, (size_t)length, &got, 0);
    if (status == CUDA_SUCCESS) name[got < (size_t)length ? got : (size_t)length - 1] = '\0';
    return status;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    ORION_ENTRY("cuDeviceGetUuid");
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceGetUuid_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceGetUuid_device, device);
    if (in_table(device)) {
        int status = text(&uuids[device], ORION_OP_cuDeviceGetUuid, req, sizeof req);
        if (status >= 0) {
            if (status != CUDA_SUCCESS) return status;
            if (uuids[device].length != 16) return CUDA_ERROR_UNKNOWN;
            memcpy(uuid, uuids[device].bytes, 16);
            return CUDA_SUCCESS;
        }
    }
    uint8_t raw[16];
    size_t got = 0;
    int status = orion_thread_forwardv(ORION_OP_cuDeviceGetUuid, &(struct orion_piece){ req, sizeof req }, 1, NULL, 0,
                                       raw, sizeof raw, &got, 0);
    if (status != CUDA_SUCCESS) return status;
    if (got != sizeof raw) return CUDA_ERROR_UNKNOWN;
    memcpy(uuid, raw, sizeof raw);
    return CUDA_SUCCESS;
}

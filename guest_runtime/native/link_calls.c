/* link_calls.c: the JIT linker (cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete, cuLinkDestroy; cuda.h's
 * _v2 names are aliases of them). The link state is the host's handle (host_agent/session/link_calls.py); this file keeps
 * what the program is handed that the host's driver holds: the linked cubin.
 *
 * - JIT options travel as cuModuleLoadDataEx's do (module_calls.c): scalar ones as (option, value) pairs; the log
 *   buffers and CU_JIT_WALL_TIME stay here and are answered at once as an empty log (sizes 0, wall time 0.0); any
 *   other option answers 801, named once.
 * - cuLinkAddData sends its `size` bytes as they lie (the request's tail) with the input's name; cuLinkAddFile reads
 *   the guest's file here and sends it as cuLinkAddData (a PTX file with a NUL after it, as PTX in memory ends).
 * - cuLinkComplete: the host links and sends the cubin back; it lies in memory this file owns for the state, whose
 *   pointer and size the program gets, valid until cuLinkDestroy (as the driver's own is), which frees it. A cubin
 *   larger than the first buffer comes back as its size, and is asked for again with a buffer of that size.
 */
#define _POSIX_C_SOURCE 200809L /* open's O_CLOEXEC, fstat under -std=c11 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hand_calls.h"

#ifndef CUDA_ERROR_FILE_NOT_FOUND
#define CUDA_ERROR_FILE_NOT_FOUND 301
#endif
#define ERROR_OUT_OF_MEMORY 2 /* CUDA_ERROR_OUT_OF_MEMORY */

/* CUjit_option values that name guest memory (driver_api.JIT_GUEST_OPTIONS) and CUjitInputType's PTX. */
enum { JIT_WALL_TIME = 2, JIT_INFO_LOG_BUFFER = 3, JIT_INFO_LOG_SIZE = 4, JIT_ERROR_LOG_BUFFER = 5,
       JIT_ERROR_LOG_SIZE = 6, JIT_LOG_VERBOSE = 12, JIT_GUEST_OPTIONS = 13, INPUT_PTX = 1 };
#define MAX_LINK_BYTES ((size_t)1 << 30)    /* host_agent/session/link_calls.py MAX_CUBIN: what a record carries */
#define FIRST_CUBIN_BUFFER ((size_t)1 << 20) /* most linked cubins fit: one round trip */

/* driver_api.JIT_SCALAR_OPTIONS */
static int jit_scalar(int option) {
    switch (option) {
    case 0: case 7: case 8: case 9: case 10: case 11: case 13: case 14:
    case 30: case 31: case 32: case 33: case 34: case 35:
        return 1;
    default:
        return 0;
    }
}

static int jit_guest(int option) {
    return (option >= JIT_WALL_TIME && option <= JIT_ERROR_LOG_SIZE) || option == JIT_LOG_VERBOSE;
}

/* An empty NUL-terminated log in each log buffer given a size, the sizes 0, the wall time 0.0 (all zero bits). */
static void empty_logs(void **values, const int *guest) {
    static const int logs[2][2] = { { JIT_INFO_LOG_BUFFER, JIT_INFO_LOG_SIZE },
                                    { JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_SIZE } };
    for (int i = 0; i < 2; i++) {
        int buffer = guest[logs[i][0]], size = guest[logs[i][1]];
        if (buffer >= 0 && size >= 0 && values[buffer] && (uint32_t)(uintptr_t)values[size])
            *(char *)values[buffer] = '\0';
        if (size >= 0) values[size] = NULL;
    }
    if (guest[JIT_WALL_TIME] >= 0) values[guest[JIT_WALL_TIME]] = NULL;
}

/* The options as a counted list of (option, value) pairs at `at` (room for `count` pairs and the count); each guest
 * option's slot noted in `guest`. 0, or the CUresult refusing an option that does not travel (801, named once). */
#define PAIR(call, field) ORION_REQ_##call##_options##field
_Static_assert(PAIR(cuLinkCreate, _ITEM) == PAIR(cuLinkAddData, _ITEM)
               && PAIR(cuLinkCreate, _ITEM_0) == PAIR(cuLinkAddData, _ITEM_0)
               && PAIR(cuLinkCreate, _ITEM_1) == PAIR(cuLinkAddData, _ITEM_1), "both calls' options are one list");
static int put_options(const char *unsupported, uint8_t *at, unsigned count, const CUjit_option *options,
                       void **values, int *guest, size_t *written) {
    for (int i = 0; i < JIT_GUEST_OPTIONS; i++) guest[i] = -1;
    uint32_t pairs = 0;
    for (unsigned i = 0; i < count; i++) {
        int option = options[i];
        if (jit_scalar(option)) {
            uint8_t *pair = at + ORION_LENGTH_BYTES + PAIR(cuLinkCreate, _ITEM) * (size_t)pairs;
            orion_put_i32(pair + PAIR(cuLinkCreate, _ITEM_0), option);
            orion_put_u64(pair + PAIR(cuLinkCreate, _ITEM_1), (uint64_t)(uintptr_t)values[i]);
            pairs++;
        } else if (jit_guest(option)) {
            guest[option] = (int)i;
        } else {
            return orion_not_forwarded(unsupported);
        }
    }
    orion_put_u32(at, pairs);
    *written = ORION_LENGTH_BYTES + PAIR(cuLinkCreate, _ITEM) * (size_t)pairs;
    return CUDA_SUCCESS;
}

/* --- the cubins this process holds for its link states ------------------------------------------------------ */

struct linked { uint64_t state; void *cubin; struct linked *next; };
static pthread_mutex_t linked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct linked *linked_list; /* a state completed twice holds both cubins: each pointer stays valid */

static int keep(uint64_t state, void *cubin) {
    struct linked *entry = malloc(sizeof *entry);
    if (!entry) return 0;
    entry->state = state;
    entry->cubin = cubin;
    pthread_mutex_lock(&linked_lock);
    entry->next = linked_list;
    linked_list = entry;
    pthread_mutex_unlock(&linked_lock);
    return 1;
}

static void forget(uint64_t state) {
    pthread_mutex_lock(&linked_lock);
    for (struct linked **at = &linked_list; *at;) {
        struct linked *entry = *at;
        if (entry->state == state) {
            *at = entry->next;
            free(entry->cubin);
            free(entry);
        } else {
            at = &entry->next;
        }
    }
    pthread_mutex_unlock(&linked_lock);
}

/* --- the calls ---------------------------------------------------------------------------------------------- */

CUresult cuLinkCreate(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut) {
    ORION_ENTRY("cuLinkCreate");
    if (!stateOut || (numOptions && (!options || !optionValues))) return CUDA_ERROR_INVALID_VALUE;
    uint8_t *head = malloc(ORION_LENGTH_BYTES + PAIR(cuLinkCreate, _ITEM) * (size_t)numOptions);
    if (!head) return ERROR_OUT_OF_MEMORY;
    int guest[JIT_GUEST_OPTIONS];
    size_t length;
    int status = put_options("cuLinkCreate with a JIT option other than the scalar, log and wall-time ones",
                             head + ORION_REQ_cuLinkCreate_options, numOptions, options, optionValues, guest, &length);
    if (status == CUDA_SUCCESS) {
        uint8_t reply[ORION_REP_cuLinkCreate_SIZE];
        status = hand_forward(ORION_OP_cuLinkCreate, head, ORION_REQ_cuLinkCreate_SIZE + length, reply, sizeof reply);
        if (status == CUDA_SUCCESS)
            *stateOut = (CUlinkState)(uintptr_t)orion_get_u64(reply + ORION_REP_cuLinkCreate_state);
        if (optionValues) empty_logs(optionValues, guest);
    }
    free(head);
    return status;
}

CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                       unsigned int numOptions, CUjit_option *options, void **optionValues) {
    ORION_ENTRY("cuLinkAddData");
    if ((size && !data) || (numOptions && (!options || !optionValues))) return CUDA_ERROR_INVALID_VALUE;
    if (size > MAX_LINK_BYTES) {
        fprintf(stderr, "orion: cuLinkAddData of %zu bytes: more than the %zu a call carries\n", size,
                MAX_LINK_BYTES);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t name_length = name ? strlen(name) : 0;
    uint8_t *head = malloc(ORION_REQ_cuLinkAddData_SIZE + ORION_LENGTH_BYTES
                           + PAIR(cuLinkAddData, _ITEM) * (size_t)numOptions + ORION_LENGTH_BYTES + name_length);
    if (!head) return ERROR_OUT_OF_MEMORY;
    orion_put_u64(head + ORION_REQ_cuLinkAddData_state, (uint64_t)(uintptr_t)state);
    orion_put_i32(head + ORION_REQ_cuLinkAddData_input_type, (int32_t)type);
    int guest[JIT_GUEST_OPTIONS];
    size_t length;
    int status = put_options("cuLinkAddData with a JIT option other than the scalar, log and wall-time ones",
                             head + ORION_REQ_cuLinkAddData_options, numOptions, options, optionValues, guest, &length);
    if (status == CUDA_SUCCESS) {
        uint8_t *named = head + ORION_REQ_cuLinkAddData_options + length; /* the name: u32 length, its bytes */
        orion_put_u32(named, (uint32_t)name_length);
        if (name_length) memcpy(named + ORION_LENGTH_BYTES, name, name_length);
        struct orion_piece pieces[2] = {
            { head, (size_t)(named - head) + ORION_LENGTH_BYTES + name_length }, { data, size } };
        status = hand_forwardv(ORION_OP_cuLinkAddData, pieces, size ? 2 : 1, NULL, 0);
        if (optionValues) empty_logs(optionValues, guest);
    }
    free(head);
    return status;
}

/* The whole of the file at `path` in a malloc'd buffer, a NUL after it (not counted in *length): CUDA_SUCCESS,
 * CUDA_ERROR_FILE_NOT_FOUND for a file that cannot be opened or read, CUDA_ERROR_OUT_OF_MEMORY, or
 * CUDA_ERROR_INVALID_VALUE for one larger than a call carries. */
static int read_link_file(const char *path, uint8_t **bytes, size_t *length) {
    int fd;
    do fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return CUDA_ERROR_FILE_NOT_FOUND;
    struct stat st;
    size_t capacity = 64 * 1024, used = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) capacity = (size_t)st.st_size;
    uint8_t *buffer = capacity < MAX_LINK_BYTES ? malloc(capacity + 1) : NULL;
    int status = buffer ? CUDA_SUCCESS : capacity < MAX_LINK_BYTES ? ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    while (status == CUDA_SUCCESS) {
        if (used == capacity) { /* a file that grew, or one with no size to ask (a pipe) */
            size_t grown = 2 * capacity;
            uint8_t *larger = grown < MAX_LINK_BYTES ? realloc(buffer, grown + 1) : NULL;
            if (!larger) {
                status = grown < MAX_LINK_BYTES ? ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
                continue;
            }
            buffer = larger;
            capacity = grown;
        }
        ssize_t got = read(fd, buffer + used, capacity - used);
        if (got < 0) {
            if (errno != EINTR) status = CUDA_ERROR_FILE_NOT_FOUND; /* a directory, an I/O error */
            continue;
        }
        if (got == 0) break;
        used += (size_t)got;
    }
    close(fd);
    if (status != CUDA_SUCCESS) {
        free(buffer);
        return status;
    }
    buffer[used] = '\0';
    *bytes = buffer;
    *length = used;
    return CUDA_SUCCESS;
}

CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                       CUjit_option *options, void **optionValues) {
    ORION_ENTRY("cuLinkAddFile");
    if (!path || (numOptions && (!options || !optionValues))) return CUDA_ERROR_INVALID_VALUE;
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t *bytes;
    size_t length;
    int status = read_link_file(path, &bytes, &length);
    if (status != CUDA_SUCCESS) return status;
    /* PTX is text the driver reads to its NUL; the file's name is the input's name in the linker's log */
    status = cuLinkAddData(state, type, bytes, type == INPUT_PTX ? length + 1 : length, path, numOptions, options,
                           optionValues);
    free(bytes);
    return status;
}

/* Ask for the state's cubin into `buffer` (`capacity` bytes): the call's CUresult, the cubin's size in *size and
 * the bytes that came in *got. */
static int ask_cubin(uint64_t state, void *buffer, size_t capacity, size_t *size, size_t *got) {
    uint8_t req[ORION_REQ_cuLinkComplete_SIZE], reply[ORION_REP_cuLinkComplete_SIZE];
    orion_put_u64(req + ORION_REQ_cuLinkComplete_state, state);
    orion_put_u64(req + ORION_REQ_cuLinkComplete_capacity, (uint64_t)capacity);
    struct orion_piece piece = { req, sizeof req };
    int status = orion_thread_forwardv(ORION_OP_cuLinkComplete, &piece, 1, reply, sizeof reply, buffer, capacity, got,
                                       0);
    if (status == CUDA_SUCCESS) *size = (size_t)orion_get_u64(reply + ORION_REP_cuLinkComplete_size);
    return status;
}

CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut) {
    ORION_ENTRY("cuLinkComplete");
    if (!cubinOut) return CUDA_ERROR_INVALID_VALUE;
    uint64_t handle = (uint64_t)(uintptr_t)state;
    size_t capacity = FIRST_CUBIN_BUFFER, size = 0, got = 0;
    uint8_t *cubin = malloc(capacity);
    if (!cubin) return ERROR_OUT_OF_MEMORY;
    int status = ask_cubin(handle, cubin, capacity, &size, &got);
    if (status == CUDA_SUCCESS && size > capacity) { /* only its size came: ask again with room for it */
        uint8_t *larger = size <= MAX_LINK_BYTES ? realloc(cubin, size) : NULL;
        if (!larger) {
            status = ERROR_OUT_OF_MEMORY;
        } else {
            cubin = larger;
            capacity = size;
            status = ask_cubin(handle, cubin, capacity, &size, &got);
        }
    }
    if (status == CUDA_SUCCESS && got != size) {
        fprintf(stderr, "orion: cuLinkComplete: the host said %zu bytes and sent %zu\n", size, got);
        status = CUDA_ERROR_UNKNOWN;
    }
    if (status == CUDA_SUCCESS && size < capacity) { /* give back what the cubin does not take */
        uint8_t *fitted = realloc(cubin, size ? size : 1);
        if (fitted) cubin = fitted;
    }
    if (status == CUDA_SUCCESS && !keep(handle, cubin)) status = ERROR_OUT_OF_MEMORY;
    if (status != CUDA_SUCCESS) {
        free(cubin);
        return status;
    }
    *cubinOut = cubin;
    if (sizeOut) *sizeOut = size;
    return CUDA_SUCCESS;
}

/* The generated call's request, then the cubins this state was given are freed. */
CUresult cuLinkDestroy(CUlinkState state) {
    ORION_ENTRY("cuLinkDestroy");
    uint8_t req[ORION_REQ_cuLinkDestroy_SIZE];
    orion_put_u64(req + ORION_REQ_cuLinkDestroy_arg0, (uint64_t)(uintptr_t)state);
    int status = orion_thread_forward(ORION_OP_cuLinkDestroy, req, sizeof req, NULL, 0, 0);
    if (status == CUDA_SUCCESS) forget((uint64_t)(uintptr_t)state);
    return status;
}

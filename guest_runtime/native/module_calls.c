/* module_calls.c: the native guest driver's module and library calls (guest_runtime/forward.py's hand-written
 * versions in C): loads that measure the image and send it from where it lies after their JIT options (or only its
 * SHA-256, when the agent already holds it), loads from a file of the guest (read here, then loaded as its bytes),
 * and the look-ups of functions, kernels and globals by name. */
#define _POSIX_C_SOURCE 200809L /* open's O_CLOEXEC, fstat under -std=c11 */
#include "module_calls.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hand_calls.h"
#include "module_image.h"
#include "param_layouts.h"
#include "sha256.h"

/* driver_api.IMAGE_BY_DIGEST (added to a load's opcode) and IMAGE_BY_DIGEST_MIN (smaller images always travel
 * whole: a few ring slots cost less than a second round trip); tests/wire/test_images_by_digest.py holds them to it. */
enum { IMAGE_BY_DIGEST = 0x4000, IMAGE_BY_DIGEST_MIN = 64 * 1024 };

/* CUjit_option values that name guest memory (logs, wall time): answered in the guest, never sent. */
enum { JIT_WALL_TIME = 2, JIT_INFO_LOG_BUFFER = 3, JIT_INFO_LOG_SIZE = 4, JIT_ERROR_LOG_BUFFER = 5,
       JIT_ERROR_LOG_SIZE = 6, JIT_LOG_VERBOSE = 12, JIT_GUEST_OPTIONS = 13 };
#define LIBRARY_BINARY_IS_PRESERVED 1 /* CUlibraryOption: a promise about the guest's copy, which stays home */

/* driver_api.JIT_SCALAR_OPTIONS: the options that travel as (option, the integer in its value slot). */
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

/* The process's note of the digests the agent was seen to hold (a load by digest it answered, or a whole image it
 * loaded, which it keeps). A noted digest answered "not cached" means the agent dropped it (evicted, or its cache
 * is off, unusable or smaller than the image); after DROPS_TO_STOP of those this process stops asking by digest,
 * and each load saves the round trip a miss costs. */
enum { NOTED = 256, DROPS_TO_STOP = 2 };
static pthread_mutex_t note_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t noted[NOTED][ORION_SHA256_BYTES];
static unsigned noted_count, noted_next, drops;

static int noted_at(const uint8_t *digest) { /* under note_lock: its slot, or -1 */
    for (unsigned i = 0; i < noted_count; i++)
        if (!memcmp(noted[i], digest, ORION_SHA256_BYTES)) return (int)i;
    return -1;
}

static void note_held(const uint8_t *digest) {
    pthread_mutex_lock(&note_lock);
    if (noted_at(digest) < 0) { /* the oldest note goes when full */
        memcpy(noted[noted_next], digest, ORION_SHA256_BYTES);
        noted_next = (noted_next + 1) % NOTED;
        if (noted_count < NOTED) noted_count++;
    }
    pthread_mutex_unlock(&note_lock);
}

/* A miss: if the digest was noted, the agent dropped it (counted; the note forgets it). */
static void note_missed(const uint8_t *digest) {
    pthread_mutex_lock(&note_lock);
    int at = noted_at(digest);
    if (at >= 0) {
        memset(noted[at], 0, ORION_SHA256_BYTES);
        drops++;
    }
    pthread_mutex_unlock(&note_lock);
}

static int asking_by_digest(void) {
    pthread_mutex_lock(&note_lock);
    int asking = drops < DROPS_TO_STOP;
    pthread_mutex_unlock(&note_lock);
    return asking;
}

/* Ask for the load by the image's digest and size, the request's usual head after them (IMAGE_BY_DIGEST_REQUEST:
 * u64 size, a u32 length and the 32-byte digest, then the head as the tail): the call's status, or
 * ORION_IMAGE_NOT_CACHED. */
static int load_by_digest(uint32_t opcode, const uint8_t *digest, size_t size, const uint8_t *head, size_t head_len,
                          uint8_t *reply, size_t reply_len) {
    uint8_t fixed[ORION_IMAGE_BY_DIGEST_REQ_SIZE + ORION_LENGTH_BYTES + ORION_SHA256_BYTES];
    orion_put_u64(fixed + ORION_IMAGE_BY_DIGEST_REQ_size, (uint64_t)size);
    orion_put_u32(fixed + ORION_IMAGE_BY_DIGEST_REQ_digest, ORION_SHA256_BYTES);
    memcpy(fixed + ORION_IMAGE_BY_DIGEST_REQ_digest + ORION_LENGTH_BYTES, digest, ORION_SHA256_BYTES);
    struct orion_piece pieces[2] = { { fixed, sizeof fixed }, { head, head_len } };
    return orion_thread_forwardv(opcode + IMAGE_BY_DIGEST, pieces, head ? 2 : 1, reply, reply_len, NULL, 0, NULL,
                                 ORION_CALL_BY_DIGEST);
}

/* Send the image at `image` as the request's tail, after `head` (the JIT options, when the request has them), and
 * store the new handle. An image of IMAGE_BY_DIGEST_MIN bytes or more is first asked for by its SHA-256: the agent
 * keeps every image a guest sent it whole (under the digest it computes itself), so a second load of it, by this
 * process or any other on the host, sends 44 bytes instead of the image. */
#define SAME_LOAD_REPLY(call, handle) (ORION_REP_##call##_##handle == ORION_REP_cuModuleLoadData_module \
                                       && ORION_REP_##call##_SIZE == ORION_REP_cuModuleLoadData_SIZE)
_Static_assert(SAME_LOAD_REPLY(cuModuleLoadDataEx, module) && SAME_LOAD_REPLY(cuLibraryLoadData, library),
               "load_image() reads every load's reply");
static int load_image(uint32_t opcode, uint64_t *handle, const void *image, const uint8_t *head, size_t head_len) {
    struct orion_image_span span;
    char why[256] = "";
    if (orion_image_locate(image, &span, why, sizeof why)) {
        fprintf(stderr, "orion: not a module image CUDA would load: %s\n", why);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    uint8_t reply[ORION_REP_cuModuleLoadData_SIZE], digest[ORION_SHA256_BYTES];
    int by_digest = span.size >= IMAGE_BY_DIGEST_MIN && asking_by_digest();
    int status = ORION_IMAGE_NOT_CACHED;
    if (by_digest) {
        orion_sha256(span.start, span.size, digest);
        status = load_by_digest(opcode, digest, span.size, head, head_len, reply, sizeof reply);
        if (status == ORION_IMAGE_NOT_CACHED) note_missed(digest);
        else note_held(digest); /* an answer from the image the agent holds (a load error included) */
    }
    if (status == ORION_IMAGE_NOT_CACHED) {
        struct orion_piece pieces[2] = { { head, head_len }, { span.start, span.size } };
        status = hand_forwardv(opcode, head ? pieces : pieces + 1, head ? 2 : 1, reply, sizeof reply);
        if (by_digest && status == CUDA_SUCCESS) note_held(digest); /* the agent keeps what it loaded */
    }
    if (status == CUDA_SUCCESS) *handle = orion_get_u64(reply + ORION_REP_cuModuleLoadData_module);
    return status;
}

int orion_module_load_image(struct CUmod_st **module, const void *image) {
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    uint64_t handle;
    int status = load_image(ORION_OP_cuModuleLoadData, &handle, image, NULL, 0);
    if (status == CUDA_SUCCESS) *module = (struct CUmod_st *)(uintptr_t)handle;
    return status;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    ORION_ENTRY("cuModuleLoadData");
    return orion_module_load_image(module, image);
}

/* After the load: the guest's log buffers hold an empty NUL-terminated log, their sizes 0 and CU_JIT_WALL_TIME
 * 0.0 ms (a float in its slot: all zero bits). `guest[option]` is the option's slot, or -1. */
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

/* Scalar JIT options travel as `[iQ]` pairs before the image; log and wall-time options are answered here after
 * the call; any other is not forwarded (801, named once as `call`). cuModuleLoadDataEx's request, which
 * cuLibraryLoadData's is too: the options first (their count, then the pairs), the image the tail. */
#define OPTIONS(field) ORION_REQ_cuModuleLoadDataEx_options##field
#define SAME_OPTIONS(field) (ORION_REQ_cuLibraryLoadData_options##field == OPTIONS(field))
_Static_assert(SAME_OPTIONS() && SAME_OPTIONS(_ITEM) && SAME_OPTIONS(_ITEM_0) && SAME_OPTIONS(_ITEM_1)
               && ORION_REQ_cuModuleLoadDataEx_SIZE == OPTIONS() && ORION_REQ_cuLibraryLoadData_SIZE == OPTIONS(),
               "the options lead both requests");
static int load_with_jit_options(uint32_t opcode, const char *unsupported, uint64_t *handle, const void *image,
                                 unsigned count, const CUjit_option *options, void **values) {
    int guest[JIT_GUEST_OPTIONS];
    for (int i = 0; i < JIT_GUEST_OPTIONS; i++) guest[i] = -1;
    uint8_t *head = malloc(ORION_LENGTH_BYTES + OPTIONS(_ITEM) * (size_t)count);
    if (!head) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    uint32_t pairs = 0;
    for (unsigned i = 0; i < count; i++) {
        int option = options[i];
        if (jit_scalar(option)) {
            uint8_t *pair = head + OPTIONS() + ORION_LENGTH_BYTES + OPTIONS(_ITEM) * (size_t)pairs;
            orion_put_i32(pair + OPTIONS(_ITEM_0), option);
            orion_put_u64(pair + OPTIONS(_ITEM_1), (uint64_t)(uintptr_t)values[i]);
            pairs++;
        } else if (jit_guest(option)) {
            guest[option] = (int)i;
        } else {
            free(head);
            return orion_not_forwarded(unsupported);
        }
    }
    orion_put_u32(head + OPTIONS(), pairs);
    int status = load_image(opcode, handle, image, head, ORION_LENGTH_BYTES + OPTIONS(_ITEM) * (size_t)pairs);
    free(head);
    if (values) empty_logs(values, guest);
    return status;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int count, CUjit_option *options,
                            void **values) {
    ORION_ENTRY("cuModuleLoadDataEx");
    if (!module || !image || (count && (!options || !values))) return CUDA_ERROR_INVALID_VALUE;
    uint64_t handle;
    int status = load_with_jit_options(ORION_OP_cuModuleLoadDataEx,
                                       "cuModuleLoadDataEx with a JIT option other than the scalar, log and "
                                       "wall-time ones", &handle, image, count, options, values);
    if (status == CUDA_SUCCESS) *module = (CUmodule)(uintptr_t)handle;
    return status;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit_options, void **jit_values,
                           unsigned int jit_count, CUlibraryOption *library_options, void **library_values,
                           unsigned int library_count) {
    ORION_ENTRY("cuLibraryLoadData");
    (void)library_values;
    if (!library || !code || (jit_count && (!jit_options || !jit_values)) || (library_count && !library_options))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < library_count; i++)
        if (library_options[i] != LIBRARY_BINARY_IS_PRESERVED) /* names host function tables */
            return orion_not_forwarded("cuLibraryLoadData with a library option other than "
                                       "CU_LIBRARY_BINARY_IS_PRESERVED");
    uint64_t handle;
    int status = load_with_jit_options(ORION_OP_cuLibraryLoadData,
                                       "cuLibraryLoadData with a JIT option other than the scalar, log and "
                                       "wall-time ones", &handle, code, jit_count, jit_options, jit_values);
    if (status == CUDA_SUCCESS) *library = (CUlibrary)(uintptr_t)handle;
    return status;
}

/* A handle and a NUL-free name (the request's tail); the reply is `reply_len` bytes. cuModuleGetFunction's request,
 * which the other lookups' are too. */
#define SAME_LOOKUP(call, owner) (ORION_REQ_##call##_##owner == ORION_REQ_cuModuleGetFunction_module \
                                  && ORION_REQ_##call##_name == ORION_REQ_cuModuleGetFunction_name \
                                  && ORION_REQ_##call##_SIZE == ORION_REQ_cuModuleGetFunction_SIZE)
_Static_assert(SAME_LOOKUP(cuLibraryGetKernel, library) && SAME_LOOKUP(cuModuleGetGlobal, module)
               && SAME_LOOKUP(cuLibraryGetGlobal, library)
               && ORION_REQ_cuModuleGetFunction_name == ORION_REQ_cuModuleGetFunction_SIZE, "by_name() asks all four");
static int by_name(uint32_t opcode, uint64_t owner, const char *name, uint8_t *reply, size_t reply_len) {
    uint8_t head[ORION_REQ_cuModuleGetFunction_SIZE];
    orion_put_u64(head + ORION_REQ_cuModuleGetFunction_module, owner);
    struct orion_piece pieces[2] = { { head, sizeof head }, { name, strlen(name) } };
    return hand_forwardv(opcode, pieces, 2, reply, reply_len);
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    ORION_ENTRY("cuModuleGetFunction");
    if (!function || !name) return CUDA_ERROR_INVALID_VALUE;
    uint8_t reply[ORION_REP_cuModuleGetFunction_SIZE];
    int status = by_name(ORION_OP_cuModuleGetFunction, (uint64_t)(uintptr_t)module, name, reply, sizeof reply);
    if (status == CUDA_SUCCESS)
        *function = (CUfunction)(uintptr_t)orion_get_u64(reply + ORION_REP_cuModuleGetFunction_function);
    return status;
}

CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name) {
    ORION_ENTRY("cuLibraryGetKernel");
    if (!kernel || !name) return CUDA_ERROR_INVALID_VALUE;
    uint8_t reply[ORION_REP_cuLibraryGetKernel_SIZE];
    int status = by_name(ORION_OP_cuLibraryGetKernel, (uint64_t)(uintptr_t)library, name, reply, sizeof reply);
    if (status == CUDA_SUCCESS) {
        uint64_t handle = orion_get_u64(reply + ORION_REP_cuLibraryGetKernel_kernel);
        orion_param_layouts_kernel_made(handle); /* launched as a function, its layout is a kernel's query */
        *kernel = (CUkernel)(uintptr_t)handle;
    }
    return status;
}

/* cuModuleGetGlobal, cuLibraryGetGlobal: either output may be NULL. Both reply as cuModuleGetGlobal. */
#define GLOBAL(field) ORION_REP_cuModuleGetGlobal_##field
_Static_assert(ORION_REP_cuLibraryGetGlobal_pointer == GLOBAL(pointer)
               && ORION_REP_cuLibraryGetGlobal_size == GLOBAL(size)
               && ORION_REP_cuLibraryGetGlobal_SIZE == GLOBAL(SIZE), "get_global() reads both");
static int get_global(uint32_t opcode, CUdeviceptr *pointer, size_t *size, uint64_t owner, const char *name) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    uint8_t reply[GLOBAL(SIZE)];
    int status = by_name(opcode, owner, name, reply, sizeof reply);
    if (status == CUDA_SUCCESS) {
        /* a global: unified addressing copies it */
        orion_range_add(orion_get_u64(reply + GLOBAL(pointer)), orion_get_u64(reply + GLOBAL(size)));
        if (pointer) *pointer = orion_get_u64(reply + GLOBAL(pointer));
        if (size) *size = (size_t)orion_get_u64(reply + GLOBAL(size));
    }
    return status;
}

CUresult cuModuleGetGlobal(CUdeviceptr *pointer, size_t *size, CUmodule module, const char *name) {
    ORION_ENTRY("cuModuleGetGlobal");
    return get_global(ORION_OP_cuModuleGetGlobal, pointer, size, (uint64_t)(uintptr_t)module, name);
}

CUresult cuLibraryGetGlobal(CUdeviceptr *pointer, size_t *size, CUlibrary library, const char *name) {
    ORION_ENTRY("cuLibraryGetGlobal");
    return get_global(ORION_OP_cuLibraryGetGlobal, pointer, size, (uint64_t)(uintptr_t)library, name);
}

/* --- loads from a file: the file is the guest's, so the guest reads it and loads its bytes -------------------- */

#define MAX_IMAGE_FILE ((size_t)2 << 30) /* module_image.c's MAX_IMAGE: no image is larger */
#ifndef CUDA_ERROR_FILE_NOT_FOUND
#define CUDA_ERROR_FILE_NOT_FOUND 301 /* cuda.h's; cuda_client.h names the ones the library shares */
#endif

/* The whole of the file at `path`, and a NUL after it (PTX is NUL-terminated text when loaded from memory; a cubin
 * or fatbin is measured from its own headers, so the NUL is never sent), in a malloc'd buffer: CUDA_SUCCESS with
 * *bytes and *length (without the NUL), CUDA_ERROR_FILE_NOT_FOUND for a file that cannot be opened or read,
 * CUDA_ERROR_OUT_OF_MEMORY, or CUDA_ERROR_INVALID_IMAGE for one larger than any image. A regular file is read into
 * a buffer of its size; anything else (a pipe, a /proc file) into one that grows. */
static int read_image_file(const char *path, uint8_t **bytes, size_t *length) {
    int fd;
    do fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return CUDA_ERROR_FILE_NOT_FOUND;
    struct stat st;
    size_t capacity = 64 * 1024; /* bytes the buffer holds before its NUL */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0) {
        if ((unsigned long long)st.st_size > MAX_IMAGE_FILE) {
            close(fd);
            fprintf(stderr, "orion: not a module image CUDA would load: %s is %llu bytes, more than any image\n",
                    path, (unsigned long long)st.st_size);
            return CUDA_ERROR_INVALID_IMAGE;
        }
        capacity = (size_t)st.st_size;
    }
    uint8_t *buffer = malloc(capacity + 1);
    size_t used = 0;
    int status = buffer ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    while (status == CUDA_SUCCESS) {
        uint8_t probe;
        int full = used == capacity; /* then one byte more says whether the file goes on (a regular file: no) */
        ssize_t got = full ? read(fd, &probe, 1) : read(fd, buffer + used, capacity - used);
        if (got < 0) {
            if (errno != EINTR) status = CUDA_ERROR_FILE_NOT_FOUND; /* a directory (EISDIR), an I/O error */
            continue;
        }
        if (got == 0) break;
        if (full) {
            if (capacity >= MAX_IMAGE_FILE) {
                fprintf(stderr, "orion: not a module image CUDA would load: %s is more than %zu bytes\n", path,
                        MAX_IMAGE_FILE);
                status = CUDA_ERROR_INVALID_IMAGE;
                continue;
            }
            size_t grown = capacity < MAX_IMAGE_FILE / 2 ? 2 * capacity + 1 : MAX_IMAGE_FILE;
            uint8_t *larger = realloc(buffer, grown + 1);
            if (!larger) {
                status = CUDA_ERROR_OUT_OF_MEMORY;
                continue;
            }
            buffer = larger;
            capacity = grown;
            buffer[used] = probe;
        }
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

/* The file's bytes are no pointer's: a fatbin wrapper in them would point into this process's memory, and headers
 * that claim more than the file holds would ship whatever lies after the buffer. Both are CUDA_ERROR_INVALID_IMAGE
 * here; anything else (an image, or bytes that are none) is the load's to judge, as cuModuleLoadData judges them. */
static int within_file(const char *path, const uint8_t *bytes, size_t length) {
    struct orion_image_span span;
    if (orion_image_locate(bytes, &span, NULL, 0)) return CUDA_SUCCESS;
    if (span.kind == ORION_IMAGE_FATBIN_WRAPPER) {
        fprintf(stderr, "orion: not a module image CUDA would load: %s holds a fatbin wrapper (a pointer)\n", path);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    size_t limit = span.kind == ORION_IMAGE_PTX ? length + 1 : length; /* PTX ends at the NUL read_image_file adds */
    if ((const uint8_t *)span.start != bytes || span.size > limit) {
        fprintf(stderr, "orion: not a module image CUDA would load: %s is truncated: its image claims %zu bytes, "
                "the file has %zu\n", path, span.size, length);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    return CUDA_SUCCESS;
}

/* Read `path` and check its image is within it: CUDA_SUCCESS with a malloc'd *bytes (freed by the caller), or the
 * error (nothing to free). */
static int image_from_file(const char *path, uint8_t **bytes) {
    size_t length;
    int status = read_image_file(path, bytes, &length);
    if (status != CUDA_SUCCESS) return status;
    if ((status = within_file(path, *bytes, length)) != CUDA_SUCCESS) free(*bytes);
    return status;
}

/* cuModuleLoad: Triton (torch.compile) loads each kernel's cubin so. The bytes go out exactly as cuModuleLoadData
 * sends them (measured, by digest when large), and the buffer is freed once the host has answered. */
CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    ORION_ENTRY("cuModuleLoad");
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t *bytes;
    int status = image_from_file(fname, &bytes);
    if (status != CUDA_SUCCESS) return status;
    status = cuModuleLoadData(module, bytes);
    free(bytes);
    return status;
}

/* The driver takes the fat binary as an image pointer: cuModuleLoadData's (a fatbin, or a wrapper it follows). */
CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    ORION_ENTRY("cuModuleLoadFatBinary");
    return cuModuleLoadData(module, fatCubin);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                               void **libraryOptionValues, unsigned int numLibraryOptions) {
    ORION_ENTRY("cuLibraryLoadFromFile");
    if (!library || !fileName || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
        (numLibraryOptions && !libraryOptions))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numLibraryOptions; i++)
        if (libraryOptions[i] == LIBRARY_BINARY_IS_PRESERVED) /* cuda.h: invalid with a file */
            return CUDA_ERROR_INVALID_VALUE;
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t *bytes;
    int status = image_from_file(fileName, &bytes);
    if (status != CUDA_SUCCESS) return status;
    status = cuLibraryLoadData(library, bytes, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                               libraryOptionValues, numLibraryOptions);
    free(bytes);
    return status;
}

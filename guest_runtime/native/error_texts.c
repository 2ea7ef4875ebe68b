/* error_texts.c: cuGetErrorName and cuGetErrorString, whose texts must stay valid for the life of the process
 * (guest_runtime/error_texts.py in C).
 *
 * The driver answers a pointer to a static string, which a program may keep and read at any later time, so every
 * text handed out lives in a buffer kept here until the process exits, never changed; each is asked of the host
 * once per (call, code). Without an agent to ask, the CUresult's enum name (the table below, cuda.h's names)
 * still says what happened; a code it does not know is CUDA_ERROR_INVALID_VALUE, as the driver answers.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "orion_guest.h"

struct kept { struct kept *next; uint32_t opcode; int code; char text[]; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept *texts; /* never freed: handed-out pointers stay valid */

static const struct { int code; const char *name; } NAMES[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {5, "CUDA_ERROR_PROFILER_DISABLED"},
    {6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"},
    {7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"},
    {8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"},
    {205, "CUDA_ERROR_MAP_FAILED"},
    {206, "CUDA_ERROR_UNMAP_FAILED"},
    {207, "CUDA_ERROR_ARRAY_IS_MAPPED"},
    {208, "CUDA_ERROR_ALREADY_MAPPED"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {210, "CUDA_ERROR_ALREADY_ACQUIRED"},
    {211, "CUDA_ERROR_NOT_MAPPED"},
    {212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"},
    {213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"},
    {224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"},
    {225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"},
    {226, "CUDA_ERROR_CONTAINED"},
    {227, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION"},
    {300, "CUDA_ERROR_INVALID_SOURCE"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND"},
    {302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"},
    {303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {401, "CUDA_ERROR_ILLEGAL_STATE"},
    {402, "CUDA_ERROR_LOSSY_QUERY"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {600, "CUDA_ERROR_NOT_READY"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {710, "CUDA_ERROR_ASSERT"},
    {711, "CUDA_ERROR_TOO_MANY_PEERS"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
    {718, "CUDA_ERROR_INVALID_PC"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
    {806, "CUDA_ERROR_MPS_RPC_FAILURE"},
    {807, "CUDA_ERROR_MPS_SERVER_NOT_READY"},
    {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"},
    {809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"},
    {810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"},
    {811, "CUDA_ERROR_CDP_NOT_SUPPORTED"},
    {812, "CUDA_ERROR_CDP_VERSION_MISMATCH"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
    {907, "CUDA_ERROR_CAPTURED_EVENT"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
    {909, "CUDA_ERROR_TIMEOUT"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE"},
    {912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"},
    {913, "CUDA_ERROR_FUNCTION_NOT_LOADED"},
    {914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"},
    {915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"},
    {916, "CUDA_ERROR_KEY_ROTATION"},
    {917, "CUDA_ERROR_STREAM_DETACHED"},
    {918, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE"},
    {919, "CUDA_ERROR_FABRIC_NOT_READY"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

static const char *local_name(int code) {
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++)
        if (NAMES[i].code == code) return NAMES[i].name;
    return NULL;
}

/* Under `lock`: keep `len` bytes of `text` as a NUL-terminated string for (opcode, code); NULL without memory. */
static const char *keep(uint32_t opcode, int code, const char *text, size_t len) {
    struct kept *k = malloc(sizeof *k + len + 1);
    if (!k) return NULL;
    k->opcode = opcode;
    k->code = code;
    memcpy(k->text, text, len);
    k->text[len] = '\0';
    k->next = texts;
    texts = k;
    return k->text;
}

_Static_assert(ORION_REQ_cuGetErrorName_SIZE == ORION_REQ_cuGetErrorString_SIZE
               && ORION_REQ_cuGetErrorName_error == ORION_REQ_cuGetErrorString_error, "one request asks both");
static int static_text(uint32_t opcode, int code, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    const char *found = NULL;
    for (const struct kept *k = texts; k && !found; k = k->next)
        if (k->opcode == opcode && k->code == code) found = k->text;
    int status = CUDA_SUCCESS;
    if (!found) {
        char reply[1024];
        size_t got = 0;
        uint8_t req[ORION_REQ_cuGetErrorString_SIZE];
        orion_put_i32(req + ORION_REQ_cuGetErrorString_error, code);
        int asked = orion_process_channel() ? orion_thread_forwardv(opcode, &(struct orion_piece){ req, sizeof req },
                                                                    1, NULL, 0, reply, sizeof reply, &got, ORION_CALL_NO_FOLD)
                                            : CUDA_ERROR_NOT_INITIALIZED;
        const char *local = local_name(code); /* no agent to ask: the enum's name still says what happened */
        if (asked == CUDA_SUCCESS) {
            const char *end = memchr(reply, '\0', got);
            found = keep(opcode, code, reply, end ? (size_t)(end - reply) : got);
        } else if (local) {
            found = keep(opcode, code, local, strlen(local));
        } else {
            status = CUDA_ERROR_INVALID_VALUE;
        }
        if (!found && status == CUDA_SUCCESS) status = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    if (found) *out = found;
    return status;
}

int cuGetErrorName(int error, const char **name) {
    ORION_ENTRY("cuGetErrorName");
    return static_text(ORION_OP_cuGetErrorName, error, name);
}

int cuGetErrorString(int error, const char **text) {
    ORION_ENTRY("cuGetErrorString");
    return static_text(ORION_OP_cuGetErrorString, error, text);
}

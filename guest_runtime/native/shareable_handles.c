/* shareable_handles.c: cuMem physical memory shared between the processes of one guest (issue 32: NCCL's P2P
 * transport between ranks exports its buffers with cuMemExportToShareableHandle as POSIX file descriptors, passes
 * them to the peer rank over a UNIX socket, and the peer imports them).
 *
 * A descriptor the GPU host's driver exports belongs to the session's worker there, and means nothing here. So the
 * worker keeps it under a token (its pid and a 128-bit secret: SHARE_EXPORT, host_agent/session/shared_handles.py)
 * and this library gives the program a descriptor of its own that carries the token: a sealed memfd holding a magic
 * word and the token. The program owns it as it owns the driver's (it closes it, passes it on with SCM_RIGHTS, dups
 * it). cuMemImportFromShareableHandle reads the token back from such a descriptor and asks the importing session's
 * worker for a handle (SHARE_IMPORT), which the GPU host answers only between sessions of one region: a descriptor
 * that is not one of these, or a token another guest made, is CUDA_ERROR_INVALID_VALUE, as a descriptor that is not
 * an export is for the driver.
 *
 * Only POSIX file descriptors: a fabric handle (or a Win32 one) is CUDA_ERROR_NOT_SUPPORTED, said once.
 *
 * Legacy IPC (cuIpcGetMemHandle, cuIpcGetEventHandle: what PyTorch's multiprocessing shares CUDA tensors with, and
 * NCCL with NCCL_CUMEM_ENABLE=0) the same way: the 64-byte CUipcMemHandle or CUipcEventHandle the program gets holds
 * a magic word, the token and what it is (IPC_EXPORT), and cuIpcOpenMemHandle / cuIpcOpenEventHandle send the token
 * back (IPC_OPEN); a handle that does not hold one is CUDA_ERROR_INVALID_VALUE. cuIpcCloseMemHandle closes what an
 * open gave (IPC_CLOSE). Not here: memory pools' exports, which are not forwarded (docs/api-table.md).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "orion_guest.h"

enum { CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 };
static const char MAGIC[8] = "ORIONSH1"; /* the memfd's first bytes: the token's format */
enum { TOKEN_AT = sizeof MAGIC, TOKEN_SIZE = 20 /* secret_a, secret_b (u64), pid (u32) */ };

/* The token is one run of TOKEN_SIZE bytes in each payload that carries it (driver_api's SHARE_REPLY, the reply of
 * every export, import and open; SHARE_IMPORT and IPC_OPEN requests), so it moves with one memcpy. */
#define TOKEN_RUN(a, b, p) ((b) == (a) + 8 && (p) == (a) + 16)
_Static_assert(TOKEN_RUN(ORION_SHARE_EXPORT_REP_secret_a, ORION_SHARE_EXPORT_REP_secret_b, ORION_SHARE_EXPORT_REP_pid)
               && ORION_IPC_EXPORT_REP_secret_a == ORION_SHARE_EXPORT_REP_secret_a, "the replies' token");
_Static_assert(TOKEN_RUN(ORION_SHARE_IMPORT_REQ_secret_a, ORION_SHARE_IMPORT_REQ_secret_b, ORION_SHARE_IMPORT_REQ_pid)
               && TOKEN_RUN(ORION_IPC_OPEN_REQ_secret_a, ORION_IPC_OPEN_REQ_secret_b, ORION_IPC_OPEN_REQ_pid),
               "the requests' token");
enum { REPLY_TOKEN = ORION_SHARE_EXPORT_REP_secret_a };

static CUresult posix_only(const char *call, int type) {
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_SUCCESS;
    if (orion_first_time(call))
        fprintf(stderr, "orion: %s: only POSIX file descriptors (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) are shared "
                        "between a guest's processes, not handle type %d: returning 801 (CUDA_ERROR_NOT_SUPPORTED)\n",
                call, type);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* A memfd of the program's holding `token`, sealed so that no one rewrites it; -1 if one cannot be made. */
static int token_descriptor(const uint8_t token[TOKEN_SIZE]) {
    int fd = memfd_create("orion-cumem-export", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    uint8_t bytes[TOKEN_AT + TOKEN_SIZE];
    memcpy(bytes, MAGIC, sizeof MAGIC);
    memcpy(bytes + TOKEN_AT, token, TOKEN_SIZE);
    if (pwrite(fd, bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes
        || fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType,
                                      unsigned long long flags) {
    ORION_ENTRY("cuMemExportToShareableHandle");
    if (!shareableHandle) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = posix_only("cuMemExportToShareableHandle", handleType);
    if (status != CUDA_SUCCESS) return status;
    uint8_t req[ORION_SHARE_EXPORT_REQ_SIZE], rep[ORION_SHARE_EXPORT_REP_SIZE];
    orion_put_u64(req + ORION_SHARE_EXPORT_REQ_handle, (uint64_t)handle);
    orion_put_u64(req + ORION_SHARE_EXPORT_REQ_flags, flags);
    orion_put_i32(req + ORION_SHARE_EXPORT_REQ_handle_type, (int32_t)handleType);
    status = orion_thread_forward(ORION_OP_SHARE_EXPORT, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    int fd = token_descriptor(rep + REPLY_TOKEN);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY; /* no descriptor to give: as the driver says when it has none */
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, int shHandleType) {
    ORION_ENTRY("cuMemImportFromShareableHandle");
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = posix_only("cuMemImportFromShareableHandle", shHandleType);
    if (status != CUDA_SUCCESS) return status;
    int fd = (int)(intptr_t)osHandle; /* cuda.h: the descriptor, cast to a pointer */
    uint8_t bytes[TOKEN_AT + TOKEN_SIZE + 1];
    ssize_t got = pread(fd, bytes, sizeof bytes, 0);
    if (got != TOKEN_AT + TOKEN_SIZE || memcmp(bytes, MAGIC, sizeof MAGIC) != 0)
        return CUDA_ERROR_INVALID_VALUE; /* not an export of this library's: no memory of the GPU host's */
    uint8_t req[ORION_SHARE_IMPORT_REQ_SIZE], rep[ORION_SHARE_IMPORT_REP_SIZE];
    memcpy(req + ORION_SHARE_IMPORT_REQ_secret_a, bytes + TOKEN_AT, TOKEN_SIZE);
    orion_put_i32(req + ORION_SHARE_IMPORT_REQ_handle_type, (int32_t)shHandleType);
    status = orion_thread_forward(ORION_OP_SHARE_IMPORT, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    *handle = (CUmemGenericAllocationHandle)orion_get_u64(rep + ORION_SHARE_IMPORT_REP_handle);
    return CUDA_SUCCESS;
}

/* --- legacy IPC ------------------------------------------------------------------------------------------------ */

typedef struct { char reserved[64]; } ipc_handle; /* cuda.h's CUipcMemHandle and CUipcEventHandle */
static const char IPC_MAGIC[8] = "ORIONIP1";
enum { IPC_KIND_AT = TOKEN_AT + TOKEN_SIZE };

static CUresult ipc_export(ipc_handle *out, uint64_t value, uint32_t kind) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_IPC_EXPORT_REQ_SIZE], rep[ORION_IPC_EXPORT_REP_SIZE];
    orion_put_u64(req + ORION_IPC_EXPORT_REQ_value, value);
    orion_put_u32(req + ORION_IPC_EXPORT_REQ_kind, kind);
    CUresult status = orion_thread_forward(ORION_OP_IPC_EXPORT, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    memset(out, 0, sizeof *out);
    memcpy(out->reserved, IPC_MAGIC, sizeof IPC_MAGIC);
    memcpy(out->reserved + TOKEN_AT, rep + REPLY_TOKEN, TOKEN_SIZE);
    orion_put_u32((uint8_t *)out->reserved + IPC_KIND_AT, kind);
    return CUDA_SUCCESS;
}

/* What an open of `handle` as `kind` gives (a device pointer, or a CUevent), or CUDA_ERROR_INVALID_VALUE for a handle
 * that holds no token of that kind. */
static CUresult ipc_open(const ipc_handle *handle, uint32_t kind, unsigned int flags, uint64_t *value) {
    const uint8_t *bytes = (const uint8_t *)handle->reserved;
    if (memcmp(bytes, IPC_MAGIC, sizeof IPC_MAGIC) != 0 || orion_get_u32(bytes + IPC_KIND_AT) != kind)
        return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_IPC_OPEN_REQ_SIZE], rep[ORION_IPC_OPEN_REP_SIZE];
    memcpy(req + ORION_IPC_OPEN_REQ_secret_a, bytes + TOKEN_AT, TOKEN_SIZE);
    orion_put_u32(req + ORION_IPC_OPEN_REQ_kind, kind);
    orion_put_u32(req + ORION_IPC_OPEN_REQ_flags, flags);
    CUresult status = orion_thread_forward(ORION_OP_IPC_OPEN, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *value = orion_get_u64(rep + ORION_IPC_OPEN_REP_handle);
    return status;
}

CUresult cuIpcGetMemHandle(ipc_handle *pHandle, CUdeviceptr dptr) {
    ORION_ENTRY("cuIpcGetMemHandle");
    return ipc_export(pHandle, (uint64_t)dptr, ORION_IPC_MEMORY);
}

CUresult cuIpcGetEventHandle(ipc_handle *pHandle, CUevent event) {
    ORION_ENTRY("cuIpcGetEventHandle");
    return ipc_export(pHandle, (uint64_t)(uintptr_t)event, ORION_IPC_EVENT);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, ipc_handle handle, unsigned int Flags) {
    ORION_ENTRY("cuIpcOpenMemHandle");
    if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
    uint64_t pointer = 0;
    CUresult status = ipc_open(&handle, ORION_IPC_MEMORY, Flags, &pointer);
    if (status == CUDA_SUCCESS) *pdptr = (CUdeviceptr)pointer;
    return status;
}

CUresult cuIpcOpenEventHandle(CUevent *phEvent, ipc_handle handle) {
    ORION_ENTRY("cuIpcOpenEventHandle");
    if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
    uint64_t event = 0;
    CUresult status = ipc_open(&handle, ORION_IPC_EVENT, 0, &event);
    if (status == CUDA_SUCCESS) *phEvent = (CUevent)(uintptr_t)event;
    return status;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    ORION_ENTRY("cuIpcCloseMemHandle");
    uint8_t req[ORION_IPC_CLOSE_REQ_SIZE];
    orion_put_u64(req + ORION_IPC_CLOSE_REQ_pointer, (uint64_t)dptr);
    return orion_thread_forward(ORION_OP_IPC_CLOSE, req, sizeof req, NULL, 0, 0);
}

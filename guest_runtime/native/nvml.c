/* nvml.c: the NVML a forwarded process sees, answered from its vGPUs (docs/native-driver.md, "NVML").
 *
 * A GPU-less guest has no NVML, and a container on the GPU host has the host's, which counts the host's GPUs, not
 * the session's. Frameworks ask it anyway: PyTorch counts devices through NVML where it loads, and JAX's CUDA
 * plugin (XLA) finds no GPU at all without it ("No visible GPU devices", measured on the H100 with NVML hidden and
 * the real driver). So the native driver exports the part of NVML they call, under the SONAME libnvidia-ml.so.1
 * too (build.py's alias), answered from the forwarded CUDA queries: devices, handles by index, PCI bus ID and UUID,
 * names, the CUDA driver version, MIG off, compute capability and P2P status. What only the GPU host's NVML knows of
 * the GPUs behind the vGPUs (NVLink state, capability and far ends, the NVLink P2P index: NCCL's topology reads
 * them) is asked of it (NVML_QUERY). What a vGPU has no answer for (its PCIe link, NVLink counters, fabric)
 * answers NVML_ERROR_NOT_SUPPORTED, as NVML does for a feature a device lacks. Every other NVML entry point of the
 * headers is a generated weak stub answering NVML_ERROR_NOT_SUPPORTED, named once (orion_nvml_not_supported;
 * nvml_symbols.txt): no name a framework resolves is missing.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "orion_guest.h"

struct CUuuid_st { unsigned char bytes[16]; };

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999,
};
enum { MAX_DEVICES = 64, UUID_TEXT = 41 /* "GPU-" and 36 characters and a NUL */ };

/* A handle is the address of its ordinal's slot (only the address matters): stable for the process, and an
 * address outside the slots is refused, so a caller cannot forge one into another device. */
typedef struct nvmlDevice_st { char slot; } *nvmlDevice_t;
static struct nvmlDevice_st handles[MAX_DEVICES];

/* nvml.h's nvmlFieldValue_t (40 bytes; `value` its union's 8 bytes). */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    unsigned long long value;
} nvmlFieldValue_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized; /* nvmlInit calls not yet matched by nvmlShutdown */

static nvmlReturn_t from_cuda(CUresult rc) {
    switch (rc) {
    case CUDA_SUCCESS: return NVML_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: case 101 /* CUDA_ERROR_INVALID_DEVICE */: return NVML_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_NO_DEVICE: case CUDA_ERROR_NOT_INITIALIZED: return NVML_ERROR_DRIVER_NOT_LOADED;
    default: return NVML_ERROR_UNKNOWN;
    }
}

static int ready(void) {
    pthread_mutex_lock(&lock);
    int on = initialized > 0;
    pthread_mutex_unlock(&lock);
    return on;
}

/* --- initialisation: Orion reachable (cuInit of the forwarded driver) or the driver is "not loaded" ------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t rc = from_cuda(cuInit(0));
    if (rc == NVML_SUCCESS) {
        pthread_mutex_lock(&lock);
        initialized++;
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = initialized > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized > 0) initialized--;
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Every other NVML entry point of the headers (the generated weak stubs, nvml_symbols.txt): NOT_SUPPORTED, as NVML
 * answers for a feature a device lacks, named once each; never a missing symbol (PyTorch resolves some with dlsym
 * and fails where one is absent). */
int orion_nvml_not_supported(const char *name) {
    if (orion_first_time(name))
        fprintf(stderr, "orion: %s is not answered by Orion's NVML: returning NVML_ERROR_NOT_SUPPORTED\n", name);
    return NVML_ERROR_NOT_SUPPORTED;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

/* --- the system ---------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    return from_cuda(cuDriverGetVersion(version));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

/* The kernel module's version is the host's, which the wire does not carry. */
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    (void)version; (void)length;
    return ready() ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNINITIALIZED;
}

/* --- devices and their handles ------------------------------------------------------------------------------- */

static nvmlReturn_t count(unsigned int *devices) {
    int n = 0;
    nvmlReturn_t rc = from_cuda(cuDeviceGetCount(&n));
    if (rc == NVML_SUCCESS) *devices = (unsigned)(n < MAX_DEVICES ? n : MAX_DEVICES);
    return rc;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *devices) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!devices) return NVML_ERROR_INVALID_ARGUMENT;
    return count(devices);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *devices) { return nvmlDeviceGetCount_v2(devices); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    unsigned int n = 0;
    nvmlReturn_t rc = device ? count(&n) : NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS) return rc;
    if (index >= n) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* The ordinal of a handle this library gave, or -1. */
static int ordinal_of(nvmlDevice_t device) {
    if (device < handles || device >= handles + MAX_DEVICES) return -1;
    return (int)(device - handles);
}

#define DEVICE_OR_RETURN(device, ordinal)                                                  \
    int ordinal = ordinal_of(device);                                                      \
    if (!ready()) return NVML_ERROR_UNINITIALIZED;                                         \
    if (ordinal < 0) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t uuid_text(int ordinal, char text[UUID_TEXT]) {
    CUuuid uuid;
    nvmlReturn_t rc = from_cuda(cuDeviceGetUuid(&uuid, ordinal));
    if (rc != NVML_SUCCESS) return rc;
    const unsigned char *b = uuid.bytes;
    snprintf(text, UUID_TEXT, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return NVML_SUCCESS;
}

/* A device whose property, written by `describe` into `text`, equals `wanted` under `same`. */
static nvmlReturn_t find(const char *wanted, nvmlReturn_t (*describe)(int, char *), int (*same)(const char *,
                                                                                                 const char *),
                         nvmlDevice_t *device) {
    if (!ready()) return NVML_ERROR_UNINITIALIZED;
    if (!wanted || !device) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    nvmlReturn_t rc = count(&n);
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < n; i++) {
        char text[64];
        rc = describe((int)i, text);
        if (rc == NVML_SUCCESS && same(text, wanted)) return nvmlDeviceGetHandleByIndex_v2(i, device);
    }
    return rc == NVML_SUCCESS ? NVML_ERROR_NOT_FOUND : rc;
}

static nvmlReturn_t bus_id_text(int ordinal, char *text) { return from_cuda(cuDeviceGetPCIBusId(text, 64, ordinal)); }

/* PCI bus IDs match by value: NVML writes the domain in 8 digits, the driver in 4, callers in either, or leave it
 * out ("bus:device.function"), in either case. */
static int same_bus(const char *a, const char *b) {
    unsigned x[3], y[3];
    return orion_parse_bus_id(a, &x[0], &x[1], &x[2]) && orion_parse_bus_id(b, &y[0], &y[1], &y[2]) &&
           memcmp(x, y, sizeof x) == 0;
}

static int same_text(const char *a, const char *b) { return strcasecmp(a, b) == 0; }

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    return find(bus_id, bus_id_text, same_bus, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

static nvmlReturn_t uuid_describe(int ordinal, char *text) { return uuid_text(ordinal, text); }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return find(uuid, uuid_describe, same_text, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEVICE_OR_RETURN(device, ordinal);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)ordinal;
    return NVML_SUCCESS;
}

/* Copies `text` into the caller's buffer of `length` bytes, as NVML does: INSUFFICIENT_SIZE if it does not fit. */
static nvmlReturn_t give_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_OR_RETURN(device, ordinal);
    char text[UUID_TEXT];
    nvmlReturn_t rc = uuid_text(ordinal, text);
    return rc == NVML_SUCCESS ? give_text(text, uuid, length) : rc;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_OR_RETURN(device, ordinal);
    char text[256];
    nvmlReturn_t rc = from_cuda(cuDeviceGetName(text, sizeof text, ordinal));
    return rc == NVML_SUCCESS ? give_text(text, name, length) : rc;
}

/* cuda.h's values of the attributes read here (the generated header has the types, not the enumerators). */
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
       CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED = 2, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED = 3 };

/* The compute capability, the device's own (NCCL reads it for every device at start and stops where it fails). */
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEVICE_OR_RETURN(device, ordinal);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = from_cuda(cuDeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal));
    return rc == NVML_SUCCESS
               ? from_cuda(cuDeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal))
               : rc;
}

/* --- what only the GPU host's NVML knows (NVML_QUERY; host_agent/session/nvml_queries.py) ------------------------ */

enum { NVML_QUERY_REPLY_SIZE = ORION_NVML_QUERY_REP_SIZE + ORION_NVML_QUERY_BUS_IDS };

/* Ask the GPU host's NVML about vGPU `ordinal`: NVML's own return code, the reply in `rep` on NVML_SUCCESS. An agent
 * that cannot answer (an older release, no NVML there) is NVML_ERROR_NOT_SUPPORTED, as for a device without the
 * feature; one that is unreachable, as from_cuda says. */
static nvmlReturn_t host_nvml(uint32_t query, int ordinal, uint32_t link, uint32_t which,
                              uint8_t rep[NVML_QUERY_REPLY_SIZE]) {
    uint8_t req[ORION_NVML_QUERY_REQ_SIZE];
    orion_put_u32(req + ORION_NVML_QUERY_REQ_query, query);
    orion_put_i32(req + ORION_NVML_QUERY_REQ_device, ordinal);
    orion_put_u32(req + ORION_NVML_QUERY_REQ_link, link);
    orion_put_u32(req + ORION_NVML_QUERY_REQ_which, which);
    int status = orion_thread_forward(ORION_OP_NVML_QUERY, req, sizeof req, rep, NVML_QUERY_REPLY_SIZE,
                                      ORION_CALL_NO_FOLD);
    if (status == CUDA_ERROR_NOT_INITIALIZED || status == CUDA_ERROR_NO_DEVICE) return from_cuda(status);
    if (status != CUDA_SUCCESS) return NVML_ERROR_NOT_SUPPORTED;
    return (nvmlReturn_t)(int32_t)orion_get_u32(rep + ORION_NVML_QUERY_REP_result);
}

/* A query whose answer is one number (`value`), written to *value on success. */
static nvmlReturn_t host_value(uint32_t query, int ordinal, uint32_t link, uint32_t which, unsigned int *value) {
    uint8_t rep[NVML_QUERY_REPLY_SIZE];
    nvmlReturn_t rc = host_nvml(query, ordinal, link, which, rep);
    if (rc == NVML_SUCCESS) *value = (unsigned int)orion_get_u64(rep + ORION_NVML_QUERY_REP_value);
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive) {
    DEVICE_OR_RETURN(device, ordinal);
    if (!isActive) return NVML_ERROR_INVALID_ARGUMENT;
    return host_value(ORION_NVML_QUERY_NVLINK_STATE, ordinal, link, 0, (unsigned int *)isActive);
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link, int capability,
                                           unsigned int *capResult) {
    DEVICE_OR_RETURN(device, ordinal);
    if (!capResult || capability < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return host_value(ORION_NVML_QUERY_NVLINK_CAPABILITY, ordinal, link, (uint32_t)capability, capResult);
}

/* nvml.h's nvmlPciInfo_t (68 bytes): what NCCL reads of a link's far end is its busId. */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    DEVICE_OR_RETURN(device, ordinal);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    uint8_t rep[NVML_QUERY_REPLY_SIZE];
    nvmlReturn_t rc = host_nvml(ORION_NVML_QUERY_NVLINK_REMOTE_PCI, ordinal, link, 0, rep);
    if (rc != NVML_SUCCESS) return rc;
    const uint8_t *ids = rep + ORION_NVML_QUERY_REP_SIZE;
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busId, ids, sizeof pci->busId - 1);             /* NUL-terminated within its field */
    memcpy(pci->busIdLegacy, ids + 32, sizeof pci->busIdLegacy - 1);
    pci->domain = orion_get_u32(rep + ORION_NVML_QUERY_REP_domain);
    pci->bus = orion_get_u32(rep + ORION_NVML_QUERY_REP_bus);
    pci->device = orion_get_u32(rep + ORION_NVML_QUERY_REP_pci_device);
    pci->pciDeviceId = orion_get_u32(rep + ORION_NVML_QUERY_REP_pci_device_id);
    pci->pciSubSystemId = orion_get_u32(rep + ORION_NVML_QUERY_REP_pci_sub_system_id);
    return NVML_SUCCESS;
}

/* Field values. Those that say what a link is (driver_api.NVML_LINK_FIELDS: NCCL reads an NVLink's state so on
 * sm_90 and later) are the GPU host's NVML's, each with its own return code, type and time; every other field (a
 * counter of traffic or errors) is NOT_SUPPORTED, as NVML says of a field the device does not have. The call itself
 * succeeds, as NVML's does. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count_, nvmlFieldValue_t *values) {
    DEVICE_OR_RETURN(device, ordinal);
    if (count_ < 0 || (count_ && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < count_; i++) {
        nvmlFieldValue_t *field = &values[i];
        uint8_t rep[NVML_QUERY_REPLY_SIZE];
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        field->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        field->latencyUsec = 0;
        field->nvmlReturn = ORION_NVML_LINK_FIELD(field->fieldId)
                                ? host_nvml(ORION_NVML_QUERY_FIELD_VALUE, ordinal, field->scopeId, field->fieldId, rep)
                                : NVML_ERROR_NOT_SUPPORTED;
        if (field->nvmlReturn != NVML_SUCCESS) continue;
        field->valueType = (int)orion_get_u32(rep + ORION_NVML_QUERY_REP_value_type);
        field->value = orion_get_u64(rep + ORION_NVML_QUERY_REP_value);
    }
    return NVML_SUCCESS;
}

/* The plain name, as NCCL resolves it (with nvml.h's current nvmlPciInfo_t). */
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

/* Peer-to-peer status between two vGPUs (NCCL asks READ and WRITE for every pair at start, and stops where one
 * fails). A device with itself: what NVML answers (measured on two H200s, driver 580: OK for every index but
 * PCI, whose status is NOT_SUPPORTED). Two devices: reads and writes as the driver's peer access of the GPUs behind
 * them (CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED), atomics as its native atomics; NVLink, PCI and the UNKNOWN
 * index, which the driver cannot say, as the GPU host's NVML answers them (NVML_QUERY). tests/gpu/test_multi_gpu.py
 * compares these with the real NVML. */
enum { NVML_P2P_CAPS_INDEX_READ = 0, NVML_P2P_CAPS_INDEX_WRITE = 1, NVML_P2P_CAPS_INDEX_NVLINK = 2,
       NVML_P2P_CAPS_INDEX_ATOMICS = 3, NVML_P2P_CAPS_INDEX_PCI = 4, NVML_P2P_CAPS_INDEX_UNKNOWN = 5 };
enum { NVML_P2P_STATUS_OK = 0, NVML_P2P_STATUS_NOT_SUPPORTED = 5 };
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, int index, int *status) {
    DEVICE_OR_RETURN(device1, first);
    int second = ordinal_of(device2);
    if (second < 0 || !status || index < 0 || index > NVML_P2P_CAPS_INDEX_UNKNOWN) return NVML_ERROR_INVALID_ARGUMENT;
    if (first == second) {
        *status = index == NVML_P2P_CAPS_INDEX_PCI ? NVML_P2P_STATUS_NOT_SUPPORTED : NVML_P2P_STATUS_OK;
        return NVML_SUCCESS;
    }
    if (index != NVML_P2P_CAPS_INDEX_READ && index != NVML_P2P_CAPS_INDEX_WRITE && index != NVML_P2P_CAPS_INDEX_ATOMICS)
        return host_value(ORION_NVML_QUERY_P2P_STATUS, first, (uint32_t)second, (uint32_t)index,
                          (unsigned int *)status);
    CUdevice_P2PAttribute attribute = index == NVML_P2P_CAPS_INDEX_ATOMICS
                                          ? CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
                                          : CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED;
    int value = 0;
    nvmlReturn_t rc = from_cuda(cuDeviceGetP2PAttribute(&value, attribute, first, second));
    if (rc == NVML_SUCCESS) *status = value ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    return rc;
}

/* A vGPU is never a MIG device from inside the session: current and pending mode NVML_DEVICE_MIG_DISABLE. */
/* The processes using a vGPU as this process sees it: itself, when its current context is on that device (its use
 * from cuMemGetInfo, which the quota counts, as NVML counts a process's use), else none it can know of. PyTorch asks
 * this to write its out-of-memory message and asserts success. `stride`: nvmlProcessInfo_v1_t (pid, used: 16
 * bytes) for the plain name, the 24-byte v2/v3 form (and GPU and compute instance ids, none: MIG is off) else. */
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, void *infos, size_t stride) {
    DEVICE_OR_RETURN(device, ordinal);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    CUdevice current;
    size_t free_bytes = 0, total = 0;
    unsigned int found = cuCtxGetDevice(&current) == CUDA_SUCCESS && current == ordinal;
    if (found && cuMemGetInfo(&free_bytes, &total) != CUDA_SUCCESS) free_bytes = total = 0;
    unsigned int room = *count;
    *count = found;
    if (room < found) return NVML_ERROR_INSUFFICIENT_SIZE;
    if (found) {
        if (!infos) return NVML_ERROR_INVALID_ARGUMENT;
        unsigned char *info = infos;
        memset(info, 0, stride);
        unsigned int pid = (unsigned int)getpid();
        unsigned long long used = total >= free_bytes && total ? (unsigned long long)(total - free_bytes)
                                                               : NVML_VALUE_NOT_AVAILABLE_ULL;
        memcpy(info, &pid, sizeof pid);
        memcpy(info + 8, &used, sizeof used);
        if (stride > 16) memset(info + 16, 0xFF, 8); /* gpuInstanceId, computeInstanceId: none (MIG off) */
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count, void *infos) {
    return running_processes(device, count, infos, 16);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count, void *infos) {
    return running_processes(device, count, infos, 24);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, void *infos) {
    return running_processes(device, count, infos, 24);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    DEVICE_OR_RETURN(device, ordinal);
    (void)ordinal;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = 0;
    return NVML_SUCCESS;
}

/* What a vGPU has no answer for: the PCIe link and NVLink fabric of the host's GPU. */
#define NOT_SUPPORTED_FOR_A_VGPU(name, type)                   \
    nvmlReturn_t name(nvmlDevice_t device, type *out) {        \
        DEVICE_OR_RETURN(device, ordinal);                     \
        (void)ordinal;                                         \
        return out ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT; \
    }
NOT_SUPPORTED_FOR_A_VGPU(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int)
NOT_SUPPORTED_FOR_A_VGPU(nvmlDeviceGetCurrPcieLinkWidth, unsigned int)
NOT_SUPPORTED_FOR_A_VGPU(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int)
NOT_SUPPORTED_FOR_A_VGPU(nvmlDeviceGetMaxPcieLinkWidth, unsigned int)
NOT_SUPPORTED_FOR_A_VGPU(nvmlDeviceGetGpuFabricInfoV, void)
NOT_SUPPORTED_FOR_A_VGPU(nvmlDeviceGetGpuFabricInfo, void)

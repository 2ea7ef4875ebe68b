/* answered_in_guest.c: driver entry points outside the call table that the guest answers itself.
 *
 * Frameworks call these (measured: tools/cuinventory, TESTBED.md); each depends only on the process's
 * environment, or is composed of calls the table forwards, so none needs a table entry of its own.
 */
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "orion_guest.h"

typedef int CUmoduleLoadingMode;
extern const unsigned char orion_pointer_attribute_width[]; /* generated from driver_api.POINTER_ATTRIBUTE_WIDTHS */
extern const unsigned orion_pointer_attributes;
enum { CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2 };

/* The driver reads CUDA_MODULE_LOADING from the process's environment (lazy unless EAGER, since CUDA 12.2); so
 * does the host agent's driver for the modules this process loads there, whose environment is the agent's: the
 * answer describes what this process asked for, which is what the runtime uses it to decide. */
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
    ORION_ENTRY("cuModuleGetLoadingMode");
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    const char *asked = getenv("CUDA_MODULE_LOADING");
    *mode = asked && strcmp(asked, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

/* "domain:bus:device.0" as the driver writes it (a 4-digit domain: "0000:00:06.0" on the H200, where NVML's bus id
 * has 8), from the device's PCI attributes (forwarded). */
CUresult cuDeviceGetPCIBusId(char *bus_id, int length, CUdevice device) {
    ORION_ENTRY("cuDeviceGetPCIBusId");
    enum { PCI_BUS = 33, PCI_DEVICE = 34, PCI_DOMAIN = 50 };
    if (!bus_id || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    int domain = 0, bus = 0, slot = 0;
    CUresult rc = cuDeviceGetAttribute(&domain, PCI_DOMAIN, device);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&bus, PCI_BUS, device);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&slot, PCI_DEVICE, device);
    if (rc == CUDA_SUCCESS) snprintf(bus_id, (size_t)length, "%04x:%02x:%02x.0", domain, bus, slot);
    return rc;
}

/* The device whose PCI location a bus id names, as the driver reads one: "domain:bus:device.function",
 * "domain:bus:device" or "bus:device.function", in hex, any case; the location from the same attributes
 * cuDeviceGetPCIBusId writes. An id that names no device of this process answers CUDA_ERROR_INVALID_DEVICE, one that
 * does not read as an id CUDA_ERROR_INVALID_VALUE. */
int orion_parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *slot) {
    unsigned function;
    int end = -1;
    if (sscanf(text, "%x:%x:%x.%x%n", domain, bus, slot, &function, &end) == 4 && end >= 0 && !text[end]) return 1;
    end = -1;
    if (sscanf(text, "%x:%x:%x%n", domain, bus, slot, &end) == 3 && end >= 0 && !text[end]) return 1;
    end = -1;
    *domain = 0;
    return sscanf(text, "%x:%x.%x%n", bus, slot, &function, &end) == 3 && end >= 0 && !text[end];
}

CUresult cuDeviceGetByPCIBusId(CUdevice *device, const char *bus_id) {
    ORION_ENTRY("cuDeviceGetByPCIBusId");
    enum { PCI_BUS = 33, PCI_DEVICE = 34, PCI_DOMAIN = 50 };
    if (!device || !bus_id) return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus = 0, slot = 0;
    if (!orion_parse_bus_id(bus_id, &domain, &bus, &slot)) return CUDA_ERROR_INVALID_VALUE;
    int count = 0;
    CUresult rc = cuDeviceGetCount(&count);
    for (int i = 0; rc == CUDA_SUCCESS && i < count; i++) {
        int d = 0, b = 0, s = 0;
        rc = cuDeviceGetAttribute(&d, PCI_DOMAIN, i);
        if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&b, PCI_BUS, i);
        if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&s, PCI_DEVICE, i);
        if (rc == CUDA_SUCCESS && (unsigned)d == domain && (unsigned)b == bus && (unsigned)s == slot) {
            *device = i;
            return CUDA_SUCCESS;
        }
    }
    return rc == CUDA_SUCCESS ? CUDA_ERROR_INVALID_DEVICE : rc;
}

/* Several pointer attributes at once, as cuPointerGetAttribute gives each; a pointer CUDA does not know is not an
 * error here (cuda.h): its attributes read as zero. */
CUresult cuPointerGetAttributes(unsigned int count, int *attributes, void **data, CUdeviceptr pointer) {
    ORION_ENTRY("cuPointerGetAttributes");
    if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++) {
        unsigned a = (unsigned)attributes[i];
        if (!data[i] || a >= orion_pointer_attributes || !orion_pointer_attribute_width[a])
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (unsigned i = 0; i < count; i++) {
        CUresult rc = cuPointerGetAttribute(data[i], attributes[i], pointer);
        if (rc == CUDA_ERROR_INVALID_VALUE) memset(data[i], 0, orion_pointer_attribute_width[attributes[i]]);
        else if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

/* CUDA 13's cuStreamGetCaptureInfo (the _v3 ABI of CUDA 12.3+: with edge data), forwarded (a hand-written call of
 * the table: request the stream; reply status, id, graph, then the dependency nodes and their edges' data as
 * counted lists of u64). The arrays it hands out are this thread's and stay valid until its next call here, as the
 * driver's stay valid until the next call on the stream. A capture with more dependencies than the arrays hold
 * answers CUDA_ERROR_NOT_SUPPORTED, said once: never a truncated list. */
enum { CAPTURE_MAX_DEPENDENCIES = 1024, CUDA_ERROR_LOSSY_QUERY_CODE = 402 };
static _Thread_local CUgraphNode capture_nodes[CAPTURE_MAX_DEPENDENCIES];
static _Thread_local uint64_t capture_edges[CAPTURE_MAX_DEPENDENCIES]; /* CUgraphEdgeData's 8 bytes each */

/* The reply's two counted lists of u64 (`nodes`, then `edges`), items of one size. */
#define CAPTURE_ITEM ORION_REP_cuStreamGetCaptureInfo_nodes_ITEM
_Static_assert(ORION_REP_cuStreamGetCaptureInfo_edges_ITEM == CAPTURE_ITEM, "nodes and edges: items of one size");

/* A counted list of u64 at `at` (u32 count, then the items) within `len` bytes: its count, or -1 if it does not fit. */
static long counted_u64s(const uint8_t *at, size_t len, size_t *used) {
    if (len < ORION_LENGTH_BYTES) return -1;
    uint32_t count = orion_get_u32(at);
    if (count > CAPTURE_MAX_DEPENDENCIES || ORION_LENGTH_BYTES + (size_t)count * CAPTURE_ITEM > len) return -1;
    *used = ORION_LENGTH_BYTES + (size_t)count * CAPTURE_ITEM;
    return (long)count;
}

CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                const CUgraphNode **dependencies, const CUgraphEdgeData **edges, size_t *count) {
    ORION_ENTRY("cuStreamGetCaptureInfo");
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    if (orion_known_not_capturing((uint64_t)(uintptr_t)stream)) { /* capture_state.c: what the forwarded call says */
        int pending = orion_pending_async_error();
        if (pending != CUDA_SUCCESS) return pending;
        *status = (CUstreamCaptureStatus)0; /* CU_STREAM_CAPTURE_STATUS_NONE */
        if (id) *id = 0;
        if (graph) *graph = NULL;
        if (dependencies) *dependencies = NULL;
        if (edges) *edges = NULL;
        if (count) *count = 0;
        return CUDA_SUCCESS;
    }
    /* the reply's fixed part, then its lists (`nodes` first, right after the fixed part) */
    enum { HEAD = ORION_REP_cuStreamGetCaptureInfo_SIZE,
           TAIL = 2 * (ORION_LENGTH_BYTES + CAPTURE_ITEM * CAPTURE_MAX_DEPENDENCIES) };
    _Static_assert(ORION_REP_cuStreamGetCaptureInfo_nodes == HEAD, "the tail begins with the nodes' count");
    static _Thread_local uint8_t tail[TAIL];
    uint8_t req[ORION_REQ_cuStreamGetCaptureInfo_SIZE], head[HEAD];
    size_t tail_len = 0;
    orion_put_u64(req + ORION_REQ_cuStreamGetCaptureInfo_stream, (uint64_t)(uintptr_t)stream);
    struct orion_piece piece = {req, sizeof req};
    CUresult rc = orion_thread_forwardv(ORION_OP_cuStreamGetCaptureInfo, &piece, 1, head, sizeof head, tail,
                                        sizeof tail, &tail_len, 0);
    if (rc != CUDA_SUCCESS) return rc;
    size_t first = 0, second = 0;
    long nodes = counted_u64s(tail, tail_len, &first);
    long edge_count = nodes < 0 ? -1 : counted_u64s(tail + first, tail_len - first, &second);
    if (nodes < 0 || edge_count < 0 || (edge_count != 0 && edge_count != nodes)) {
        if (orion_first_time("cuStreamGetCaptureInfo"))
            fprintf(stderr, "orion: cuStreamGetCaptureInfo: a capture with more than %d dependencies (or a reply "
                    "that does not read as one) is not answered: CUDA_ERROR_NOT_SUPPORTED\n", CAPTURE_MAX_DEPENDENCIES);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    for (long i = 0; i < nodes; i++) {
        capture_nodes[i] = (CUgraphNode)(uintptr_t)orion_get_u64(tail + ORION_LENGTH_BYTES + CAPTURE_ITEM * i);
        capture_edges[i] = edge_count ? orion_get_u64(tail + first + ORION_LENGTH_BYTES + CAPTURE_ITEM * i)
                                      : 0; /* no data: default edges */
    }
    if (!edges)  /* edges with data of their own, and nowhere to say so: the driver's answer */
        for (long i = 0; i < nodes; i++)
            if (capture_edges[i]) return CUDA_ERROR_LOSSY_QUERY_CODE;
    *status = (CUstreamCaptureStatus)(int32_t)orion_get_u32(head + ORION_REP_cuStreamGetCaptureInfo_status);
    if (id) *id = orion_get_u64(head + ORION_REP_cuStreamGetCaptureInfo_id);
    if (graph) *graph = (CUgraph)(uintptr_t)orion_get_u64(head + ORION_REP_cuStreamGetCaptureInfo_graph);
    if (dependencies) *dependencies = nodes ? capture_nodes : NULL;
    if (edges) *edges = nodes ? (const CUgraphEdgeData *)(const void *)capture_edges : NULL;
    if (count) *count = (size_t)nodes;
    return CUDA_SUCCESS;
}

static CUresult capture_info(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **dependencies, const CUgraphEdgeData **edges, size_t *count) {
    return cuStreamGetCaptureInfo(stream, status, id, graph, dependencies, edges, count);
}

/* The _v2 ABI (CUDA 11.3 to 12.2): no edge data. */
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                   const CUgraphNode **dependencies, size_t *count) {
    ORION_ENTRY("cuStreamGetCaptureInfo_v2");
    return capture_info(stream, status, id, graph, dependencies, NULL, count);
}

/* The first ABI (before CUDA 11.3): status and id only. Reached through cuGetProcAddress (orion_versioned_entry). */
static CUresult capture_info_v1(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id) {
    return capture_info(stream, status, id, NULL, NULL, NULL, NULL);
}

/* cuGetProcAddress's answer for an API name whose ABI changed across CUDA versions, for a caller built against
 * `version` (cudaVersion, e.g. 12020): the entry point with that caller's ABI, or NULL where the name's current
 * one (the name table's) serves every version. Names whose versions kept one signature (cuStreamWaitValue32 and
 * its _v2, which only lifted a device-attribute requirement) need no entry. */
void *orion_versioned_entry(const char *symbol, int version) {
    if (strcmp(symbol, "cuStreamGetCaptureInfo") == 0) {
        if (version < 11030) return (void *)capture_info_v1;
        if (version < 12030) return (void *)cuStreamGetCaptureInfo_v2;
    }
    void *host_function = orion_host_function_entry(symbol, version); /* host_functions.c: cuLaunchHostFunc_v2 */
    if (host_function) return host_function;
    return orion_graph_versioned_entry(symbol, version); /* graph_calls.c: kernel node and edge ABIs */
}

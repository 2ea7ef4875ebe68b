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
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    const char *asked = getenv("CUDA_MODULE_LOADING");
    *mode = asked && strcmp(asked, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

/* "domain:bus:device.0" as the driver writes it, from the device's PCI attributes (forwarded). */
CUresult cuDeviceGetPCIBusId(char *bus_id, int length, CUdevice device) {
    enum { PCI_BUS = 33, PCI_DEVICE = 34, PCI_DOMAIN = 50 };
    if (!bus_id || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    int domain = 0, bus = 0, slot = 0;
    CUresult rc = cuDeviceGetAttribute(&domain, PCI_DOMAIN, device);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&bus, PCI_BUS, device);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&slot, PCI_DEVICE, device);
    if (rc == CUDA_SUCCESS) snprintf(bus_id, (size_t)length, "%08x:%02x:%02x.0", domain, bus, slot);
    return rc;
}

/* Several pointer attributes at once, as cuPointerGetAttribute gives each; a pointer CUDA does not know is not an
 * error here (cuda.h): its attributes read as zero. */
CUresult cuPointerGetAttributes(unsigned int count, int *attributes, void **data, CUdeviceptr pointer) {
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

/* Stream capture is not forwarded (cuStreamBeginCapture answers 801), so no stream can be capturing: the answer is
 * cuStreamIsCapturing's (forwarded, which checks the stream is the session's) with no graph. Should the host ever
 * say a stream is capturing, there is no graph here to describe: CUDA_ERROR_NOT_SUPPORTED. */
static CUresult capture_info(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **dependencies, const CUgraphEdgeData **edges, size_t *count) {
    enum { CAPTURE_STATUS_NONE = 0 };
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureStatus answer = CAPTURE_STATUS_NONE;
    CUresult rc = cuStreamIsCapturing(stream, &answer);
    if (rc != CUDA_SUCCESS) return rc;
    if (answer != CAPTURE_STATUS_NONE) return CUDA_ERROR_NOT_SUPPORTED;
    *status = answer;
    if (id) *id = 0;
    if (graph) *graph = NULL;
    if (dependencies) *dependencies = NULL;
    if (edges) *edges = NULL;
    if (count) *count = 0;
    return CUDA_SUCCESS;
}

/* CUDA 13's cuStreamGetCaptureInfo (the _v3 ABI of CUDA 12.3+: with edge data). */
CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                const CUgraphNode **dependencies, const CUgraphEdgeData **edges, size_t *count) {
    return capture_info(stream, status, id, graph, dependencies, edges, count);
}

/* The _v2 ABI (CUDA 11.3 to 12.2): no edge data. */
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                   const CUgraphNode **dependencies, size_t *count) {
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
    return NULL;
}

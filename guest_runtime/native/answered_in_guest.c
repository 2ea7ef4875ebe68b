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

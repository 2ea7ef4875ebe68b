/* param_layouts.h: the kernel-parameter layouts this process learned from the host, asked once per function, and
 * the packing of a launch's kernelParams by them (guest_runtime/param_layouts.py and kernel_params.py in C).
 *
 * cuLaunchKernel's kernelParams is an array of pointers whose sizes only the driver knows; the guest asks the host
 * cuFuncGetParamInfo (cuKernelGetParamInfo for a CUkernel from cuLibraryGetKernel) for each parameter at a
 * function's first launch, keeps the layout in a per-process map keyed by handle (thread-safe), and packs the
 * values into one buffer at those offsets, padding zero. A module or library unload forgets every layout: its
 * handles may then name other functions.
 */
#ifndef ORION_PARAM_LAYOUTS_H
#define ORION_PARAM_LAYOUTS_H

#include <stddef.h>
#include <stdint.h>

#define ORION_MAX_PARAM_BYTES 32764 /* the driver's limit for one launch's parameters */

/* cuLibraryGetKernel gave `kernel`: its layout is asked with cuKernelGetParamInfo. */
void orion_param_layouts_kernel_made(uint64_t kernel);

/* A module or library was unloaded (cuModuleUnload, cuLibraryUnload succeeded): forget every layout. */
void orion_param_layouts_forget(void);

/* Pack the values `kernel_params` points at for `function` into one buffer: into `small` when the packed size
 * fits `small_cap`, else into a buffer this allocates (the caller frees *packed when it is not `small`). Returns
 * CUDA_SUCCESS with *packed and *size set, CUDA_ERROR_INVALID_VALUE for a NULL kernelParams (or entry) of a
 * function with parameters or a layout the host gave that cannot be packed, or the error asking the layout met. */
int orion_params_pack(uint64_t function, void *const *kernel_params, uint8_t *small, size_t small_cap,
                      uint8_t **packed, size_t *size);

/* The packed buffer an `extra` list (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE, then CU_LAUNCH_PARAM_END) names, read as
 * cuLaunchKernel reads a launch's (launch_calls.c): *buffer and *size (none: 0), or CUDA_ERROR_INVALID_VALUE for a
 * list the launch path refuses. The buffer stays the caller's. */
int orion_params_from_extra(void *const *extra, const void **buffer, size_t *size);

#endif

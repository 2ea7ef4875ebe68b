/* module_calls.h: loading a module from an image pointer, for the native guest driver's other parts (the export
 * tables load the fatbins cudart registers through it). What cuModuleLoadData does: the image's extent found as
 * module_image.h says, its bytes sent from where they lie. */
#ifndef ORION_MODULE_CALLS_H
#define ORION_MODULE_CALLS_H

struct CUmod_st;

/* cuModuleLoadData: CUDA_SUCCESS with the new module in *module, CUDA_ERROR_INVALID_VALUE for a NULL pointer,
 * CUDA_ERROR_INVALID_IMAGE for bytes that are no image this library can measure, or the host's answer. */
int orion_module_load_image(struct CUmod_st **module, const void *image);

#endif

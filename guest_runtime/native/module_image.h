/* module_image.h: how long is a module image? The native guest driver must know before it can ship one.
 *
 * cuModuleLoadData and cuLibraryLoadData get a bare address; the driver finds the image's extent from its own
 * bytes, and so must the guest, to send exactly that many bytes to the host. The rules are those of
 * guest_runtime/module_image.py, which documents them: an ELF cubin ends at the furthest end of its headers,
 * tables and sections; a fatbin is its header's size plus the size it declares; PTX is NUL-terminated text (the
 * NUL included) with a `.version` directive; a fatbin wrapper (`__fatBinC_Wrapper_t`) points at its fatbin.
 *
 * Nothing here reads past readable memory: the readable extent at the address comes from /proc/self/maps, so a
 * garbage pointer or a header that claims more than is there is "not an image", never a fault. Used by the module
 * and library loads and by the export tables (fatbins cudart registers).
 */
#ifndef ORION_MODULE_IMAGE_H
#define ORION_MODULE_IMAGE_H

#include <stddef.h>

enum { ORION_IMAGE_CUBIN = 1, ORION_IMAGE_FATBIN = 2, ORION_IMAGE_PTX = 3, ORION_IMAGE_FATBIN_WRAPPER = 4 };

/* Where the bytes to ship lie: for a fatbin wrapper, the fatbin it points at. */
struct orion_image_span {
    int kind;          /* what was at the address given: ORION_IMAGE_FATBIN_WRAPPER for a wrapper */
    const void *start; /* the first byte to ship */
    size_t size;       /* how many */
};

/* The length of the cubin, fatbin or PTX image at `image` (PTX with its NUL), or 0 when the bytes there are not
 * one (a fatbin wrapper is not: orion_image_locate follows it). */
size_t orion_image_size(const void *image);

/* The span to ship for the image handed to cuModuleLoadData at `image`: 0, or -1 with one line saying why in
 * `why` (may be NULL). */
int orion_image_locate(const void *image, struct orion_image_span *span, char *why, size_t whylen);

#endif

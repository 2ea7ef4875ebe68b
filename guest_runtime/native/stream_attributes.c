/* stream_attributes.c: cuStreamGetAttribute and cuStreamSetAttribute for the native guest driver. A CUstreamAttrValue
 * is CUlaunchAttributeValue's 64-byte union (cuda.h), and travels as its bytes: a set streams them from the caller's
 * union, a get writes the reply's into it. Only the plain-valued attribute IDs travel (driver_api's
 * STREAM_ATTRIBUTES_PLAIN, generated as ORION_STREAM_ATTRIBUTES_FORWARDED); the host's driver answers for each, its
 * own error for an ID that is not a stream's (host_agent/session/stream_extras.py). Any other ID (an event's, which names a
 * handle, DEVICE_UPDATABLE_KERNEL_NODE, or one newer than this library) answers CUDA_ERROR_NOT_SUPPORTED, named once.
 * cuStreamCopyAttributes is a generic call of the table. */
#include <string.h>

#include "orion_guest.h"

/* sizeof(CUstreamAttrValue): the value part of a CUlaunchAttribute as it travels (its id, padding, then the union) */
#define VALUE_BYTES (ORION_LAUNCH_ATTRIBUTE_SIZE - ORION_LAUNCH_ATTRIBUTE_value)
#define GET(payload, field) ORION_##payload##_cuStreamGetAttribute_##field
#define SET(field) ORION_REQ_cuStreamSetAttribute_##field
_Static_assert(SET(stream) == GET(REQ, stream) && SET(attribute) == GET(REQ, attribute) && SET(value) == SET(SIZE)
               && GET(REQ, SIZE) == SET(SIZE) && GET(REP, SIZE) == 0,
               "the same head, the value's bytes after it (a set) or as the whole reply (a get)");

static int travels(CUstreamAttrID attribute) {
    return attribute >= 0 && attribute < 64 && (ORION_STREAM_ATTRIBUTES_FORWARDED >> attribute) & 1;
}

static int refused(void) {
    return orion_not_forwarded("cuStreamGetAttribute/cuStreamSetAttribute with an attribute other than the plain-valued "
                               "ones (an event's, DEVICE_UPDATABLE_KERNEL_NODE, or one newer than this library)");
}

static void put_head(uint8_t head[SET(SIZE)], CUstream stream, CUstreamAttrID attribute) {
    orion_put_u64(head + SET(stream), (uint64_t)(uintptr_t)stream);
    orion_put_i32(head + SET(attribute), attribute);
}

CUresult cuStreamGetAttribute(CUstream stream, CUstreamAttrID attribute, CUstreamAttrValue *value) {
    ORION_ENTRY("cuStreamGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (!travels(attribute)) return refused();
    uint8_t request[GET(REQ, SIZE)], reply[VALUE_BYTES]; /* the reply: the union's bytes, the whole tail */
    put_head(request, stream, attribute);
    int status = orion_thread_forward(ORION_OP_cuStreamGetAttribute, request, sizeof request, reply, sizeof reply, 0);
    if (status == CUDA_SUCCESS) memcpy(value, reply, VALUE_BYTES);
    return status;
}

CUresult cuStreamSetAttribute(CUstream stream, CUstreamAttrID attribute, const CUstreamAttrValue *value) {
    ORION_ENTRY("cuStreamSetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (!travels(attribute)) return refused();
    uint8_t head[SET(SIZE)];
    put_head(head, stream, attribute);
    struct orion_piece request[2] = { { head, sizeof head }, { value, VALUE_BYTES } };
    return orion_thread_forwardv(ORION_OP_cuStreamSetAttribute, request, 2, NULL, 0, NULL, 0, NULL, 0);
}

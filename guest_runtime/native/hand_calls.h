/* hand_calls.h: what the hand-written module, library, launch and occupancy calls of the native guest driver share
 * (module_calls.c, param_layouts.c, launch_calls.c, occupancy_calls.c; private to them).
 *
 * Types, opcodes (ORION_OP_<name>), posted flags (ORION_POSTED_<name>) and prototypes come from the generated
 * orion_calls.h (through orion_guest.h); this adds cuda.h's launch configuration and the sending helpers.
 */
#ifndef ORION_HAND_CALLS_H
#define ORION_HAND_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "orion_guest.h"

/* cuda.h's launch configuration, which the generated header only names: its attributes are an id and a 64-byte
 * union of values (72 bytes, as cuda.h lays them out). */
typedef struct CUlaunchAttribute_st {
    int id;
    char pad[4];
    unsigned char value[64];
} CUlaunchAttribute;
struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
};

/* A launch configuration as the wire carries it (driver_api LAUNCH, whose fields orion_layouts.h places: u64
 * function, u32 grid x y z, block x y z, shared bytes, u64 stream; then, where the request has attributes, their
 * u32 count): launch_calls.c writes it for cuLaunchKernel* and cuOccupancyMaxActiveClusters alike. Each attribute
 * travels as cuda.h's CUlaunchAttribute (ORION_LAUNCH_ATTRIBUTE_SIZE bytes: id, padding, a 64-byte value). */
#define ORION_LAUNCH_HEAD_BYTES (ORION_LAUNCH_SIZE + ORION_LENGTH_BYTES) /* the LAUNCH fields, the attributes' count */
/* The head into `head` (ORION_LAUNCH_HEAD_BYTES): its length, with the count only where `count` is given. */
size_t orion_launch_head(uint8_t *head, uint64_t function, const unsigned int dims[7], uint64_t stream,
                         const unsigned int *count);
/* A CUlaunchConfig's request pieces: the head (in `head`) and its attributes array, after checking it as the driver
 * does (non-NULL, attributes where counted) and that each attribute travels (driver_api.LAUNCH_ATTRIBUTES_PLAIN and
 * _EVENT; another answers 801, named once for `caller`). A CUresult; on success `*count` pieces. */
int orion_launch_config_pieces(const char *caller, uint64_t function, const CUlaunchConfig *config, uint8_t *head,
                               struct orion_piece pieces[2], int *count);

/* One call, waited for, as the calling thread: its CUresult; on success exactly `cap` reply bytes in `rep`. */
static inline int hand_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap) {
    return orion_thread_forwardv(opcode, req, nreq, rep, cap, NULL, 0, NULL, 0);
}

static inline int hand_forward(uint32_t opcode, const void *req, size_t len, void *rep, size_t cap) {
    struct orion_piece piece = { req, len };
    return hand_forwardv(opcode, &piece, 1, rep, cap);
}

/* A request in pieces sent as the table says: posted (no wait; a failure surfaces later) or waited for (with no
 * reply payload). */
static inline int hand_send(uint32_t opcode, int posted, const struct orion_piece *req, int nreq) {
    return posted ? orion_thread_postv(opcode, req, nreq) : hand_forwardv(opcode, req, nreq, NULL, 0);
}

#endif

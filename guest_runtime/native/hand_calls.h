/* hand_calls.h: what the hand-written module, library, launch and occupancy calls of the native guest driver share
 * (module_calls.c, param_layouts.c, launch_calls.c, occupancy_calls.c; private to them).
 *
 * The generated file (gen_libcuda.py) declares cuda.h's types in its own translation unit only, so these files
 * declare the few they use, with cuda.h's names and ABI. The opcodes and posted flags of the table calls they send
 * are written here by hand: tests/wire/test_native_launch_calls.py holds every line below to ivshmem/driver_api.py,
 * so a change of the table that is not made here too fails that test (the generator could emit them instead: see
 * the report of issue 13's hand-written calls).
 */
#ifndef ORION_HAND_CALLS_H
#define ORION_HAND_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_client.h"
#include "orion_wire.h"

#ifndef __cuda_cuda_h__
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef size_t (*CUoccupancyB2DSize)(int blockSize);
typedef struct CUlaunchAttribute_st { /* its id, then a 64-byte union of values: 72 bytes, as cuda.h lays it out */
    int id;
    char pad[4];
    unsigned char value[64];
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
#endif

#define CUDA_ERROR_INVALID_IMAGE 200

/* Opcode and posted flag of each table call sent from these files (the test compares them with the table). */
#define ORION_OP_cuModuleLoadData 0x12c
#define ORION_OP_cuModuleLoadDataEx 0x157
#define ORION_OP_cuLibraryLoadData 0x14f
#define ORION_OP_cuModuleGetFunction 0x12d
#define ORION_OP_cuModuleGetGlobal 0x12e
#define ORION_OP_cuLibraryGetKernel 0x130
#define ORION_OP_cuLibraryGetGlobal 0x131
#define ORION_OP_cuFuncGetParamInfo 0x138
#define ORION_OP_cuKernelGetParamInfo 0x139
#define ORION_OP_cuLaunchKernel 0x13b
#define ORION_OP_cuLaunchCooperativeKernel 0x156
#define ORION_OP_cuLaunchKernelEx 0x150
#define ORION_OP_cuOccupancyMaxPotentialBlockSize 0x160
#define ORION_OP_cuOccupancyMaxPotentialBlockSizeWithFlags 0x161
#define ORION_POSTED_cuLaunchKernel 1
#define ORION_POSTED_cuLaunchCooperativeKernel 1
#define ORION_POSTED_cuLaunchKernelEx 1

/* The calling thread's forwards (context_stacks.c: its current context made the host's first, as forward.py's
 * _sync_context does) and the device ranges unified addressing reads (device_ranges.c), where this library has
 * them: weak references, so these files build and forward (plainly, through cuda_client.h) without them too. */
int orion_thread_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap,
                          void *tail, size_t tail_cap, size_t *tail_len, int flags) __attribute__((weak));
int orion_thread_postv(uint32_t opcode, const struct orion_piece *req, int nreq) __attribute__((weak));
void orion_range_add(uint64_t base, uint64_t size) __attribute__((weak));

/* One call, waited for: its CUresult; on success exactly `cap` reply bytes in `rep`. */
static inline int hand_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap) {
    return orion_thread_forwardv ? orion_thread_forwardv(opcode, req, nreq, rep, cap, NULL, 0, NULL, 0)
                                 : orion_forwardv(opcode, req, nreq, rep, cap, NULL, 0, NULL, 0);
}

static inline int hand_forward(uint32_t opcode, const void *req, size_t len, void *rep, size_t cap) {
    struct orion_piece piece = { req, len };
    return hand_forwardv(opcode, &piece, 1, rep, cap);
}

/* A request in pieces sent as the table says: posted (no wait; a failure surfaces later) or waited for (with no
 * reply payload). */
static inline int hand_send(uint32_t opcode, int posted, const struct orion_piece *req, int nreq) {
    if (!posted) return hand_forwardv(opcode, req, nreq, NULL, 0);
    return orion_thread_postv ? orion_thread_postv(opcode, req, nreq) : orion_forward_postv(opcode, req, nreq);
}

/* A module or library global is device memory the process may copy to and from with unified addressing. */
static inline void hand_device_range(uint64_t base, uint64_t size) {
    if (orion_range_add) orion_range_add(base, size);
}

#endif

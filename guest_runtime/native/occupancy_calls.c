/* occupancy_calls.c: the occupancy calls of the native guest driver that the table cannot marshal by itself.
 * cuOccupancyMaxPotentialBlockSize(WithFlags): without a callback the host answers; with one (a
 * block-size-to-shared-memory function, which lives in the guest) the search
 * cudaOccupancyMaxPotentialBlockSizeVariableSMemWithFlags does runs here over forwarded occupancy queries, one per
 * candidate block size, as guest_runtime/occupancy.py does. cuOccupancyMaxActiveClusters and
 * cuOccupancyMaxPotentialClusterSize: a launch configuration, packed as cuLaunchKernelEx packs it (launch_calls.c). */
#include "hand_calls.h"

/* The entry points the search asks (this library's own, generated or answered in the guest). */
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device);
CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction function, int block_size,
                                                              size_t dynamic_shared, unsigned int flags);

/* CU_DEVICE_ATTRIBUTE_: MAX_THREADS_PER_MULTIPROCESSOR, WARP_SIZE, MAX_THREADS_PER_BLOCK, MULTIPROCESSOR_COUNT */
static const int ATTRIBUTES[4] = { 39, 10, 1, 16 };
#define FUNCTION_MAX_THREADS_PER_BLOCK 0

/* occupancy.PotentialBlockSize.search: the block size with the most resident threads per SM, from the largest
 * candidate down in warp-sized steps, stopping at a full SM. */
static int search(CUfunction function, CUoccupancyB2DSize dynamic, int limit, unsigned int flags, int *min_grid,
                  int *block_size) {
    CUdevice device = 0;
    int values[4] = { 0 }, function_limit = 0;
    int status = cuCtxGetDevice(&device);
    for (int i = 0; i < 4 && status == CUDA_SUCCESS; i++) status = cuDeviceGetAttribute(&values[i], ATTRIBUTES[i],
                                                                                       device);
    if (status == CUDA_SUCCESS) status = cuFuncGetAttribute(&function_limit, FUNCTION_MAX_THREADS_PER_BLOCK, function);
    if (status != CUDA_SUCCESS) return status;
    int per_sm = values[0], granularity = values[1], device_limit = values[2], sm_count = values[3];
    if (granularity <= 0) return CUDA_ERROR_UNKNOWN; /* a warp of no threads: not a device's answer */
    int block_limit = limit ? limit : device_limit;
    if (device_limit < block_limit) block_limit = device_limit;
    if (function_limit < block_limit) block_limit = function_limit;
    long long best_block = 0, best_blocks = 0, best_threads = 0;
    long long candidate = block_limit > 0 ? ((long long)block_limit + granularity - 1) / granularity * granularity : 0;
    for (; candidate > 0; candidate -= granularity) {
        int block = candidate < block_limit ? (int)candidate : block_limit;
        int blocks = 0;
        status = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, function, block, dynamic(block),
                                                                      flags);
        if (status != CUDA_SUCCESS) return status;
        if ((long long)block * blocks > best_threads) {
            best_block = block;
            best_blocks = blocks;
            best_threads = (long long)block * blocks;
        }
        if (best_threads == per_sm) break;
    }
    *min_grid = (int)(best_blocks * sm_count);
    *block_size = (int)best_block;
    return CUDA_SUCCESS;
}

/* Without a callback: the request (function, dynamic shared bytes, limit[, flags]) and the reply (min grid, block):
 * cuOccupancyMaxPotentialBlockSizeWithFlags's, which without its flags is cuOccupancyMaxPotentialBlockSize's. */
#define WITH_FLAGS(payload, field) ORION_##payload##_cuOccupancyMaxPotentialBlockSizeWithFlags_##field
#define PLAIN(payload, field) ORION_##payload##_cuOccupancyMaxPotentialBlockSize_##field
_Static_assert(PLAIN(REQ, function) == WITH_FLAGS(REQ, function)
               && PLAIN(REQ, dynamic_shared_bytes) == WITH_FLAGS(REQ, dynamic_shared_bytes)
               && PLAIN(REQ, block_limit) == WITH_FLAGS(REQ, block_limit) && PLAIN(REQ, SIZE) <= WITH_FLAGS(REQ, SIZE)
               && PLAIN(REP, min_grid) == WITH_FLAGS(REP, min_grid) && PLAIN(REP, block) == WITH_FLAGS(REP, block)
               && PLAIN(REP, SIZE) == WITH_FLAGS(REP, SIZE), "ask_host() packs both");
static int ask_host(uint32_t opcode, CUfunction function, size_t dynamic, int limit, const unsigned int *flags,
                    int *min_grid, int *block_size) {
    uint8_t request[WITH_FLAGS(REQ, SIZE)], reply[WITH_FLAGS(REP, SIZE)];
    orion_put_u64(request + WITH_FLAGS(REQ, function), (uint64_t)(uintptr_t)function);
    orion_put_u64(request + WITH_FLAGS(REQ, dynamic_shared_bytes), (uint64_t)dynamic);
    orion_put_i32(request + WITH_FLAGS(REQ, block_limit), limit);
    if (flags) orion_put_u32(request + WITH_FLAGS(REQ, flags), *flags);
    int status = hand_forward(opcode, request, flags ? WITH_FLAGS(REQ, SIZE) : PLAIN(REQ, SIZE), reply, sizeof reply);
    if (status == CUDA_SUCCESS) {
        *min_grid = orion_get_i32(reply + WITH_FLAGS(REP, min_grid));
        *block_size = orion_get_i32(reply + WITH_FLAGS(REP, block));
    }
    return status;
}

static int potential_block_size(uint32_t opcode, int *min_grid, int *block_size, CUfunction function,
                                CUoccupancyB2DSize callback, size_t dynamic, int limit, const unsigned int *flags) {
    if (!min_grid || !block_size) return CUDA_ERROR_INVALID_VALUE;
    int grid = 0, block = 0;
    int status = callback ? search(function, callback, limit, flags ? *flags : 0, &grid, &block)
                          : ask_host(opcode, function, dynamic, limit, flags, &grid, &block);
    if (status == CUDA_SUCCESS) {
        *min_grid = grid;
        *block_size = block;
    }
    return status;
}

CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction function,
                                          CUoccupancyB2DSize callback, size_t dynamic, int limit) {
    ORION_ENTRY("cuOccupancyMaxPotentialBlockSize");
    return potential_block_size(ORION_OP_cuOccupancyMaxPotentialBlockSize, min_grid, block_size, function, callback,
                                dynamic, limit, NULL);
}

CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size, CUfunction function,
                                                   CUoccupancyB2DSize callback, size_t dynamic, int limit,
                                                   unsigned int flags) {
    ORION_ENTRY("cuOccupancyMaxPotentialBlockSizeWithFlags");
    return potential_block_size(ORION_OP_cuOccupancyMaxPotentialBlockSizeWithFlags, min_grid, block_size, function,
                                callback, dynamic, limit, &flags);
}

/* The configuration as cuLaunchKernelEx sends it (launch_calls.c packs both), without parameters; the host checks
 * the function, stream and event attributes are the session's and asks the driver. */
CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction function, const CUlaunchConfig *config) {
    ORION_ENTRY("cuOccupancyMaxActiveClusters");
    if (!clusters) return CUDA_ERROR_INVALID_VALUE;
    uint8_t head[ORION_LAUNCH_HEAD_BYTES], reply[ORION_REP_cuOccupancyMaxActiveClusters_SIZE];
    struct orion_piece pieces[2];
    int count = 0;
    int status = orion_launch_config_pieces("cuOccupancyMaxActiveClusters", (uint64_t)(uintptr_t)function, config,
                                            head, pieces, &count);
    if (status == CUDA_SUCCESS)
        status = hand_forwardv(ORION_OP_cuOccupancyMaxActiveClusters, pieces, count, reply, sizeof reply);
    if (status == CUDA_SUCCESS) *clusters = orion_get_i32(reply + ORION_REP_cuOccupancyMaxActiveClusters_clusters);
    return status;
}

/* The same request as cuOccupancyMaxActiveClusters's (the driver ignores its cluster dimensions here); the answer is
 * the largest cluster the function can be launched with under that configuration. */
#define CLUSTERS(field) ORION_REQ_cuOccupancyMaxActiveClusters_##field
#define POTENTIAL(field) ORION_REQ_cuOccupancyMaxPotentialClusterSize_##field
_Static_assert(POTENTIAL(LAUNCH) == CLUSTERS(LAUNCH) && POTENTIAL(attributes) == CLUSTERS(attributes)
               && POTENTIAL(SIZE) == CLUSTERS(SIZE), "orion_launch_config_pieces() packs both");

CUresult cuOccupancyMaxPotentialClusterSize(int *size, CUfunction function, const CUlaunchConfig *config) {
    ORION_ENTRY("cuOccupancyMaxPotentialClusterSize");
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    /* An attribute that does not travel is named here, for this call (orion_launch_config_pieces checks again). */
    if (config && (!config->numAttrs || config->attrs))
        for (unsigned int i = 0; i < config->numAttrs; i++) {
            int id = config->attrs[i].id;
            if (id < 0 || id >= 64 || !((ORION_LAUNCH_ATTRIBUTES_FORWARDED >> id) & 1))
                return orion_not_forwarded("cuOccupancyMaxPotentialClusterSize with a launch attribute other than "
                                           "the plain and event ones");
        }
    uint8_t head[ORION_LAUNCH_HEAD_BYTES], reply[ORION_REP_cuOccupancyMaxPotentialClusterSize_SIZE];
    struct orion_piece pieces[2];
    int count = 0;
    int status = orion_launch_config_pieces("cuOccupancyMaxPotentialClusterSize", (uint64_t)(uintptr_t)function,
                                            config, head, pieces, &count);
    if (status == CUDA_SUCCESS)
        status = hand_forwardv(ORION_OP_cuOccupancyMaxPotentialClusterSize, pieces, count, reply, sizeof reply);
    if (status == CUDA_SUCCESS)
        *size = orion_get_i32(reply + ORION_REP_cuOccupancyMaxPotentialClusterSize_cluster_size);
    return status;
}

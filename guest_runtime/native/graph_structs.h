/* graph_structs.h: cuda.h's graph structs (CUDA 13.0), completed byte for byte, for graph_calls.c and
 * graph_queries.c (private to guest_runtime/native/). The generated orion_calls.h declares them incomplete; the asserts
 * hold each to cuda.h's layout. CUDA_MEMCPY3D is copy_structs.h's. CUDA_KERNEL_NODE_PARAMS is the _v2 layout, with
 * `kern` and `ctx`; a memory allocation node's pool properties are CUDA 13's CUmemPoolProps (its first reserved byte
 * gpuDirectRDMACapable, as cuda-bindings 13.5 reads it).
 */
#ifndef ORION_GRAPH_STRUCTS_H
#define ORION_GRAPH_STRUCTS_H

#include <stddef.h>
#include <stdint.h>

#include "copy_structs.h"
#include "orion_guest.h"

struct CUmemPoolProps_st {
    int allocType;                      /* CUmemAllocationType */
    int handleTypes;                    /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32SecurityAttributes;      /* Windows only: never travels */
    size_t maxSize;
    unsigned short usage;
    unsigned char gpuDirectRDMACapable; /* reserved[0] in cuda.h 13.0 */
    unsigned char reserved[53];         /* must be zero */
};

struct CUDA_MEM_ALLOC_NODE_PARAMS_st { /* cuda.h's _v1, which _v2 (CUgraphNodeParams.alloc) lays out alike */
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;                   /* out */
};

struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;           /* out */
    int result_out;                     /* out: CUgraphInstantiateResult */
};

struct CUkernelNodeAttrValue_st {        /* CUlaunchAttributeValue, a 64-byte union: its bytes */
    unsigned char bytes[64];
};

_Static_assert(sizeof(CUmemPoolProps) == 88 && offsetof(CUmemPoolProps, maxSize) == 24 &&
               offsetof(CUmemPoolProps, usage) == 32 && offsetof(CUmemPoolProps, reserved) == 35,
               "CUmemPoolProps as cuda.h lays it out");
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120 && offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs) == 88 &&
               offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112, "CUDA_MEM_ALLOC_NODE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32 &&
               offsetof(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out) == 24,
               "CUDA_GRAPH_INSTANTIATE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(CUkernelNodeAttrValue) == 64, "CUkernelNodeAttrValue is 64 bytes");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "a CUmemAccessDesc travels as its three ints");

struct CUgraphEdgeData_st {
    unsigned char from_port;
    unsigned char to_port;
    unsigned char type;
    unsigned char reserved[5];
};

struct CUDA_KERNEL_NODE_PARAMS_st { /* cuda.h's CUDA_KERNEL_NODE_PARAMS_v2 */
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
};

struct CUDA_MEMSET_NODE_PARAMS_st {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
};

struct CUgraphExecUpdateResultInfo_st {
    int result; /* CUgraphExecUpdateResult */
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
};

_Static_assert(sizeof(CUgraphEdgeData) == 8, "CUgraphEdgeData is 8 bytes in cuda.h");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS) == 72 && offsetof(CUDA_KERNEL_NODE_PARAMS, kernelParams) == 40 &&
               offsetof(CUDA_KERNEL_NODE_PARAMS, kern) == 56 && offsetof(CUDA_KERNEL_NODE_PARAMS, ctx) == 64,
               "CUDA_KERNEL_NODE_PARAMS_v2 as cuda.h lays it out");
_Static_assert(sizeof(CUDA_MEMSET_NODE_PARAMS) == 40 && offsetof(CUDA_MEMSET_NODE_PARAMS, width) == 24,
               "CUDA_MEMSET_NODE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(CUgraphExecUpdateResultInfo) == 24 && offsetof(CUgraphExecUpdateResultInfo, errorNode) == 8,
               "CUgraphExecUpdateResultInfo as cuda.h lays it out");
_Static_assert(sizeof(CUgraphNode) == ORION_REQ_cuGraphAddEmptyNode_deps_ITEM,
               "a node array's bytes are its counted list's items");
_Static_assert(sizeof(CUgraphEdgeData) == ORION_REQ_cuGraphAddDependencies_edges_ITEM,
               "an edge data array's bytes are its counted list's items");

/* cuda.h's union, 48 bytes: a wait or write (operation, address, a 32- or 64-bit value, flags, alias) or a barrier
 * or flush (operation, flags). */
typedef struct {        /* CUstreamMemOpWaitValueParams, CUstreamMemOpWriteValueParams */
    int operation;
    CUdeviceptr address;
    union {
        uint32_t value;
        uint64_t value64;
    };
    unsigned int flags;
    CUdeviceptr alias; /* for the driver's own use: never travels */
} value_op;
typedef struct {        /* CUstreamMemOpFlushRemoteWritesParams, CUstreamMemOpMemoryBarrierParams */
    int operation;
    unsigned int flags;
} flagged_op;
struct CUstreamBatchMemOpParams_st {
    union {
        int operation;
        value_op waitValue;
        value_op writeValue;
        flagged_op flushRemoteWrites;
        flagged_op memoryBarrier;
        uint64_t pad[6];
    };
};
struct CUDA_BATCH_MEM_OP_NODE_PARAMS_st {
    CUcontext ctx;
    unsigned int count;
    CUstreamBatchMemOpParams *paramArray;
    unsigned int flags;
};
_Static_assert(sizeof(CUstreamBatchMemOpParams) == 48 && offsetof(value_op, address) == 8 &&
               offsetof(value_op, value) == 16 && offsetof(value_op, flags) == 24 && offsetof(value_op, alias) == 32,
               "CUstreamBatchMemOpParams as cuda.h lays it out");
_Static_assert(sizeof(CUDA_BATCH_MEM_OP_NODE_PARAMS) == 32 &&
               offsetof(CUDA_BATCH_MEM_OP_NODE_PARAMS, paramArray) == 16 &&
               offsetof(CUDA_BATCH_MEM_OP_NODE_PARAMS, flags) == 24, "CUDA_BATCH_MEM_OP_NODE_PARAMS as cuda.h lays it out");

/* cuda.h's CUgraphNodeParams (CUDA 13.0, the ABI of cuGraphAddNode_v2, cuGraphNodeSetParams and
 * cuGraphExecNodeSetParams): the node's type, then the union of the per-type structs, padded to 29 long longs. The
 * member structs are cuda.h's too: CUDA_KERNEL_NODE_PARAMS_v3 has the _v2 layout above; CUDA_MEMSET_NODE_PARAMS_v2 is
 * CUDA_MEMSET_NODE_PARAMS and a context; the member names here are this file's (`memcpy` would read as the
 * function). */
typedef struct {        /* CUDA_MEMCPY_NODE_PARAMS */
    int flags;          /* must be zero */
    int reserved;       /* must be zero */
    CUcontext copyCtx;
    CUDA_MEMCPY3D copyParams;
} memcpy_node_params;

typedef struct {        /* CUDA_MEMSET_NODE_PARAMS_v2 */
    CUDA_MEMSET_NODE_PARAMS params;
    CUcontext ctx;
} memset_node_params;

typedef struct {        /* CUDA_CHILD_GRAPH_NODE_PARAMS */
    CUgraph graph;
    int ownership;      /* CUgraphChildGraphNodeOwnership */
} child_graph_node_params;

typedef struct {        /* CUDA_EVENT_RECORD_NODE_PARAMS, CUDA_EVENT_WAIT_NODE_PARAMS */
    CUevent event;
} event_node_params;

struct CUDA_HOST_NODE_PARAMS_st { /* cuda.h's; CUDA_HOST_NODE_PARAMS_v2 (CUgraphNodeParams.host) begins alike */
    CUhostFn fn;
    void *userData;
};

typedef struct {        /* CUDA_CONDITIONAL_NODE_PARAMS */
    CUgraphConditionalHandle handle;
    int type;           /* CUgraphConditionalNodeType */
    unsigned int size;  /* body graphs: 1 (WHILE), 1 or 2 (IF), any (SWITCH) */
    CUgraph *phGraph_out; /* out: the body graphs, in an array CUDA (here: this library) owns */
    CUcontext ctx;
} conditional_node_params;

struct CUgraphNodeParams_st {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS kernel;
        memcpy_node_params copy;
        memset_node_params fill;
        child_graph_node_params child;
        event_node_params event; /* eventWait and eventRecord alike */
        conditional_node_params conditional;
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;  /* CUDA_MEM_ALLOC_NODE_PARAMS_v2: the same layout */
        CUdeviceptr mem_free;              /* CUDA_MEM_FREE_NODE_PARAMS: its one field, dptr */
        CUDA_HOST_NODE_PARAMS host;        /* CUDA_HOST_NODE_PARAMS_v2: fn and userData first */
        CUDA_BATCH_MEM_OP_NODE_PARAMS batch_mem_op; /* CUDA_BATCH_MEM_OP_NODE_PARAMS_v2: the same layout */
    };
    long long reserved2;
};

_Static_assert(sizeof(memcpy_node_params) == 216 && offsetof(memcpy_node_params, copyCtx) == 8 &&
               offsetof(memcpy_node_params, copyParams) == 16, "CUDA_MEMCPY_NODE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(memset_node_params) == 48 && offsetof(memset_node_params, ctx) == 40,
               "CUDA_MEMSET_NODE_PARAMS_v2 as cuda.h lays it out");
_Static_assert(sizeof(child_graph_node_params) == 16 && offsetof(child_graph_node_params, ownership) == 8,
               "CUDA_CHILD_GRAPH_NODE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(conditional_node_params) == 32 && offsetof(conditional_node_params, type) == 8 &&
               offsetof(conditional_node_params, size) == 12 && offsetof(conditional_node_params, phGraph_out) == 16 &&
               offsetof(conditional_node_params, ctx) == 24, "CUDA_CONDITIONAL_NODE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(CUgraphNodeParams) == 256 && offsetof(CUgraphNodeParams, kernel) == 16 &&
               offsetof(CUgraphNodeParams, copy.copyParams) == 32 && offsetof(CUgraphNodeParams, fill.ctx) == 56 &&
               offsetof(CUgraphNodeParams, child.ownership) == 24 &&
               offsetof(CUgraphNodeParams, conditional.phGraph_out) == 32 &&
               offsetof(CUgraphNodeParams, alloc.dptr) == 128 && offsetof(CUgraphNodeParams, mem_free) == 16 &&
               offsetof(CUgraphNodeParams, host.userData) == 24 &&
               offsetof(CUgraphNodeParams, batch_mem_op.flags) == 40 &&
               offsetof(CUgraphNodeParams, reserved2) == 248,
               "CUgraphNodeParams as cuda.h (13.0) lays it out");
_Static_assert(sizeof(CUDA_HOST_NODE_PARAMS) == 16, "CUDA_HOST_NODE_PARAMS as cuda.h lays it out");
_Static_assert(sizeof(CUgraphConditionalHandle) == 8, "a conditional handle travels as a u64");

/* --- graph_calls.c, for graph_queries.c --------------------------------------------------------------------------- */
/* The body graphs this library keeps for conditional node `node` (its phGraph_out), or NULL where it keeps none of
 * `size` graphs. */
CUgraph *orion_graph_conditional_bodies(CUgraphNode node, unsigned int size);
/* CUDA_SUCCESS, or CUDA_ERROR_NOT_SUPPORTED (said once) for more dependencies or edges than one call carries. */
int orion_graph_too_many(const char *call, size_t count);

/* --- batch_mem_ops.c ------------------------------------------------------------------------------------------- */
/* What cuGraphBatchMemOpNodeGetParams handed out for `node` goes (a new node of its handle, the node gone). */
void orion_batch_node_forget(CUgraphNode node);

/* --- graph_queries.c, for graph_calls.c --------------------------------------------------------------------------- */
/* A node handle this library was given for a new node, one whose parameters it set, a node or graph destroyed: what
 * graph_queries.c keeps for earlier nodes of that handle (asked-back parameters, graph memory ranges) goes. */
void orion_graph_node_made(CUgraphNode node);
void orion_graph_kernel_params_set(CUgraphNode node);
void orion_graph_queries_node_gone(CUgraphNode node);
void orion_graph_queries_graph_gone(CUgraph graph);
/* cuGetProcAddress's answer for an entry point of graph_queries.c whose ABI changed (or NULL). */
void *orion_graph_queries_versioned_entry(const char *symbol, int version);

#endif

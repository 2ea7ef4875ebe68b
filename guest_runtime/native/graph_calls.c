/* graph_calls.c: CUDA graphs built node by node (XLA's command buffers, PyTorch's CUDA graphs): the hand-written
 * cuGraph* calls of the call table, marshalling exactly the requests and replies ivshmem/driver_api.py declares
 * (KERNEL_NODE, MEMSET_NODE and MEMCPY_3D for the node parameter structs; node arrays and dependency lists as
 * counted u64 lists; CUgraphEdgeData's 8 bytes as a u64). The host checks every handle and device range against the
 * session and translates page-locked host memory (host_agent/session/graph_calls.py).
 *
 * - A kernel node's parameters travel as a launch's do (launch_calls.c): packed from kernelParams at the offsets of
 *   the function's layout (param_layouts.h: for `kern` where `func` is NULL), or the buffer an `extra` list names,
 *   sent from where it lies. The host rebuilds kernelParams from its own copy of the layout, so an `extra` buffer
 *   must be exactly the layout's size.
 * - A memcpy node's host side travels as its address: it must be page-locked pool memory (cuMemAllocHost), else the
 *   host answers CUDA_ERROR_NOT_SUPPORTED (said once here). CUDA arrays are not forwarded: CUDA_ERROR_NOT_SUPPORTED,
 *   said once, before anything is sent.
 * - A query asks with the caller's array length (0 when it passed no array: the count only); above DIRECT_QUERY
 *   entries it asks for the count first, so no buffer is sized by what the caller merely has room for. Entries past
 *   those the driver wrote are set to NULL, as the driver does; a node query whose caller passed no edge-data array
 *   answers CUDA_ERROR_LOSSY_QUERY where an edge carries data, as the driver does.
 * - cuGraphExecUpdate's result information comes back only when the update succeeds: the call table's reply, like
 *   the wheel the host calls, carries none on CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, so the caller's struct then
 *   says CU_GRAPH_EXEC_UPDATE_ERROR with no error nodes.
 * - More than MAX_DEPENDENCIES dependencies or edges in one call answer CUDA_ERROR_NOT_SUPPORTED (said once): the
 *   host refuses longer lists.
 * - Callers built against CUDA before 12.0 (kernel nodes without kern/ctx, cuGraphExecUpdate's two pointers) or 12.3
 *   (edge calls without edge data, cuGraphAddNode without them) get their ABI from orion_graph_versioned_entry, for
 *   cuGetProcAddress.
 * - The generic node calls (cuGraphAddNode, cuGraphNodeSetParams, cuGraphExecNodeSetParams: XLA's command buffers)
 *   take cuda.h's CUgraphNodeParams, a tagged union. Every node type the calls above serve is turned into that type's
 *   own call (`node_by_type`, `set_by_type`); cuGraphAddNode with edge data of its own (not all zero) makes the node
 *   without dependencies and then adds the edges with cuGraphAddDependencies (deps[i] -> node, edges[i]): the same
 *   graph, since cuda.h defines both by the same edges; if the edges are refused the node is destroyed again
 *   (cuGraphDestroyNode), so a failed call leaves the graph as it was. Two nodes travel as cuGraphAddNode itself
 *   (driver_api: graph, type, a conditional node's handle, condition type, size and context, a moved child graph and
 *   its ownership, dependencies and edges), the fields of the other kind zero:
 *   - a conditional node, its body graphs coming back: cuda.h makes `phGraph_out` a CUDA-owned array valid for the
 *     life of the node, so this library keeps one per conditional node (`conditional_bodies`: at most
 *     MAX_CONDITIONAL_NODES live, freed when cuGraphDestroyNode destroys the node or cuGraphDestroy its graph, or a
 *     graph holding that graph as a body, through this library);
 *   - a child graph moved into its node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, as XLA adds one): the graph itself, no
 *     clone, since the caller goes on naming its nodes (XLA sets them through the parent's executable graph); the
 *     reply lists no graphs. A cloned one (OWNERSHIP_CLONE) is cuGraphAddChildGraphNode; another ownership value
 *     CUDA_ERROR_INVALID_VALUE, before anything is sent.
 *   Memory allocation and free nodes are their own calls' (graph_queries.c; the allocation's address back in the
 *   caller's `alloc.dptr`), but not with edge data of their own (801, named once: such a node could not be removed
 *   again if its edges were refused); setting their parameters answers 801, named once. Host, batch memory operation
 *   and external semaphore nodes answer CUDA_ERROR_NOT_SUPPORTED, named once; nonzero reserved fields
 *   CUDA_ERROR_INVALID_VALUE, as cuda.h requires them zero. cuGraphExecNodeSetParams of a child graph node with
 *   OWNERSHIP_MOVE answers CUDA_ERROR_NOT_SUPPORTED, named once (cuGraphExecChildGraphNodeSetParams, which it would
 *   be, takes no ownership).
 * - Node parameters asked back, kernel node attributes, capture into a given graph, instantiation with parameters,
 *   memory nodes and the DOT description: graph_queries.c, which this file tells of nodes made, kernel parameters set
 *   and nodes and graphs destroyed (graph_structs.h).
 *
 * The structs are cuda.h's (CUDA 13: CUDA_KERNEL_NODE_PARAMS is the _v2 layout, with `kern` and `ctx`); the generated
 * orion_calls.h declares them incomplete, and graph_structs.h completes them, byte for byte (its asserts).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "copy_structs.h" /* CUDA_MEMCPY3D and orion_put_copy */
#include "graph_structs.h" /* the graph structs, completed as cuda.h lays them out */
#include "hand_calls.h"
#include "param_layouts.h"

enum {
    MAX_DEPENDENCIES = 1 << 16,   /* host_agent/session/graph_calls.py MAX_DEPENDENCIES */
    DIRECT_QUERY = 1024,          /* a query's capacity up to which it is asked at once */
    PACKED_ON_STACK = 1024,
    MEMORYTYPE_HOST = 1, MEMORYTYPE_ARRAY = 3, MEMORYTYPE_UNIFIED = 4, /* CUmemorytype */
    UPDATE_ERROR = 1,             /* CU_GRAPH_EXEC_UPDATE_ERROR */
    ERROR_LOSSY_QUERY = 402,      /* CUDA_ERROR_LOSSY_QUERY */
    ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    /* CUgraphNodeType */
    NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_GRAPH = 4, NODE_EMPTY = 5,
    NODE_WAIT_EVENT = 6, NODE_EVENT_RECORD = 7, NODE_EXT_SEMAS_SIGNAL = 8, NODE_EXT_SEMAS_WAIT = 9,
    NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11, NODE_BATCH_MEM_OP = 12, NODE_CONDITIONAL = 13, NODE_TYPES = 14,
    OWNERSHIP_CLONE = 0, OWNERSHIP_MOVE = 1, /* CUgraphChildGraphNodeOwnership */
    MAX_CONDITIONAL_BODIES = 64,  /* host_agent/session/graph_calls.py MAX_CONDITIONAL_BODIES */
    MAX_CONDITIONAL_NODES = 1 << 16, /* conditional nodes whose body arrays this library keeps at once */
    EDGES_ON_STACK = 64,
};

/* --- requests ------------------------------------------------------------------------------------------------- */

static uint64_t handle_word(const void *handle) { return (uint64_t)(uintptr_t)handle; }

int orion_graph_too_many(const char *call, size_t count) {
    if (count <= MAX_DEPENDENCIES) return CUDA_SUCCESS;
    if (orion_first_time("graph dependencies"))
        fprintf(stderr, "orion: %s with more than %d dependencies or edges in one call is not forwarded: "
                "CUDA_ERROR_NOT_SUPPORTED\n", call, MAX_DEPENDENCIES);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* The structs requests embed, each at `p` (where the request has it: ORION_REQ_<call>_KERNEL_NODE...) and
 * ORION_<STRUCT>_SIZE bytes long: driver_api's KERNEL_NODE, MEMSET_NODE and MEMCPY_3D (its two copy sides alike). */
static void put_kernel(uint8_t *p, const CUDA_KERNEL_NODE_PARAMS *k) {
    orion_put_u64(p + ORION_KERNEL_NODE_function, handle_word(k->func));
    orion_put_u64(p + ORION_KERNEL_NODE_kernel, handle_word(k->kern));
    orion_put_u64(p + ORION_KERNEL_NODE_context, handle_word(k->ctx));
    orion_put_u32(p + ORION_KERNEL_NODE_grid_x, k->gridDimX);
    orion_put_u32(p + ORION_KERNEL_NODE_grid_y, k->gridDimY);
    orion_put_u32(p + ORION_KERNEL_NODE_grid_z, k->gridDimZ);
    orion_put_u32(p + ORION_KERNEL_NODE_block_x, k->blockDimX);
    orion_put_u32(p + ORION_KERNEL_NODE_block_y, k->blockDimY);
    orion_put_u32(p + ORION_KERNEL_NODE_block_z, k->blockDimZ);
    orion_put_u32(p + ORION_KERNEL_NODE_shared_bytes, k->sharedMemBytes);
}

static void put_memset(uint8_t *p, const CUDA_MEMSET_NODE_PARAMS *m) {
    orion_put_u64(p + ORION_MEMSET_NODE_dst, m->dst);
    orion_put_u64(p + ORION_MEMSET_NODE_pitch, m->pitch);
    orion_put_u32(p + ORION_MEMSET_NODE_value, m->value);
    orion_put_u32(p + ORION_MEMSET_NODE_element_size, m->elementSize);
    orion_put_u64(p + ORION_MEMSET_NODE_width, m->width);
    orion_put_u64(p + ORION_MEMSET_NODE_height, m->height);
}

/* A copy's operands this library can send: CUDA arrays are not forwarded (their handles do not travel). */
static int copy_forwarded(const CUDA_MEMCPY3D *c) {
    if (c->srcMemoryType != MEMORYTYPE_ARRAY && c->dstMemoryType != MEMORYTYPE_ARRAY) return CUDA_SUCCESS;
    return orion_not_forwarded("a graph memcpy node with a CUDA array operand");
}

/* A host side the host answered NOT_SUPPORTED for: memory outside the page-locked pool. Said once. */
static int copy_answered(const CUDA_MEMCPY3D *c, int status) {
    int host_side = c->srcMemoryType == MEMORYTYPE_HOST || c->dstMemoryType == MEMORYTYPE_HOST ||
                    c->srcMemoryType == MEMORYTYPE_UNIFIED || c->dstMemoryType == MEMORYTYPE_UNIFIED;
    if (status == CUDA_ERROR_NOT_SUPPORTED && host_side && orion_first_time("graph memcpy host memory"))
        fprintf(stderr, "orion: a graph memcpy node's host memory must be page-locked memory from cuMemAllocHost or "
                "cuMemHostAlloc (the GPU host cannot reach other guest memory): CUDA_ERROR_NOT_SUPPORTED\n");
    return status;
}

/* A kernel node's packed parameters, as cuLaunchKernel packs a launch's: from kernelParams by the layout of `func`
 * (or of `kern` where `func` is NULL), or the buffer an `extra` list names (left where it lies). *packed is `small`
 * or a buffer the caller frees. */
static int kernel_params(const CUDA_KERNEL_NODE_PARAMS *k, uint8_t *small, size_t cap, uint8_t **packed,
                         const void **tail, size_t *size) {
    uint64_t target = k->func ? handle_word(k->func) : handle_word(k->kern);
    *packed = small;
    *tail = NULL;
    *size = 0;
    if (!target || (k->kernelParams && k->extra)) return CUDA_ERROR_INVALID_VALUE; /* cuda.h: not both */
    if (k->kernelParams) {
        int status = orion_params_pack(target, k->kernelParams, small, cap, packed, size);
        *tail = *packed;
        return status;
    }
    if (k->extra) {
        orion_graph_kernel_extra_given(); /* graph_queries.c: a node may now hold `extra` (GetParams says 801) */
        return orion_params_from_extra(k->extra, tail, size);
    }
    return CUDA_SUCCESS;
}

/* One call whose request is `head` (its scalars, then the dependencies' count where `deps` is given), the caller's
 * dependency array where it lies, then `tail` (a kernel node's parameters); the reply's node into *node. Every call
 * that adds a node replies as cuGraphAddEmptyNode. */
#define NODE_REPLY(call) (ORION_REP_##call##_node == ORION_REP_cuGraphAddEmptyNode_node \
                          && ORION_REP_##call##_SIZE == ORION_REP_cuGraphAddEmptyNode_SIZE)
_Static_assert(NODE_REPLY(cuGraphAddChildGraphNode) && NODE_REPLY(cuGraphAddEventRecordNode)
               && NODE_REPLY(cuGraphAddEventWaitNode) && NODE_REPLY(cuGraphAddMemsetNode)
               && NODE_REPLY(cuGraphAddMemcpyNode) && NODE_REPLY(cuGraphAddKernelNode)
               && NODE_REPLY(cuGraphAddHostNode), "one node reply");
static int send_node_call(uint32_t opcode, const uint8_t *head, size_t head_len, const CUgraphNode *deps,
                          size_t count, const void *tail, size_t tail_len, CUgraphNode *node) {
    struct orion_piece pieces[3] = { { head, head_len }, { deps, count * sizeof *deps }, { tail, tail_len } };
    uint8_t rep[ORION_REP_cuGraphAddEmptyNode_SIZE];
    int status = orion_thread_forwardv(opcode, pieces, 3, node ? rep : NULL, node ? sizeof rep : 0, NULL, 0, NULL, 0);
    if (status == CUDA_SUCCESS && node) {
        *node = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphAddEmptyNode_node);
        orion_graph_node_made(*node);
    }
    return status;
}

/* The checks every node-adding call makes, as the driver: an output, and dependencies where some are counted. */
static int node_args(const char *call, CUgraphNode *node, const CUgraphNode *deps, size_t count) {
    if (!node || (count && !deps)) return CUDA_ERROR_INVALID_VALUE;
    return orion_graph_too_many(call, count);
}

/* --- nodes added ---------------------------------------------------------------------------------------------- */

CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count) {
    ORION_ENTRY("cuGraphAddEmptyNode");
    int status = node_args("cuGraphAddEmptyNode", node, deps, count);
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuGraphAddEmptyNode_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuGraphAddEmptyNode_graph, handle_word(graph));
    orion_put_u32(head + ORION_REQ_cuGraphAddEmptyNode_deps, (uint32_t)count);
    return send_node_call(ORION_OP_cuGraphAddEmptyNode, head, sizeof head, deps, count, NULL, 0, node);
}

CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                                  CUgraph child) {
    ORION_ENTRY("cuGraphAddChildGraphNode");
    int status = node_args("cuGraphAddChildGraphNode", node, deps, count);
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuGraphAddChildGraphNode_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuGraphAddChildGraphNode_graph, handle_word(graph));
    orion_put_u64(head + ORION_REQ_cuGraphAddChildGraphNode_child, handle_word(child));
    orion_put_u32(head + ORION_REQ_cuGraphAddChildGraphNode_deps, (uint32_t)count);
    return send_node_call(ORION_OP_cuGraphAddChildGraphNode, head, sizeof head, deps, count, NULL, 0, node);
}

/* cuGraphAddEventRecordNode's request, which cuGraphAddEventWaitNode's is too */
#define EVENT_NODE(field) ORION_REQ_cuGraphAddEventRecordNode_##field
#define SAME_EVENT_NODE(field) (ORION_REQ_cuGraphAddEventWaitNode_##field == EVENT_NODE(field))
_Static_assert(SAME_EVENT_NODE(graph) && SAME_EVENT_NODE(event) && SAME_EVENT_NODE(deps) && SAME_EVENT_NODE(SIZE),
               "add_event_node() packs both");
static int add_event_node(uint32_t opcode, const char *call, CUgraphNode *node, CUgraph graph,
                          CUgraphNode const *deps, size_t count, CUevent event) {
    int status = node_args(call, node, deps, count);
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[EVENT_NODE(SIZE) + ORION_LENGTH_BYTES];
    orion_put_u64(head + EVENT_NODE(graph), handle_word(graph));
    orion_put_u64(head + EVENT_NODE(event), handle_word(event));
    orion_put_u32(head + EVENT_NODE(deps), (uint32_t)count);
    return send_node_call(opcode, head, sizeof head, deps, count, NULL, 0, node);
}

CUresult cuGraphAddEventRecordNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                                   CUevent event) {
    ORION_ENTRY("cuGraphAddEventRecordNode");
    return add_event_node(ORION_OP_cuGraphAddEventRecordNode, "cuGraphAddEventRecordNode", node, graph, deps, count,
                          event);
}

CUresult cuGraphAddEventWaitNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                                 CUevent event) {
    ORION_ENTRY("cuGraphAddEventWaitNode");
    return add_event_node(ORION_OP_cuGraphAddEventWaitNode, "cuGraphAddEventWaitNode", node, graph, deps, count,
                          event);
}

static int malformed_reply(const char *what);

/* A host node: its function is guest code, so it travels as the page-locked words that stand for (fn, userData)
 * (host_functions.c), which the host's node hands to oriond's trampoline; the function runs here at each run. */
CUresult cuGraphAddHostNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                            CUDA_HOST_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphAddHostNode");
    int status = node_args("cuGraphAddHostNode", node, deps, count);
    uint64_t words = 0;
    if (status == CUDA_SUCCESS) status = params ? orion_host_node_words(params->fn, params->userData, &words)
                                                : CUDA_ERROR_INVALID_VALUE;
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuGraphAddHostNode_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuGraphAddHostNode_graph, handle_word(graph));
    orion_put_u64(head + ORION_REQ_cuGraphAddHostNode_words, words);
    orion_put_u32(head + ORION_REQ_cuGraphAddHostNode_deps, (uint32_t)count);
    return send_node_call(ORION_OP_cuGraphAddHostNode, head, sizeof head, deps, count, NULL, 0, node);
}

CUresult cuGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS *params) {
    ORION_ENTRY("cuGraphHostNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[ORION_REQ_cuGraphHostNodeGetParams_SIZE], reply[ORION_REP_cuGraphHostNodeGetParams_SIZE];
    orion_put_u64(request + ORION_REQ_cuGraphHostNodeGetParams_node, handle_word(node));
    int status = orion_thread_forward(ORION_OP_cuGraphHostNodeGetParams, request, sizeof request, reply, sizeof reply,
                                      0);
    if (status != CUDA_SUCCESS) return status;
    CUhostFn fn;
    void *data;
    if (!orion_host_node_function(orion_get_u64(reply + ORION_REP_cuGraphHostNodeGetParams_words), &fn, &data))
        return malformed_reply("cuGraphHostNodeGetParams");
    params->fn = fn;
    params->userData = data;
    return CUDA_SUCCESS;
}

CUresult cuGraphHostNodeSetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphHostNodeSetParams");
    uint64_t words = 0;
    int status = params ? orion_host_node_words(params->fn, params->userData, &words) : CUDA_ERROR_INVALID_VALUE;
    if (status != CUDA_SUCCESS) return status;
    uint8_t request[ORION_REQ_cuGraphHostNodeSetParams_SIZE];
    orion_put_u64(request + ORION_REQ_cuGraphHostNodeSetParams_node, handle_word(node));
    orion_put_u64(request + ORION_REQ_cuGraphHostNodeSetParams_words, words);
    return orion_thread_forward(ORION_OP_cuGraphHostNodeSetParams, request, sizeof request, NULL, 0, 0);
}

CUresult cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node, CUDA_HOST_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphExecHostNodeSetParams");
    uint64_t words = 0;
    int status = params ? orion_host_node_words(params->fn, params->userData, &words) : CUDA_ERROR_INVALID_VALUE;
    if (status != CUDA_SUCCESS) return status;
    uint8_t request[ORION_REQ_cuGraphExecHostNodeSetParams_SIZE];
    orion_put_u64(request + ORION_REQ_cuGraphExecHostNodeSetParams_exec, handle_word(exec));
    orion_put_u64(request + ORION_REQ_cuGraphExecHostNodeSetParams_node, handle_word(node));
    orion_put_u64(request + ORION_REQ_cuGraphExecHostNodeSetParams_words, words);
    return orion_thread_forward(ORION_OP_cuGraphExecHostNodeSetParams, request, sizeof request, NULL, 0, 0);
}

CUresult cuGraphAddMemsetNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                              CUDA_MEMSET_NODE_PARAMS const *params, CUcontext ctx) {
    ORION_ENTRY("cuGraphAddMemsetNode");
    int status = node_args("cuGraphAddMemsetNode", node, deps, count);
    if (status != CUDA_SUCCESS) return status;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t head[ORION_REQ_cuGraphAddMemsetNode_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuGraphAddMemsetNode_graph, handle_word(graph));
    orion_put_u64(head + ORION_REQ_cuGraphAddMemsetNode_context, handle_word(ctx));
    put_memset(head + ORION_REQ_cuGraphAddMemsetNode_MEMSET_NODE, params);
    orion_put_u32(head + ORION_REQ_cuGraphAddMemsetNode_deps, (uint32_t)count);
    return send_node_call(ORION_OP_cuGraphAddMemsetNode, head, sizeof head, deps, count, NULL, 0, node);
}

CUresult cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                              CUDA_MEMCPY3D const *params, CUcontext ctx) {
    ORION_ENTRY("cuGraphAddMemcpyNode");
    int status = node_args("cuGraphAddMemcpyNode", node, deps, count);
    if (status != CUDA_SUCCESS) return status;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    if ((status = copy_forwarded(params)) != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuGraphAddMemcpyNode_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuGraphAddMemcpyNode_graph, handle_word(graph));
    orion_put_u64(head + ORION_REQ_cuGraphAddMemcpyNode_context, handle_word(ctx));
    orion_put_copy(head + ORION_REQ_cuGraphAddMemcpyNode_MEMCPY_3D, params);
    orion_put_u32(head + ORION_REQ_cuGraphAddMemcpyNode_deps, (uint32_t)count);
    status = send_node_call(ORION_OP_cuGraphAddMemcpyNode, head, sizeof head, deps, count, NULL, 0, node);
    return copy_answered(params, status);
}

/* A kernel-node call: `prefix` (its handles: the request up to its KERNEL_NODE fields), the KERNEL_NODE fields,
 * [the dependencies], then the parameters. In each of the three requests the KERNEL_NODE fields end the fixed part. */
#define KERNEL_LAST(call) (ORION_REQ_##call##_KERNEL_NODE + ORION_KERNEL_NODE_SIZE == ORION_REQ_##call##_SIZE)
_Static_assert(KERNEL_LAST(cuGraphAddKernelNode) && KERNEL_LAST(cuGraphKernelNodeSetParams)
               && KERNEL_LAST(cuGraphExecKernelNodeSetParams), "the KERNEL_NODE fields end each fixed part");
#define KERNEL_HEAD_BYTES (ORION_REQ_cuGraphExecKernelNodeSetParams_SIZE + ORION_LENGTH_BYTES) /* the longest prefix */
_Static_assert(ORION_REQ_cuGraphAddKernelNode_SIZE + ORION_LENGTH_BYTES <= KERNEL_HEAD_BYTES, "room for every head");
static int kernel_node_call(uint32_t opcode, const uint8_t *prefix, size_t prefix_len,
                            CUDA_KERNEL_NODE_PARAMS const *params, int with_deps, CUgraphNode const *deps,
                            size_t count, CUgraphNode *node) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t head[KERNEL_HEAD_BYTES];
    memcpy(head, prefix, prefix_len);
    put_kernel(head + prefix_len, params);
    size_t at = prefix_len + ORION_KERNEL_NODE_SIZE;
    if (with_deps) { /* cuGraphAddKernelNode's deps, right after the fixed part */
        orion_put_u32(head + at, (uint32_t)count);
        at += ORION_LENGTH_BYTES;
    }
    uint8_t small[PACKED_ON_STACK];
    uint8_t *packed = small;
    const void *tail = NULL;
    size_t size = 0;
    int status = kernel_params(params, small, sizeof small, &packed, &tail, &size);
    if (status == CUDA_SUCCESS)
        status = send_node_call(opcode, head, at, with_deps ? deps : NULL, with_deps ? count : 0, tail, size, node);
    if (packed != small) free(packed);
    return status;
}

CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                              CUDA_KERNEL_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphAddKernelNode");
    int status = node_args("cuGraphAddKernelNode", node, deps, count);
    if (status != CUDA_SUCCESS) return status;
    uint8_t prefix[ORION_REQ_cuGraphAddKernelNode_KERNEL_NODE];
    orion_put_u64(prefix + ORION_REQ_cuGraphAddKernelNode_graph, handle_word(graph));
    return kernel_node_call(ORION_OP_cuGraphAddKernelNode, prefix, sizeof prefix, params, 1, deps, count, node);
}

/* --- edges ---------------------------------------------------------------------------------------------------- */

/* from[i] -> to[i] with edge data[i] (NULL: default edges, sent as an empty list): three counted lists, each sent
 * from the caller's array (a node handle and a CUgraphEdgeData are one item each). cuGraphAddDependencies's
 * request, which cuGraphRemoveDependencies's is too. */
#define EDGES(field) ORION_REQ_cuGraphAddDependencies_##field
#define SAME_EDGES(field) (ORION_REQ_cuGraphRemoveDependencies_##field == EDGES(field))
_Static_assert(SAME_EDGES(graph) && SAME_EDGES(from) && SAME_EDGES(SIZE) && SAME_EDGES(from_ITEM)
               && SAME_EDGES(to_ITEM) && SAME_EDGES(edges_ITEM) && sizeof(CUgraphNode) == EDGES(to_ITEM),
               "edges_call() packs both");
static int edges_call(uint32_t opcode, const char *call, CUgraph graph, CUgraphNode const *from,
                      CUgraphNode const *to, CUgraphEdgeData const *data, size_t count) {
    if (count && (!from || !to)) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_graph_too_many(call, count);
    if (status != CUDA_SUCCESS) return status;
    size_t edges = data ? count : 0;
    uint8_t head[EDGES(SIZE) + ORION_LENGTH_BYTES], to_count[ORION_LENGTH_BYTES], data_count[ORION_LENGTH_BYTES];
    orion_put_u64(head + EDGES(graph), handle_word(graph));
    orion_put_u32(head + EDGES(from), (uint32_t)count);
    orion_put_u32(to_count, (uint32_t)count);
    orion_put_u32(data_count, (uint32_t)edges);
    struct orion_piece pieces[6] = {
        { head, sizeof head }, { count ? from : NULL, count * sizeof *from },
        { to_count, sizeof to_count }, { count ? to : NULL, count * sizeof *to },
        { data_count, sizeof data_count }, { edges ? data : NULL, edges * sizeof *data },
    };
    return orion_thread_forwardv(opcode, pieces, 6, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuGraphAddDependencies(CUgraph graph, CUgraphNode const *from, CUgraphNode const *to,
                                CUgraphEdgeData const *data, size_t count) {
    ORION_ENTRY("cuGraphAddDependencies");
    return edges_call(ORION_OP_cuGraphAddDependencies, "cuGraphAddDependencies", graph, from, to, data, count);
}

CUresult cuGraphRemoveDependencies(CUgraph graph, CUgraphNode const *from, CUgraphNode const *to,
                                   CUgraphEdgeData const *data, size_t count) {
    ORION_ENTRY("cuGraphRemoveDependencies");
    return edges_call(ORION_OP_cuGraphRemoveDependencies, "cuGraphRemoveDependencies", graph, from, to, data, count);
}

/* --- queries -------------------------------------------------------------------------------------------------- */

/* A query's answer: the driver's count and `lists` lists of `n` u64 entries each (n <= what was asked for). */
struct answer {
    uint64_t count;
    size_t n;
    const uint8_t *items[3];
    uint8_t *buffer; /* freed by the caller */
};

static int malformed_reply(const char *what) {
    if (orion_first_time("graph query reply"))
        fprintf(stderr, "orion: %s: the agent's reply does not read as the call table declares it\n", what);
    return CUDA_ERROR_UNKNOWN;
}

/* The five queries share cuGraphGetNodes's request (a handle, the capacity) and reply (the count, then `lists`
 * counted lists of u64 items, the first right after the fixed part). */
#define QUERY(payload, field) ORION_##payload##_cuGraphGetNodes_##field
#define SAME_QUERY(call, handle, first) (ORION_REQ_##call##_##handle == QUERY(REQ, graph) \
    && ORION_REQ_##call##_capacity == QUERY(REQ, capacity) && ORION_REQ_##call##_SIZE == QUERY(REQ, SIZE) \
    && ORION_REP_##call##_count == QUERY(REP, count) && ORION_REP_##call##_SIZE == QUERY(REP, SIZE) \
    && ORION_REP_##call##_##first == QUERY(REP, SIZE) && ORION_REP_##call##_##first##_ITEM == QUERY_ITEM)
#define QUERY_ITEM QUERY(REP, nodes_ITEM)
_Static_assert(SAME_QUERY(cuGraphGetRootNodes, graph, nodes) && SAME_QUERY(cuGraphGetEdges, graph, from)
               && ORION_REP_cuGraphGetEdges_to_ITEM == QUERY_ITEM && ORION_REP_cuGraphGetEdges_edges_ITEM == QUERY_ITEM
               && SAME_QUERY(cuGraphNodeGetDependencies, node, nodes)
               && ORION_REP_cuGraphNodeGetDependencies_edges_ITEM == QUERY_ITEM
               && SAME_QUERY(cuGraphNodeGetDependentNodes, node, nodes)
               && ORION_REP_cuGraphNodeGetDependentNodes_edges_ITEM == QUERY_ITEM
               && QUERY(REP, nodes) == QUERY(REP, SIZE) && sizeof(CUgraphEdgeData) == QUERY_ITEM,
               "ask() packs and reads all five");

/* Ask once, with room for `asked` entries per list. */
static int ask(uint32_t opcode, const char *call, uint64_t handle, uint64_t asked, int lists, struct answer *out) {
    out->buffer = NULL;
    out->n = 0;
    if (asked > (SIZE_MAX / 2 - 16) / (QUERY_ITEM * (size_t)lists)) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t cap = (size_t)lists * (ORION_LENGTH_BYTES + QUERY_ITEM * (size_t)asked);
    uint8_t *buffer = malloc(cap);
    if (!buffer) return CUDA_ERROR_OUT_OF_MEMORY;
    uint8_t req[QUERY(REQ, SIZE)], head[QUERY(REP, SIZE)];
    orion_put_u64(req + QUERY(REQ, graph), handle);
    orion_put_u64(req + QUERY(REQ, capacity), asked);
    size_t got = 0;
    struct orion_piece piece = { req, sizeof req };
    int status = orion_thread_forwardv(opcode, &piece, 1, head, sizeof head, buffer, cap, &got, 0);
    if (status != CUDA_SUCCESS) {
        free(buffer);
        return status;
    }
    out->count = orion_get_u64(head + QUERY(REP, count));
    size_t at = 0;
    for (int i = 0; i < lists; i++) {
        uint32_t n = at + ORION_LENGTH_BYTES <= got ? orion_get_u32(buffer + at) : 0;
        if (at + ORION_LENGTH_BYTES > got || n > asked || (i && n != out->n)
            || got - at - ORION_LENGTH_BYTES < (size_t)n * QUERY_ITEM) {
            free(buffer);
            return malformed_reply(call);
        }
        out->n = n;
        out->items[i] = buffer + at + ORION_LENGTH_BYTES;
        at += ORION_LENGTH_BYTES + (size_t)n * QUERY_ITEM;
    }
    if (at != got || out->n > out->count) {
        free(buffer);
        return malformed_reply(call);
    }
    out->buffer = buffer;
    return CUDA_SUCCESS;
}

/* Ask for a caller whose arrays hold `asked` entries (0: the count only); a large one only after the count. */
static int query(uint32_t opcode, const char *call, uint64_t handle, uint64_t asked, int lists, struct answer *out) {
    if (asked > DIRECT_QUERY) {
        int status = ask(opcode, call, handle, 0, lists, out);
        if (status != CUDA_SUCCESS || !out->count) return status;
        free(out->buffer);
        if (out->count < asked) asked = out->count;
    }
    return ask(opcode, call, handle, asked, lists, out);
}

/* The first `n` entries of list `items` into `nodes`, NULL after them up to `room`, as the driver fills an array. */
static void fill_nodes(CUgraphNode *nodes, const uint8_t *items, size_t n, size_t room) {
    for (size_t i = 0; i < room; i++)
        nodes[i] = i < n ? (CUgraphNode)(uintptr_t)orion_get_u64(items + QUERY_ITEM * i) : NULL;
}

static int any_edge_data(const uint8_t *items, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (orion_get_u64(items + QUERY_ITEM * i)) return 1;
    return 0;
}

static int graph_nodes(uint32_t opcode, const char *call, CUgraph graph, CUgraphNode *nodes, size_t *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    size_t room = nodes ? *count : 0;
    struct answer a;
    int status = query(opcode, call, handle_word(graph), room, 1, &a);
    if (status != CUDA_SUCCESS) return status;
    if (room) fill_nodes(nodes, a.items[0], a.n, room);
    *count = (size_t)a.count;
    free(a.buffer);
    return CUDA_SUCCESS;
}

CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    ORION_ENTRY("cuGraphGetNodes");
    return graph_nodes(ORION_OP_cuGraphGetNodes, "cuGraphGetNodes", graph, nodes, count);
}

CUresult cuGraphGetRootNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    ORION_ENTRY("cuGraphGetRootNodes");
    return graph_nodes(ORION_OP_cuGraphGetRootNodes, "cuGraphGetRootNodes", graph, nodes, count);
}

CUresult cuGraphGetEdges(CUgraph graph, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *data, size_t *count) {
    ORION_ENTRY("cuGraphGetEdges");
    if (!count || !from != !to || (data && !from)) return CUDA_ERROR_INVALID_VALUE; /* cuda.h's pairings */
    size_t room = from ? *count : 0;
    struct answer a;
    int status = query(ORION_OP_cuGraphGetEdges, "cuGraphGetEdges", handle_word(graph), room, 3, &a);
    if (status != CUDA_SUCCESS) return status;
    if (room && !data && any_edge_data(a.items[2], a.n)) {
        status = ERROR_LOSSY_QUERY; /* edges with data of their own, and nowhere to say so */
    } else if (room) {
        fill_nodes(from, a.items[0], a.n, room);
        fill_nodes(to, a.items[1], a.n, room);
        if (data) memcpy(data, a.items[2], a.n * sizeof *data);
    }
    if (status == CUDA_SUCCESS) *count = (size_t)a.count;
    free(a.buffer);
    return status;
}

static int node_edges(uint32_t opcode, const char *call, CUgraphNode node, CUgraphNode *nodes,
                      CUgraphEdgeData *data, size_t *count) {
    if (!count || (data && !nodes)) return CUDA_ERROR_INVALID_VALUE;
    size_t room = nodes ? *count : 0;
    struct answer a;
    int status = query(opcode, call, handle_word(node), room, 2, &a);
    if (status != CUDA_SUCCESS) return status;
    if (room && !data && any_edge_data(a.items[1], a.n)) {
        status = ERROR_LOSSY_QUERY;
    } else if (room) {
        fill_nodes(nodes, a.items[0], a.n, room);
        if (data) memcpy(data, a.items[1], a.n * sizeof *data);
    }
    if (status == CUDA_SUCCESS) *count = (size_t)a.count;
    free(a.buffer);
    return status;
}

CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, CUgraphEdgeData *data, size_t *count) {
    ORION_ENTRY("cuGraphNodeGetDependencies");
    return node_edges(ORION_OP_cuGraphNodeGetDependencies, "cuGraphNodeGetDependencies", node, deps, data, count);
}

CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *dependents, CUgraphEdgeData *data,
                                      size_t *count) {
    ORION_ENTRY("cuGraphNodeGetDependentNodes");
    return node_edges(ORION_OP_cuGraphNodeGetDependentNodes, "cuGraphNodeGetDependentNodes", node, dependents, data,
                      count);
}

/* --- parameters set ------------------------------------------------------------------------------------------- */

CUresult cuGraphKernelNodeSetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphKernelNodeSetParams");
    uint8_t prefix[ORION_REQ_cuGraphKernelNodeSetParams_KERNEL_NODE];
    orion_put_u64(prefix + ORION_REQ_cuGraphKernelNodeSetParams_node, handle_word(node));
    int status = kernel_node_call(ORION_OP_cuGraphKernelNodeSetParams, prefix, sizeof prefix, params, 0, NULL, 0,
                                  NULL);
    if (status == CUDA_SUCCESS) orion_graph_kernel_params_set(node); /* what GetParams handed out goes */
    return status;
}

CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node, CUDA_KERNEL_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphExecKernelNodeSetParams");
    uint8_t prefix[ORION_REQ_cuGraphExecKernelNodeSetParams_KERNEL_NODE];
    orion_put_u64(prefix + ORION_REQ_cuGraphExecKernelNodeSetParams_exec, handle_word(exec));
    orion_put_u64(prefix + ORION_REQ_cuGraphExecKernelNodeSetParams_node, handle_word(node));
    return kernel_node_call(ORION_OP_cuGraphExecKernelNodeSetParams, prefix, sizeof prefix, params, 0, NULL, 0,
                            NULL);
}

CUresult cuGraphMemsetNodeSetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphMemsetNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphMemsetNodeSetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphMemsetNodeSetParams_node, handle_word(node));
    put_memset(req + ORION_REQ_cuGraphMemsetNodeSetParams_MEMSET_NODE, params);
    return hand_forward(ORION_OP_cuGraphMemsetNodeSetParams, req, sizeof req, NULL, 0);
}

CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node, CUDA_MEMSET_NODE_PARAMS const *params,
                                        CUcontext ctx) {
    ORION_ENTRY("cuGraphExecMemsetNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphExecMemsetNodeSetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphExecMemsetNodeSetParams_exec, handle_word(exec));
    orion_put_u64(req + ORION_REQ_cuGraphExecMemsetNodeSetParams_node, handle_word(node));
    orion_put_u64(req + ORION_REQ_cuGraphExecMemsetNodeSetParams_context, handle_word(ctx));
    put_memset(req + ORION_REQ_cuGraphExecMemsetNodeSetParams_MEMSET_NODE, params);
    return hand_forward(ORION_OP_cuGraphExecMemsetNodeSetParams, req, sizeof req, NULL, 0);
}

CUresult cuGraphMemcpyNodeSetParams(CUgraphNode node, CUDA_MEMCPY3D const *params) {
    ORION_ENTRY("cuGraphMemcpyNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    int status = copy_forwarded(params);
    if (status != CUDA_SUCCESS) return status;
    uint8_t req[ORION_REQ_cuGraphMemcpyNodeSetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphMemcpyNodeSetParams_node, handle_word(node));
    orion_put_copy(req + ORION_REQ_cuGraphMemcpyNodeSetParams_MEMCPY_3D, params);
    return copy_answered(params, hand_forward(ORION_OP_cuGraphMemcpyNodeSetParams, req, sizeof req, NULL, 0));
}

CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, CUDA_MEMCPY3D const *params,
                                        CUcontext ctx) {
    ORION_ENTRY("cuGraphExecMemcpyNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    int status = copy_forwarded(params);
    if (status != CUDA_SUCCESS) return status;
    uint8_t req[ORION_REQ_cuGraphExecMemcpyNodeSetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphExecMemcpyNodeSetParams_exec, handle_word(exec));
    orion_put_u64(req + ORION_REQ_cuGraphExecMemcpyNodeSetParams_node, handle_word(node));
    orion_put_u64(req + ORION_REQ_cuGraphExecMemcpyNodeSetParams_context, handle_word(ctx));
    orion_put_copy(req + ORION_REQ_cuGraphExecMemcpyNodeSetParams_MEMCPY_3D, params);
    return copy_answered(params, hand_forward(ORION_OP_cuGraphExecMemcpyNodeSetParams, req, sizeof req, NULL, 0));
}

CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info) {
    ORION_ENTRY("cuGraphExecUpdate");
    if (!info) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphExecUpdate_SIZE], rep[ORION_REP_cuGraphExecUpdate_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphExecUpdate_exec, handle_word(exec));
    orion_put_u64(req + ORION_REQ_cuGraphExecUpdate_graph, handle_word(graph));
    int status = hand_forward(ORION_OP_cuGraphExecUpdate, req, sizeof req, rep, sizeof rep);
    if (status == CUDA_SUCCESS) {
        info->result = orion_get_i32(rep + ORION_REP_cuGraphExecUpdate_result);
        info->errorNode = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphExecUpdate_error_node);
        info->errorFromNode = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphExecUpdate_error_from_node);
    } else if (status == ERROR_GRAPH_EXEC_UPDATE_FAILURE) { /* the reply carries no result information */
        info->result = UPDATE_ERROR;
        info->errorNode = info->errorFromNode = NULL;
    }
    return status;
}

/* --- conditional nodes' body graphs ---------------------------------------------------------------------------
 * cuda.h: a conditional node's `phGraph_out` is "a CUDA-owned array ... valid for the lifetime of the conditional
 * node". The driver's array lives on the GPU host, so this library keeps one per conditional node it made: at most
 * MAX_CONDITIONAL_NODES at once (past them cuGraphAddNode answers CUDA_ERROR_OUT_OF_MEMORY, said once), each freed
 * when cuGraphDestroyNode destroys its node or cuGraphDestroy its graph (the nodes in its body graphs going with
 * it). */
struct conditional_bodies {
    struct conditional_bodies *next;
    CUgraphNode node;
    CUgraph graph;          /* the graph the node is in */
    unsigned int size;
    CUgraph bodies[];       /* what phGraph_out points at */
};

static pthread_mutex_t conditionals_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conditional_bodies *conditionals;
static size_t conditionals_kept; /* entries listed, and those reserved by a cuGraphAddNode under way */

/* Room for one more entry (released with conditional_release unless conditional_keep lists it): a CUresult. */
static int conditional_reserve(void) {
    pthread_mutex_lock(&conditionals_lock);
    int room = conditionals_kept < MAX_CONDITIONAL_NODES;
    if (room) conditionals_kept++;
    pthread_mutex_unlock(&conditionals_lock);
    if (room) return CUDA_SUCCESS;
    if (orion_first_time("graph conditional nodes"))
        fprintf(stderr, "orion: cuGraphAddNode: more than %d conditional nodes at once (the library keeps each one's "
                "body graphs until it is destroyed): CUDA_ERROR_OUT_OF_MEMORY\n", MAX_CONDITIONAL_NODES);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void conditional_release(struct conditional_bodies *entry) {
    free(entry);
    pthread_mutex_lock(&conditionals_lock);
    conditionals_kept--;
    pthread_mutex_unlock(&conditionals_lock);
}

static void conditional_keep(struct conditional_bodies *entry) {
    pthread_mutex_lock(&conditionals_lock);
    entry->next = conditionals;
    conditionals = entry;
    pthread_mutex_unlock(&conditionals_lock);
}

static int holds_body(const struct conditional_bodies *owner, CUgraph graph) {
    for (unsigned int i = 0; i < owner->size; i++)
        if (owner->bodies[i] == graph) return 1;
    return 0;
}

/* Free the body arrays of conditional node `node` (non-NULL) or of every conditional node in `graph` (non-NULL), then
 * of the conditional nodes in their body graphs (destroyed with them), and so on down. */
static void conditionals_forget(CUgraphNode node, CUgraph graph) {
    pthread_mutex_lock(&conditionals_lock);
    struct conditional_bodies *gone = NULL, **tail = &gone;
    for (struct conditional_bodies **at = &conditionals; *at;) {
        struct conditional_bodies *entry = *at;
        if ((node && entry->node == node) || (graph && entry->graph == graph)) {
            *at = entry->next;
            entry->next = NULL;
            *tail = entry;
            tail = &entry->next;
        } else {
            at = &entry->next;
        }
    }
    for (struct conditional_bodies *owner = gone; owner; owner = owner->next) { /* `gone` grows as it is walked */
        for (struct conditional_bodies **at = &conditionals; *at;) {
            struct conditional_bodies *entry = *at;
            if (holds_body(owner, entry->graph)) {
                *at = entry->next;
                entry->next = NULL;
                *tail = entry;
                tail = &entry->next;
            } else {
                at = &entry->next;
            }
        }
    }
    while (gone) {
        struct conditional_bodies *next = gone->next;
        free(gone);
        conditionals_kept--;
        gone = next;
    }
    pthread_mutex_unlock(&conditionals_lock);
}

/* How many conditional nodes' body arrays the library keeps now (tests/differential/test_graph_add_node.py). */
size_t orion_graph_conditionals_kept(void);
size_t orion_graph_conditionals_kept(void) {
    pthread_mutex_lock(&conditionals_lock);
    size_t kept = conditionals_kept;
    pthread_mutex_unlock(&conditionals_lock);
    return kept;
}

/* The body graphs kept for conditional node `node` (graph_structs.h: cuGraphNodeGetParams' phGraph_out). The array
 * stays valid while the node lives, as the one cuGraphAddNode handed out. */
CUgraph *orion_graph_conditional_bodies(CUgraphNode node, unsigned int size) {
    CUgraph *found = NULL;
    pthread_mutex_lock(&conditionals_lock);
    for (struct conditional_bodies *entry = conditionals; entry && !found; entry = entry->next)
        if (entry->node == node && entry->size == size) found = entry->bodies;
    pthread_mutex_unlock(&conditionals_lock);
    return found;
}

/* The generated cuGraphDestroyNode and cuGraphDestroy call these once the host destroyed it (their `destroys`
 * effect: gen_libcuda._effect_hooks): the conditional bodies kept for it are forgotten, and what graph_queries.c
 * keeps for it. */
void orion_graph_node_destroyed(CUgraphNode node) {
    if (!node) return;
    conditionals_forget(node, NULL);
    orion_graph_queries_node_gone(node);
}

void orion_graph_destroyed(CUgraph graph) {
    if (!graph) return;
    conditionals_forget(NULL, graph);
    orion_graph_queries_graph_gone(graph);
}

/* --- the generic node calls (CUgraphNodeParams) --------------------------------------------------------------- */

/* What the generic calls do not serve, each said once (the strings' addresses are what orion_first_time keeps). */
static const char *const node_type_not_forwarded[NODE_TYPES] = {
    [NODE_EXT_SEMAS_SIGNAL] = "a graph external semaphore signal node (CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL)",
    [NODE_EXT_SEMAS_WAIT] = "a graph external semaphore wait node (CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT)",
};
static const char memory_node_set[] =
    "cuGraphNodeSetParams or cuGraphExecNodeSetParams of a memory allocation or free node";
static const char memory_node_edges[] = "cuGraphAddNode of a memory allocation or free node with edge data of its own "
    "(the node cannot be removed again if its edges are refused)";
static const char moved_child_graph[] =
    "cuGraphExecNodeSetParams of a child graph node with CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE (OWNERSHIP_CLONE is)";
static const char graph_child_set[] = "cuGraphNodeSetParams of a child graph node (cuGraphExecNodeSetParams of one is)";
static const char conditional_set[] = "cuGraphNodeSetParams or cuGraphExecNodeSetParams of a conditional node";

/* What every generic node call checks first, as the driver: parameters given, reserved fields zero (cuda.h: "must
 * be zero"), a node type cuda.h knows, a memcpy node's flags zero; a type not forwarded answers 801, said once. */
static int params_checked(const CUgraphNodeParams *p) {
    if (!p || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2) return CUDA_ERROR_INVALID_VALUE;
    if (p->type < 0 || p->type >= NODE_TYPES) return CUDA_ERROR_INVALID_VALUE;
    if (p->type == NODE_MEMCPY && (p->copy.flags || p->copy.reserved)) return CUDA_ERROR_INVALID_VALUE;
    if (node_type_not_forwarded[p->type]) return orion_not_forwarded(node_type_not_forwarded[p->type]);
    return CUDA_SUCCESS;
}

/* A child graph's ownership where only a clone is served (cuGraphAddNode's MOVE has its own path above). */
static int ownership_forwarded(int ownership) {
    if (ownership == OWNERSHIP_CLONE) return CUDA_SUCCESS;
    return ownership == OWNERSHIP_MOVE ? orion_not_forwarded(moved_child_graph) : CUDA_ERROR_INVALID_VALUE;
}

/* A node of a type the calls above serve, made by that type's own call with dependencies `deps`. */
static int node_by_type(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t count,
                        CUgraphNodeParams *p) {
    int status;
    switch (p->type) {
    case NODE_KERNEL: return cuGraphAddKernelNode(node, graph, deps, count, &p->kernel);
    case NODE_MEMCPY: return cuGraphAddMemcpyNode(node, graph, deps, count, &p->copy.copyParams, p->copy.copyCtx);
    case NODE_MEMSET: return cuGraphAddMemsetNode(node, graph, deps, count, &p->fill.params, p->fill.ctx);
    case NODE_EMPTY: return cuGraphAddEmptyNode(node, graph, deps, count);
    case NODE_GRAPH:
        status = ownership_forwarded(p->child.ownership);
        return status != CUDA_SUCCESS ? status : cuGraphAddChildGraphNode(node, graph, deps, count, p->child.graph);
    case NODE_EVENT_RECORD: return cuGraphAddEventRecordNode(node, graph, deps, count, p->event.event);
    case NODE_WAIT_EVENT: return cuGraphAddEventWaitNode(node, graph, deps, count, p->event.event);
    /* the allocation's address comes back in the caller's `alloc.dptr`, as cuda.h says of cuGraphAddNode */
    case NODE_MEM_ALLOC: return cuGraphAddMemAllocNode(node, graph, deps, count, &p->alloc);
    case NODE_MEM_FREE: return cuGraphAddMemFreeNode(node, graph, deps, count, p->mem_free);
    case NODE_HOST: return cuGraphAddHostNode(node, graph, deps, count, &p->host);
    case NODE_BATCH_MEM_OP: return cuGraphAddBatchMemOpNode(node, graph, deps, count, &p->batch_mem_op);
    default: return CUDA_ERROR_INVALID_VALUE; /* params_checked let no other type through */
    }
}

/* Edge data absent or all default (zero): the node may be made with its dependencies directly. */
static int default_edges(const CUgraphEdgeData *edges, size_t count) {
    static const CUgraphEdgeData none;
    for (size_t i = 0; edges && i < count; i++)
        if (memcmp(&edges[i], &none, sizeof none) != 0) return 0;
    return 1;
}

/* The call table's cuGraphAddNode (graph, type, a conditional node's handle, condition type, body count and context,
 * a moved child graph and its ownership, dependencies, edges; the reply the node and a conditional node's body
 * graphs, none for a moved child graph), its edges sent only where one carries data. `tail` gets the reply's body-graph
 * list (its count, then the graphs), `got` its length. */
#define ADD_NODE(payload, field) ORION_##payload##_cuGraphAddNode_##field
/* The reply's body graphs (`graphs`: their count, then the handles) are its tail, right after the node. */
#define BODIES_BYTES(n) (ORION_LENGTH_BYTES + ADD_NODE(REP, graphs_ITEM) * (size_t)(n))
_Static_assert(ADD_NODE(REP, graphs) == ADD_NODE(REP, SIZE), "the body graphs right after the node");
static int add_node_forwarded(CUgraphNode *made, CUgraph graph, int type, const conditional_node_params *c,
                              CUgraph child, int ownership, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                              size_t count, uint8_t *tail, size_t tail_size, size_t *got) {
    static const conditional_node_params none;
    if (!c) c = &none;
    size_t sent = default_edges(edges, count) ? 0 : count;
    uint8_t head[ADD_NODE(REQ, SIZE) + ORION_LENGTH_BYTES], listed[ORION_LENGTH_BYTES], rep[ADD_NODE(REP, SIZE)];
    orion_put_u64(head + ADD_NODE(REQ, graph), handle_word(graph));
    orion_put_i32(head + ADD_NODE(REQ, type), type);
    orion_put_u64(head + ADD_NODE(REQ, handle), c->handle);
    orion_put_i32(head + ADD_NODE(REQ, cond_type), c->type);
    orion_put_u32(head + ADD_NODE(REQ, size), c->size);
    orion_put_u64(head + ADD_NODE(REQ, context), handle_word(c->ctx));
    orion_put_u64(head + ADD_NODE(REQ, child), handle_word(child));
    orion_put_u32(head + ADD_NODE(REQ, ownership), (uint32_t)ownership);
    orion_put_u32(head + ADD_NODE(REQ, deps), (uint32_t)count);
    orion_put_u32(listed, (uint32_t)sent); /* the edges' count, after the dependencies */
    struct orion_piece pieces[4] = { { head, sizeof head }, { deps, count * sizeof *deps }, { listed, sizeof listed },
                                     { edges, sent * sizeof *edges } };
    int status = orion_thread_forwardv(ORION_OP_cuGraphAddNode, pieces, 4, rep, sizeof rep, tail, tail_size, got, 0);
    if (status == CUDA_SUCCESS) {
        *made = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ADD_NODE(REP, node));
        orion_graph_node_made(*made);
    }
    return status;
}

/* A conditional node, its body graphs kept here for phGraph_out. */
static int add_conditional(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                           size_t count, conditional_node_params *c) {
    if (!c->size || c->size > MAX_CONDITIONAL_BODIES) {
        if (c->size && orion_first_time("graph conditional bodies"))
            fprintf(stderr, "orion: cuGraphAddNode: a conditional node with more than %d body graphs is not "
                    "forwarded: CUDA_ERROR_INVALID_VALUE\n", MAX_CONDITIONAL_BODIES);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int status = conditional_reserve();
    if (status != CUDA_SUCCESS) return status;
    struct conditional_bodies *entry = malloc(sizeof *entry + c->size * sizeof(CUgraph));
    if (!entry) {
        conditional_release(NULL);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint8_t tail[BODIES_BYTES(MAX_CONDITIONAL_BODIES)];
    size_t got = 0;
    CUgraphNode made = NULL;
    status = add_node_forwarded(&made, graph, NODE_CONDITIONAL, c, NULL, 0, deps, edges, count, tail, sizeof tail,
                                &got);
    if (status == CUDA_SUCCESS) {
        if (got != BODIES_BYTES(c->size) || orion_get_u32(tail) != c->size) {
            cuGraphDestroyNode(made); /* a reply this library cannot read: the call has no effect */
            status = malformed_reply("cuGraphAddNode");
        } else {
            entry->node = made;
            entry->graph = graph;
            entry->size = c->size;
            for (unsigned int i = 0; i < c->size; i++)
                entry->bodies[i] = (CUgraph)(uintptr_t)orion_get_u64(tail + BODIES_BYTES(i));
            conditional_keep(entry);
            c->phGraph_out = entry->bodies;
            *node = made;
            return CUDA_SUCCESS;
        }
    }
    conditional_release(entry);
    return status;
}

/* A child graph moved into its node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): the graph itself, not a clone, so its
 * nodes stay the ones the caller names (through the parent's executable graph too); the reply lists no graphs. */
static int add_moved_child(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                           size_t count, CUgraph child) {
    uint8_t tail[BODIES_BYTES(0)];
    size_t got = 0;
    CUgraphNode made = NULL;
    int status = add_node_forwarded(&made, graph, NODE_GRAPH, NULL, child, OWNERSHIP_MOVE, deps, edges, count, tail,
                                    sizeof tail, &got);
    if (status != CUDA_SUCCESS) return status;
    if (got != BODIES_BYTES(0) || orion_get_u32(tail) != 0) {
        cuGraphDestroyNode(made); /* a reply this library cannot read: the node goes again, and the moved graph
                                   * with it (the node owns it now); the host forgets the graph too */
        return malformed_reply("cuGraphAddNode");
    }
    *node = made;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, CUgraphEdgeData const *edges,
                        size_t count, CUgraphNodeParams *params) {
    ORION_ENTRY("cuGraphAddNode");
    int status = node_args("cuGraphAddNode", node, deps, count);
    if (status == CUDA_SUCCESS) status = params_checked(params);
    if (status != CUDA_SUCCESS) return status;
    if (params->type == NODE_CONDITIONAL) return add_conditional(node, graph, deps, edges, count, &params->conditional);
    if (params->type == NODE_GRAPH && params->child.ownership == OWNERSHIP_MOVE)
        return add_moved_child(node, graph, deps, edges, count, params->child.graph);
    if (default_edges(edges, count)) return node_by_type(node, graph, deps, count, params);
    if (params->type == NODE_MEM_ALLOC || params->type == NODE_MEM_FREE) return orion_not_forwarded(memory_node_edges);
    /* edges with data of their own: the node first, then its edges (deps[i] -> node, edges[i]), as one call */
    CUgraphNode small[EDGES_ON_STACK], *to = count <= EDGES_ON_STACK ? small : malloc(count * sizeof *to);
    if (!to) return CUDA_ERROR_OUT_OF_MEMORY;
    CUgraphNode made = NULL;
    status = node_by_type(&made, graph, NULL, 0, params);
    if (status == CUDA_SUCCESS) {
        for (size_t i = 0; i < count; i++) to[i] = made;
        status = cuGraphAddDependencies(graph, deps, to, edges, count);
        if (status == CUDA_SUCCESS)
            *node = made;
        else
            cuGraphDestroyNode(made); /* edges refused: the node goes again, and the graph is as it was */
    }
    if (to != small) free(to);
    return status;
}

/* A node's type checked: an empty node has no parameters to set. */
static int node_is(CUgraphNode node, int type) {
    CUgraphNodeType found;
    int status = cuGraphNodeGetType(node, &found);
    if (status != CUDA_SUCCESS) return status;
    return found == type ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A graph's node takes the parameters its type's own setter takes (a memset or memcpy node keeps its context: the
 * setters of a graph's node take none). */
CUresult cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams *params) {
    ORION_ENTRY("cuGraphNodeSetParams");
    int status = params_checked(params);
    if (status != CUDA_SUCCESS) return status;
    switch (params->type) {
    case NODE_KERNEL: return cuGraphKernelNodeSetParams(node, &params->kernel);
    case NODE_MEMCPY: return cuGraphMemcpyNodeSetParams(node, &params->copy.copyParams);
    case NODE_MEMSET: return cuGraphMemsetNodeSetParams(node, &params->fill.params);
    case NODE_EMPTY: return node_is(node, NODE_EMPTY);
    case NODE_EVENT_RECORD: return cuGraphEventRecordNodeSetEvent(node, params->event.event);
    case NODE_WAIT_EVENT: return cuGraphEventWaitNodeSetEvent(node, params->event.event);
    case NODE_HOST: return cuGraphHostNodeSetParams(node, &params->host);
    case NODE_BATCH_MEM_OP: return cuGraphBatchMemOpNodeSetParams(node, &params->batch_mem_op);
    case NODE_GRAPH: return orion_not_forwarded(graph_child_set);
    case NODE_MEM_ALLOC: case NODE_MEM_FREE: return orion_not_forwarded(memory_node_set);
    default: return orion_not_forwarded(conditional_set);
    }
}

/* An executable graph's copy of a node takes the parameters its type's own setter takes. */
CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *params) {
    ORION_ENTRY("cuGraphExecNodeSetParams");
    int status = params_checked(params);
    if (status != CUDA_SUCCESS) return status;
    switch (params->type) {
    case NODE_KERNEL: return cuGraphExecKernelNodeSetParams(exec, node, &params->kernel);
    case NODE_MEMCPY:
        return cuGraphExecMemcpyNodeSetParams(exec, node, &params->copy.copyParams, params->copy.copyCtx);
    case NODE_MEMSET: return cuGraphExecMemsetNodeSetParams(exec, node, &params->fill.params, params->fill.ctx);
    case NODE_EMPTY: return node_is(node, NODE_EMPTY);
    case NODE_GRAPH:
        status = ownership_forwarded(params->child.ownership);
        return status != CUDA_SUCCESS ? status : cuGraphExecChildGraphNodeSetParams(exec, node, params->child.graph);
    case NODE_EVENT_RECORD: return cuGraphExecEventRecordNodeSetEvent(exec, node, params->event.event);
    case NODE_WAIT_EVENT: return cuGraphExecEventWaitNodeSetEvent(exec, node, params->event.event);
    case NODE_HOST: return cuGraphExecHostNodeSetParams(exec, node, &params->host);
    case NODE_BATCH_MEM_OP: return cuGraphExecBatchMemOpNodeSetParams(exec, node, &params->batch_mem_op);
    case NODE_MEM_ALLOC: case NODE_MEM_FREE: return orion_not_forwarded(memory_node_set);
    default: return orion_not_forwarded(conditional_set);
    }
}

/* --- the ABIs of callers built against older CUDA --------------------------------------------------------------
 * cuGetProcAddress gives a caller the ABI of the CUDA version it was built against (cudaTypedefs.h's PFN_*_vNNNNN):
 * before 12.0, kernel nodes take CUDA_KERNEL_NODE_PARAMS_v1 (no kern, no ctx) and cuGraphExecUpdate reports through
 * two pointers; before 12.3, the edge calls and cuGraphAddNode take no edge data. orion_graph_versioned_entry answers
 * those, built on the entry points above, for answered_in_guest.c's orion_versioned_entry to return (NULL: the
 * current ABI serves). */
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
} kernel_node_params_v1;
_Static_assert(sizeof(kernel_node_params_v1) == 56, "CUDA_KERNEL_NODE_PARAMS_v1 as cuda.h lays it out");

static CUDA_KERNEL_NODE_PARAMS from_v1(const kernel_node_params_v1 *p) {
    CUDA_KERNEL_NODE_PARAMS params = { p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY,
                                       p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra, NULL, NULL };
    return params;
}

static CUresult add_kernel_node_v1(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                                   kernel_node_params_v1 const *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS current = from_v1(params);
    return cuGraphAddKernelNode(node, graph, deps, count, &current);
}

static CUresult kernel_node_set_params_v1(CUgraphNode node, kernel_node_params_v1 const *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS current = from_v1(params);
    return cuGraphKernelNodeSetParams(node, &current);
}

static CUresult exec_kernel_node_set_params_v1(CUgraphExec exec, CUgraphNode node,
                                               kernel_node_params_v1 const *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS current = from_v1(params);
    return cuGraphExecKernelNodeSetParams(exec, node, &current);
}

static CUresult exec_update_v1(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node, int *result) {
    CUgraphExecUpdateResultInfo info;
    CUresult status = cuGraphExecUpdate(exec, graph, &info);
    if (status == CUDA_SUCCESS || status == ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
        if (error_node) *error_node = info.errorNode;
        if (result) *result = info.result;
    }
    return status;
}

static CUresult get_edges_v1(CUgraph graph, CUgraphNode *from, CUgraphNode *to, size_t *count) {
    return cuGraphGetEdges(graph, from, to, NULL, count);
}

static CUresult dependencies_v1(CUgraphNode node, CUgraphNode *deps, size_t *count) {
    return cuGraphNodeGetDependencies(node, deps, NULL, count);
}

static CUresult dependents_v1(CUgraphNode node, CUgraphNode *dependents, size_t *count) {
    return cuGraphNodeGetDependentNodes(node, dependents, NULL, count);
}

static CUresult add_dependencies_v1(CUgraph graph, CUgraphNode const *from, CUgraphNode const *to, size_t count) {
    return cuGraphAddDependencies(graph, from, to, NULL, count);
}

static CUresult remove_dependencies_v1(CUgraph graph, CUgraphNode const *from, CUgraphNode const *to, size_t count) {
    return cuGraphRemoveDependencies(graph, from, to, NULL, count);
}

static CUresult add_node_v1(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                            CUgraphNodeParams *params) {
    return cuGraphAddNode(node, graph, deps, NULL, count, params);
}

void *orion_graph_versioned_entry(const char *symbol, int version) {
    static const struct { const char *name; int since; void *older; } entries[] = {
        { "cuGraphAddKernelNode", 12000, (void *)add_kernel_node_v1 },
        { "cuGraphKernelNodeSetParams", 12000, (void *)kernel_node_set_params_v1 },
        { "cuGraphExecKernelNodeSetParams", 12000, (void *)exec_kernel_node_set_params_v1 },
        { "cuGraphExecUpdate", 12000, (void *)exec_update_v1 },
        { "cuGraphGetEdges", 12030, (void *)get_edges_v1 },
        { "cuGraphNodeGetDependencies", 12030, (void *)dependencies_v1 },
        { "cuGraphNodeGetDependentNodes", 12030, (void *)dependents_v1 },
        { "cuGraphAddDependencies", 12030, (void *)add_dependencies_v1 },
        { "cuGraphRemoveDependencies", 12030, (void *)remove_dependencies_v1 },
        { "cuGraphAddNode", 12030, (void *)add_node_v1 },
    };
    if (!symbol) return NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (version < entries[i].since && strcmp(symbol, entries[i].name) == 0) return entries[i].older;
    return orion_graph_queries_versioned_entry(symbol, version);
}

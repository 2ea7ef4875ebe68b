/* graph_queries.c: CUDA graphs, their second part (graph_calls.c has the first): node parameters asked back, kernel
 * node attributes, capture into a given graph, instantiation with parameters, memory allocation and free nodes, the
 * graph memory attributes and the DOT description; hand-written calls of the call table, marshalling exactly what
 * ivshmem/driver_api.py declares for them. The host checks every handle and range (host_agent/session/graph_queries.py).
 *
 * - cuGraphKernelNodeGetParams: cuda.h lets the caller read the argument values through `kernelParams` (or `extra`,
 *   whichever was set last) in memory "owned by the node ... valid until the node is destroyed or its parameters are
 *   modified". The host sends the values its driver holds, packed, with each parameter's offset; this library keeps
 *   them (`kept`) with a kernelParams array pointing into them, the same memory again while they do not change, until
 *   the node is destroyed (cuGraphDestroyNode, or its graph by cuGraphDestroy), its parameters are set through this
 *   library, its handle is given out again, or they change. Which of the two forms a node holds the host cannot say
 *   (it launches and adds every node with its own form), so the answer is kernelParams, right as long as no launch
 *   or kernel node of this process was given `extra`; after one was, the call answers CUDA_ERROR_NOT_SUPPORTED, said
 *   once, rather than maybe the wrong form. A node holding no parameters answers both NULL.
 * - cuGraphMemsetNodeGetParams, cuGraphMemcpyNodeGetParams: the fields as the host answers them (a memcpy side as
 *   the guest gave it: its page-locked address, UNIFIED kept).
 * - cuGraphNodeGetParams: the node's type and the fields of the types the host carries; a kernel, memset, memcpy or
 *   memory allocation node's own fields by that type's own call (above), their context from the first reply. A
 *   conditional node's phGraph_out is the array graph_calls.c keeps for it (a node this library did not make has none:
 *   801, said once). Host, external semaphore and batch memory-operation nodes answer 801 (the host's).
 * - Kernel node attributes: CUlaunchAttributeValue's 64 bytes, for driver_api.LAUNCH_ATTRIBUTES_PLAIN IDs only
 *   (ORION_KERNEL_NODE_ATTRIBUTES_FORWARDED); any other ID answers 801, said once, before anything is sent.
 * - cuStreamBeginCaptureToGraph, cuStreamUpdateCaptureDependencies: dependencies and edge data as counted lists, sent
 *   from the caller's arrays (at most graph_calls.c's MAX_DEPENDENCIES: more is 801, said once).
 * - cuGraphInstantiateWithParams: `result_out` and `hErrNode_out` come back with an executable graph; a failed
 *   reply carries none (the call table's rule), so the caller's struct then says CUDA_GRAPH_INSTANTIATE_ERROR ("the
 *   reason ... is described in the return value") with no error node.
 * - Memory nodes: an allocation node's pool properties travel as driver_api.POOL_PROPS (the first reserved byte as
 *   gpuDirectRDMACapable; the others must be zero, else 801, said once: fields the table does not carry) and its
 *   access descriptors from the caller's array; the address comes back into `dptr` and joins this process's device
 *   ranges (unified-addressing copies) until its graph is destroyed through this library. cuGraphMemAllocNodeGetParams'
 *   accessDescs is an array kept as a kernel node's values are.
 * - cuGraphDebugDotPrint: the host's driver writes the description into a file of its own and sends the text; this
 *   library writes it to the caller's path (a file it cannot write: CUDA_ERROR_OPERATING_SYSTEM, as cuda.h says).
 * - Callers built against CUDA before 12.0 get cuGraphKernelNodeGetParams' CUDA_KERNEL_NODE_PARAMS_v1, before 12.3
 *   cuStreamUpdateCaptureDependencies without edge data (orion_graph_queries_versioned_entry, for cuGetProcAddress).
 *
 * At most MAX_KEPT nodes' asked-back parameters are kept at once (past them: CUDA_ERROR_OUT_OF_MEMORY, said once).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_structs.h"
#include "hand_calls.h"
#include "param_layouts.h" /* ORION_MAX_PARAM_BYTES */

enum {
    MAX_ACCESS_DESCS = 64,        /* host_agent/session/graph_queries.py MAX_ACCESS_DESCS */
    MAX_PARAM_COUNT = ORION_MAX_PARAM_BYTES, /* a parameter takes at least a byte */
    MAX_DOT_BYTES = 64 << 20,     /* host_agent/session/graph_queries.py MAX_DOT_BYTES */
    MAX_KEPT = 1 << 16,
    ATTRIBUTE_BYTES = 64,
    ERROR_OPERATING_SYSTEM = 304, /* CUDA_ERROR_OPERATING_SYSTEM */
    INSTANTIATE_ERROR = 1,        /* CUDA_GRAPH_INSTANTIATE_ERROR */
    KEPT_KERNEL = 1, KEPT_ACCESS = 2,
    /* CUgraphNodeType */
    NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_GRAPH = 4, NODE_EMPTY = 5, NODE_WAIT_EVENT = 6,
    NODE_EVENT_RECORD = 7, NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11, NODE_CONDITIONAL = 13,
};

_Static_assert(sizeof(CUmemAccessDesc) == ORION_REQ_cuGraphAddMemAllocNode_access_ITEM,
               "an access descriptor array's bytes are its counted list's items");
_Static_assert(ORION_REP_cuGraphMemAllocNodeGetParams_access_ITEM == sizeof(CUmemAccessDesc),
               "the reply's access descriptors are CUmemAccessDesc's three ints");
_Static_assert(ORION_REP_cuGraphKernelNodeGetParams_offsets_ITEM == 4, "a parameter's offset is a u32");

static uint64_t word_of(const void *handle) { return (uint64_t)(uintptr_t)handle; }


static int malformed(const char *call) {
    if (orion_first_time("graph queries reply"))
        fprintf(stderr, "orion: %s: the agent's reply does not read as the call table declares it\n", call);
    return CUDA_ERROR_UNKNOWN;
}

/* --- what this library keeps for a node: asked-back parameters ------------------------------------------------- */

struct kept {
    struct kept *next;
    CUgraphNode node;
    CUgraph graph;       /* the graph the host says it lies in (0: not known) */
    int kind;            /* KEPT_KERNEL, KEPT_ACCESS */
    size_t key_len;      /* what the host sent, compared when asked again */
    uint8_t *key;
    void *memory;        /* what the caller was handed */
};

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept *kept_list;
static size_t kept_count;
static atomic_int extra_given; /* a launch or kernel node of this process was given `extra` */

void orion_graph_kernel_extra_given(void) { atomic_store_explicit(&extra_given, 1, memory_order_relaxed); }

static void kept_free(struct kept *entry) {
    free(entry->key);
    free(entry->memory);
    free(entry);
    kept_count--;
}

/* Drop the entries `gone(entry)` names (under kept_lock). */
static void kept_drop(int (*gone)(const struct kept *, const void *), const void *what) {
    for (struct kept **at = &kept_list; *at;) {
        struct kept *entry = *at;
        if (gone(entry, what)) {
            *at = entry->next;
            kept_free(entry);
        } else {
            at = &entry->next;
        }
    }
}

static int of_node(const struct kept *entry, const void *node) { return entry->node == (CUgraphNode)node; }
static int of_graph(const struct kept *entry, const void *graph) {
    return entry->graph && entry->graph == (CUgraph)graph;
}
static int of_kernel(const struct kept *entry, const void *node) {
    return entry->node == (CUgraphNode)node && entry->kind == KEPT_KERNEL;
}

/* The memory handed out for (node, kind) that `key` made: the same as last time where the host sent the same bytes,
 * else a new one from `build(key, key_len, context)` (NULL: out of memory), replacing the old. NULL on failure, with
 * *status set. */
static void *keep(CUgraphNode node, CUgraph graph, int kind, const uint8_t *key, size_t key_len,
                  void *(*build)(const uint8_t *, size_t, const void *), const void *context, int *status) {
    void *memory = NULL;
    *status = CUDA_SUCCESS;
    pthread_mutex_lock(&kept_lock);
    struct kept **at = &kept_list;
    for (; *at; at = &(*at)->next)
        if ((*at)->node == node && (*at)->kind == kind) break;
    struct kept *old = *at;
    if (old && old->key_len == key_len && memcmp(old->key, key, key_len) == 0) {
        old->graph = graph ? graph : old->graph;
        memory = old->memory;
    } else if (!old && kept_count >= MAX_KEPT) {
        *status = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct kept *entry = calloc(1, sizeof *entry);
        uint8_t *copy = entry ? malloc(key_len ? key_len : 1) : NULL;
        void *made = copy ? build(key, key_len, context) : NULL;
        if (!made) {
            free(copy);
            free(entry);
            *status = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            memcpy(copy, key, key_len);
            *entry = (struct kept){ NULL, node, graph, kind, key_len, copy, made };
            if (old) { /* its parameters changed: what was handed out for them goes (cuda.h) */
                *at = old->next;
                kept_free(old);
            }
            entry->next = kept_list;
            kept_list = entry;
            kept_count++;
            memory = made;
        }
    }
    pthread_mutex_unlock(&kept_lock);
    if (*status == CUDA_ERROR_OUT_OF_MEMORY && kept_count >= MAX_KEPT && orion_first_time("graph kept parameters"))
        fprintf(stderr, "orion: more than %d graph nodes' parameters asked back at once (the library keeps each "
                "until its node goes): CUDA_ERROR_OUT_OF_MEMORY\n", MAX_KEPT);
    return memory;
}

/* --- graph memory ranges: each allocation node's, as device memory for unified addressing, while its graph lives -- */

struct graph_range {
    struct graph_range *next;
    CUgraph graph;
    CUgraphNode node;
    CUdeviceptr dptr;
};

static struct graph_range *ranges; /* under kept_lock */

static void ranges_drop(CUgraph graph, CUgraphNode node) {
    for (struct graph_range **at = &ranges; *at;) {
        struct graph_range *entry = *at;
        if ((graph && entry->graph == graph) || (node && entry->node == node)) {
            *at = entry->next;
            orion_range_remove(entry->dptr);
            free(entry);
        } else {
            at = &entry->next;
        }
    }
}

void orion_graph_node_made(CUgraphNode node) { orion_graph_queries_node_gone(node); }

void orion_graph_kernel_params_set(CUgraphNode node) {
    pthread_mutex_lock(&kept_lock);
    kept_drop(of_kernel, node);
    pthread_mutex_unlock(&kept_lock);
}

void orion_graph_queries_node_gone(CUgraphNode node) {
    if (!node) return;
    orion_batch_node_forget(node);
    pthread_mutex_lock(&kept_lock);
    kept_drop(of_node, node);
    ranges_drop(NULL, node);
    pthread_mutex_unlock(&kept_lock);
}

void orion_graph_queries_graph_gone(CUgraph graph) {
    if (!graph) return;
    pthread_mutex_lock(&kept_lock);
    kept_drop(of_graph, graph);
    ranges_drop(graph, NULL);
    pthread_mutex_unlock(&kept_lock);
}

/* How many nodes' asked-back parameters the library keeps now (tests/differential/test_graph_queries.py). */
size_t orion_graph_kept(void);
size_t orion_graph_kept(void) {
    pthread_mutex_lock(&kept_lock);
    size_t count = kept_count;
    pthread_mutex_unlock(&kept_lock);
    return count;
}

/* --- node parameters asked back -------------------------------------------------------------------------------- */

static const char kernel_extra[] = "cuGraphKernelNodeGetParams once a launch or kernel node of this process was given "
    "`extra` (whether a node holds kernelParams or extra is not kept)";

/* kernelParams over a copy of the packed values: `count` pointers, then the values (key: u32 count, the offsets,
 * the values). */
static void *build_kernel_params(const uint8_t *key, size_t len, const void *unused) {
    (void)unused;
    uint32_t count = orion_get_u32(key);
    size_t head = ORION_LENGTH_BYTES + 4 * (size_t)count, values = len - head;
    void **pointers = malloc(count * sizeof(void *) + values + 1);
    if (!pointers) return NULL;
    uint8_t *copy = (uint8_t *)(pointers + count);
    memcpy(copy, key + head, values);
    for (uint32_t i = 0; i < count; i++) pointers[i] = copy + orion_get_u32(key + ORION_LENGTH_BYTES + 4 * (size_t)i);
    return pointers;
}

CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params) {
    ORION_ENTRY("cuGraphKernelNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load_explicit(&extra_given, memory_order_relaxed)) return orion_not_forwarded(kernel_extra);
    uint8_t req[ORION_REQ_cuGraphKernelNodeGetParams_SIZE], rep[ORION_REP_cuGraphKernelNodeGetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphKernelNodeGetParams_node, word_of(node));
    size_t cap = ORION_LENGTH_BYTES + 4 * (size_t)MAX_PARAM_COUNT + ORION_MAX_PARAM_BYTES, got = 0;
    uint8_t *tail = malloc(cap);
    if (!tail) return CUDA_ERROR_OUT_OF_MEMORY;
    struct orion_piece piece = { req, sizeof req };
    int status = orion_thread_forwardv(ORION_OP_cuGraphKernelNodeGetParams, &piece, 1, rep, sizeof rep, tail, cap,
                                       &got, 0);
    if (status != CUDA_SUCCESS) {
        free(tail);
        return status;
    }
#define KERNEL_REP(field) (rep + ORION_REP_cuGraphKernelNodeGetParams_KERNEL_NODE + ORION_KERNEL_NODE_##field)
    uint32_t count = got >= ORION_LENGTH_BYTES ? orion_get_u32(tail) : 0;
    size_t head = ORION_LENGTH_BYTES + 4 * (size_t)count;
    int given = (int)orion_get_u32(rep + ORION_REP_cuGraphKernelNodeGetParams_given);
    int bad = got < ORION_LENGTH_BYTES || count > MAX_PARAM_COUNT || head > got || (!given && got != head);
    for (uint32_t i = 0; !bad && i < count; i++) /* each parameter's first byte among the values */
        bad = orion_get_u32(tail + ORION_LENGTH_BYTES + 4 * (size_t)i) >= got - head;
    void **kernel_params = NULL;
    if (bad) {
        status = malformed("cuGraphKernelNodeGetParams");
    } else if (given) {
        CUgraph graph = (CUgraph)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphKernelNodeGetParams_graph);
        kernel_params = keep(node, graph, KEPT_KERNEL, tail, got, build_kernel_params, NULL, &status);
    }
    free(tail);
    if (status != CUDA_SUCCESS) return status;
    params->func = (CUfunction)(uintptr_t)orion_get_u64(KERNEL_REP(function));
    params->kern = (CUkernel)(uintptr_t)orion_get_u64(KERNEL_REP(kernel));
    params->ctx = (CUcontext)(uintptr_t)orion_get_u64(KERNEL_REP(context));
    params->gridDimX = orion_get_u32(KERNEL_REP(grid_x));
    params->gridDimY = orion_get_u32(KERNEL_REP(grid_y));
    params->gridDimZ = orion_get_u32(KERNEL_REP(grid_z));
    params->blockDimX = orion_get_u32(KERNEL_REP(block_x));
    params->blockDimY = orion_get_u32(KERNEL_REP(block_y));
    params->blockDimZ = orion_get_u32(KERNEL_REP(block_z));
    params->sharedMemBytes = orion_get_u32(KERNEL_REP(shared_bytes));
#undef KERNEL_REP
    params->kernelParams = kernel_params;
    params->extra = NULL;
    return CUDA_SUCCESS;
}

CUresult cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS *params) {
    ORION_ENTRY("cuGraphMemsetNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphMemsetNodeGetParams_SIZE], rep[ORION_REP_cuGraphMemsetNodeGetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphMemsetNodeGetParams_node, word_of(node));
    int status = hand_forward(ORION_OP_cuGraphMemsetNodeGetParams, req, sizeof req, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    const uint8_t *p = rep + ORION_REP_cuGraphMemsetNodeGetParams_MEMSET_NODE;
    params->dst = orion_get_u64(p + ORION_MEMSET_NODE_dst);
    params->pitch = orion_get_u64(p + ORION_MEMSET_NODE_pitch);
    params->value = orion_get_u32(p + ORION_MEMSET_NODE_value);
    params->elementSize = orion_get_u32(p + ORION_MEMSET_NODE_element_size);
    params->width = orion_get_u64(p + ORION_MEMSET_NODE_width);
    params->height = orion_get_u64(p + ORION_MEMSET_NODE_height);
    return CUDA_SUCCESS;
}

/* One side of a copy from where a reply has it (ORION_MEMCPY_3D_src or _dst from its MEMCPY_3D). */
static void get_side(const uint8_t *p, size_t *x, size_t *y, size_t *z, size_t *lod, int *type, void **host,
                     CUdeviceptr *device, size_t *pitch, size_t *height) {
    *x = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_x);
    *y = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_y);
    *z = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_z);
    *lod = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_lod);
    *type = (int)orion_get_u32(p + ORION_MEMCPY_3D_SIDE_type);
    *host = (void *)(uintptr_t)orion_get_u64(p + ORION_MEMCPY_3D_SIDE_host);
    *device = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_device);
    *pitch = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_pitch);
    *height = orion_get_u64(p + ORION_MEMCPY_3D_SIDE_height);
}

CUresult cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D *params) {
    ORION_ENTRY("cuGraphMemcpyNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphMemcpyNodeGetParams_SIZE], rep[ORION_REP_cuGraphMemcpyNodeGetParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphMemcpyNodeGetParams_node, word_of(node));
    int status = hand_forward(ORION_OP_cuGraphMemcpyNodeGetParams, req, sizeof req, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    const uint8_t *p = rep + ORION_REP_cuGraphMemcpyNodeGetParams_MEMCPY_3D;
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c); /* no arrays travel; the reserved pointers stay NULL */
    void *src_host;
    get_side(p + ORION_MEMCPY_3D_src, &c.srcXInBytes, &c.srcY, &c.srcZ, &c.srcLOD, &c.srcMemoryType, &src_host,
             &c.srcDevice, &c.srcPitch, &c.srcHeight);
    c.srcHost = src_host;
    get_side(p + ORION_MEMCPY_3D_dst, &c.dstXInBytes, &c.dstY, &c.dstZ, &c.dstLOD, &c.dstMemoryType, &c.dstHost,
             &c.dstDevice, &c.dstPitch, &c.dstHeight);
    c.WidthInBytes = orion_get_u64(p + ORION_MEMCPY_3D_width);
    c.Height = orion_get_u64(p + ORION_MEMCPY_3D_height);
    c.Depth = orion_get_u64(p + ORION_MEMCPY_3D_depth);
    *params = c;
    return CUDA_SUCCESS;
}

/* accessDescs over a copy of the reply's descriptors (key: their bytes, each a CUmemAccessDesc already). */
static void *build_access(const uint8_t *key, size_t len, const void *unused) {
    (void)unused;
    CUmemAccessDesc *descs = malloc(len ? len : 1);
    if (descs) memcpy(descs, key, len);
    return descs;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    ORION_ENTRY("cuGraphMemAllocNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
#define ALLOC_REP(field) (rep + ORION_REP_cuGraphMemAllocNodeGetParams_##field)
    uint8_t req[ORION_REQ_cuGraphMemAllocNodeGetParams_SIZE], rep[ORION_REP_cuGraphMemAllocNodeGetParams_SIZE];
    uint8_t tail[ORION_LENGTH_BYTES + MAX_ACCESS_DESCS * sizeof(CUmemAccessDesc)];
    orion_put_u64(req + ORION_REQ_cuGraphMemAllocNodeGetParams_node, word_of(node));
    struct orion_piece piece = { req, sizeof req };
    size_t got = 0;
    int status = orion_thread_forwardv(ORION_OP_cuGraphMemAllocNodeGetParams, &piece, 1, rep, sizeof rep, tail,
                                       sizeof tail, &got, 0);
    if (status != CUDA_SUCCESS) return status;
    uint32_t count = got >= ORION_LENGTH_BYTES ? orion_get_u32(tail) : 0;
    if (got < ORION_LENGTH_BYTES || count > MAX_ACCESS_DESCS || got != ORION_LENGTH_BYTES + count * sizeof(CUmemAccessDesc))
        return malformed("cuGraphMemAllocNodeGetParams");
    const CUmemAccessDesc *descs = NULL;
    if (count) {
        CUgraph graph = (CUgraph)(uintptr_t)orion_get_u64(ALLOC_REP(graph));
        descs = keep(node, graph, KEPT_ACCESS, tail + ORION_LENGTH_BYTES, count * sizeof(CUmemAccessDesc),
                     build_access, NULL, &status);
        if (status != CUDA_SUCCESS) return status;
    }
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = orion_get_i32(ALLOC_REP(kind));
    props.handleTypes = orion_get_i32(ALLOC_REP(handle_types));
    props.location.type = orion_get_i32(ALLOC_REP(location_kind));
    props.location.id = orion_get_i32(ALLOC_REP(location));
    props.maxSize = orion_get_u64(ALLOC_REP(max_size));
    props.usage = orion_get_u16(ALLOC_REP(usage));
    props.gpuDirectRDMACapable = orion_get_u8(ALLOC_REP(rdma_capable));
    params->poolProps = props;
    params->accessDescs = descs;
    params->accessDescCount = count;
    params->bytesize = orion_get_u64(ALLOC_REP(bytesize));
    params->dptr = orion_get_u64(ALLOC_REP(dptr));
#undef ALLOC_REP
    return CUDA_SUCCESS;
}

static const char conditional_unknown[] = "cuGraphNodeGetParams of a conditional node this library did not make (its "
    "phGraph_out array is the one cuGraphAddNode handed out)";

CUresult cuGraphNodeGetParams(CUgraphNode node, CUgraphNodeParams *params) {
    ORION_ENTRY("cuGraphNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
#define NODE_REP(field) (rep + ORION_REP_cuGraphNodeGetParams_##field)
    uint8_t req[ORION_REQ_cuGraphNodeGetParams_SIZE], rep[ORION_REP_cuGraphNodeGetParams_SIZE];
    uint8_t tail[ORION_LENGTH_BYTES + 64 * ORION_REP_cuGraphNodeGetParams_graphs_ITEM]; /* MAX_CONDITIONAL_BODIES */
    orion_put_u64(req + ORION_REQ_cuGraphNodeGetParams_node, word_of(node));
    struct orion_piece piece = { req, sizeof req };
    size_t got = 0;
    int status = orion_thread_forwardv(ORION_OP_cuGraphNodeGetParams, &piece, 1, rep, sizeof rep, tail, sizeof tail,
                                       &got, 0);
    if (status != CUDA_SUCCESS) return status;
    uint32_t listed = got >= ORION_LENGTH_BYTES ? orion_get_u32(tail) : 0;
    if (got < ORION_LENGTH_BYTES || got != ORION_LENGTH_BYTES + (size_t)listed * ORION_REP_cuGraphNodeGetParams_graphs_ITEM)
        return malformed("cuGraphNodeGetParams");
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = orion_get_i32(NODE_REP(type));
    CUcontext context = (CUcontext)(uintptr_t)orion_get_u64(NODE_REP(context));
    switch (p.type) {
    case NODE_KERNEL: status = cuGraphKernelNodeGetParams(node, &p.kernel); break;
    case NODE_MEMSET:
        status = cuGraphMemsetNodeGetParams(node, &p.fill.params);
        p.fill.ctx = context;
        break;
    case NODE_MEMCPY:
        status = cuGraphMemcpyNodeGetParams(node, &p.copy.copyParams);
        p.copy.copyCtx = context;
        break;
    case NODE_MEM_ALLOC: status = cuGraphMemAllocNodeGetParams(node, &p.alloc); break;
    case NODE_MEM_FREE: p.mem_free = orion_get_u64(NODE_REP(dptr)); break;
    case NODE_EMPTY: break;
    case NODE_GRAPH:
        p.child.graph = (CUgraph)(uintptr_t)orion_get_u64(NODE_REP(child));
        p.child.ownership = (int)orion_get_u32(NODE_REP(ownership));
        break;
    case NODE_EVENT_RECORD: case NODE_WAIT_EVENT:
        p.event.event = (CUevent)(uintptr_t)orion_get_u64(NODE_REP(event));
        break;
    case NODE_CONDITIONAL:
        p.conditional.handle = orion_get_u64(NODE_REP(handle));
        p.conditional.type = orion_get_i32(NODE_REP(cond_type));
        p.conditional.size = orion_get_u32(NODE_REP(size));
        p.conditional.ctx = context;
        p.conditional.phGraph_out = orion_graph_conditional_bodies(node, p.conditional.size);
        if (!p.conditional.phGraph_out || listed != p.conditional.size) {
            status = orion_not_forwarded(conditional_unknown);
            break;
        }
        for (uint32_t i = 0; i < listed; i++) /* the host's bodies are the ones kept for the node */
            if (word_of(p.conditional.phGraph_out[i]) !=
                orion_get_u64(tail + ORION_LENGTH_BYTES + (size_t)i * ORION_REP_cuGraphNodeGetParams_graphs_ITEM))
                status = orion_not_forwarded(conditional_unknown);
        break;
    default: status = malformed("cuGraphNodeGetParams"); /* the host carries no other type */
    }
#undef NODE_REP
    if (status == CUDA_SUCCESS) *params = p;
    return status;
}

/* --- kernel node attributes ------------------------------------------------------------------------------------ */

static const char attribute_not_forwarded[] = "a graph kernel node attribute other than the plain-valued launch "
    "attributes (an event, DEVICE_UPDATABLE_KERNEL_NODE, or one newer than the call table)";

static int attribute_forwarded(int attribute) {
    if (attribute >= 0 && attribute < 64 && (ORION_KERNEL_NODE_ATTRIBUTES_FORWARDED >> attribute & 1))
        return CUDA_SUCCESS;
    return orion_not_forwarded(attribute_not_forwarded);
}

CUresult cuGraphKernelNodeGetAttribute(CUgraphNode node, CUkernelNodeAttrID attr, CUkernelNodeAttrValue *value) {
    ORION_ENTRY("cuGraphKernelNodeGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    int status = attribute_forwarded(attr);
    if (status != CUDA_SUCCESS) return status;
    uint8_t req[ORION_REQ_cuGraphKernelNodeGetAttribute_SIZE], got_value[ATTRIBUTE_BYTES];
    orion_put_u64(req + ORION_REQ_cuGraphKernelNodeGetAttribute_node, word_of(node));
    orion_put_i32(req + ORION_REQ_cuGraphKernelNodeGetAttribute_attribute, attr);
    struct orion_piece piece = { req, sizeof req };
    size_t got = 0;
    status = orion_thread_forwardv(ORION_OP_cuGraphKernelNodeGetAttribute, &piece, 1, NULL, 0, got_value,
                                   sizeof got_value, &got, 0);
    if (status != CUDA_SUCCESS) return status;
    if (got != ATTRIBUTE_BYTES) return malformed("cuGraphKernelNodeGetAttribute");
    memcpy(value->bytes, got_value, ATTRIBUTE_BYTES);
    return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID attr, CUkernelNodeAttrValue const *value) {
    ORION_ENTRY("cuGraphKernelNodeSetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    int status = attribute_forwarded(attr);
    if (status != CUDA_SUCCESS) return status;
    uint8_t req[ORION_REQ_cuGraphKernelNodeSetAttribute_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphKernelNodeSetAttribute_node, word_of(node));
    orion_put_i32(req + ORION_REQ_cuGraphKernelNodeSetAttribute_attribute, attr);
    struct orion_piece pieces[2] = { { req, sizeof req }, { value->bytes, ATTRIBUTE_BYTES } };
    return hand_forwardv(ORION_OP_cuGraphKernelNodeSetAttribute, pieces, 2, NULL, 0);
}

/* --- capture into a given graph -------------------------------------------------------------------------------- */

/* A request of `head` (its scalars and the dependencies' count), the dependencies and the edge data (counted; none
 * where `edges` is NULL), each sent from the caller's array. */
static int capture_call(uint32_t opcode, const char *call, uint8_t *head, size_t head_len, size_t count_at,
                        CUgraphNode const *deps, CUgraphEdgeData const *edges, size_t count) {
    if (count && !deps) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_graph_too_many(call, count);
    if (status != CUDA_SUCCESS) return status;
    size_t data = edges ? count : 0;
    uint8_t listed[ORION_LENGTH_BYTES];
    orion_put_u32(head + count_at, (uint32_t)count);
    orion_put_u32(listed, (uint32_t)data);
    struct orion_piece pieces[4] = { { head, head_len }, { count ? deps : NULL, count * sizeof *deps },
                                     { listed, sizeof listed }, { data ? edges : NULL, data * sizeof *edges } };
    return hand_forwardv(opcode, pieces, 4, NULL, 0);
}

_Static_assert(ORION_REQ_cuStreamBeginCaptureToGraph_deps == ORION_REQ_cuStreamBeginCaptureToGraph_SIZE &&
               ORION_REQ_cuStreamUpdateCaptureDependencies_deps == ORION_REQ_cuStreamUpdateCaptureDependencies_SIZE,
               "the dependencies' count right after each fixed part");

CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, CUgraphNode const *deps,
                                     CUgraphEdgeData const *edges, size_t count, CUstreamCaptureMode mode) {
    ORION_ENTRY("cuStreamBeginCaptureToGraph");
    uint8_t head[ORION_REQ_cuStreamBeginCaptureToGraph_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuStreamBeginCaptureToGraph_stream, word_of(stream));
    orion_put_u64(head + ORION_REQ_cuStreamBeginCaptureToGraph_graph, word_of(graph));
    orion_put_i32(head + ORION_REQ_cuStreamBeginCaptureToGraph_mode, mode);
    CUresult status = capture_call(ORION_OP_cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", head,
                                   sizeof head, ORION_REQ_cuStreamBeginCaptureToGraph_deps, deps, edges, count);
    orion_capture_began(status, word_of(stream), (int)mode);
    return status;
}

CUresult cuStreamUpdateCaptureDependencies(CUstream stream, CUgraphNode *deps, CUgraphEdgeData const *edges,
                                           size_t count, unsigned int flags) {
    ORION_ENTRY("cuStreamUpdateCaptureDependencies");
    uint8_t head[ORION_REQ_cuStreamUpdateCaptureDependencies_SIZE + ORION_LENGTH_BYTES];
    orion_put_u64(head + ORION_REQ_cuStreamUpdateCaptureDependencies_stream, word_of(stream));
    orion_put_u32(head + ORION_REQ_cuStreamUpdateCaptureDependencies_flags, flags);
    return capture_call(ORION_OP_cuStreamUpdateCaptureDependencies, "cuStreamUpdateCaptureDependencies", head,
                        sizeof head, ORION_REQ_cuStreamUpdateCaptureDependencies_deps, deps, edges, count);
}

/* --- instantiation with parameters ----------------------------------------------------------------------------- */

CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    ORION_ENTRY("cuGraphInstantiateWithParams");
    if (!exec || !params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphInstantiateWithParams_SIZE], rep[ORION_REP_cuGraphInstantiateWithParams_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphInstantiateWithParams_graph, word_of(graph));
    orion_put_u64(req + ORION_REQ_cuGraphInstantiateWithParams_flags, params->flags);
    orion_put_u64(req + ORION_REQ_cuGraphInstantiateWithParams_upload_stream, word_of(params->hUploadStream));
    int status = hand_forward(ORION_OP_cuGraphInstantiateWithParams, req, sizeof req, rep, sizeof rep);
    if (status == CUDA_SUCCESS) {
        *exec = (CUgraphExec)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphInstantiateWithParams_exec);
        params->result_out = orion_get_i32(rep + ORION_REP_cuGraphInstantiateWithParams_result);
        params->hErrNode_out =
            (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphInstantiateWithParams_error_node);
    } else { /* a failed reply carries no result information (see the top of this file) */
        params->result_out = INSTANTIATE_ERROR;
        params->hErrNode_out = NULL;
    }
    return status;
}

/* --- memory allocation and free nodes -------------------------------------------------------------------------- */

static const char pool_reserved[] = "a graph memory allocation node whose pool properties have reserved bytes set "
    "(fields the call table does not carry)";

CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    ORION_ENTRY("cuGraphAddMemAllocNode");
    if (!node || !params || (count && !deps)) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_graph_too_many("cuGraphAddMemAllocNode", count);
    if (status != CUDA_SUCCESS) return status;
    const CUmemPoolProps *props = &params->poolProps;
    for (size_t i = 0; i < sizeof props->reserved; i++)
        if (props->reserved[i]) return orion_not_forwarded(pool_reserved);
    size_t access = params->accessDescCount;
    if (access > MAX_ACCESS_DESCS || (access && !params->accessDescs)) return CUDA_ERROR_INVALID_VALUE;
#define ALLOC_REQ(field) (head + ORION_REQ_cuGraphAddMemAllocNode_##field)
    uint8_t head[ORION_REQ_cuGraphAddMemAllocNode_SIZE + ORION_LENGTH_BYTES], listed[ORION_LENGTH_BYTES];
    uint8_t rep[ORION_REP_cuGraphAddMemAllocNode_SIZE];
    orion_put_u64(ALLOC_REQ(graph), word_of(graph));
    orion_put_i32(ALLOC_REQ(kind), props->allocType);
    orion_put_i32(ALLOC_REQ(handle_types), props->handleTypes);
    orion_put_i32(ALLOC_REQ(location_kind), props->location.type);
    orion_put_i32(ALLOC_REQ(location), props->location.id);
    orion_put_u64(ALLOC_REQ(max_size), props->maxSize);
    orion_put_u16(ALLOC_REQ(usage), props->usage);
    orion_put_u8(ALLOC_REQ(rdma_capable), props->gpuDirectRDMACapable);
    orion_put_u64(ALLOC_REQ(bytesize), params->bytesize);
    orion_put_u32(ALLOC_REQ(deps), (uint32_t)count);
#undef ALLOC_REQ
    _Static_assert(ORION_REQ_cuGraphAddMemAllocNode_deps == ORION_REQ_cuGraphAddMemAllocNode_SIZE,
                   "the dependencies' count right after the fixed part");
    orion_put_u32(listed, (uint32_t)access);
    struct orion_piece pieces[4] = { { head, sizeof head }, { count ? deps : NULL, count * sizeof *deps },
                                     { listed, sizeof listed },
                                     { access ? params->accessDescs : NULL, access * sizeof(CUmemAccessDesc) } };
    status = hand_forwardv(ORION_OP_cuGraphAddMemAllocNode, pieces, 4, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    CUgraphNode made = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphAddMemAllocNode_node);
    CUdeviceptr dptr = orion_get_u64(rep + ORION_REP_cuGraphAddMemAllocNode_dptr);
    orion_graph_node_made(made);
    struct graph_range *range = malloc(sizeof *range);
    if (range) { /* device memory for unified addressing while its graph lives (else the host still judges it) */
        *range = (struct graph_range){ NULL, graph, made, dptr };
        pthread_mutex_lock(&kept_lock);
        range->next = ranges;
        ranges = range;
        orion_range_reserve(dptr, params->bytesize); /* device memory only while its allocation lives */
        pthread_mutex_unlock(&kept_lock);
    }
    params->dptr = dptr;
    *node = made;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                               CUdeviceptr dptr) {
    ORION_ENTRY("cuGraphAddMemFreeNode");
    if (!node || (count && !deps)) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_graph_too_many("cuGraphAddMemFreeNode", count);
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuGraphAddMemFreeNode_SIZE + ORION_LENGTH_BYTES], rep[ORION_REP_cuGraphAddMemFreeNode_SIZE];
    orion_put_u64(head + ORION_REQ_cuGraphAddMemFreeNode_graph, word_of(graph));
    orion_put_u64(head + ORION_REQ_cuGraphAddMemFreeNode_dptr, dptr);
    orion_put_u32(head + ORION_REQ_cuGraphAddMemFreeNode_deps, (uint32_t)count);
    struct orion_piece pieces[2] = { { head, sizeof head }, { count ? deps : NULL, count * sizeof *deps } };
    status = hand_forwardv(ORION_OP_cuGraphAddMemFreeNode, pieces, 2, rep, sizeof rep);
    if (status != CUDA_SUCCESS) return status;
    *node = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphAddMemFreeNode_node);
    orion_graph_node_made(*node);
    return CUDA_SUCCESS;
}

/* --- graph memory attributes ----------------------------------------------------------------------------------- */

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value) {
    ORION_ENTRY("cuDeviceGetGraphMemAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceGetGraphMemAttribute_SIZE], rep[ORION_REP_cuDeviceGetGraphMemAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceGetGraphMemAttribute_device, device);
    orion_put_i32(req + ORION_REQ_cuDeviceGetGraphMemAttribute_attribute, attr);
    int status = hand_forward(ORION_OP_cuDeviceGetGraphMemAttribute, req, sizeof req, rep, sizeof rep);
    if (status == CUDA_SUCCESS) /* every attribute's value is a cuuint64_t (cuda.h) */
        *(cuuint64_t *)value = orion_get_u64(rep + ORION_REP_cuDeviceGetGraphMemAttribute_value);
    return status;
}

CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value) {
    ORION_ENTRY("cuDeviceSetGraphMemAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuDeviceSetGraphMemAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuDeviceSetGraphMemAttribute_device, device);
    orion_put_i32(req + ORION_REQ_cuDeviceSetGraphMemAttribute_attribute, attr);
    orion_put_u64(req + ORION_REQ_cuDeviceSetGraphMemAttribute_value, *(const cuuint64_t *)value);
    return hand_forward(ORION_OP_cuDeviceSetGraphMemAttribute, req, sizeof req, NULL, 0);
}

/* --- the DOT description --------------------------------------------------------------------------------------- */

CUresult cuGraphDebugDotPrint(CUgraph graph, char const *path, unsigned int flags) {
    ORION_ENTRY("cuGraphDebugDotPrint");
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuGraphDebugDotPrint_SIZE];
    orion_put_u64(req + ORION_REQ_cuGraphDebugDotPrint_graph, word_of(graph));
    orion_put_u32(req + ORION_REQ_cuGraphDebugDotPrint_flags, flags);
    char *text = malloc(MAX_DOT_BYTES); /* pages are touched only as the reply fills them */
    if (!text) return CUDA_ERROR_OUT_OF_MEMORY;
    struct orion_piece piece = { req, sizeof req };
    size_t got = 0;
    int status = orion_thread_forwardv(ORION_OP_cuGraphDebugDotPrint, &piece, 1, NULL, 0, text, MAX_DOT_BYTES, &got,
                                       0);
    if (status == CUDA_SUCCESS) {
        FILE *out = fopen(path, "wb");
        if (!out || fwrite(text, 1, got, out) != got) status = ERROR_OPERATING_SYSTEM;
        if (out && fclose(out) != 0) status = ERROR_OPERATING_SYSTEM;
    }
    free(text);
    return status;
}

/* --- the ABIs of callers built against older CUDA (graph_calls.c's orion_graph_versioned_entry asks here) -------- */

typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
} kernel_node_params_v1;

static CUresult kernel_node_get_params_v1(CUgraphNode node, kernel_node_params_v1 *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS current;
    CUresult status = cuGraphKernelNodeGetParams(node, &current);
    if (status == CUDA_SUCCESS)
        *params = (kernel_node_params_v1){ current.func, current.gridDimX, current.gridDimY, current.gridDimZ,
                                           current.blockDimX, current.blockDimY, current.blockDimZ,
                                           current.sharedMemBytes, current.kernelParams, current.extra };
    return status;
}

static CUresult update_capture_dependencies_v1(CUstream stream, CUgraphNode *deps, size_t count, unsigned int flags) {
    return cuStreamUpdateCaptureDependencies(stream, deps, NULL, count, flags);
}

void *orion_graph_queries_versioned_entry(const char *symbol, int version) {
    static const struct { const char *name; int since; void *older; } entries[] = {
        { "cuGraphKernelNodeGetParams", 12000, (void *)kernel_node_get_params_v1 },
        { "cuStreamUpdateCaptureDependencies", 12030, (void *)update_capture_dependencies_v1 },
    };
    if (!symbol) return NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (version < entries[i].since && strcmp(symbol, entries[i].name) == 0) return entries[i].older;
    return NULL;
}

/* batch_mem_ops.c: cuStreamBatchMemOp and the batch memory-operation nodes (cuGraphAddBatchMemOpNode, its
 * Get/SetParams, cuGraphExecBatchMemOpNodeSetParams) for the native guest driver.
 *
 * Each CUstreamBatchMemOpParams travels as driver_api.BATCH_MEM_OP (orion_layouts.h places it): its operation, its
 * flags, the address and value of a wait or a write (a 32-bit one's value read as the union's 32 bits, never its 64).
 * A barrier or a flush of remote writes travels with its flags only. The host checks every address against the
 * session's memory, as it checks a single stream memory operation's (host_agent/session/batch_mem_ops.py). An atomic
 * reduction (CUDA 13's CU_STREAM_MEM_OP_ATOMIC_REDUCTION) answers 801, named once; an operation cuda.h does not have
 * answers CUDA_ERROR_INVALID_VALUE, before anything is sent.
 *
 * cuStreamBatchMemOp is posted, as cuStreamWriteValue32 and cuStreamWaitValue32 are: a refusal by the host surfaces at
 * the next synchronising call. cuGraphBatchMemOpNodeGetParams hands back an array the node owns (cuda.h): this library
 * keeps one per node asked, until the node is asked again, its parameters are set, or the node's handle is given for a
 * new node (the hooks graph_queries.c calls); a destroyed graph's arrays stay until then.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_structs.h"
#include "hand_calls.h"

enum { /* CUstreamBatchMemOpType */
    WAIT_VALUE_32 = 1, WRITE_VALUE_32 = 2, FLUSH_REMOTE_WRITES = 3, WAIT_VALUE_64 = 4, WRITE_VALUE_64 = 5,
    BARRIER = 6, ATOMIC_REDUCTION = 8,
};

/* Every request's ops list has one item layout: cuStreamBatchMemOp's. */
#define OP(field) ORION_REQ_cuStreamBatchMemOp_ops_##field
#define SAME_OPS(payload, call) (ORION_##payload##_##call##_ops_ITEM == OP(ITEM) \
                                 && ORION_##payload##_##call##_ops_ITEM_3 == OP(ITEM_3))
_Static_assert(SAME_OPS(REQ, cuGraphAddBatchMemOpNode) && SAME_OPS(REP, cuGraphBatchMemOpNodeGetParams) &&
               SAME_OPS(REQ, cuGraphBatchMemOpNodeSetParams) && SAME_OPS(REQ, cuGraphExecBatchMemOpNodeSetParams) &&
               OP(ITEM_0) == 0 && OP(ITEM_1) == 4 && OP(ITEM_2) == 8, "one packing of an operation");

static int is_value_op(int operation) {
    return operation == WAIT_VALUE_32 || operation == WRITE_VALUE_32 || operation == WAIT_VALUE_64 ||
           operation == WRITE_VALUE_64;
}

/* `count` operations into `items` (the list's count first), checked: a CUresult. */
static int pack_ops(const CUstreamBatchMemOpParams *ops, unsigned int count, uint8_t *items) {
    orion_put_u32(items, count);
    for (unsigned int i = 0; i < count; i++) {
        const CUstreamBatchMemOpParams *op = &ops[i];
        uint8_t *item = items + ORION_LENGTH_BYTES + (size_t)i * OP(ITEM);
        uint64_t address = 0, value = 0;
        unsigned int flags;
        if (is_value_op(op->operation)) {
            address = op->waitValue.address;
            int wide = op->operation == WAIT_VALUE_64 || op->operation == WRITE_VALUE_64;
            value = wide ? op->waitValue.value64 : op->waitValue.value;
            flags = op->waitValue.flags;
        } else if (op->operation == BARRIER || op->operation == FLUSH_REMOTE_WRITES) {
            flags = op->memoryBarrier.flags;
        } else if (op->operation == ATOMIC_REDUCTION) {
            return orion_not_forwarded("a batch memory operation CU_STREAM_MEM_OP_ATOMIC_REDUCTION");
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        }
        orion_put_i32(item + OP(ITEM_0), op->operation);
        orion_put_u32(item + OP(ITEM_1), flags);
        orion_put_u64(item + OP(ITEM_2), address);
        orion_put_u64(item + OP(ITEM_3), value);
    }
    return CUDA_SUCCESS;
}

/* The packed ops of a call (malloc'ed into *items, freed by the caller), checked as the driver checks an array. */
static int ops_of(const char *call, const CUstreamBatchMemOpParams *ops, unsigned int count, uint8_t **items,
                  size_t *len) {
    *items = NULL;
    if (count && !ops) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_graph_too_many(call, count);
    if (status != CUDA_SUCCESS) return status;
    *len = ORION_LENGTH_BYTES + (size_t)count * OP(ITEM);
    *items = malloc(*len);
    if (!*items) return CUDA_ERROR_OUT_OF_MEMORY;
    status = pack_ops(ops, count, *items);
    if (status != CUDA_SUCCESS) {
        free(*items);
        *items = NULL;
    }
    return status;
}

CUresult cuStreamBatchMemOp(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *ops, unsigned int flags) {
    ORION_ENTRY("cuStreamBatchMemOp");
    uint8_t *items;
    size_t len;
    int status = ops_of("cuStreamBatchMemOp", ops, count, &items, &len);
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuStreamBatchMemOp_SIZE];
    orion_put_u64(head + ORION_REQ_cuStreamBatchMemOp_stream, (uint64_t)(uintptr_t)stream);
    orion_put_u32(head + ORION_REQ_cuStreamBatchMemOp_flags, flags);
    struct orion_piece pieces[2] = { { head, sizeof head }, { items, len } };
    status = hand_send(ORION_OP_cuStreamBatchMemOp, ORION_POSTED_cuStreamBatchMemOp, pieces, 2);
    free(items);
    return status;
}

/* --- nodes ------------------------------------------------------------------------------------------------------ */

/* The arrays cuGraphBatchMemOpNodeGetParams handed out, by node. */
struct kept {
    struct kept *next;
    CUgraphNode node;
    CUstreamBatchMemOpParams *ops;
};
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept *kept;

void orion_batch_node_forget(CUgraphNode node) {
    pthread_mutex_lock(&kept_lock);
    for (struct kept **at = &kept; *at;) {
        struct kept *k = *at;
        if (k->node != node) {
            at = &k->next;
            continue;
        }
        *at = k->next;
        free(k->ops);
        free(k);
    }
    pthread_mutex_unlock(&kept_lock);
}

/* A node's ops packed (into *items, malloc'ed), the parameters checked first. */
static int params_pieces(const char *call, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p, uint8_t **items, size_t *len) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return ops_of(call, p->paramArray, p->count, items, len);
}

CUresult cuGraphAddBatchMemOpNode(CUgraphNode *node, CUgraph graph, CUgraphNode const *deps, size_t count,
                                  CUDA_BATCH_MEM_OP_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphAddBatchMemOpNode");
    if (!node || (count && !deps)) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_graph_too_many("cuGraphAddBatchMemOpNode", count);
    uint8_t *items = NULL;
    size_t len = 0;
    if (status == CUDA_SUCCESS) status = params_pieces("cuGraphAddBatchMemOpNode", params, &items, &len);
    if (status != CUDA_SUCCESS) return status;
    uint8_t head[ORION_REQ_cuGraphAddBatchMemOpNode_SIZE], listed[ORION_LENGTH_BYTES];
    uint8_t rep[ORION_REP_cuGraphAddBatchMemOpNode_SIZE];
    orion_put_u64(head + ORION_REQ_cuGraphAddBatchMemOpNode_graph, (uint64_t)(uintptr_t)graph);
    orion_put_u64(head + ORION_REQ_cuGraphAddBatchMemOpNode_context, (uint64_t)(uintptr_t)params->ctx);
    orion_put_u32(head + ORION_REQ_cuGraphAddBatchMemOpNode_flags, params->flags);
    orion_put_u32(listed, (uint32_t)count);
    struct orion_piece pieces[4] = { { head, sizeof head }, { items, len }, { listed, sizeof listed },
                                     { deps, count * sizeof *deps } };
    status = hand_forwardv(ORION_OP_cuGraphAddBatchMemOpNode, pieces, 4, rep, sizeof rep);
    free(items);
    if (status == CUDA_SUCCESS) {
        *node = (CUgraphNode)(uintptr_t)orion_get_u64(rep + ORION_REP_cuGraphAddBatchMemOpNode_node);
        orion_graph_node_made(*node);
    }
    return status;
}

/* The reply's ops (a counted list, right after its fixed part) into a new array the node owns. */
#define GET(field) ORION_REP_cuGraphBatchMemOpNodeGetParams_##field
_Static_assert(GET(ops) == GET(SIZE), "the ops right after the fixed part");
static int unpack_ops(const uint8_t *tail, size_t got, CUstreamBatchMemOpParams **ops, unsigned int *count) {
    if (got < ORION_LENGTH_BYTES) return CUDA_ERROR_UNKNOWN;
    uint32_t n = orion_get_u32(tail);
    if (got != ORION_LENGTH_BYTES + (size_t)n * OP(ITEM)) return CUDA_ERROR_UNKNOWN;
    *ops = calloc(n ? n : 1, sizeof **ops);
    if (!*ops) return CUDA_ERROR_OUT_OF_MEMORY;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *item = tail + ORION_LENGTH_BYTES + (size_t)i * OP(ITEM);
        CUstreamBatchMemOpParams *op = &(*ops)[i];
        op->operation = orion_get_i32(item + OP(ITEM_0));
        if (is_value_op(op->operation)) {
            op->waitValue.address = orion_get_u64(item + OP(ITEM_2));
            op->waitValue.value64 = orion_get_u64(item + OP(ITEM_3)); /* a 32-bit one's: zero-extended */
            op->waitValue.flags = orion_get_u32(item + OP(ITEM_1));
        } else {
            op->memoryBarrier.flags = orion_get_u32(item + OP(ITEM_1));
        }
    }
    *count = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphBatchMemOpNodeGetParams(CUgraphNode node, CUDA_BATCH_MEM_OP_NODE_PARAMS *params) {
    ORION_ENTRY("cuGraphBatchMemOpNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[ORION_REQ_cuGraphBatchMemOpNodeGetParams_SIZE], rep[GET(SIZE)];
    orion_put_u64(request + ORION_REQ_cuGraphBatchMemOpNodeGetParams_node, (uint64_t)(uintptr_t)node);
    size_t cap = ORION_LENGTH_BYTES + (size_t)(1 << 16) * OP(ITEM), got = 0; /* orion_graph_too_many's bound */
    uint8_t *tail = malloc(cap);
    if (!tail) return CUDA_ERROR_OUT_OF_MEMORY;
    struct orion_piece piece = { request, sizeof request };
    int status = orion_thread_forwardv(ORION_OP_cuGraphBatchMemOpNodeGetParams, &piece, 1, rep, sizeof rep, tail, cap,
                                       &got, 0);
    CUstreamBatchMemOpParams *ops = NULL;
    unsigned int count = 0;
    if (status == CUDA_SUCCESS) status = unpack_ops(tail, got, &ops, &count);
    free(tail);
    if (status == CUDA_ERROR_UNKNOWN && orion_first_time("batch node reply"))
        fprintf(stderr, "orion: cuGraphBatchMemOpNodeGetParams: the agent's reply does not read as the call table "
                        "declares it\n");
    struct kept *k = status == CUDA_SUCCESS ? malloc(sizeof *k) : NULL;
    if (status == CUDA_SUCCESS && !k) status = CUDA_ERROR_OUT_OF_MEMORY;
    if (status != CUDA_SUCCESS) {
        free(ops);
        return status;
    }
    orion_batch_node_forget(node); /* what was handed out for it before goes */
    *k = (struct kept){ NULL, node, ops };
    pthread_mutex_lock(&kept_lock);
    k->next = kept;
    kept = k;
    pthread_mutex_unlock(&kept_lock);
    params->ctx = (CUcontext)(uintptr_t)orion_get_u64(rep + GET(context));
    params->flags = orion_get_u32(rep + GET(flags));
    params->count = count;
    params->paramArray = ops;
    return CUDA_SUCCESS;
}

/* cuGraphBatchMemOpNodeSetParams's request after its handles (`head`: the node, or the exec and node). */
static int set_params(uint32_t opcode, const char *call, uint8_t *head, size_t head_len, size_t context_at,
                      size_t flags_at, const CUDA_BATCH_MEM_OP_NODE_PARAMS *params) {
    uint8_t *items = NULL;
    size_t len = 0;
    int status = params_pieces(call, params, &items, &len);
    if (status != CUDA_SUCCESS) return status;
    orion_put_u64(head + context_at, (uint64_t)(uintptr_t)params->ctx);
    orion_put_u32(head + flags_at, params->flags);
    struct orion_piece pieces[2] = { { head, head_len }, { items, len } };
    status = hand_forwardv(opcode, pieces, 2, NULL, 0);
    free(items);
    return status;
}

#define SET(field) ORION_REQ_cuGraphBatchMemOpNodeSetParams_##field
#define EXEC_SET(field) ORION_REQ_cuGraphExecBatchMemOpNodeSetParams_##field

CUresult cuGraphBatchMemOpNodeSetParams(CUgraphNode node, CUDA_BATCH_MEM_OP_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphBatchMemOpNodeSetParams");
    uint8_t head[SET(SIZE)];
    orion_put_u64(head + SET(node), (uint64_t)(uintptr_t)node);
    int status = set_params(ORION_OP_cuGraphBatchMemOpNodeSetParams, "cuGraphBatchMemOpNodeSetParams", head,
                            sizeof head, SET(context), SET(flags), params);
    if (status == CUDA_SUCCESS) orion_batch_node_forget(node); /* the node's array is the driver's new one */
    return status;
}

CUresult cuGraphExecBatchMemOpNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                            CUDA_BATCH_MEM_OP_NODE_PARAMS const *params) {
    ORION_ENTRY("cuGraphExecBatchMemOpNodeSetParams");
    uint8_t head[EXEC_SET(SIZE)];
    orion_put_u64(head + EXEC_SET(exec), (uint64_t)(uintptr_t)exec);
    orion_put_u64(head + EXEC_SET(node), (uint64_t)(uintptr_t)node);
    return set_params(ORION_OP_cuGraphExecBatchMemOpNodeSetParams, "cuGraphExecBatchMemOpNodeSetParams", head,
                      sizeof head, EXEC_SET(context), EXEC_SET(flags), params);
}

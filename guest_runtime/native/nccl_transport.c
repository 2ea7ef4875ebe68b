/* nccl_transport.c: the NCCL transport that works forwarded, chosen before NCCL reads its environment.
 *
 * Where two ranks' GPUs cannot reach each other directly (no NVLink, P2P off across CPU sockets), NCCL connects them
 * with its SHM transport: POSIX shared memory that both processes page-lock and hand to their GPUs. A forwarded
 * process page-locks memory by moving it into the region's pool (moved_ranges.c), and a segment two processes share
 * can be moved by one of them only, so the second rank's registration fails and NCCL stops ("Cuda failure 801",
 * measured on 2 x H200 with NCCL_P2P_DISABLE=1). With SHM off NCCL takes its network transport over loopback
 * instead, which only page-locks each process's own memory: slower than SHM, correct (docs/multi-gpu.md, "Which NCCL
 * transport a forwarded job uses"). Where the GPUs are peers NCCL uses P2P and this changes nothing.
 *
 * A value the user set is kept (NCCL_SHM_DISABLE=0 brings the failure back). Orion's oriond set NCCL variables too.
 * What does not belong here: anything NCCL-specific beyond its environment.
 */
#define _GNU_SOURCE
#include <stdlib.h>

__attribute__((constructor)) static void nccl_transport_that_works(void) {
    setenv("NCCL_SHM_DISABLE", "1", 0); /* 0: a value the user set stays */
}

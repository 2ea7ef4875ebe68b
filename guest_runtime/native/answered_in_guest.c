/* answered_in_guest.c: driver entry points outside the call table whose answer is the guest's own.
 *
 * The CUDA runtime calls these at start-up (measured: tools/cuinventory, TESTBED.md); they depend only on the
 * process's environment, as in the real driver, so they cost no round trip and need no table entry.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_client.h"

typedef int CUresult;
typedef int CUmoduleLoadingMode;
enum { CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2 };

/* The driver reads CUDA_MODULE_LOADING from the process's environment (lazy unless EAGER, since CUDA 12.2); so
 * does the host agent's driver for the modules this process loads there, whose environment is the agent's: the
 * answer describes what this process asked for, which is what the runtime uses it to decide. */
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    const char *asked = getenv("CUDA_MODULE_LOADING");
    *mode = asked && strcmp(asked, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

/* export_tables.c: cuGetExportTable, the driver's private interfaces to the CUDA runtime.
 *
 * The CUDA runtime inside PyTorch, CuPy and JAX (libcudart) asks the driver for tables of functions by UUID and
 * will not start without some of them: the integrity check above all (integrity.h). These are not forwardable
 * as data (their arguments are the runtime's own pointers), so the guest answers them from guest-side state and
 * from forwarded calls. Which tables the runtime asks for, and which entries it calls, was measured on the GPU
 * machine (tools/cuinventory; TESTBED.md); the entries' meaning follows public reverse engineering (ZLUDA's
 * dark-API notes). A table we do not know answers CUDA_ERROR_INVALID_VALUE, as the driver does for an unknown
 * UUID; ORION_NATIVE_TRACE=1 names it on stderr.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integrity.h"
#include "orion_guest.h"

struct CUuuid_st { unsigned char bytes[16]; };

enum { ATTRIBUTE_PCI_BUS_ID = 33, ATTRIBUTE_PCI_DEVICE_ID = 34, ATTRIBUTE_PCI_DOMAIN_ID = 50 };

#define TRACE(...) do { if (orion_tracing()) fprintf(stderr, "orion-native: " __VA_ARGS__); } while (0)

/* --- CUDART_INTERFACE: modules from the runtime's embedded fat binaries, a device's primary context ------- */

/* What nvcc embeds for each translation unit (__fatbinwrapper): a magic, a version, the fat binary. */
struct fatbin_wrapper { uint32_t magic, version; const void *data; const void *unused; };
#define FATBIN_WRAPPER_MAGIC 0x466243b1u

static CUresult module_from_wrapper(CUmodule *module, const struct fatbin_wrapper *wrapper) {
    if (!module || !wrapper || wrapper->magic != FATBIN_WRAPPER_MAGIC || !wrapper->data)
        return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, wrapper->data);
}

static void cudart_get_module(CUmodule *module, const struct fatbin_wrapper *wrapper) {
    CUresult rc = module_from_wrapper(module, wrapper);
    TRACE("CUDART_INTERFACE get_module: %d\n", rc);
}

static CUresult cudart_primary_context(CUcontext *context, CUdevice device) {
    if (!context) return CUDA_ERROR_INVALID_VALUE;
    return cuDevicePrimaryCtxRetain(context, device);
}

static CUresult cudart_get_module_ext1(CUmodule *module, const struct fatbin_wrapper *wrapper, void *a3, void *a4,
                                       unsigned a5) {
    if (a3 || a4 || a5) return orion_not_forwarded("CUDART_INTERFACE entry 6 with arguments");
    return module_from_wrapper(module, wrapper);
}

static CUresult cudart_noop7(size_t arg) { (void)arg; return CUDA_SUCCESS; }

static CUresult cudart_get_module_ext2(const void *fatbin, CUmodule *module, void *a3, void *a4, unsigned a5) {
    if (a3 || a4 || a5) return orion_not_forwarded("CUDART_INTERFACE entry 8 with arguments");
    if (!module || !fatbin) return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, fatbin);
}

static const void *cudart_interface[10] = {
    (void *)(10 * sizeof(void *)), (void *)cudart_get_module, (void *)cudart_primary_context, NULL, NULL, NULL,
    (void *)cudart_get_module_ext1, (void *)cudart_noop7, (void *)cudart_get_module_ext2, NULL,
};

/* --- TOOLS_TLS (42d85a81): the calling thread's current context (entry 2, which cuBLASLt calls before each
 * context lookup; measured on the H100: it writes what cuCtxGetCurrent answers). Three words, as the driver's. */

static CUresult tools_tls_1(void) { return orion_not_forwarded("export table TOOLS_TLS, entry 1"); }

static CUresult tools_tls_current_context(CUcontext *context) { return cuCtxGetCurrent(context); }

static const void *tools_tls[3] = { (void *)(3 * sizeof(void *)), (void *)tools_tls_1,
                                    (void *)tools_tls_current_context };

/* --- CONTEXT_IDENTITY (21318c60): 92 entries, of which cuBLASLt calls entry 4, a context's unique ID (measured:
 * what cuCtxGetId answers for the context entry 2 above gave). Every other entry answers 801, named once. ------ */

static CUresult context_identity_other(void) { return orion_not_forwarded("export table 21318c60, an entry other "
                                                                          "than 4"); }

static CUresult context_identity_id(CUcontext context, unsigned long long *id) { return cuCtxGetId(context, id); }

#define CONTEXT_IDENTITY_WORDS 93 /* the driver's first word: 0x2e8 bytes */
static const void *context_identity[CONTEXT_IDENTITY_WORDS] = {
    [0] = (void *)(CONTEXT_IDENTITY_WORDS * sizeof(void *)),
    [1 ... CONTEXT_IDENTITY_WORDS - 1] = (void *)context_identity_other,
    [4] = (void *)context_identity_id,
};

/* --- TOOLS_RUNTIME_CALLBACK_HOOKS: tools' hooks; no tool is attached, so their buffers stay zero ----------- */

static uint32_t hooks_buffer_a[1024], hooks_buffer_b[14];

static void hooks_buffer_2(void **buffer, size_t *size) {
    if (buffer) *buffer = hooks_buffer_a;
    if (size) *size = sizeof hooks_buffer_a;
}

static void hooks_buffer_6(void **buffer, size_t *size) {
    if (buffer) *buffer = hooks_buffer_b;
    if (size) *size = sizeof hooks_buffer_b;
}

static const void *tools_callback_hooks[7] = {
    (void *)(7 * sizeof(void *)), NULL, (void *)hooks_buffer_2, NULL, NULL, NULL, (void *)hooks_buffer_6,
};

/* --- CONTEXT_LOCAL_STORAGE: the runtime's per-context state, kept by (context, key) in the guest ---------- */

typedef void (*storage_destructor)(CUcontext, void *, void *);
struct stored { CUcontext context; void *key, *value; storage_destructor destructor; };

static pthread_mutex_t storage_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stored *storage;
static size_t storage_count, storage_capacity;

static CUcontext context_or_current(CUcontext context) { return context ? context : orion_current_context(); }

static struct stored *stored_at(CUcontext context, void *key) {
    for (size_t i = 0; i < storage_count; i++)
        if (storage[i].context == context && storage[i].key == key) return &storage[i];
    return NULL;
}

static CUresult storage_put(CUcontext context, void *key, void *value, storage_destructor destructor) {
    context = context_or_current(context);
    if (!context) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&storage_lock);
    CUresult rc = CUDA_SUCCESS;
    struct stored *entry = stored_at(context, key);
    if (!entry && storage_count == storage_capacity) {
        size_t capacity = storage_capacity ? 2 * storage_capacity : 16;
        struct stored *grown = realloc(storage, capacity * sizeof *grown);
        if (grown) { storage = grown; storage_capacity = capacity; }
    }
    if (!entry && storage_count < storage_capacity) entry = &storage[storage_count++];
    if (entry) *entry = (struct stored){ context, key, value, destructor };
    else rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&storage_lock);
    return rc;
}

static CUresult storage_delete(CUcontext context, void *key) {
    context = context_or_current(context);
    pthread_mutex_lock(&storage_lock);
    struct stored *entry = stored_at(context, key);
    if (entry) *entry = storage[--storage_count];
    pthread_mutex_unlock(&storage_lock);
    return CUDA_SUCCESS;
}

static CUresult storage_get(void **value, CUcontext context, void *key) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    context = context_or_current(context);
    pthread_mutex_lock(&storage_lock);
    struct stored *entry = context ? stored_at(context, key) : NULL;
    *value = entry ? entry->value : NULL;
    pthread_mutex_unlock(&storage_lock);
    return entry ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; /* the driver's answer for "nothing stored" */
}

static const void *context_local_storage[4] = { (void *)storage_put, (void *)storage_delete, (void *)storage_get,
                                                NULL };

/* --- CTX_CREATE_BYPASS, HEAP_ACCESS, DEVICE_EXTENDED_RT ---------------------------------------------------- */

static CUresult bypass_ctx_create(CUcontext *context, unsigned int flags, CUdevice device) {
    return cuCtxCreate(context, NULL, flags, device);
}

static const void *ctx_create_bypass[2] = { (void *)(2 * sizeof(void *)), (void *)bypass_ctx_create };

static CUresult heap_alloc(const void **record, size_t a2, size_t a3) {
    (void)record; (void)a2; (void)a3;
    return orion_not_forwarded("HEAP_ACCESS heap_alloc");
}

static CUresult heap_free(const void *record, size_t *a2) {
    (void)record; (void)a2;
    return orion_not_forwarded("HEAP_ACCESS heap_free");
}

static const void *heap_access[3] = { (void *)(3 * sizeof(void *)), (void *)heap_alloc, (void *)heap_free };

static CUresult device_attribute_ext(CUdevice device, unsigned attribute, int unknown, size_t result[2]) {
    (void)device; (void)attribute; (void)unknown; (void)result;
    return orion_not_forwarded("DEVICE_EXTENDED_RT entry 5");
}

static CUresult device_entry_13(unsigned char *result, CUdevice device) {
    (void)result; (void)device;
    return orion_not_forwarded("DEVICE_EXTENDED_RT entry 13");
}

static const void *device_extended_rt[26] = {
    [0] = (void *)(26 * sizeof(void *)), [5] = (void *)device_attribute_ext, [13] = (void *)device_entry_13,
};

/* --- INTEGRITY_CHECK --------------------------------------------------------------------------------------- */

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t result[2]);
static const void *integrity_table[3] = { (void *)(3 * sizeof(void *)), (void *)integrity_check, NULL };

static CUresult device_identities(struct orion_device_identity **out, uint32_t *count) {
    int n = 0;
    CUresult rc = cuDeviceGetCount(&n);
    if (rc != CUDA_SUCCESS) return rc;
    struct orion_device_identity *devices = calloc(n > 0 ? (size_t)n : 1, sizeof *devices);
    if (!devices) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int d = 0; d < n && rc == CUDA_SUCCESS; d++) {
        CUuuid uuid;
        rc = cuDeviceGetUuid(&uuid, d);
        if (rc == CUDA_SUCCESS) memcpy(devices[d].uuid, uuid.bytes, 16);
        if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&devices[d].pci_domain, ATTRIBUTE_PCI_DOMAIN_ID, d);
        if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&devices[d].pci_bus, ATTRIBUTE_PCI_BUS_ID, d);
        if (rc == CUDA_SUCCESS) rc = cuDeviceGetAttribute(&devices[d].pci_device, ATTRIBUTE_PCI_DEVICE_ID, d);
    }
    if (rc != CUDA_SUCCESS) { free(devices); return rc; }
    *out = devices;
    *count = (uint32_t)n;
    return CUDA_SUCCESS;
}

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t result[2]) {
    if (!result) return CUDA_ERROR_INVALID_VALUE;
    int driver = 0;
    struct orion_device_identity *devices = NULL;
    uint32_t count = 0;
    CUresult rc = cuDriverGetVersion(&driver);
    if (rc == CUDA_SUCCESS) rc = device_identities(&devices, &count);
    if (rc != CUDA_SUCCESS) {
        TRACE("INTEGRITY_CHECK: the device identities could not be read (%d)\n", rc);
        return rc;
    }
    struct orion_integrity_input input = {
        .driver_version = (uint32_t)driver, .version = version, .process = (uint32_t)getpid(),
        .thread = (uint32_t)(uintptr_t)pthread_self(), .cudart_table = cudart_interface,
        .integrity_table = integrity_table, .integrity_function = integrity_table[1], .unix_seconds = unix_seconds,
    };
    orion_integrity_digest(&input, devices, count, (uint8_t *)result);
    free(devices);
    TRACE("INTEGRITY_CHECK version %u, %u device(s)\n", version, count);
    return CUDA_SUCCESS;
}

/* --- CONTEXT_CHECKS (263e8860): flags the runtime asks about a context; never set on a forwarded one ------- */

static CUresult context_check(CUcontext context, uint32_t *flags, const void **unused) {
    (void)context; (void)unused;
    if (flags) *flags = 0;
    return CUDA_SUCCESS;
}

static uint32_t context_check_3(void) { return 0; }

static const void *context_checks[4] = { (void *)(4 * sizeof(void *)), NULL, (void *)context_check,
                                         (void *)context_check_3 };

/* --- 1734dc26…: cuBLASLt's, asked in cublasLtMatmulAlgoGetHeuristic for half-precision GEMMs ---------------------
 * Measured on the H200 (CUDA 13): 16 entries; cuBLASLt calls entry 4 (two out-pointers it zeroed first, then
 * values), then entry 13 on what entry 4 gave. What they compute is not known, and cuBLASLt calls the table without
 * checking that the driver gave one: answering the UUID as unknown crashes the process. Every entry answers
 * CUDA_ERROR_NOT_SUPPORTED (named once) and writes nothing. */
static CUresult heuristics_entry(void) { return orion_not_forwarded("export table 1734dc26 (cuBLASLt heuristics)"); }

static const void *cublaslt_heuristics[17] = {
    (void *)(17 * sizeof(void *)), (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry,
    (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry,
    (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry,
    (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry, (void *)heuristics_entry,
    (void *)heuristics_entry,
};

/* --- the directory ----------------------------------------------------------------------------------------- */

struct export_table { unsigned char uuid[16]; const void *const *table; const char *name; };

#define UUID(...) { __VA_ARGS__ }
static const struct export_table TABLES[] = {
    { UUID(0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9),
      cudart_interface, "CUDART_INTERFACE" },
    { UUID(0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc),
      tools_tls, "TOOLS_TLS" },
    { UUID(0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66),
      tools_callback_hooks, "TOOLS_RUNTIME_CALLBACK_HOOKS" },
    { UUID(0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93),
      context_local_storage, "CONTEXT_LOCAL_STORAGE" },
    { UUID(0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7, 0x72, 0x86),
      ctx_create_bypass, "CTX_CREATE_BYPASS" },
    { UUID(0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6, 0x31, 0xae),
      heap_access, "HEAP_ACCESS" },
    { UUID(0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2, 0x23, 0xbe, 0x99, 0xf1, 0xe2),
      device_extended_rt, "DEVICE_EXTENDED_RT" },
    { UUID(0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2),
      integrity_table, "INTEGRITY_CHECK" },
    { UUID(0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e),
      context_checks, "CONTEXT_CHECKS" },
    { UUID(0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2),
      context_identity, "CONTEXT_IDENTITY" },
    { UUID(0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca),
      cublaslt_heuristics, "CUBLASLT_HEURISTICS" },
};

CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    ORION_ENTRY("cuGetExportTable");
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof TABLES / sizeof *TABLES; i++) {
        if (memcmp(TABLES[i].uuid, id->bytes, 16) == 0) {
            *table = TABLES[i].table;
            TRACE("cuGetExportTable %s\n", TABLES[i].name);
            return CUDA_SUCCESS;
        }
    }
    *table = NULL;
    const unsigned char *b = id->bytes;
    TRACE("cuGetExportTable unknown %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0],
          b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return CUDA_ERROR_INVALID_VALUE;
}

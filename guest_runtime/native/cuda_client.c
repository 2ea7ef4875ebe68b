/* cuda_client.c: the process's one channel to the host agent, for the generated entry points (cuda_client.h),
 * and cuGetProcAddress over the generated name table. */
#include "cuda_client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "orion_wire.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

int orion_tracing(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("ORION_NATIVE_TRACE");
        on = v && *v && strcmp(v, "0") != 0;
    }
    return on;
}
static orion_channel *channel;

int orion_vgpus_wanted(void); /* vgpu_lease.c */
int orion_take_up_vgpus(orion_channel *channel, const char *where, char *err, size_t errlen);
void orion_host_functions_saw(int status); /* host_functions.c */
static int unreachable; /* the agent could not be reached (said once); every later call answers at once */

/* Under `lock`. */
static int connect_once(void) {
    if (channel) return 1;
    if (unreachable) return 0;
    char err[512] = "";
    const char *path = getenv("ORION_SHM");
    char found[256];
    int rc = ORION_E_REGION;
    if ((!path || !*path) && orion_discover(found, sizeof found)) path = found;
    if (!path || !*path) {
        snprintf(err, sizeof err, "no Orion region found: no ivshmem device and no /dev/shm/orionsock<N>; set "
                 "ORION_SHM, or create one with 'orion-shm create' and start oriond");
    } else if ((rc = orion_open(path, &channel, err, sizeof err)) == ORION_OK) {
        if ((rc = orion_hello(channel, orion_table_digest, NULL)) != ORION_OK)
            snprintf(err, sizeof err, "%s", orion_error(channel));
        else if (orion_vgpus_wanted() && orion_take_up_vgpus(channel, path, err, sizeof err) != 0)
            rc = ORION_E_REFUSED; /* vgpu_lease.c: no vGPUs for this process, `err` says why */
        if (rc != ORION_OK) {
            orion_close(channel);
            channel = NULL;
        }
    }
    if (rc != ORION_OK) {
        unreachable = 1;
        fprintf(stderr, "orion: no GPU through Orion: %s\n", err);
        return 0;
    }
    return 1;
}

static int failed(const char *what, int rc) {
    static int said;
    if (!said) {
        said = 1;
        fprintf(stderr, "orion: %s failed (%d): %s\n", what, rc, channel ? orion_error(channel) : "no channel");
    }
    return CUDA_ERROR_UNKNOWN;
}

/* A call the channel could not carry (an ORION_E_* code): a relayed session whose GPU host is gone answers what the
 * relay itself answers once it knows (CUDA_ERROR_DEVICE_UNAVAILABLE), anything else CUDA_ERROR_UNKNOWN. */
static int not_carried(const char *what, int rc) {
    int result = failed(what, rc);
    return rc == ORION_E_DEVICE_LOST ? CUDA_ERROR_DEVICE_UNAVAILABLE : result;
}

/* A call answered CUDA_ERROR_DEVICE_UNAVAILABLE (a relay that lost its GPU host answers every later call so): no
 * copy is posted any more (copy_calls.c), so each gets that answer itself. */
static atomic_int unavailable;

/* Under `lock`: an earlier posted call's failure that came back (taken: said once), or CUDA_SUCCESS. */
static int async_error_taken(void) {
    int32_t status = CUDA_SUCCESS;
    if (channel == NULL || !orion_take_async_error(channel, NULL, NULL, &status)) return CUDA_SUCCESS;
    return status > 0 ? status : CUDA_ERROR_UNKNOWN;
}

int orion_forwardv(uint32_t opcode, const struct orion_piece *req, int nreq, void *rep, size_t cap, void *tail,
                   size_t tail_cap, size_t *tail_len, int flags) {
    pthread_mutex_lock(&lock);
    int result;
    if (tail_len) *tail_len = 0;
    if (!connect_once()) {
        result = (flags & ORION_CALL_INIT) ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_NOT_INITIALIZED;
    } else {
        int32_t status = 0;
        size_t got = 0;
        int rc = orion_callv(channel, opcode, req, nreq, &status, rep, cap, tail, tail_cap, &got);
        if (orion_stats_on) orion_stat_wire(0);
        if (rc != ORION_OK) {
            result = not_carried("a forwarded call", rc);
        } else if (status == ORION_IMAGE_NOT_CACHED && (flags & ORION_CALL_BY_DIGEST)) {
            result = status; /* module_calls.c sends the image whole */
        } else if (status < 0) {
            result = failed("the agent refused a call: wire status", status);
        } else if (status == CUDA_SUCCESS && !(flags & ORION_CALL_NO_FOLD)
                   && (result = async_error_taken()) != CUDA_SUCCESS) {
            /* an earlier posted call failed: say it now */
        } else if (status == CUDA_SUCCESS && (got < cap || (!tail && got != cap))) {
            result = failed("a reply of the wrong size", (int)got);
        } else {
            if (tail_len && got > cap) *tail_len = got - cap;
            result = status;
        }
    }
    pthread_mutex_unlock(&lock);
    if (result == CUDA_ERROR_DEVICE_UNAVAILABLE) atomic_store(&unavailable, 1);
    if (result != CUDA_SUCCESS) orion_host_functions_saw(result); /* an error that ends CUDA fails the callbacks */
    if (result != CUDA_SUCCESS && orion_tracing()) {
        uint64_t first = 0; /* the request's first word: which pointer or handle it named */
        if (nreq > 0 && req[0].len) memcpy(&first, req[0].data, req[0].len < 8 ? req[0].len : 8);
        fprintf(stderr, "orion-native: call %#x answered %d (request begins %#llx)\n", opcode, result,
                (unsigned long long)first);
    }
    return result;
}

int orion_forward(uint32_t opcode, const void *req, size_t len, void *rep, size_t cap, int flags) {
    struct orion_piece piece = { req, len };
    return orion_forwardv(opcode, &piece, 1, rep, cap, NULL, 0, NULL, flags);
}

int orion_forward_postv(uint32_t opcode, const struct orion_piece *req, int nreq) {
    pthread_mutex_lock(&lock);
    int result = CUDA_ERROR_NOT_INITIALIZED;
    if (connect_once()) {
        int rc = orion_postv(channel, opcode, req, nreq);
        if (orion_stats_on) orion_stat_wire(1);
        result = rc == ORION_OK ? CUDA_SUCCESS : not_carried("a posted call", rc);
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int orion_forward_post(uint32_t opcode, const void *req, size_t len) {
    struct orion_piece piece = { req, len };
    return orion_forward_postv(opcode, &piece, 1);
}

int orion_first_time(const char *name) {
    static const char *said[1024];
    static size_t count;
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < count && said[i] != name) i++;
    int first = i == count;
    if (first && count < sizeof said / sizeof *said) said[count++] = name;
    pthread_mutex_unlock(&lock);
    return first;
}

int orion_not_forwarded(const char *name) {
    if (orion_first_time(name))
        fprintf(stderr, "orion: %s is not forwarded by Orion's native driver yet: returning 801 "
                        "(CUDA_ERROR_NOT_SUPPORTED)\n", name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

void *orion_versioned_entry(const char *symbol, int version); /* answered_in_guest.c */

/* cuda.h's cuGetProcAddress (the _v2 ABI): the entry point of any table call by its API name; for the few names
 * whose ABI changed, the one a caller built against `version` expects (orion_versioned_entry). */
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    ORION_ENTRY("cuGetProcAddress_v2");
    (void)flags;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = orion_versioned_entry(symbol, version);
    for (const struct orion_entry *e = orion_entries; e->name && !*pfn; e++) {
        if (strcmp(e->name, symbol) == 0) {
            *pfn = e->function;
            break;
        }
    }
    if (!*pfn && *symbol && orion_tracing())
        fprintf(stderr, "orion-native: cuGetProcAddress %s: not found\n", symbol);
    if (status) *status = *pfn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS, _SYMBOL_NOT_FOUND */
    /* The real driver answers the CUDA runtime's start-up lookup of the empty name with success and no entry
     * point (measured on the H100); any other unknown name without a status to say so is NOT_FOUND. */
    return *pfn || status || !*symbol ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* The legacy four-argument ABI of the same name. */
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    ORION_ENTRY("cuGetProcAddress");
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

int orion_device_unavailable(void) { return atomic_load(&unavailable); }

int orion_pending_async_error(void) {
    pthread_mutex_lock(&lock);
    int result = async_error_taken();
    pthread_mutex_unlock(&lock);
    return result;
}

int orion_connected(void) {
    pthread_mutex_lock(&lock);
    int connected = channel != NULL && !unreachable;
    pthread_mutex_unlock(&lock);
    return connected;
}

orion_channel *orion_process_channel(void) {
    pthread_mutex_lock(&lock);
    orion_channel *connected = connect_once() ? channel : NULL;
    pthread_mutex_unlock(&lock);
    return connected;
}

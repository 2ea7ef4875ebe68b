/* known_streams.c: the streams this process created and has not destroyed, each with the context it belongs to.
 *
 * A small copy to the device on a default stream is posted with its bytes (copy_calls.c), because nothing the
 * driver checks first can fail there. On a stream of the program's own the one thing that could is the handle
 * itself; a stream this process created, in the current context, and has not destroyed is a valid handle, so a copy
 * on it may be posted too, as forward.py's `_posted_as_the_driver_would` does with its own set. Every stream is
 * forgotten at once when a context may have gone (cuCtxDestroy, a primary context's release or reset): a stream of a
 * gone context is then unknown, and a copy on it waits for the host's answer (its INVALID_HANDLE), as before.
 *
 * What does not belong here: the copies (copy_calls.c), captures (capture_state.c: a stream being captured is never
 * posted to, whatever this says).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "orion_guest.h"

struct known { uint64_t stream, context; };
static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct known *streams;
static size_t count, cap;

void orion_stream_created(uint64_t stream) {
    uint64_t context = (uint64_t)(uintptr_t)orion_current_context();
    pthread_rwlock_wrlock(&lock);
    size_t i = 0;
    while (i < count && streams[i].stream != stream) i++; /* a handle seen before names a new stream now */
    if (i == count && count == cap) {
        size_t more = cap ? cap * 2 : 32;
        struct known *grown = realloc(streams, more * sizeof *grown);
        if (grown) {
            streams = grown;
            cap = more;
        }
    }
    if (i < cap) {
        streams[i] = (struct known){ stream, context };
        if (i == count) count++;
    }
    pthread_rwlock_unlock(&lock);
}

void orion_stream_destroyed(uint64_t stream) {
    pthread_rwlock_wrlock(&lock);
    for (size_t i = 0; i < count; i++) {
        if (streams[i].stream == stream) {
            streams[i] = streams[--count];
            break;
        }
    }
    pthread_rwlock_unlock(&lock);
}

void orion_streams_forget(void) {
    pthread_rwlock_wrlock(&lock);
    count = 0;
    pthread_rwlock_unlock(&lock);
}

int orion_stream_known(uint64_t stream) {
    uint64_t context = (uint64_t)(uintptr_t)orion_current_context();
    int known = 0;
    pthread_rwlock_rdlock(&lock);
    for (size_t i = 0; i < count && !known; i++) known = streams[i].stream == stream && streams[i].context == context;
    pthread_rwlock_unlock(&lock);
    return known;
}

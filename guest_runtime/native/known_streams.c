/* known_streams.c: the streams this process created and has not destroyed, each with the context it belongs to.
 *
 * A small copy to the device on a default stream is posted with its bytes (copy_calls.c), because nothing the
 * driver checks first can fail there. On a stream of the program's own the one thing that could is the handle
 * itself; a stream this process created, in the current context, and has not destroyed is a valid handle, so a copy
 * on it may be posted too, as forward.py's `_posted_as_the_driver_would` does with its own set. Every stream is
 * forgotten at once when a context may have gone (cuCtxDestroy, a primary context's release or reset): a stream of a
 * gone context is then unknown, and a copy on it waits for the host's answer (its INVALID_HANDLE), as before.
 *
 * Kept in a handle_map (stream -> its context), which forgets only all at once: a destroyed stream's entry says so
 * (DESTROYED) until the handle names a new stream or the map is emptied (at a context's end, or past MAX_KNOWN).
 *
 * What does not belong here: the copies (copy_calls.c), captures (capture_state.c: a stream being captured is never
 * posted to, whatever this says).
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "handle_map.h"
#include "orion_guest.h"

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct handle_map streams;
static char destroyed_mark;
#define DESTROYED ((void *)&destroyed_mark)

static void put(uint64_t stream, void *value) {
    if (!stream) return;
    pthread_rwlock_wrlock(&lock);
    (void)handle_map_put(&streams, stream, value); /* without memory the stream stays unknown: its copies wait */
    pthread_rwlock_unlock(&lock);
}

void orion_stream_created(uint64_t stream) {
    void *context = (void *)orion_current_context();
    put(stream, context ? context : DESTROYED);
}

/* A destroyed stream's mark stays until the map is emptied; past MAX_KNOWN handles it is emptied at once (every
 * stream unknown: their copies wait), so that making and destroying streams without end takes bounded memory. */
enum { MAX_KNOWN = 4096 };
void orion_stream_destroyed(uint64_t stream) {
    put(stream, DESTROYED);
    pthread_rwlock_wrlock(&lock);
    if (streams.used > MAX_KNOWN) handle_map_clear(&streams, NULL);
    pthread_rwlock_unlock(&lock);
}

void orion_streams_forget(void) {
    pthread_rwlock_wrlock(&lock);
    handle_map_clear(&streams, NULL);
    pthread_rwlock_unlock(&lock);
}

int orion_stream_known(uint64_t stream) {
    void *context = (void *)orion_current_context();
    pthread_rwlock_rdlock(&lock);
    void *of = stream ? handle_map_get(&streams, stream) : NULL;
    pthread_rwlock_unlock(&lock);
    return context && of == context;
}

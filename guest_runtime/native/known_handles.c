/* known_handles.c: the streams and events this process made and has not destroyed, each with the context it belongs
 * to.
 *
 * A handle the process made in the current context, and has not destroyed, is valid, so a call whose only possible
 * failure is the handle may be posted, or answered in the guest, without the host's word:
 * - a small copy to the device on a stream of the program's own (copy_calls.c), as forward.py's
 *   `_posted_as_the_driver_would` does with its own set; the capture status of such a stream while no capture may
 *   run (capture_state.c);
 * - cuEventDestroy of such an event (event_pool.c).
 * Every handle of a kind is forgotten at once when a context may have gone (cuCtxDestroy, a primary context's release
 * or reset): a handle of a gone context is then unknown, and its call waits for the host's answer, as before.
 *
 * Kept in a handle_map per kind (handle -> its context), which forgets only all at once: a destroyed handle's entry
 * says so (DESTROYED) until the handle names a new object or the map is emptied (at a context's end, or past
 * MAX_KNOWN, so that making and destroying without end takes bounded memory).
 *
 * What does not belong here: the copies, captures (a stream being captured is never posted to, whatever this says),
 * the event pool.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "handle_map.h"
#include "orion_guest.h"

enum { MAX_KNOWN = 4096 };
static struct {
    pthread_rwlock_t lock;
    struct handle_map map;
} known[ORION_KNOWN_KINDS] = {{PTHREAD_RWLOCK_INITIALIZER, {0}}, {PTHREAD_RWLOCK_INITIALIZER, {0}}};
static char destroyed_mark;
#define DESTROYED ((void *)&destroyed_mark)

void orion_known_made(int kind, uint64_t handle) {
    void *context = (void *)orion_current_context();
    if (!handle) return;
    pthread_rwlock_wrlock(&known[kind].lock);
    if (known[kind].map.used > MAX_KNOWN) handle_map_clear(&known[kind].map, NULL);
    /* without memory it stays unknown: its calls wait */
    (void)handle_map_put(&known[kind].map, handle, context ? context : DESTROYED);
    pthread_rwlock_unlock(&known[kind].lock);
}

int orion_known_destroyed(int kind, uint64_t handle) {
    void *context = (void *)orion_current_context();
    if (!handle) return 0;
    pthread_rwlock_wrlock(&known[kind].lock);
    void *of = handle_map_get(&known[kind].map, handle);
    if (of && of != DESTROYED) (void)handle_map_put(&known[kind].map, handle, DESTROYED);
    pthread_rwlock_unlock(&known[kind].lock);
    return context && of == context;
}

void orion_known_forget(int kind) {
    pthread_rwlock_wrlock(&known[kind].lock);
    handle_map_clear(&known[kind].map, NULL);
    pthread_rwlock_unlock(&known[kind].lock);
}

int orion_known(int kind, uint64_t handle) {
    void *context = (void *)orion_current_context();
    pthread_rwlock_rdlock(&known[kind].lock);
    void *of = handle ? handle_map_get(&known[kind].map, handle) : NULL;
    pthread_rwlock_unlock(&known[kind].lock);
    return context && of == context;
}

/* moved_ranges.c: cuMemHostRegister'ed guest memory moved into the region's page-locked pool, so that the GPU
 * reaches it (page_locked_calls.c decides when to ask; docs/native-driver.md, "Page-locked memory outside the pool").
 *
 * The guest's own pages cannot be page-locked for a GPU on another machine, but the pool's can: they are the region
 * file's, which the GPU host has registered. So a registered range of whole pages (page-aligned start, one readable
 * and writable mapping to the end of its last page, not READ_ONLY) has its bytes copied to pool pages of its size,
 * which are then mapped over it (MAP_FIXED): the program and the GPU see the same bytes, and the range's device
 * pointer is the pool pages' (NCCL page-locks its POSIX shared memory this way and gives the GPU that pointer).
 *
 * A shared file mapping (a file's, or shared anonymous memory) must stay one set of bytes for everything that maps
 * it. So it is moved only when no other process whose /proc/PID/maps this one may read maps the file, and no other
 * mapping of this process does; an exclusive lock on the file, held while it is moved, makes a registration in
 * another process leave its mapping where it is (no device pointer there: an error, never two diverging copies).
 * Another mapping of the same file in this process that registers later (NCCL's peer attaching to a segment in the
 * same process) gets the same pool pages; what it wrote through the file before (NCCL's reference count) is merged
 * in first: each byte that differs from the file's bytes at the move. The bytes go back when the last registration
 * of the file ends (or the process does): into the file, and every mapping moved is the file's again. A private range goes back as fresh
 * private pages holding its bytes. A mapping that the program unmapped or replaced meanwhile is left alone.
 *
 * What does not belong here: the registry of registered ranges and the driver's answers about them
 * (page_locked_calls.c), the pool itself (pinned_pool.c).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "orion_guest.h"

enum { REGISTER_READ_ONLY = 0x8, MAX_VIEWS = 16, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713 };

/* One mapping of the program's that now shows pool pages. */
struct view { uint64_t address, size, file_offset; int registered; };

/* One set of pool pages holding what was moved: a private range (no file), or a span of a shared file. */
struct moved {
    unsigned long long device, inode; /* the file; 0, 0 for a private range */
    uint64_t file_offset, size;       /* the span of the file moved (whole pages) */
    uint64_t pool;                    /* its pool pages (this process's address) */
    uint64_t pool_file_offset;        /* where those lie in the region file */
    int fd;                           /* the file, locked while moved (-1: private) */
    unsigned char *snapshot;          /* the file's bytes as of the move and merges (NULL: private) */
    struct view views[MAX_VIEWS];
    int view_count;
    struct moved *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct moved *moves;

static uint64_t page_size(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (uint64_t)page : 4096;
}

static uint64_t whole_pages(uint64_t size) { return (size + page_size() - 1) / page_size() * page_size(); }

/* --- what /proc says ------------------------------------------------------------------------------------------ */

/* The mapping of /proc/self/maps holding all of [base, base+size): 1 and what it is; 0 where no one mapping does. */
struct mapping {
    unsigned long long start, end, device, inode, offset; /* offset: the file's, at `base` */
    char perms[5], path[256];
};
static int mapping_of(uint64_t base, uint64_t size, struct mapping *found) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (!maps) return 0;
    char line[512];
    int ok = 0;
    while (!ok && fgets(line, sizeof line, maps)) {
        unsigned long long start, end, offset, inode;
        unsigned major, minor;
        char perms[5];
        int at = 0;
        if (sscanf(line, "%llx-%llx %4s %llx %x:%x %llu %n", &start, &end, perms, &offset, &major, &minor, &inode, &at)
            < 7)
            continue;
        if (start <= base && base + size <= end) {
            *found = (struct mapping){ .start = start, .end = end, .device = makedev(major, minor), .inode = inode,
                                       .offset = offset + (base - start) };
            memcpy(found->perms, perms, sizeof perms);
            snprintf(found->path, sizeof found->path, "%s", line + at);
            found->path[strcspn(found->path, "\n")] = 0;
            ok = 1;
        }
    }
    fclose(maps);
    return ok;
}

/* Whether the file (device, inode) is mapped anywhere but in this process's mapping [start, end): by another mapping
 * here, or by a process whose /proc/PID/maps this one may read. One it may not read (another user's where this is
 * not root; a container's init) is not counted: NCCL makes its files 0600, so only this user's processes open them. */
static int mapped_elsewhere(unsigned long long device, unsigned long long inode, uint64_t start, uint64_t end) {
    DIR *proc = opendir("/proc");
    if (!proc) return 1;
    char key[64];
    snprintf(key, sizeof key, " %02x:%02x %llu ", major(device), minor(device), inode);
    pid_t self = getpid();
    int found = 0;
    struct dirent *entry;
    while (!found && (entry = readdir(proc))) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        int mine = atoi(entry->d_name) == self;
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/%s/maps", entry->d_name);
        FILE *maps = fopen(path, "re");
        if (!maps) continue;
        while (!found && fgets(line, sizeof line, maps)) {
            unsigned long long low = 0, high = 0;
            found = strstr(line, key) != NULL
                    && !(mine && sscanf(line, "%llx-%llx", &low, &high) == 2 && low == start && high == end);
        }
        fclose(maps);
    }
    closedir(proc);
    return found;
}

/* The file behind this process's shared mapping `m`, opened for writing and locked exclusively, when that mapping is
 * the file's only one: its descriptor, or -1. */
static int sole_shared_file(const struct mapping *m) {
    char path[96];
    snprintf(path, sizeof path, "/proc/self/map_files/%llx-%llx", m->start, m->end);
    int fd = open(path, O_RDWR | O_CLOEXEC); /* the mapping's own file, even unlinked (needs CAP_SYS_ADMIN) */
    if (fd < 0 && m->path[0] == '/') fd = open(m->path, O_RDWR | O_CLOEXEC); /* else by its name, checked below */
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != m->device || st.st_ino != m->inode || flock(fd, LOCK_EX | LOCK_NB) != 0
        || mapped_elsewhere(m->device, m->inode, m->start, m->end)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* --- moving and giving back --------------------------------------------------------------------------------- */

/* Map `size` bytes of `moved`'s pool pages, from `offset` into them, at `address`: 1, or 0 with nothing changed
 * (MAP_FIXED replaces the mapping there only when it succeeds). */
static int show_pool(const struct moved *moved, uint64_t offset, uint64_t address, uint64_t size) {
    int fd;
    uint64_t file_offset;
    if (!orion_pool_file(moved->pool + offset, size, &fd, &file_offset)) return 0;
    return mmap((void *)(uintptr_t)address, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                (off_t)file_offset) != MAP_FAILED;
}

/* How many bytes of the file span [offset, offset+size) the file holds (its last page may run past its end). */
static uint64_t in_file(int fd, uint64_t offset, uint64_t size) {
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size <= offset) return 0;
    return (uint64_t)st.st_size - offset < size ? (uint64_t)st.st_size - offset : size;
}

/* Bring into the pool what was written through the file (by mappings that do not show the pool) over the file span
 * [offset, offset+size): each byte that differs from the snapshot, which then holds the file's bytes. */
static void merge_file_writes(struct moved *moved, uint64_t offset, uint64_t size) {
    size = in_file(moved->fd, offset, size);
    unsigned char *now = size ? malloc(size) : NULL;
    if (!now) return;
    if (pread(moved->fd, now, size, (off_t)offset) == (ssize_t)size) {
        unsigned char *pool = (unsigned char *)(uintptr_t)moved->pool + (offset - moved->file_offset);
        unsigned char *then = moved->snapshot + (offset - moved->file_offset);
        for (uint64_t i = 0; i < size; i++) {
            if (now[i] != then[i]) {
                pool[i] = now[i];
                then[i] = now[i];
            }
        }
    }
    free(now);
}

/* Whether the view still shows `moved`'s pool pages (the program has not unmapped or replaced it). */
static int still_shown(const struct moved *moved, const struct view *view) {
    int fd;
    uint64_t file_offset;
    struct stat region;
    struct mapping m;
    uint64_t into = moved->fd >= 0 ? view->file_offset - moved->file_offset : 0;
    return orion_pool_file(moved->pool + into, view->size, &fd, &file_offset) && fstat(fd, &region) == 0
           && mapping_of(view->address, view->size, &m) && m.device == region.st_dev && m.inode == region.st_ino
           && m.offset == file_offset;
}

static void forget(struct moved *moved) {
    for (struct moved **at = &moves; *at; at = &(*at)->next) {
        if (*at == moved) {
            *at = moved->next;
            break;
        }
    }
    if (moved->fd >= 0) close(moved->fd); /* and its lock */
    free(moved->snapshot);
    free(moved);
}

/* The pool had no room to move `size` registered bytes: said once, with what to do. */
static void no_room(uint64_t size) {
    static int said;
    if (said++) return;
    fprintf(stderr, "orion: no room in this channel's page-locked pool (%llu MiB) to move %llu registered bytes "
            "there, so the GPU cannot reach them (cuMemHostGetDevicePointer answers 801): create the region larger "
            "(orion-shm create -s MiB) or with fewer channels\n", (unsigned long long)(orion_pool_size() >> 20),
            (unsigned long long)size);
}

/* A new set of pool pages for `size` bytes at `base` (copied there) and shown there: the entry, or NULL. */
static struct moved *move(uint64_t base, uint64_t size, const struct mapping *m, int fd) {
    void *pages = NULL;
    struct moved *moved = calloc(1, sizeof *moved);
    int status = moved ? orion_pool_alloc(&pages, size) : CUDA_ERROR_OUT_OF_MEMORY;
    if (status != CUDA_SUCCESS) {
        if (status == CUDA_ERROR_OUT_OF_MEMORY) no_room(size);
        free(moved);
        return NULL;
    }
    *moved = (struct moved){ .pool = (uint64_t)(uintptr_t)pages, .size = size, .fd = fd };
    if (fd >= 0) {
        moved->device = m->device;
        moved->inode = m->inode;
        moved->file_offset = m->offset;
        moved->snapshot = malloc(size);
    }
    memcpy(pages, (void *)(uintptr_t)base, size);
    if (moved->pool % page_size() || (fd >= 0 && !moved->snapshot) || !show_pool(moved, 0, base, size)) {
        (void)cuMemFreeHost(pages);
        free(moved->snapshot);
        free(moved);
        return NULL;
    }
    if (moved->snapshot) memcpy(moved->snapshot, pages, size);
    moved->views[0] = (struct view){ base, size, m->offset, 1 };
    moved->view_count = 1;
    moved->next = moves;
    moves = moved;
    return moved;
}

int orion_move_into_pool(uint64_t base, uint64_t bytes, unsigned flags, uint64_t *pool) {
    uint64_t size = whole_pages(bytes);
    struct mapping m;
    if (base % page_size() || bytes > UINT64_MAX - page_size() || flags & REGISTER_READ_ONLY
        || !mapping_of(base, size, &m) || m.perms[0] != 'r' || m.perms[1] != 'w')
        return 0;
    pthread_mutex_lock(&lock);
    int done = 0;
    if (m.perms[3] != 's') { /* private */
        struct moved *moved = move(base, size, &m, -1);
        if (moved) *pool = moved->pool;
        done = moved != NULL;
    } else {
        struct moved *moved = moves;
        while (moved && !(moved->fd >= 0 && moved->device == m.device && moved->inode == m.inode)) moved = moved->next;
        if (moved) { /* another mapping of a file this process moved: its pages, with what it wrote merged in */
            uint64_t into = m.offset - moved->file_offset;
            if (m.offset >= moved->file_offset && into <= moved->size && size <= moved->size - into
                && moved->view_count < MAX_VIEWS) {
                merge_file_writes(moved, m.offset, size);
                if (show_pool(moved, into, base, size)) {
                    moved->views[moved->view_count++] = (struct view){ base, size, m.offset, 1 };
                    *pool = moved->pool + into;
                    done = 1;
                }
            }
        } else {
            int fd = sole_shared_file(&m);
            if (fd >= 0) {
                moved = move(base, size, &m, fd);
                if (moved) *pool = moved->pool;
                else close(fd);
                done = moved != NULL;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return done;
}

/* A moved file's bytes into the file, with what was written through it merged first; the file keeps its size (what
 * lies past its end on the last page is not its): 1, or 0 when the write failed. */
static int write_back(struct moved *moved) {
    merge_file_writes(moved, moved->file_offset, moved->size);
    uint64_t size = in_file(moved->fd, moved->file_offset, moved->size);
    return pwrite(moved->fd, (void *)(uintptr_t)moved->pool, size, (off_t)moved->file_offset) == (ssize_t)size;
}

/* The last registration of `moved` ended: its bytes back where they belong, every view shown as it was. */
static int give_back(struct moved *moved) {
    int status = CUDA_SUCCESS;
    if (moved->fd >= 0 && !write_back(moved)) return CUDA_ERROR_UNKNOWN; /* the pool pages stay shown: nothing lost */
    for (int i = 0; i < moved->view_count; i++) {
        const struct view *view = &moved->views[i];
        if (!still_shown(moved, view)) continue;
        void *at = (void *)(uintptr_t)view->address;
        if (moved->fd >= 0) {
            if (mmap(at, view->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, moved->fd,
                     (off_t)view->file_offset) == MAP_FAILED)
                status = CUDA_ERROR_UNKNOWN;
        } else {
            void *copy = malloc(view->size);
            if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
            memcpy(copy, at, view->size);
            if (mmap(at, view->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                == MAP_FAILED) {
                free(copy);
                return CUDA_ERROR_UNKNOWN;
            }
            memcpy(at, copy, view->size);
            free(copy);
        }
    }
    if (status != CUDA_SUCCESS) return status;
    (void)cuMemFreeHost((void *)(uintptr_t)moved->pool);
    forget(moved);
    return CUDA_SUCCESS;
}

int orion_move_back(uint64_t base) {
    pthread_mutex_lock(&lock);
    int status = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    for (struct moved *moved = moves; moved; moved = moved->next) {
        int registered = 0, found = 0;
        for (int i = 0; i < moved->view_count; i++) {
            struct view *view = &moved->views[i];
            if (view->address == base && view->registered) {
                view->registered = 0;
                found = 1;
            }
            registered += view->registered;
        }
        if (found) { /* while another registration of the file lasts, this view keeps showing the same bytes */
            status = registered ? CUDA_SUCCESS : give_back(moved);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* At exit, a shared file still moved (its last registration never ended) gets its bytes back, as its own pages
 * would have kept them: the pool pages go with the process. */
__attribute__((destructor)) static void give_back_files_at_exit(void) {
    pthread_mutex_lock(&lock);
    for (struct moved *moved = moves; moved; moved = moved->next) {
        if (moved->fd >= 0 && !write_back(moved))
            fprintf(stderr, "orion: could not write a registered shared mapping's bytes back to its file at exit\n");
    }
    pthread_mutex_unlock(&lock);
}

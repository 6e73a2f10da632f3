/* fsynccount.so: counts the sync calls of a process tree (LD_PRELOAD).
 *
 * BENCH_FSYNC_FILE names a file of four uint64 counters (fsync, fdatasync,
 * syncfs, sync) shared by every process that preloads this library with the
 * same file, so the harness reads them live (the daemon) or after a run (a
 * workload and its children). Without the variable, calls pass through
 * uncounted. Calls on a FUSE file system's descriptor are not counted: they
 * are requests to its daemon (a txfs transaction's fsync costs no disk sync;
 * the daemon's own syncs are counted in the daemon). Counting costs an
 * fstatfs and an atomic add per call: nothing next to a sync.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#define FUSE_MAGIC 0x65735546

static uint64_t *counters; /* [0] fsync [1] fdatasync [2] syncfs [3] sync */

__attribute__((constructor)) static void fc_init(void) {
    const char *path = getenv("BENCH_FSYNC_FILE");
    if (!path || !*path) return;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (ftruncate(fd, 4096) == 0) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) counters = p;
    }
    close(fd);
}

static void bump(int i) {
    if (counters) __atomic_fetch_add(&counters[i], 1, __ATOMIC_RELAXED);
}

/* Counts a sync of `fd` unless it is on a FUSE file system. */
static void bump_fd(int i, int fd) {
    struct statfs s;
    if (counters && !(fstatfs(fd, &s) == 0 && s.f_type == FUSE_MAGIC)) bump(i);
}

typedef int (*fd_fn)(int);
typedef void (*void_fn)(void);

#define NEXT(name, type) \
    static type next_##name; \
    if (!next_##name) next_##name = (type)dlsym(RTLD_NEXT, #name)

int fsync(int fd) {
    NEXT(fsync, fd_fn);
    bump_fd(0, fd);
    return next_fsync(fd);
}

int fdatasync(int fd) {
    NEXT(fdatasync, fd_fn);
    bump_fd(1, fd);
    return next_fdatasync(fd);
}

int syncfs(int fd) {
    NEXT(syncfs, fd_fn);
    bump_fd(2, fd);
    return next_syncfs(fd);
}

void sync(void) {
    NEXT(sync, void_fn);
    bump(3);
    next_sync();
}

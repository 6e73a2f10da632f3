/* fsynccount.so: counts the sync calls of a process tree (LD_PRELOAD).
 *
 * BENCH_FSYNC_FILE names a file of four uint64 counters (fsync, fdatasync,
 * syncfs, sync) shared by every process that preloads this library with the
 * same file, so the harness reads them live (the daemon) or after a run (a
 * workload and its children). Without the variable, calls pass through
 * uncounted. Counting costs one atomic add per call: nothing next to a sync.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

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

typedef int (*fd_fn)(int);
typedef void (*void_fn)(void);

#define NEXT(name, type) \
    static type next_##name; \
    if (!next_##name) next_##name = (type)dlsym(RTLD_NEXT, #name)

int fsync(int fd) {
    NEXT(fsync, fd_fn);
    bump(0);
    return next_fsync(fd);
}

int fdatasync(int fd) {
    NEXT(fdatasync, fd_fn);
    bump(1);
    return next_fdatasync(fd);
}

int syncfs(int fd) {
    NEXT(syncfs, fd_fn);
    bump(2);
    return next_syncfs(fd);
}

void sync(void) {
    NEXT(sync, void_fn);
    bump(3);
    next_sync();
}

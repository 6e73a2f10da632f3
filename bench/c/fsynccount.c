/* fsynccount.so: counts the sync calls of a process tree (LD_PRELOAD).
 *
 * BENCH_FSYNC_FILE names a file of four uint64 counters (fsync, fdatasync,
 * syncfs, sync) shared by every process that preloads this library with the
 * same file, so the harness reads them live (the daemon) or after a run (a
 * workload and its children). Without the variable, calls pass through
 * uncounted. Calls on a FUSE file system's descriptor are not counted: they
 * are requests to its daemon (a txfs transaction's fsync costs no disk sync;
 * the daemon's own syncs are counted in the daemon). A descriptor's file
 * system is found from its device number (statx with AT_STATX_DONT_SYNC,
 * which a FUSE file system answers from the kernel's cache) in
 * /proc/self/mountinfo, once per device: no request reaches a daemon (an
 * fstatfs would be one: a STATFS round trip per counted call).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* Whether device major:minor is a FUSE mount (fstype fuse or fuse.*). */
static int dev_is_fuse(unsigned major, unsigned minor) {
    static struct { unsigned major, minor; int fuse; } seen[16];
    static int nseen;
    for (int k = 0; k < __atomic_load_n(&nseen, __ATOMIC_ACQUIRE); k++)
        if (seen[k].major == major && seen[k].minor == minor) return seen[k].fuse;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < nseen; k++)
        if (seen[k].major == major && seen[k].minor == minor) {
            pthread_mutex_unlock(&lock);
            return seen[k].fuse;
        }
    int fuse = 0;
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f) {
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            unsigned ma, mi;
            /* id parent major:minor root point opts [tags] - fstype ... */
            if (sscanf(line, "%*d %*d %u:%u", &ma, &mi) != 2 || ma != major || mi != minor) continue;
            const char *dash = strstr(line, " - ");
            if (dash && strncmp(dash + 3, "fuse", 4) == 0 && (dash[7] == ' ' || dash[7] == '.')) fuse = 1;
            break;
        }
        fclose(f);
    }
    int k = nseen;
    if (k < 16) {
        seen[k].major = major;
        seen[k].minor = minor;
        seen[k].fuse = fuse;
        __atomic_store_n(&nseen, k + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    return fuse;
}

/* Counts a sync of `fd` unless it is on a FUSE file system. */
static void bump_fd(int i, int fd) {
    struct statx st;
    if (!counters) return;
    if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, 0, &st) == 0 && dev_is_fuse(st.stx_dev_major, st.stx_dev_minor))
        return;
    bump(i);
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

/* txfs.c — the C client library of txfs (see txfs.h and SPEC.md §2).
 *
 * Every call resolves a mount and issues one ioctl of the wire protocol in
 * txfs.h on a descriptor of its root directory (the change set's iterator,
 * at the end of this file, issues one a page). Each thread remembers the
 * last mount it resolved and checked (its device number), and re-checks it
 * with statx(AT_STATX_DONT_SYNC), which the kernel answers from its own
 * inode. The outermost begin's descriptor serves the whole transaction, and
 * the thread keeps it afterwards for its next transaction (its *control
 * descriptor*), so a transaction costs the daemon two requests (begin,
 * commit), not four (OPENDIR and RELEASEDIR besides). The daemon owns the
 * transaction (it identifies it by the calling thread's id); this library
 * only remembers, per thread, which mount that thread's transaction lives on
 * (and the descriptor), so that commit and abort reach the same daemon as the
 * begin.
 *
 * A kept descriptor keeps the mount busy. It is opened with O_DSYNC (which
 * means nothing for a directory) as a mark: `txfs umount`, finding the mount
 * busy, looks for holders in /proc and detaches the mount when marked
 * descriptors are all that hold it and no transaction is live; a kept
 * descriptor of a mount that is gone answers ENOTCONN and is replaced by a
 * fresh open. Kept descriptors are closed when their thread exits and, in a
 * forked child, at the fork; they are O_CLOEXEC.
 */#define _GNU_SOURCE
#include "txfs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <unistd.h>

#define TXFS_API __attribute__((visibility("default")))

#define TXFS_FSTYPE "fuse.txfs"
/* A root `txfs run`'s transaction view, mounted over the shared mount in the
 * run's own mount namespace: its processes reach the mount through it. */
#define TXFS_VIEW_FSTYPE "fuse.txfs-view"
#define TXFS_DEFAULT_MOUNTINFO "/proc/self/mountinfo"
#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* Per-thread bookkeeping. `tid` guards against a forked child (whose copy of
 * this memory describes its parent's thread, not itself): the record is only
 * believed by the thread that wrote it. */
static __thread struct {
    pid_t tid;
    unsigned depth; /* begins issued through this library, not yet ended */
    int fd_plus1;   /* the mount root, open while depth > 0; 0: none */
    unsigned long long token; /* its registration (held_add) */
    char mount[PATH_MAX];
} tls;

static pid_t current_tid(void) { return (pid_t)syscall(SYS_gettid); }

static int tls_valid(void) { return tls.depth > 0 && tls.tid == current_tid(); }

/* ---- descriptors of mount roots ----------------------------------------- */

/* Every descriptor this library holds open beyond one call (a transaction's,
 * or a thread's kept one), with the identity it had when opened (device and
 * inode of the mount root). A forked child closes its copies (it has only
 * the forking thread: nothing else would ever close the others', and they
 * would keep the mount busy for the child's whole life). And a descriptor
 * is used or closed only while it still is ours: a program may have closed
 * it behind our back (closefrom() when daemonizing) and reused the number
 * for a file of its own. Each registration has a token, kept by whoever
 * holds the descriptor: a number closed behind our back and reopened by
 * another thread for the same root (same identity) is that thread's, and
 * the first holder's token no longer finds it. */
struct held_fd {
    int fd;
    dev_t dev;
    ino_t ino;
    unsigned long long token;
};
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static struct held_fd *held;
static size_t held_n, held_cap;
static unsigned long long held_tokens;

/* Device and inode of what `fd` names, as the kernel has them cached. */
static int fd_identity(int fd, dev_t *dev, ino_t *ino)
{
    struct statx stx;
    if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &stx) != 0)
        return -1;
    *dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    *ino = (ino_t)stx.stx_ino;
    return 0;
}

/* `h` still names what we opened: same root, and our O_DSYNC mark. */
static int still_ours(const struct held_fd *h)
{
    dev_t dev;
    ino_t ino;
    int fl = fcntl(h->fd, F_GETFL);
    return fl >= 0 && (fl & O_DSYNC) && fd_identity(h->fd, &dev, &ino) == 0 && dev == h->dev && ino == h->ino;
}

/* Register `fd` (just opened by this library) and set `*token`; -1 if it
 * cannot be. Older registrations of the same number are forgotten: the
 * kernel just handed it out, so whatever they named was closed. */
static int held_add(int fd, unsigned long long *token)
{
    struct held_fd h = {.fd = fd};
    if (fd_identity(fd, &h.dev, &h.ino) != 0)
        return -1;
    pthread_mutex_lock(&held_lock);
    for (size_t i = 0; i < held_n;)
        if (held[i].fd == fd)
            held[i] = held[--held_n];
        else
            i++;
    h.token = ++held_tokens;
    *token = h.token;
    if (held_n == held_cap) {
        size_t cap = held_cap ? held_cap * 2 : 16;
        struct held_fd *n = realloc(held, cap * sizeof *n);
        if (n) {
            held = n;
            held_cap = cap;
        }
    }
    int ok = held_n < held_cap;
    if (ok)
        held[held_n++] = h;
    pthread_mutex_unlock(&held_lock);
    return ok ? 0 : -1;
}

/* Take `fd` (registration `token`) out of the registry; close it if it
 * still is ours. */
static void held_close(int fd, unsigned long long token)
{
    pthread_mutex_lock(&held_lock);
    for (size_t i = 0; i < held_n; i++)
        if (held[i].fd == fd && held[i].token == token) {
            if (still_ours(&held[i]))
                close(fd);
            held[i] = held[--held_n];
            break;
        }
    pthread_mutex_unlock(&held_lock);
}

/* Whether `fd` (registration `token`) still is ours; if not, it is
 * forgotten (never closed: the number is someone else's now). */
static int held_check(int fd, unsigned long long token)
{
    int ours = 0;
    pthread_mutex_lock(&held_lock);
    for (size_t i = 0; i < held_n; i++)
        if (held[i].fd == fd && held[i].token == token) {
            ours = still_ours(&held[i]);
            if (!ours)
                held[i] = held[--held_n];
            break;
        }
    pthread_mutex_unlock(&held_lock);
    return ours;
}

static void fork_prepare(void) { pthread_mutex_lock(&held_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&held_lock); }
static void fork_child(void)
{
    for (size_t i = 0; i < held_n; i++)
        if (still_ours(&held[i]))
            close(held[i].fd);
    held_n = 0;
    pthread_mutex_unlock(&held_lock);
}

/* The calling thread's kept descriptor of the mount root `mount` (device
 * `dev`), between its transactions. Believed only by the thread that kept
 * it (`tid`): a forked child's copy of this memory names a closed number. */
static __thread struct {
    pid_t tid;
    int fd_plus1;
    unsigned long long token;
    dev_t dev;
    char mount[PATH_MAX];
} kept;

static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static int exit_key_ok;

static void kept_drop(void)
{
    if (kept.fd_plus1 > 0 && kept.tid == current_tid())
        held_close(kept.fd_plus1 - 1, kept.token);
    kept.fd_plus1 = 0;
    kept.tid = 0;
}

/* A thread that exits closes its kept descriptor (thread pools would
 * otherwise leak one per thread). */
static void on_thread_exit(void *unused)
{
    (void)unused;
    kept_drop();
    if (tls.fd_plus1 > 0 && tls.tid == current_tid())
        held_close(tls.fd_plus1 - 1, tls.token);
    tls.fd_plus1 = 0;
}

/* Once per process, before the first descriptor is opened: a fork or a
 * thread exit during the very first transaction must find them. */
static void make_keys(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    exit_key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

/* Arm the calling thread's exit destructor (once per thread is enough). */
static void arm_thread_exit(void)
{
    pthread_once(&keys_once, make_keys);
    if (exit_key_ok && !pthread_getspecific(exit_key))
        pthread_setspecific(exit_key, (void *)1);
}

/* Keep `fd` (a descriptor of the root of `mount`) for the thread's next
 * transaction, replacing what it kept before. */
static void kept_set(int fd, unsigned long long token, const char *mount)
{
    dev_t dev;
    ino_t ino;
    kept_drop();
    if (strlen(mount) >= sizeof kept.mount || fd_identity(fd, &dev, &ino) != 0) {
        held_close(fd, token);
        return;
    }
    strcpy(kept.mount, mount);
    kept.dev = dev;
    kept.tid = current_tid();
    kept.fd_plus1 = fd + 1;
    kept.token = token;
}

static void tls_clear(void)
{
    /* A forked child's copy names its parent's descriptor: not ours. */
    if (tls.fd_plus1 > 0 && tls.tid == current_tid())
        kept_set(tls.fd_plus1 - 1, tls.token, tls.mount);
    tls.fd_plus1 = 0;
    tls.depth = 0;
    tls.tid = 0;
    tls.mount[0] = '\0';
}

/* ---- mountinfo ---------------------------------------------------------- */

/* Undo the octal escapes of /proc/self/mountinfo (\040 space, \011 tab,
 * \012 newline, \134 backslash) in place. */
static void unescape_octal(char *s)
{
    char *w = s;
    for (char *r = s; *r;) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
            r += 4;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

struct mount_entry {
    unsigned maj, min;
    char *point; /* unescaped mount point */
};

/* "fuse.txfs" or "fuse.txfs-view"; or plain "fuse" with the source "txfs" or "txfs:BACKING", as
 * a daemon mounting with mount(2) directly (as root, without fusermount3)
 * may leave it when its FUSE library drops the subtype. */
static int is_txfs(const char *fstype, const char *source)
{
    if (strcmp(fstype, TXFS_FSTYPE) == 0 || strcmp(fstype, TXFS_VIEW_FSTYPE) == 0)
        return 1;
    if (strcmp(fstype, "fuse") != 0 || !source)
        return 0;
    return strcmp(source, "txfs") == 0 || strncmp(source, "txfs:", 5) == 0;
}

/* Parse one mountinfo line; returns 1 if it is a txfs mount (entry filled,
 * pointing into `line`), 0 otherwise.
 *   36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
 */
static int parse_line(char *line, struct mount_entry *e)
{
    char *save = NULL;
    char *f[5];
    for (int i = 0; i < 5; i++) {
        f[i] = strtok_r(i == 0 ? line : NULL, " \n", &save);
        if (!f[i])
            return 0;
    }
    /* Skip the mount options and optional fields up to the "-" separator. */
    char *tok;
    while ((tok = strtok_r(NULL, " \n", &save)) && strcmp(tok, "-") != 0)
        ;
    if (!tok)
        return 0;
    char *fstype = strtok_r(NULL, " \n", &save);
    char *source = strtok_r(NULL, " \n", &save);
    if (!fstype || !is_txfs(fstype, source))
        return 0;
    if (sscanf(f[2], "%u:%u", &e->maj, &e->min) != 2)
        return 0;
    unescape_octal(f[4]);
    e->point = f[4];
    return 1;
}

/* Is `prefix` the path `path` or one of its ancestors (component-wise)? */
static size_t path_prefix_len(const char *prefix, const char *path)
{
    size_t n = strlen(prefix);
    if (n == 1 && prefix[0] == '/')
        return 1;
    if (strncmp(prefix, path, n) != 0)
        return 0;
    return (path[n] == '\0' || path[n] == '/') ? n : 0;
}

static int copy_out(char *out, size_t outlen, const char *s)
{
    size_t n = strlen(s);
    if (n + 1 > outlen) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(out, s, n + 1);
    return 0;
}

/* The mount root for `path` (NULL: the only txfs mount), found in the
 * mountinfo file `mountinfo`. Private, but exported for the tests.
 *   path == NULL: 0 txfs file systems -> ENODEV; one -> it; several: the
 *     one holding the current directory (as `txfs run`), else ENOTUNIQ with
 *     the candidates in txfs_last_error(). Bind mounts of one file system
 *     (same device) count once.
 *   path given: the txfs mount holding it (same device; the longest mount
 *     point that is a prefix of its real path, if several); none -> ENOTTY.
 *     If the mountinfo file cannot be read, the path itself (or, for a
 *     non-directory, its parent) is taken as the mount.
 */
/* The calling thread's last message of mount resolution (txfs_last_error). */
static __thread char last_error[1280];

TXFS_API const char *txfs_last_error(void)
{
    return last_error;
}

static int find_mount(const char *mountinfo, const char *path, char *out, size_t outlen, int *by_cwd);

/* Append `a` then `b` to the string `dst` of `cap` bytes, truncating. */
static void append_bounded(char *dst, size_t cap, const char *a, const char *b)
{
    size_t n = strlen(dst);
    for (const char *p = a; *p && n + 1 < cap; p++)
        dst[n++] = *p;
    for (const char *p = b; *p && n + 1 < cap; p++)
        dst[n++] = *p;
    dst[n] = '\0';
}

TXFS_API int txfs__find_mount(const char *mountinfo, const char *path, char *out, size_t outlen)
{
    int by_cwd;
    return find_mount(mountinfo, path, out, outlen, &by_cwd);
}

/* txfs__find_mount; *by_cwd set when the current directory chose among
 * several mounts (the answer then depends on it). */
static int find_mount(const char *mountinfo, const char *path, char *out, size_t outlen, int *by_cwd)
{
    struct stat st;
    *by_cwd = 0;
    last_error[0] = '\0';
    char real[PATH_MAX];
    if (path) {
        if (stat(path, &st) != 0)
            return -1;
        if (!realpath(path, real))
            return -1;
    }
    FILE *f = fopen(mountinfo, "re");
    if (!f) {
        if (!path)
            return -1;
        if (!S_ISDIR(st.st_mode)) {
            char *slash = strrchr(real, '/');
            if (slash == real)
                slash[1] = '\0';
            else if (slash)
                *slash = '\0';
        }
        return copy_out(out, outlen, real);
    }

    char *line = NULL;
    size_t cap = 0;
    int found = 0, several = 0;
    unsigned dev_maj = 0, dev_min = 0;
    size_t best = 0;
    char chosen[PATH_MAX];
    chosen[0] = '\0';
    int rc = 0;
    /* With no path: the current directory, to choose among several. */
    struct stat cwd_st;
    char cwd[PATH_MAX];
    int have_cwd = !path && stat(".", &cwd_st) == 0 && realpath(".", cwd) != NULL;
    char by_dir[PATH_MAX];
    size_t by_dir_len = 0;
    by_dir[0] = '\0';
    char points[1024]; /* the candidates, ", "-separated, truncated */
    points[0] = '\0';
    while (getline(&line, &cap, f) >= 0) {
        struct mount_entry e;
        if (!parse_line(line, &e))
            continue;
        if (strlen(e.point) >= sizeof chosen)
            continue;
        if (path) {
            if (makedev(e.maj, e.min) != st.st_dev)
                continue;
            size_t n = path_prefix_len(e.point, real);
            if (!found || n > best) {
                best = n;
                strcpy(chosen, e.point);
            }
            found = 1;
        } else {
            append_bounded(points, sizeof points, points[0] ? ", " : "", e.point);
            if (have_cwd && makedev(e.maj, e.min) == cwd_st.st_dev) {
                size_t k = path_prefix_len(e.point, cwd);
                if (k > by_dir_len) {
                    by_dir_len = k;
                    strcpy(by_dir, e.point);
                }
            }
            if (!found) {
                found = 1;
                dev_maj = e.maj;
                dev_min = e.min;
                strcpy(chosen, e.point);
            } else if (e.maj != dev_maj || e.min != dev_min) {
                several = 1;
            }
        }
    }
    if (several && by_dir[0]) {
        several = 0;
        *by_cwd = 1;
        strcpy(chosen, by_dir);
    }
    if (ferror(f)) {
        rc = -1;
    } else if (!found) {
        if (path)
            snprintf(last_error, sizeof last_error, "%s is not inside a txfs mount", path);
        else
            snprintf(last_error, sizeof last_error, "no txfs mount (mount one, or set TXFS_MOUNT)");
        errno = path ? ENOTTY : ENODEV;
        rc = -1;
    } else if (several) {
        snprintf(last_error, sizeof last_error,
                 "several txfs mounts (%s) and the current directory is in none of them: set TXFS_MOUNT or use "
                 "txfs_begin(path)",
                 points);
        errno = ENOTUNIQ;
        rc = -1;
    } else {
        rc = copy_out(out, outlen, chosen);
    }
    free(line);
    fclose(f);
    return rc;
}

/* The calling thread's last resolution: `key` (the path asked about, or ""
 * for the default mount) was found on `mount`, whose root is device `dev`;
 * `checked`: that device was seen to be FUSE by open_mount. */
static __thread struct {
    int valid, checked;
    int by_cwd; /* chosen by the current directory, which was on `dev` */
    dev_t dev;
    char key[PATH_MAX];
    char mount[PATH_MAX];
} last;

/* The device of `path` as the kernel has it cached: no request to the
 * daemon (FUSE honours AT_STATX_DONT_SYNC). `fd` >= 0 with path "": that
 * descriptor. */
static int cached_dev(int fd, const char *path, dev_t *dev)
{
    struct statx stx;
    int flags = AT_STATX_DONT_SYNC | (fd >= 0 ? AT_EMPTY_PATH : 0);
    if (statx(fd >= 0 ? fd : AT_FDCWD, path, flags, STATX_TYPE, &stx) != 0)
        return -1;
    *dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    return 0;
}

/* `path` (NULL: $TXFS_MOUNT if set and non-empty, else the only txfs mount)
 * to the root directory of its txfs mount. Reuses the thread's last answer
 * while `path` is still on the same device. */
static int resolve_mount(const char *path, char *out, size_t outlen)
{
    if (!path) {
        const char *env = getenv("TXFS_MOUNT");
        if (env && *env)
            path = env;
    }
    const char *key = path ? path : "";
    dev_t dev;
    dev_t cwd_dev;
    if (last.valid && strcmp(last.key, key) == 0 && cached_dev(-1, path ? path : last.mount, &dev) == 0 &&
        dev == last.dev && (!last.by_cwd || (cached_dev(-1, ".", &cwd_dev) == 0 && cwd_dev == dev)))
        return copy_out(out, outlen, last.mount);
    int by_cwd;
    if (find_mount(TXFS_DEFAULT_MOUNTINFO, path, out, outlen, &by_cwd) != 0)
        return -1;
    last.by_cwd = by_cwd;
    if (strlen(key) < sizeof last.key && strlen(out) < sizeof last.mount && cached_dev(-1, out, &dev) == 0) {
        strcpy(last.key, key);
        strcpy(last.mount, out);
        last.dev = dev;
        last.checked = 0;
        last.valid = 1;
    } else {
        last.valid = 0;
    }
    return 0;
}

/* Open the root of `mount` and check it is FUSE: a descriptor, or -1. The
 * check (fstatfs, a request to the daemon) runs once per thread and mount;
 * after that the device number, known without a request, must match. */
static int open_mount(const char *mount, int extra_flags)
{
    int fd = open(mount, O_RDONLY | O_DIRECTORY | O_CLOEXEC | extra_flags);
    if (fd < 0)
        return -1;
    int known = last.valid && strcmp(last.mount, mount) == 0;
    dev_t dev;
    if (known && last.checked && cached_dev(fd, "", &dev) == 0 && dev == last.dev)
        return fd;
    struct statfs sfs;
    if (fstatfs(fd, &sfs) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (sfs.f_type != FUSE_SUPER_MAGIC) {
        close(fd);
        errno = ENOTTY;
        return -1;
    }
    if (known && cached_dev(fd, "", &dev) == 0 && dev == last.dev)
        last.checked = 1;
    return fd;
}

static int fd_ioctl(int fd, unsigned long cmd, void *arg)
{
    if (ioctl(fd, cmd, arg) < 0) {
        /* A FUSE file system without ioctl support is not txfs. */
        if (errno == ENOSYS)
            errno = ENOTTY;
        return -1;
    }
    return 0;
}

/* Issue the ioctl on `mount`: through the calling thread's transaction
 * descriptor when it is on that mount, else open, ioctl, close. */
static int mount_ioctl(const char *mount, unsigned long cmd, void *arg)
{
    if (tls_valid() && tls.fd_plus1 > 0 && strcmp(mount, tls.mount) == 0)
        return fd_ioctl(tls.fd_plus1 - 1, cmd, arg);
    int fd = open_mount(mount, 0);
    if (fd < 0)
        return -1;
    int rc = fd_ioctl(fd, cmd, arg);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* The mount the calling thread's transaction is on, or else the default. */
static int current_mount(char *out, size_t outlen)
{
    if (tls_valid())
        return copy_out(out, outlen, tls.mount);
    return resolve_mount(NULL, out, outlen);
}

/* The thread's kept descriptor if it is of `mount` and `mount` is still
 * the same mount (its root's device, as the kernel has it cached), taken
 * out of `kept`; else -1 (and a stale one is closed). */
static int kept_take(const char *mount, unsigned long long *token)
{
    if (kept.fd_plus1 <= 0 || kept.tid != current_tid())
        return -1;
    dev_t dev;
    if (strcmp(kept.mount, mount) != 0 || cached_dev(-1, mount, &dev) != 0 || dev != kept.dev) {
        kept_drop();
        return -1;
    }
    int fd = kept.fd_plus1 - 1;
    *token = kept.token;
    kept.fd_plus1 = 0;
    kept.tid = 0;
    return held_check(fd, *token) ? fd : -1;
}

/* ---- the API ------------------------------------------------------------ */

TXFS_API int txfs_begin(const char *path_in_mount, unsigned flags)
{
    char mount[PATH_MAX];
    if (resolve_mount(path_in_mount, mount, sizeof mount) != 0)
        return -1;
    if (tls_valid() && strcmp(mount, tls.mount) != 0) {
        /* Nested begin on another mount: one transaction, one file system. */
        struct stat a, b;
        if (stat(mount, &a) != 0 || stat(tls.mount, &b) != 0 || a.st_dev != b.st_dev) {
            errno = EXDEV;
            return -1;
        }
    }
    struct txfs_ioc_flags arg = {.flags = flags, .reserved = 0};
    if (tls_valid()) {
        if (mount_ioctl(tls.mount, TXFS_IOC_BEGIN, &arg) != 0)
            return -1;
        tls.depth++;
        return 0;
    }
    /* The outermost begin: its descriptor serves the whole transaction. */
    unsigned long long token = 0;
    int fd = kept_take(mount, &token);
    if (fd >= 0 && fd_ioctl(fd, TXFS_IOC_BEGIN, &arg) != 0) {
        int e = errno;
        held_close(fd, token);
        fd = -1;
        errno = e;
        /* The kept descriptor's mount went away (unmounted, its daemon
         * gone): try the mount that is there now. */
        if (e != ENOTCONN && e != ECONNABORTED && e != ENODEV && e != ECANCELED)
            return -1;
    } else if (fd >= 0) {
        goto begun;
    }
    arm_thread_exit();
    fd = open_mount(mount, O_DSYNC);
    if (fd < 0)
        return -1;
    if (held_add(fd, &token) != 0) {
        int e = errno ? errno : ENOMEM;
        close(fd);
        errno = e;
        return -1;
    }
    if (fd_ioctl(fd, TXFS_IOC_BEGIN, &arg) != 0) {
        int e = errno;
        held_close(fd, token);
        errno = e;
        return -1;
    }
begun:
    strcpy(tls.mount, mount);
    tls.tid = current_tid();
    tls.fd_plus1 = fd + 1;
    tls.token = token;
    tls.depth = 1;
    return 0;
}

/* Ask the daemon how deep the calling thread's transaction is; on failure
 * assume it ended. Used to resynchronise after a failed commit. */
static void resync_depth(const char *mount)
{
    struct txfs_ioc_state st;
    memset(&st, 0, sizeof st);
    int saved = errno;
    if (mount_ioctl(mount, TXFS_IOC_STATE, &st) != 0) {
        /* A doomed transaction answers EDEADLK until it is aborted. */
        if (errno != TXFS_ECONFLICT)
            tls_clear();
    } else if (st.depth == 0 || st.tx == 0) {
        tls_clear();
    } else if (st.depth < tls.depth) {
        tls.depth = st.depth;
    }
    errno = saved;
}

TXFS_API int txfs_commit(unsigned flags)
{
    char mount[PATH_MAX];
    if (current_mount(mount, sizeof mount) != 0)
        return -1;
    int mine = tls_valid();
    struct txfs_ioc_flags arg = {.flags = flags, .reserved = 0};
    if (mount_ioctl(mount, TXFS_IOC_COMMIT, &arg) != 0) {
        if (mine)
            resync_depth(mount);
        return -1;
    }
    if (mine && --tls.depth == 0)
        tls_clear();
    return 0;
}

TXFS_API int txfs_abort(void)
{
    char mount[PATH_MAX];
    if (current_mount(mount, sizeof mount) != 0)
        return -1;
    struct txfs_ioc_flags arg = {.flags = 0, .reserved = 0};
    int rc = mount_ioctl(mount, TXFS_IOC_ABORT, &arg);
    /* An abort ends the whole (flattened) transaction, or there was none. */
    if (tls_valid())
        tls_clear();
    return rc;
}

TXFS_API int txfs_sync(const char *path_in_mount)
{
    char mount[PATH_MAX];
    int rc = path_in_mount ? resolve_mount(path_in_mount, mount, sizeof mount)
                           : current_mount(mount, sizeof mount);
    if (rc != 0)
        return -1;
    struct txfs_ioc_flags arg = {.flags = 0, .reserved = 0};
    return mount_ioctl(mount, TXFS_IOC_SYNC, &arg);
}

TXFS_API int fs_tx_begin(void) { return txfs_begin(NULL, 0); }

TXFS_API int fs_tx_commit(void) { return txfs_commit(0); }

TXFS_API int fs_tx_abort(void) { return txfs_abort(); }

/* ---- the change set (TXFS_IOC_CHANGES) ---------------------------------- */
/*
 * An iterator holds one page of the listing, as the daemon answered it, and
 * consumes its records in place; a record that straddles pages (or is longer
 * than one) is gathered into `rec` as the next pages arrive. Each ioctl goes
 * through mount_ioctl: the thread's transaction descriptor when the
 * transaction is libtxfs's, else a descriptor opened for that one call.
 */

_Static_assert(sizeof(struct txfs_ioc_changes) == 48 + TXFS_CHANGES_DATA, "struct txfs_ioc_changes is packed");

struct txfs_changes {
    char mount[PATH_MAX];
    uint32_t snap;                 /* the listing's snapshot on the daemon */
    int lost;                      /* TXFS_CHANGES_LOST at the first page */
    uint64_t total;                /* the listing's length */
    uint64_t page_at;              /* listing offset of page.data[0] */
    size_t used;                   /* bytes of the page consumed */
    int failed;                    /* errno of a failure, which stays */
    size_t next_index;
    unsigned char *rec;            /* a record gathered across pages */
    size_t rec_cap;
    char *strs;                    /* the current change's strings */
    size_t strs_cap;
    struct txfs_ioc_changes *side; /* answers of txfs_change_read */
    struct txfs_change cur;
    struct txfs_ioc_changes page;
};

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* `p` (of `*cap` bytes) grown to hold at least `n`: it, or its
 * reallocation; NULL (ENOMEM) leaves `p` as it was. */
static void *grow(void *p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return p;
    size_t c = *cap ? *cap : 256;
    while (c < n)
        c = c > SIZE_MAX / 2 ? n : c * 2;
    void *q = realloc(p, c);
    if (q)
        *cap = c;
    return q;
}

/* Ask for the page of the listing at `offset` (0: a new snapshot). */
static int changes_fetch(txfs_changes_t *it, uint64_t offset)
{
    memset(&it->page, 0, offsetof(struct txfs_ioc_changes, data));
    it->page.op = TXFS_CHANGES_LIST;
    it->page.offset = offset;
    it->page.snap = offset ? it->snap : 0;
    if (mount_ioctl(it->mount, TXFS_IOC_CHANGES, &it->page) != 0)
        return -1;
    if (it->page.len > TXFS_CHANGES_DATA || (offset && (it->page.snap != it->snap || it->page.total != it->total))) {
        errno = EPROTO;
        return -1;
    }
    it->page_at = offset;
    it->used = 0;
    return 0;
}

/* The next `n` bytes of the listing, consumed: in the page, or gathered
 * into `rec` from as many pages as they span. Valid until the next call. */
static const unsigned char *changes_take(txfs_changes_t *it, size_t n)
{
    if (it->page.len - it->used >= n) {
        const unsigned char *p = it->page.data + it->used;
        it->used += n;
        return p;
    }
    unsigned char *rec = grow(it->rec, &it->rec_cap, n);
    if (!rec)
        return NULL;
    it->rec = rec;
    for (size_t got = 0; got < n;) {
        size_t avail = it->page.len - it->used;
        if (avail == 0) {
            uint64_t at = it->page_at + it->page.len;
            if (at >= it->total) {
                errno = EPROTO; /* the listing ends inside a record */
                return NULL;
            }
            if (changes_fetch(it, at) != 0)
                return NULL;
            if (it->page.len == 0) {
                errno = EPROTO;
                return NULL;
            }
            continue;
        }
        size_t k = avail < n - got ? avail : n - got;
        memcpy(it->rec + got, it->page.data + it->used, k);
        it->used += k;
        got += k;
    }
    return it->rec;
}

TXFS_API txfs_changes_t *txfs_changes(void)
{
    txfs_changes_t *it = calloc(1, sizeof *it);
    if (!it)
        return NULL;
    if (current_mount(it->mount, sizeof it->mount) != 0 || changes_fetch(it, 0) != 0) {
        int e = errno;
        free(it);
        errno = e;
        return NULL;
    }
    it->snap = it->page.snap;
    it->total = it->page.total;
    it->lost = (it->page.flags & TXFS_CHANGES_LOST) != 0;
    if (it->total > 0 && it->page.len == 0) {
        free(it);
        errno = EPROTO;
        return NULL;
    }
    return it;
}

/* Decode the record whose bytes after its length field are `b` (`len` - 4
 * of them: offsets below are the record's, less 4) into it->cur; -1
 * (EPROTO, ENOMEM). */
static int changes_decode(txfs_changes_t *it, const unsigned char *b, size_t len)
{
    const unsigned char *s[5];
    size_t n[5], at = TXFS_CHANGE_HEAD - 4, end = len - 4, room = 0;
    for (int i = 0; i < 5; i++) {
        if (end - at < 4 || end - at - 4 < le32(b + at)) {
            errno = EPROTO;
            return -1;
        }
        n[i] = le32(b + at);
        s[i] = b + at + 4;
        at += 4 + n[i];
        room += n[i] + 1;
    }
    if (at != end || (n[4] > 0 && s[4][n[4] - 1] != '\0')) {
        errno = EPROTO;
        return -1;
    }
    char *strs = grow(it->strs, &it->strs_cap, room + 1);
    if (!strs)
        return -1;
    it->strs = strs;
    const char *p[5];
    char *w = it->strs;
    for (int i = 0; i < 5; i++) {
        memcpy(w, s[i], n[i]);
        w[n[i]] = '\0';
        p[i] = w;
        w += n[i] + 1;
    }
    *w = '\0'; /* the xattr names' list ends in two NULs, even when empty */
    struct txfs_change *c = &it->cur;
    uint32_t u[8];
    for (int i = 0; i < 8; i++)
        u[i] = le32(b + 4 * i); /* record offsets 4 .. 36; then a u32 0 */
    c->what = u[0];
    c->kind = u[1];
    c->old_mode = u[2];
    c->new_mode = u[3];
    c->old_uid = u[4];
    c->old_gid = u[5];
    c->new_uid = u[6];
    c->new_gid = u[7];
    c->old_size = le64(b + 36); /* record offsets 40 .. 80 */
    c->new_size = le64(b + 44);
    c->bytes = le64(b + 52);
    c->files = le64(b + 60);
    c->dirs = le64(b + 68);
    c->path = p[0];
    c->from = p[1];
    c->old_target = p[2];
    c->target = p[3];
    c->xattrs = p[4];
    c->xattrs_len = n[4];
    c->index = it->next_index;
    return 0;
}

TXFS_API const struct txfs_change *txfs_changes_next(txfs_changes_t *it)
{
    if (!it) {
        errno = EINVAL;
        return NULL;
    }
    if (it->failed) {
        errno = it->failed;
        return NULL;
    }
    uint64_t at = it->page_at + it->used;
    if (at >= it->total) {
        errno = 0;
        return NULL;
    }
    const unsigned char *head = changes_take(it, 4);
    if (!head)
        goto fail;
    uint32_t len = le32(head);
    if (len < TXFS_CHANGE_HEAD || len > it->total - at) {
        errno = EPROTO;
        goto fail;
    }
    const unsigned char *body = changes_take(it, len - 4);
    if (!body || changes_decode(it, body, len) != 0)
        goto fail;
    it->next_index++;
    errno = 0;
    return &it->cur;
fail:
    it->failed = errno ? errno : EIO;
    errno = it->failed;
    return NULL;
}

TXFS_API ssize_t txfs_change_read(txfs_changes_t *it, const struct txfs_change *c, int new_side, uint64_t offset,
                                  void *buf, size_t len)
{
    if (!it || !c || (!buf && len)) {
        errno = EINVAL;
        return -1;
    }
    if (len > SSIZE_MAX)
        len = SSIZE_MAX;
    if (!it->side && !(it->side = malloc(sizeof *it->side)))
        return -1;
    struct txfs_ioc_changes *q = it->side;
    size_t got = 0;
    do {
        memset(q, 0, offsetof(struct txfs_ioc_changes, data));
        q->op = new_side ? TXFS_CHANGES_NEW : TXFS_CHANGES_OLD;
        q->index = c->index;
        q->offset = offset + got;
        q->snap = it->snap;
        if (mount_ioctl(it->mount, TXFS_IOC_CHANGES, q) != 0)
            return got ? (ssize_t)got : -1;
        if (q->len > TXFS_CHANGES_DATA) {
            errno = EPROTO;
            return -1;
        }
        size_t k = q->len < len - got ? q->len : len - got;
        memcpy((char *)buf + got, q->data, k);
        got += k;
        if (q->len == 0 || offset + got >= q->total)
            break;
    } while (got < len);
    return (ssize_t)got;
}

TXFS_API int txfs_changes_lost(const txfs_changes_t *it) { return it && it->lost; }

TXFS_API void txfs_changes_free(txfs_changes_t *it)
{
    if (!it)
        return;
    int e = errno;
    free(it->rec);
    free(it->strs);
    free(it->side);
    free(it);
    errno = e;
}

/* Tests of libtxfs. Unit tests of the mount resolution always run; the
 * integration tests run against the txfs mount named by $TXFS_MOUNT (see
 * run.sh, which mounts a fresh one) and are skipped when it is unset.
 * Output: one line per test, then "N passed, M failed[, K skipped]".
 */
#define _GNU_SOURCE
#include "txfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Private to the library, exported for these tests. */
int txfs__find_mount(const char *mountinfo, const char *path, char *out, size_t outlen);

#define PASS 0
#define FAIL (-1)
#define SKIP 1

static char failure[1024];

static const char *en(int e)
{
    const char *s = strerrorname_np(e);
    return s ? s : "0";
}
static const char *mnt; /* $TXFS_MOUNT, or NULL */
static char tmpdir[256];

static void set_failure(int line, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(failure, sizeof failure, "line %d: ", line);
    va_start(ap, fmt);
    vsnprintf(failure + n, sizeof failure - (size_t)n, fmt, ap);
    va_end(ap);
}

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            set_failure(__LINE__, __VA_ARGS__);                                                \
            return FAIL;                                                                       \
        }                                                                                      \
    } while (0)
/* Expect a -1/errno failure with errno `e`. */
#define CHECK_ERR(call, e)                                                                     \
    do {                                                                                       \
        errno = 0;                                                                             \
        int rc_ = (call);                                                                      \
        int en_ = errno;                                                                       \
        CHECK(rc_ == -1 && en_ == (e), "%s: expected -1/%s, got %d/%s", #call, en(e), \
              rc_, rc_ ? en(en_) : "-");                                          \
    } while (0)
#define CHECK_OK(call)                                                                         \
    do {                                                                                       \
        errno = 0;                                                                             \
        int rc_ = (call);                                                                      \
        CHECK(rc_ == 0, "%s: expected 0, got %d errno %s (%s)", #call, rc_,                    \
              en(errno), strerror(errno));                                        \
    } while (0)

/* ---- helpers -------------------------------------------------------------- */

static int write_file(const char *path, const char *data)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t n = strlen(data);
    ssize_t w = write(fd, data, n);
    int e = errno;
    if (close(fd) != 0 && w == (ssize_t)n)
        return -1;
    errno = e;
    return w == (ssize_t)n ? 0 : -1;
}

static ssize_t read_file(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t r = read(fd, buf, len - 1);
    int e = errno;
    close(fd);
    errno = e;
    if (r >= 0)
        buf[r] = '\0';
    return r;
}

/* stat(path) in a forked child process. Returns 0 if it exists, else the
 * child's errno (ENOENT, ...), or -1 if the child could not run. */
static int child_stat(const char *path)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        struct stat st;
        _exit(stat(path, &st) == 0 ? 0 : (errno & 0xff));
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* Read a file in a forked child; its content goes to buf. 0 or the errno. */
static int child_read(const char *path, char *buf, size_t len)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(p[0]);
        char tmp[4096];
        ssize_t r = read_file(path, tmp, sizeof tmp);
        if (r < 0)
            _exit(errno & 0xff);
        if (write(p[1], tmp, (size_t)r) != r)
            _exit(255);
        _exit(0);
    }
    close(p[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(p[0], buf + got, len - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(p[0]);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* Entries in a directory, other than . and .. ; -1 on error. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static int ioc_state(struct txfs_ioc_state *st)
{
    int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    memset(st, 0, sizeof *st);
    int rc = ioctl(fd, TXFS_IOC_STATE, st);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Nesting depth of the calling thread's transaction per the daemon, or -1. */
static int tx_depth(void)
{
    struct txfs_ioc_state st;
    if (ioc_state(&st) != 0)
        return -1;
    return (int)st.depth;
}

static int ioc_status(struct txfs_ioc_status *st)
{
    int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    memset(st, 0, sizeof *st);
    int rc = ioctl(fd, TXFS_IOC_STATUS, st);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* A fresh directory for one test, created outside any transaction. */
static char *test_dir(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/c-%s-%d", mnt, name, (int)getpid());
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return NULL;
    return buf;
}

static char *join(char *buf, size_t len, const char *dir, const char *name)
{
    if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
        abort();
    return buf;
}

#define J(dir, name) join((char[PATH_MAX]){0}, PATH_MAX, dir, name)

/* ---- unit tests: mount resolution (no mount needed) -------------------- */

static char fake[PATH_MAX];

static int write_fake(const char *content)
{
    if ((size_t)snprintf(fake, sizeof fake, "%s/mountinfo", tmpdir) >= sizeof fake)
        return -1;
    return write_file(fake, content);
}

static const char *EXT4_LINES =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
    "24 22 0:45 / /home/u/sshfs rw,nosuid shared:40 - fuse.sshfs u@h: rw,user_id=0\n"
    "25 22 0:46 / /media/x rw,nosuid - fuse other:/txfs rw,user_id=0\n"
    "26 22 0:47 / /media/y rw,nosuid - fuse txfsnot rw,user_id=0\n";

static int t_mountinfo_none(void)
{
    char out[PATH_MAX];
    CHECK(write_fake(EXT4_LINES) == 0, "write fake mountinfo");
    CHECK_ERR(txfs__find_mount(fake, NULL, out, sizeof out), ENODEV);
    return PASS;
}

static int t_mountinfo_one(void)
{
    char out[PATH_MAX], buf[2048];
    snprintf(buf, sizeof buf,
             "%s"
             "40 22 0:50 / /mnt/my\\040txfs rw,nosuid,nodev,relatime shared:50 - fuse.txfs txfs "
             "rw,user_id=0,group_id=0\n",
             EXT4_LINES);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    CHECK_OK(txfs__find_mount(fake, NULL, out, sizeof out));
    CHECK(strcmp(out, "/mnt/my txfs") == 0, "got %s", out);
    /* too small a buffer */
    CHECK_ERR(txfs__find_mount(fake, NULL, out, 5), ENAMETOOLONG);
    return PASS;
}

static int t_mountinfo_binds(void)
{
    char out[PATH_MAX], buf[2048];
    snprintf(buf, sizeof buf,
             "%s"
             "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n"
             "41 22 0:50 /sub /mnt/b rw master:3 - fuse.txfs txfs rw\n"
             "42 22 0:50 / /mnt/c rw - fuse txfs:/srv/backing rw\n",
             EXT4_LINES);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    CHECK_OK(txfs__find_mount(fake, NULL, out, sizeof out));
    CHECK(strcmp(out, "/mnt/a") == 0, "got %s", out);
    return PASS;
}

static int t_mountinfo_several(void)
{
    char out[PATH_MAX], buf[2048];
    snprintf(buf, sizeof buf,
             "%s"
             "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n"
             "41 22 0:51 / /mnt/b rw - fuse.txfs txfs rw\n",
             EXT4_LINES);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    CHECK_ERR(txfs__find_mount(fake, NULL, out, sizeof out), ENOTUNIQ);
    /* a plain "fuse" mount whose source is txfs:BACKING counts too */
    snprintf(buf, sizeof buf,
             "%s"
             "40 22 0:50 / /mnt/a rw - fuse.txfs txfs rw\n"
             "41 22 0:51 / /mnt/b rw - fuse txfs:/srv/b rw\n",
             EXT4_LINES);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    CHECK_ERR(txfs__find_mount(fake, NULL, out, sizeof out), ENOTUNIQ);
    snprintf(buf, sizeof buf, "%s41 22 0:51 / /mnt/b rw - fuse txfs:/srv/b rw\n", EXT4_LINES);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    CHECK_OK(txfs__find_mount(fake, NULL, out, sizeof out));
    CHECK(strcmp(out, "/mnt/b") == 0, "got %s", out);
    return PASS;
}

static int t_mountinfo_path(void)
{
    /* Pretend that tmpdir (and, shorter, "/") is a txfs mount of tmpdir's
     * device; a path below tmpdir resolves to tmpdir. */
    char out[PATH_MAX], buf[2 * PATH_MAX], sub[PATH_MAX], real[PATH_MAX];
    struct stat st;
    CHECK(stat(tmpdir, &st) == 0, "stat tmpdir");
    CHECK(realpath(tmpdir, real) != NULL, "realpath");
    snprintf(buf, sizeof buf,
             "50 1 %u:%u / / rw - fuse.txfs txfs rw\n"
             "51 1 %u:%u / %s rw - fuse.txfs txfs rw\n"
             "52 1 0:99 / /elsewhere rw - fuse.txfs txfs rw\n",
             major(st.st_dev), minor(st.st_dev), major(st.st_dev), minor(st.st_dev), real);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    snprintf(sub, sizeof sub, "%s/sub", tmpdir);
    mkdir(sub, 0755);
    CHECK_OK(txfs__find_mount(fake, sub, out, sizeof out));
    CHECK(strcmp(out, real) == 0, "got %s, want %s", out, real);
    CHECK_OK(txfs__find_mount(fake, fake, out, sizeof out));
    CHECK(strcmp(out, real) == 0, "got %s, want %s", out, real);
    CHECK_ERR(txfs__find_mount(fake, "/nonexistent/x", out, sizeof out), ENOENT);
    /* /proc is on another device: not inside a txfs mount */
    CHECK_ERR(txfs__find_mount(fake, "/proc/self", out, sizeof out), ENOTTY);
    /* no default: several devices, the current directory in none */
    char here[PATH_MAX];
    CHECK(getcwd(here, sizeof here) != NULL && chdir("/proc") == 0, "chdir /proc");
    int r = txfs__find_mount(fake, NULL, out, sizeof out);
    int e = errno;
    CHECK(chdir(here) == 0, "chdir back");
    CHECK(r == -1 && e == ENOTUNIQ, "from /proc: rc %d, %s", r, strerror(e));
    return PASS;
}

/* Of several txfs mounts, the one holding the current directory (the
 * deepest); in none of them, ENOTUNIQ with every candidate listed. */
static int t_mountinfo_cwd(void)
{
    char out[PATH_MAX], buf[2 * PATH_MAX], real[PATH_MAX], sub[PATH_MAX + 8], here[PATH_MAX];
    struct stat st;
    CHECK(stat(tmpdir, &st) == 0 && realpath(tmpdir, real) != NULL, "stat tmpdir");
    snprintf(sub, sizeof sub, "%s/inner", real);
    mkdir(sub, 0755);
    snprintf(buf, sizeof buf,
             "50 1 0:98 / /mnt/a rw - fuse.txfs txfs rw\n"
             "51 1 %u:%u / %s rw - fuse.txfs txfs rw\n"
             "52 1 0:99 / /mnt/b rw - fuse txfs:/srv/b rw\n",
             major(st.st_dev), minor(st.st_dev), real);
    CHECK(write_fake(buf) == 0, "write fake mountinfo");
    CHECK(getcwd(here, sizeof here) != NULL, "getcwd");
    CHECK(chdir(sub) == 0, "chdir");
    int r = txfs__find_mount(fake, NULL, out, sizeof out);
    int e = errno;
    CHECK(chdir("/proc") == 0, "chdir /proc");
    int r2 = txfs__find_mount(fake, NULL, out, sizeof out);
    int e2 = errno;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", txfs_last_error());
    CHECK(chdir(here) == 0, "chdir back");
    CHECK(r == 0, "from a directory inside %s: %s", real, strerror(e));
    CHECK(r2 == -1 && e2 == ENOTUNIQ, "from /proc: rc %d, %s", r2, strerror(e2));
    CHECK(strstr(msg, "/mnt/a") && strstr(msg, "/mnt/b") && strstr(msg, real), "the candidates listed: %s", msg);
    CHECK_OK(txfs__find_mount(fake, real, out, sizeof out));
    CHECK(txfs_last_error()[0] == '\0', "cleared on success: %s", txfs_last_error());
    return PASS;
}

static int t_env_errors(void)
{
    char *old = getenv("TXFS_MOUNT") ? strdup(getenv("TXFS_MOUNT")) : NULL;
    int rc = PASS;
    setenv("TXFS_MOUNT", "/nonexistent/txfs", 1);
    errno = 0;
    if (fs_tx_begin() != -1 || errno != ENOENT) {
        set_failure(__LINE__, "TXFS_MOUNT=/nonexistent: want -1/ENOENT, got errno %s",
                    en(errno));
        rc = FAIL;
    }
    setenv("TXFS_MOUNT", tmpdir, 1);
    errno = 0;
    if (rc == PASS && (fs_tx_begin() != -1 || errno != ENOTTY)) {
        set_failure(__LINE__, "TXFS_MOUNT=%s (not txfs): want -1/ENOTTY, got errno %s", tmpdir,
                    en(errno));
        rc = FAIL;
    }
    errno = 0;
    if (rc == PASS && (txfs_begin("/proc", 0) != -1 || errno != ENOTTY)) {
        set_failure(__LINE__, "txfs_begin(/proc): want -1/ENOTTY, got errno %s",
                    en(errno));
        rc = FAIL;
    }
    if (old)
        setenv("TXFS_MOUNT", old, 1);
    else
        unsetenv("TXFS_MOUNT");
    free(old);
    return rc;
}

/* fs_tx_begin with no txfs mount at all: in a private mount namespace where
 * every txfs mount has been detached (needs CAP_SYS_ADMIN; skipped without). */
static int t_no_mount_enodev(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return FAIL;
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
            _exit(100);
        /* Detach every fuse.txfs mount of this namespace (deepest first:
         * repeat until none is left). */
        for (int round = 0; round < 16; round++) {
            char out[PATH_MAX];
            if (txfs__find_mount("/proc/self/mountinfo", NULL, out, sizeof out) != 0 &&
                errno == ENODEV)
                break;
            FILE *f = fopen("/proc/self/mountinfo", "re");
            char line[8192];
            while (f && fgets(line, sizeof line, f)) {
                char point[PATH_MAX], fstype[256];
                char *sep = strstr(line, " - ");
                char source[256] = "";
                if (!sep || sscanf(sep, " - %255s %255s", fstype, source) < 1)
                    continue;
                if (strcmp(fstype, "fuse.txfs") && !(!strcmp(fstype, "fuse") && !strncmp(source, "txfs", 4)))
                    continue;
                if (sscanf(line, "%*s %*s %*s %*s %4095s", point) == 1)
                    umount2(point, MNT_DETACH); /* (no escapes in test paths) */
            }
            if (f)
                fclose(f);
        }
        unsetenv("TXFS_MOUNT");
        errno = 0;
        int rc = fs_tx_begin();
        _exit(rc == -1 && errno == ENODEV ? 0 : (rc == 0 ? 101 : (errno & 0xff)));
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status), "child died");
    if (WEXITSTATUS(status) == 100) {
        snprintf(failure, sizeof failure, "cannot make a private mount namespace");
        return SKIP;
    }
    CHECK(WEXITSTATUS(status) == 0, "fs_tx_begin without a mount: want -1/ENODEV, got %s",
          WEXITSTATUS(status) == 101 ? "0" : en(WEXITSTATUS(status)));
    return PASS;
}

/* ---- integration tests ----------------------------------------------------- */

static int t_invisible_until_commit(void)
{
    char dir[PATH_MAX], buf[256];
    CHECK(test_dir("commit", dir, sizeof dir), "mkdir: %s", strerror(errno));
    const char *f = J(dir, "file"), *sub = J(dir, "sub");
    CHECK_OK(fs_tx_begin());
    CHECK(tx_depth() == 1, "depth %d, want 1", tx_depth());
    CHECK_OK(write_file(f, "hello"));
    CHECK_OK(mkdir(sub, 0755));
    /* the transaction sees its own writes */
    CHECK(read_file(f, buf, sizeof buf) == 5 && !strcmp(buf, "hello"), "own read: %s", buf);
    /* another process does not */
    CHECK(child_stat(f) == ENOENT, "child stat(file) = %d before commit, want ENOENT",
          child_stat(f));
    CHECK(child_stat(sub) == ENOENT, "child stat(sub) before commit");
    CHECK(child_read(f, buf, sizeof buf) == ENOENT, "child read before commit: '%s'", buf);
    CHECK_OK(fs_tx_commit());
    CHECK(tx_depth() == 0, "depth %d after commit", tx_depth());
    CHECK(child_stat(f) == 0, "child stat(file) after commit: %s", en(child_stat(f)));
    CHECK(child_stat(sub) == 0, "child stat(sub) after commit");
    CHECK(child_read(f, buf, sizeof buf) == 0 && !strcmp(buf, "hello"), "child read: '%s'", buf);
    return PASS;
}

static int t_abort_leaves_nothing(void)
{
    char dir[PATH_MAX], buf[256];
    CHECK(test_dir("abort", dir, sizeof dir), "mkdir");
    const char *keep = J(dir, "keep");
    CHECK_OK(write_file(keep, "old"));
    CHECK_OK(fs_tx_begin());
    CHECK_OK(write_file(J(dir, "new"), "data"));
    CHECK_OK(mkdir(J(dir, "newdir"), 0755));
    CHECK_OK(write_file(J(dir, "newdir/inner"), "x"));
    CHECK_OK(write_file(keep, "changed"));
    CHECK_OK(fs_tx_abort());
    CHECK(tx_depth() == 0, "depth %d after abort", tx_depth());
    struct stat st;
    CHECK(stat(J(dir, "new"), &st) == -1 && errno == ENOENT, "new survived the abort");
    CHECK(stat(J(dir, "newdir"), &st) == -1 && errno == ENOENT, "newdir survived the abort");
    CHECK(child_stat(J(dir, "new")) == ENOENT, "child sees new");
    CHECK(count_entries(dir) == 1, "%d entries, want 1 (keep)", count_entries(dir));
    CHECK(read_file(keep, buf, sizeof buf) == 3 && !strcmp(buf, "old"), "keep = '%s'", buf);
    CHECK(child_read(keep, buf, sizeof buf) == 0 && !strcmp(buf, "old"), "child keep = '%s'", buf);
    return PASS;
}

static int t_nested_flattens(void)
{
    char dir[PATH_MAX];
    CHECK(test_dir("nested", dir, sizeof dir), "mkdir");
    const char *f = J(dir, "f");
    CHECK_OK(fs_tx_begin());
    CHECK_OK(fs_tx_begin());
    CHECK(tx_depth() == 2, "depth %d, want 2", tx_depth());
    CHECK_OK(write_file(f, "nested"));
    CHECK_OK(fs_tx_commit()); /* inner: publishes nothing */
    CHECK(tx_depth() == 1, "depth %d after inner commit, want 1", tx_depth());
    CHECK(child_stat(f) == ENOENT, "inner commit published the file");
    CHECK_OK(fs_tx_commit());
    CHECK(tx_depth() == 0, "depth %d after outer commit", tx_depth());
    CHECK(child_stat(f) == 0, "outer commit did not publish");
    /* nested abort: the inner abort ends the whole transaction */
    const char *g = J(dir, "g");
    CHECK_OK(fs_tx_begin());
    CHECK_OK(write_file(g, "g"));
    CHECK_OK(fs_tx_begin());
    CHECK_OK(fs_tx_abort());
    CHECK(tx_depth() == 0, "depth %d after nested abort, want 0", tx_depth());
    CHECK(child_stat(g) == ENOENT, "g survived the abort");
    struct stat st;
    CHECK(stat(g, &st) == -1 && errno == ENOENT, "g visible to its writer after abort");
    return PASS;
}

struct thr_arg {
    const char *path;
    pthread_barrier_t *barrier;
    int rc;
    int err;
    const char *step;
    int retries; /* 0: one attempt; else retry on conflict up to this many times */
    int attempts;
};

static void *isolation_thread(void *p)
{
    struct thr_arg *a = p;
    struct stat st;
    a->rc = stat(a->path, &st);
    a->err = errno;
    return NULL;
}

static int t_thread_isolation(void)
{
    char dir[PATH_MAX];
    CHECK(test_dir("threads", dir, sizeof dir), "mkdir");
    const char *f = J(dir, "f");
    CHECK_OK(fs_tx_begin());
    CHECK_OK(write_file(f, "x"));
    struct thr_arg a = {.path = f};
    pthread_t t;
    pthread_create(&t, NULL, isolation_thread, &a);
    pthread_join(t, NULL);
    int before = a.rc, before_err = a.err;
    CHECK_OK(fs_tx_commit());
    pthread_create(&t, NULL, isolation_thread, &a);
    pthread_join(t, NULL);
    CHECK(before == -1 && before_err == ENOENT, "another thread saw the file before commit");
    CHECK(a.rc == 0, "another thread does not see the file after commit: %s", strerror(a.err));
    return PASS;
}

/* One read-modify-write of the counter in a transaction of this thread. */
static void *rmw_thread(void *p)
{
    struct thr_arg *a = p;
    for (a->attempts = 1;; a->attempts++) {
        char buf[64] = {0};
        int fd = -1;
        a->rc = -1;
        int waited = 0;
        a->step = "begin";
        if (txfs_begin(a->path, 0) != 0) {
            a->err = errno;
            if (a->attempts == 1 && a->barrier)
                pthread_barrier_wait(a->barrier);
            return NULL;
        }
        a->step = "open";
        if ((fd = open(a->path, O_RDWR | O_CLOEXEC)) < 0)
            goto fail;
        a->step = "read";
        ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
        if (r < 0)
            goto fail;
        /* both threads have read before either writes */
        if (a->attempts == 1 && a->barrier) {
            pthread_barrier_wait(a->barrier);
            waited = 1;
        }
        long v = strtol(buf, NULL, 10);
        int n = snprintf(buf, sizeof buf, "%ld\n", v + 1);
        a->step = "write";
        if (pwrite(fd, buf, (size_t)n, 0) != n)
            goto fail;
        a->step = "close";
        int c = close(fd);
        fd = -1;
        if (c != 0)
            goto fail;
        a->step = "commit";
        if (fs_tx_commit() != 0)
            goto fail;
        a->rc = 0;
        a->err = 0;
        a->step = "done";
        return NULL;
    fail:
        a->err = errno;
        if (a->attempts == 1 && a->barrier && !waited)
            pthread_barrier_wait(a->barrier); /* do not leave the other thread waiting */
        if (fd >= 0)
            close(fd);
        fs_tx_abort();
        if (a->err != TXFS_ECONFLICT || a->attempts > a->retries)
            return NULL;
        usleep((useconds_t)(1000 * a->attempts + (rand() % 1000)));
    }
}

static int read_counter(const char *path, long *v)
{
    char buf[64];
    if (read_file(path, buf, sizeof buf) < 0)
        return -1;
    *v = strtol(buf, NULL, 10);
    return 0;
}

static int t_conflict_edeadlk(void)
{
    char dir[PATH_MAX];
    CHECK(test_dir("conflict", dir, sizeof dir), "mkdir");
    const char *f = J(dir, "counter");
    CHECK_OK(write_file(f, "0\n"));
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, 2);
    struct thr_arg a[2] = {{.path = f, .barrier = &b}, {.path = f, .barrier = &b}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, rmw_thread, &a[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&b);
    int ok = (a[0].rc == 0) + (a[1].rc == 0);
    int lost = (a[0].rc != 0 && a[0].err == EDEADLK) + (a[1].rc != 0 && a[1].err == EDEADLK);
    long v = -1;
    CHECK(read_counter(f, &v) == 0, "read counter: %s", strerror(errno));
    CHECK(ok == 1 && lost == 1,
          "want one commit and one EDEADLK; thread 0: %s at %s, thread 1: %s at %s; counter %ld",
          a[0].rc ? en(a[0].err) : "ok", a[0].step,
          a[1].rc ? en(a[1].err) : "ok", a[1].step, v);
    CHECK(v == 1, "counter %ld, want 1", v);
    CHECK(child_read(f, (char[64]){0}, 64) == 0, "child cannot read the counter");

    /* the same race, each thread retrying on conflict: both increments land */
    pthread_barrier_init(&b, NULL, 2);
    for (int i = 0; i < 2; i++) {
        a[i] = (struct thr_arg){.path = f, .barrier = &b, .retries = 20};
        pthread_create(&t[i], NULL, rmw_thread, &a[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&b);
    CHECK(a[0].rc == 0 && a[1].rc == 0, "retries: thread 0: %s at %s, thread 1: %s at %s",
          en(a[0].err), a[0].step, en(a[1].err), a[1].step);
    CHECK(read_counter(f, &v) == 0 && v == 3, "counter %ld after retries, want 3", v);
    CHECK(a[0].attempts + a[1].attempts >= 3, "nobody retried (attempts %d+%d)", a[0].attempts,
          a[1].attempts);
    return PASS;
}

static int t_ordered_and_sync(void)
{
    char dir[PATH_MAX];
    CHECK(test_dir("ordered", dir, sizeof dir), "mkdir");
    const char *f = J(dir, "f");
    CHECK_OK(txfs_begin(dir, 0));
    CHECK_OK(write_file(f, "ordered"));
    CHECK(child_stat(f) == ENOENT, "visible before commit");
    CHECK_OK(txfs_commit(TXFS_COMMIT_ORDERED));
    CHECK(child_stat(f) == 0, "ordered commit not visible");
    CHECK_OK(txfs_sync(f));
    CHECK_OK(txfs_sync(mnt));
    CHECK_OK(txfs_sync(NULL));
    CHECK_ERR(txfs_sync("/proc"), ENOTTY);
    return PASS;
}

static int t_begin_paths(void)
{
    char dir[PATH_MAX];
    CHECK(test_dir("paths", dir, sizeof dir), "mkdir");
    const char *f = J(dir, "f");
    CHECK_OK(write_file(f, "file"));
    /* begin through a file inside the mount, commit reaches the same mount */
    CHECK_OK(txfs_begin(f, 0));
    CHECK_OK(unlink(f));
    CHECK(child_stat(f) == 0, "unlink visible before commit");
    /* a nested begin naming a non-txfs path fails, the transaction goes on */
    CHECK_ERR(txfs_begin("/proc", 0), ENOTTY);
    CHECK(tx_depth() == 1, "depth %d", tx_depth());
    CHECK_OK(txfs_commit(0)); /* f no longer exists: commit must not need it */
    CHECK(child_stat(f) == ENOENT, "unlink not published");
    return PASS;
}

static int t_commit_without_begin(void)
{
    CHECK(tx_depth() == 0, "thread already in a transaction");
    errno = 0;
    int rc = fs_tx_commit();
    CHECK(rc == -1, "fs_tx_commit without a transaction returned %d", rc);
    snprintf(failure, sizeof failure, "(errno %s)", en(errno));
    return PASS;
}

static int t_fork_child_not_in_tx(void)
{
    char dir[PATH_MAX];
    CHECK(test_dir("fork", dir, sizeof dir), "mkdir");
    const char *f = J(dir, "f");
    CHECK_OK(fs_tx_begin());
    CHECK_OK(write_file(f, "parent"));
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        /* The child inherits the library's memory, not the transaction. */
        struct stat st;
        if (tx_depth() != 0)
            _exit(1);
        if (stat(f, &st) == 0)
            _exit(2);
        if (fs_tx_commit() == 0)
            _exit(3);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 99;
    CHECK(tx_depth() == 1, "parent's depth %d after the child", tx_depth());
    CHECK_OK(fs_tx_commit());
    CHECK(code == 0, "child: %s",
          code == 1   ? "in a transaction"
          : code == 2 ? "sees the parent's file"
          : code == 3 ? "committed the parent's transaction"
                      : "died");
    CHECK(child_stat(f) == 0, "parent's commit did not publish");
    return PASS;
}

static int t_status_counters(void)
{
    struct txfs_ioc_status s0, s1;
    struct txfs_ioc_state st;
    char dir[PATH_MAX];
    CHECK(test_dir("status", dir, sizeof dir), "mkdir");
    CHECK_OK(ioc_status(&s0));
    CHECK_OK(fs_tx_begin());
    CHECK_OK(ioc_state(&st));
    CHECK(st.tx != 0 && st.depth == 1, "state tx=%llu depth=%u", (unsigned long long)st.tx,
          st.depth);
    CHECK_OK(ioc_status(&s1));
    CHECK(s1.live_txs >= 1, "live_txs %llu during a transaction", (unsigned long long)s1.live_txs);
    CHECK_OK(write_file(J(dir, "f"), "s"));
    CHECK_OK(fs_tx_commit());
    CHECK_OK(ioc_status(&s1));
    CHECK(s1.commits >= s0.commits + 1, "commits %llu -> %llu", (unsigned long long)s0.commits,
          (unsigned long long)s1.commits);
    CHECK(s1.last_seq >= s0.last_seq, "last_seq went back");
    CHECK_OK(fs_tx_begin());
    CHECK_OK(fs_tx_abort());
    CHECK_OK(ioc_status(&s0));
    CHECK(s0.aborts >= s1.aborts + 1, "aborts %llu -> %llu", (unsigned long long)s1.aborts,
          (unsigned long long)s0.aborts);
    return PASS;
}

/* ---- the change set ------------------------------------------------------ */

/* Bytes of a change's record in the daemon's listing. */
static size_t record_len(const struct txfs_change *c)
{
    return TXFS_CHANGE_HEAD + 5 * 4 + strlen(c->path) + strlen(c->from) + strlen(c->old_target) +
           strlen(c->target) + c->xattrs_len;
}

/* A thread's transaction as txfs_changes() lists it: one change a path in
 * path order, with sizes and the old name of a rename; both sides of a
 * file readable; nothing of a file created and deleted inside. A second
 * listing makes the first one's reads ESTALE. The abort then leaves the
 * mount as it was, and outside a transaction there is nothing to list. */
static int t_changes_lists_the_transaction(void)
{
    char dir[PATH_MAX], buf[256];
    CHECK(test_dir("changes", dir, sizeof dir), "mkdir");
    const char *rel = dir + strlen(mnt) + 1;
    CHECK_OK(write_file(J(dir, "mod"), "old content"));
    CHECK_OK(write_file(J(dir, "ren"), "moved"));
    CHECK_OK(write_file(J(dir, "del"), "doomed"));
    CHECK_OK(fs_tx_begin());
    CHECK_OK(write_file(J(dir, "new"), "fresh"));
    CHECK_OK(write_file(J(dir, "mod"), "new content, longer"));
    CHECK_OK(rename(J(dir, "ren"), J(dir, "ren2")));
    CHECK_OK(unlink(J(dir, "del")));
    CHECK_OK(write_file(J(dir, "tmp"), "scratch"));
    CHECK_OK(unlink(J(dir, "tmp")));

    struct {
        const char *name;
        uint32_t what;
        uint64_t old_size, new_size;
        const char *from;
    } want[] = {
        {"del", TXFS_CHANGE_DELETED, 6, 0, NULL},
        {"mod", TXFS_CHANGE_MODIFIED, 11, 19, NULL},
        {"new", TXFS_CHANGE_CREATED, 0, 5, NULL},
        {"ren2", TXFS_CHANGE_RENAMED, 5, 5, "ren"},
    };
    struct txfs_change got[4];
    txfs_changes_t *it = txfs_changes();
    CHECK(it, "txfs_changes: %s", en(errno));
    CHECK(txfs_changes_lost(it) == 0, "the transaction lost no conflict");
    const struct txfs_change *c;
    size_t n = 0;
    while ((c = txfs_changes_next(it))) {
        if (n < 4)
            got[n] = *c;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", rel, n < 4 ? want[n].name : "?");
        CHECK(n < 4 && strcmp(c->path, path) == 0, "change %zu: %s (what %#x), want %s", n, c->path, c->what,
              n < 4 ? path : "none");
        CHECK(c->index == n, "change %zu has index %zu", n, c->index);
        /* (A truncating open's SETATTR carries an mtime: not TIMES.) */
        CHECK(c->what == want[n].what, "%s: what %#x, want %#x", c->path, c->what, want[n].what);
        CHECK(c->kind == S_IFREG, "%s: kind %#o", c->path, c->kind);
        CHECK(c->old_size == want[n].old_size && c->new_size == want[n].new_size, "%s: sizes %llu -> %llu",
              c->path, (unsigned long long)c->old_size, (unsigned long long)c->new_size);
        snprintf(path, sizeof path, "%s/%s", rel, want[n].from ? want[n].from : "");
        CHECK(strcmp(c->from, want[n].from ? path : "") == 0, "%s: from '%s'", c->path, c->from);
        CHECK(!*c->target && !*c->old_target && c->xattrs_len == 0 && !*c->xattrs, "%s: strings", c->path);
        n++;
    }
    CHECK(errno == 0, "the listing ended with %s", en(errno));
    CHECK(n == 4, "%zu changes, want 4", n);
    CHECK(txfs_changes_next(it) == NULL && errno == 0, "past the end: NULL, errno 0");

    /* Both sides of the modified file; the old side of a rename is at its
     * old name; a side with no file is ENOENT. Reads need only the index. */
    memset(buf, 0, sizeof buf);
    CHECK(txfs_change_read(it, &got[1], 1, 0, buf, sizeof buf) == 19 && !strcmp(buf, "new content, longer"),
          "new side of mod: '%s'", buf);
    memset(buf, 0, sizeof buf);
    CHECK(txfs_change_read(it, &got[1], 0, 0, buf, sizeof buf) == 11 && !strcmp(buf, "old content"),
          "old side of mod: '%s'", buf);
    memset(buf, 0, sizeof buf);
    CHECK(txfs_change_read(it, &got[1], 1, 4, buf, 3) == 3 && !strcmp(buf, "con"), "3 bytes at 4: '%s'", buf);
    CHECK(txfs_change_read(it, &got[1], 1, 100, buf, sizeof buf) == 0, "past the end: 0");
    memset(buf, 0, sizeof buf);
    CHECK(txfs_change_read(it, &got[3], 0, 0, buf, sizeof buf) == 5 && !strcmp(buf, "moved"),
          "old side of the rename: '%s'", buf);
    memset(buf, 0, sizeof buf);
    CHECK(txfs_change_read(it, &got[0], 0, 0, buf, sizeof buf) == 6 && !strcmp(buf, "doomed"),
          "old side of the deleted file: '%s'", buf);
    CHECK_ERR((int)txfs_change_read(it, &got[0], 1, 0, buf, sizeof buf), ENOENT);
    CHECK_ERR((int)txfs_change_read(it, &got[2], 0, 0, buf, sizeof buf), ENOENT);

    /* Listed again with nothing changed: the same snapshot, which goes on
     * answering (the daemon does not work it out again). */
    txfs_changes_t *same = txfs_changes();
    CHECK(same, "an unchanged listing: %s", en(errno));
    CHECK(txfs_change_read(it, &got[1], 1, 0, buf, sizeof buf) == 19, "the first listing still reads");
    txfs_changes_free(same);
    /* After a change, a newer listing replaces this one's snapshot. */
    CHECK_OK(write_file(J(dir, "mod"), "new content, longer"));
    txfs_changes_t *again = txfs_changes();
    CHECK(again, "a second listing: %s", en(errno));
    CHECK_ERR((int)txfs_change_read(it, &got[1], 1, 0, buf, sizeof buf), ESTALE);
    CHECK(txfs_change_read(again, &got[1], 1, 0, buf, sizeof buf) == 19, "the newer listing reads");
    txfs_changes_free(it);
    txfs_changes_free(again);
    txfs_changes_free(NULL);

    CHECK_OK(fs_tx_abort());
    CHECK(read_file(J(dir, "mod"), buf, sizeof buf) == 11 && !strcmp(buf, "old content"), "mod = '%s'", buf);
    CHECK(read_file(J(dir, "ren"), buf, sizeof buf) == 5, "ren is back");
    CHECK(read_file(J(dir, "del"), buf, sizeof buf) == 6, "del is back");
    struct stat st;
    CHECK(stat(J(dir, "ren2"), &st) == -1 && errno == ENOENT, "ren2 survived the abort");
    CHECK(stat(J(dir, "new"), &st) == -1 && errno == ENOENT, "new survived the abort");
    CHECK(count_entries(dir) == 3, "%d entries, want 3", count_entries(dir));

    errno = 0;
    CHECK(txfs_changes() == NULL && errno == EINVAL, "outside a transaction: want NULL/EINVAL, got %s", en(errno));
    return PASS;
}

/* A listing of many pages, fetched as it is consumed: every record whole,
 * also those that straddle two pages; a newer listing taken half-way makes
 * the older one's next page ESTALE. */
static int t_changes_many_pages(void)
{
    enum { N = 400 };
    char dir[PATH_MAX], name[256];
    CHECK(test_dir("changes-pages", dir, sizeof dir), "mkdir");
    const char *rel = dir + strlen(mnt) + 1;
    CHECK_OK(fs_tx_begin());
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "%04d-%0196d", i, 0);
        CHECK_OK(write_file(J(dir, name), "x"));
    }
    txfs_changes_t *it = txfs_changes();
    CHECK(it, "txfs_changes: %s", en(errno));
    CHECK(txfs_changes_next(it) != NULL, "a first change: %s", en(errno));
    /* A change (the same bytes again) makes the next listing a new one. */
    snprintf(name, sizeof name, "%04d-%0196d", 0, 0);
    CHECK_OK(write_file(J(dir, name), "x"));
    txfs_changes_t *newer = txfs_changes();
    CHECK(newer, "a second listing: %s", en(errno));
    size_t stale = 1;
    while (txfs_changes_next(it))
        stale++;
    CHECK(errno == ESTALE && stale < N, "the replaced listing: %zu changes, then %s", stale, en(errno));
    CHECK(txfs_changes_next(it) == NULL && errno == ESTALE, "and stays failed");
    txfs_changes_free(it);

    const struct txfs_change *c;
    size_t n = 0, at = 0, straddled = 0;
    while ((c = txfs_changes_next(newer))) {
        char path[PATH_MAX];
        snprintf(name, sizeof name, "%04zu-%0196d", n, 0);
        snprintf(path, sizeof path, "%s/%s", rel, name);
        CHECK(strcmp(c->path, path) == 0 && c->what == TXFS_CHANGE_CREATED && c->new_size == 1,
              "change %zu: %s (what %#x)", n, c->path, c->what);
        size_t len = record_len(c);
        straddled += at / TXFS_CHANGES_DATA != (at + len - 1) / TXFS_CHANGES_DATA;
        at += len;
        n++;
    }
    CHECK(errno == 0 && n == N, "%zu changes, then %s", n, en(errno));
    CHECK(at / TXFS_CHANGES_DATA >= 4 && straddled >= 4, "%zu bytes, %zu records across a page's end", at,
          straddled);
    txfs_changes_free(newer);
    CHECK_OK(fs_tx_abort());
    CHECK(count_entries(dir) == 0, "%d entries after the abort", count_entries(dir));
    return PASS;
}

/* ---- runner ------------------------------------------------------------- */

static int passed, failed, skipped;

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "TIMEOUT: a test hung for 60 s (daemon not answering?)\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(3);
}

static void run(const char *name, int (*fn)(void), int needs_mount)
{
    failure[0] = '\0';
    if (needs_mount && !mnt) {
        printf("skip - %s (TXFS_MOUNT not set)\n", name);
        skipped++;
        return;
    }
    alarm(60);
    int rc = fn();
    alarm(0);
    /* never leave this thread inside a transaction for the next test */
    if (mnt && tx_depth() > 0)
        fs_tx_abort();
    if (rc == PASS) {
        printf("ok - %s%s%s\n", name, failure[0] ? " " : "", failure);
        passed++;
    } else if (rc == SKIP) {
        printf("skip - %s (%s)\n", name, failure);
        skipped++;
    } else {
        printf("FAIL - %s: %s\n", name, failure);
        failed++;
    }
    fflush(stdout);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Descriptors open on the mount root, and how many of them carry the
 * O_DSYNC mark of a kept control descriptor. */
static int marked_fd = -1; /* the last marked descriptor root_fds saw */

static int root_fds(int *marked)
{
    int n = 0;
    *marked = 0;
    marked_fd = -1;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char link[300], target[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t r = readlink(link, target, sizeof target - 1);
        if (r <= 0)
            continue;
        target[r] = '\0';
        if (strcmp(target, mnt) != 0)
            continue;
        n++;
        char info[300], buf[512];
        snprintf(info, sizeof info, "/proc/self/fdinfo/%s", e->d_name);
        if (read_file(info, buf, sizeof buf) > 0) {
            char *fl = strstr(buf, "flags:");
            if (fl && (strtol(fl + 6, NULL, 8) & O_DSYNC)) {
                (*marked)++;
                marked_fd = atoi(e->d_name);
            }
        }
    }
    closedir(d);
    return n;
}

/* The outermost begin opens one descriptor of the mount (marked O_DSYNC);
 * it serves the transaction and stays for the thread's next one: commit,
 * abort and a failed commit keep exactly that one, and later begins open
 * none. */
static int t_descriptor_is_kept_for_the_next_transaction(void)
{
    int marked;
    int before = open_fds();
    CHECK(fs_tx_begin() == 0, "begin: %s", en(errno));
    CHECK(open_fds() == before + 1 || open_fds() == before, "begin opens at most one: %d -> %d", before, open_fds());
    int held = open_fds();
    CHECK(root_fds(&marked) >= 1 && marked == 1, "one marked descriptor of the mount root (%d)", marked);
    CHECK(fs_tx_begin() == 0, "nested begin: %s", en(errno));
    CHECK(open_fds() == held, "a nested begin opens none");
    CHECK(fs_tx_commit() == 0, "inner commit: %s", en(errno));
    CHECK(fs_tx_commit() == 0, "commit: %s", en(errno));
    CHECK(open_fds() == held, "commit keeps it: %d -> %d", held, open_fds());
    for (int i = 0; i < 20; i++) {
        CHECK(fs_tx_begin() == 0, "begin %d: %s", i, en(errno));
        CHECK(fs_tx_commit() == 0, "commit %d: %s", i, en(errno));
    }
    CHECK(open_fds() == held, "20 more transactions open none: %d -> %d", held, open_fds());
    CHECK(fs_tx_begin() == 0, "begin: %s", en(errno));
    CHECK(fs_tx_abort() == 0, "abort: %s", en(errno));
    CHECK(open_fds() == held, "abort keeps it");
    CHECK(fs_tx_commit() == -1, "commit without a transaction fails");
    CHECK(open_fds() == held, "a failed commit leaks none");
    CHECK(root_fds(&marked) >= 1 && marked == 1, "still one marked descriptor (%d)", marked);
    return PASS;
}

static void *begin_commit_thread(void *p)
{
    (void)p;
    if (fs_tx_begin() != 0 || fs_tx_commit() != 0)
        return (void *)1;
    return NULL;
}

/* A thread's kept descriptor goes with the thread. */
static int t_thread_exit_closes_its_descriptor(void)
{
    int marked;
    root_fds(&marked);
    int before = marked;
    for (int i = 0; i < 8; i++) {
        pthread_t t;
        void *r;
        CHECK(pthread_create(&t, NULL, begin_commit_thread, NULL) == 0, "pthread_create");
        pthread_join(t, &r);
        CHECK(r == NULL, "begin/commit in the thread failed");
    }
    root_fds(&marked);
    CHECK(marked == before, "marked descriptors after 8 threads came and went: %d -> %d", before, marked);
    return PASS;
}

/* A forked child does not inherit the kept descriptors (they would keep
 * the mount busy for its whole life), and begins with one of its own. */
static int t_fork_child_holds_no_kept_descriptor(void)
{
    int marked;
    CHECK(fs_tx_begin() == 0 && fs_tx_commit() == 0, "begin/commit: %s", en(errno));
    root_fds(&marked);
    CHECK(marked >= 1, "the parent keeps one");
    pthread_t t;
    void *r;
    /* and another thread's, still alive in the parent when it forks */
    CHECK(pthread_create(&t, NULL, begin_commit_thread, NULL) == 0, "pthread_create");
    pthread_join(t, &r);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int m;
        if (root_fds(&m) != 0)
            _exit(1);
        if (fs_tx_begin() != 0 || fs_tx_commit() != 0)
            _exit(2);
        if (root_fds(&m) != 1 || m != 1)
            _exit(3);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 99;
    CHECK(code == 0, "child: %s",
          code == 1   ? "inherited a descriptor of the mount"
          : code == 2 ? "could not begin/commit"
          : code == 3 ? "did not keep exactly one of its own"
                      : "died");
    return PASS;
}

/* A program closes the kept descriptor behind the library's back (as
 * closefrom() does when daemonizing) and the number comes back for a file
 * of its own: the library must neither use nor close that file. */
static int t_kept_number_reused_by_the_program(void)
{
    int marked;
    CHECK(fs_tx_begin() == 0 && fs_tx_commit() == 0, "begin/commit: %s", en(errno));
    CHECK(root_fds(&marked) >= 1 && marked == 1 && marked_fd >= 0, "one kept descriptor");
    int k = marked_fd;
    int nul = open("/dev/null", O_RDONLY);
    CHECK(nul >= 0, "open /dev/null");
    CHECK(dup2(nul, k) == k, "dup2 onto the kept number");
    close(nul);
    CHECK(fs_tx_begin() == 0, "begin after the number was reused: %s", en(errno));
    CHECK(fs_tx_commit() == 0, "commit: %s", en(errno));
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", k);
    ssize_t r = readlink(link, target, sizeof target - 1);
    CHECK(r > 0, "the program's descriptor %d was closed by the library", k);
    target[r] = '\0';
    CHECK(strcmp(target, "/dev/null") == 0, "descriptor %d now names %s", k, target);
    CHECK(root_fds(&marked) >= 1 && marked == 1, "a fresh kept descriptor (%d)", marked);
    close(k);
    return PASS;
}

static void *begin_and_exit_thread(void *p)
{
    (void)p;
    return fs_tx_begin() == 0 ? NULL : (void *)1;
}

/* fresh-reopen's thread A: commits (keeping a descriptor), reports its
 * number, then waits on the pipe and exits. */
static int reopen_up[2], reopen_down[2]; /* A -> main, main -> A */
static void *reopen_thread_a(void *p)
{
    int *kept_fd = p, marked;
    if (fs_tx_begin() != 0 || fs_tx_commit() != 0)
        return (void *)1;
    root_fds(&marked);
    *kept_fd = marked == 1 ? marked_fd : -1;
    char c;
    if (write(reopen_up[1], "k", 1) != 1 || read(reopen_down[0], &c, 1) != 1)
        return (void *)2;
    return NULL;
}

/* Scenarios that need a process whose library has done nothing yet (run as
 * `test_txfs fresh-NAME`): the exit code is 0 or a failure number. */
static int fresh(const char *what)
{
    int marked;
    if (strcmp(what, "cwd-begin") == 0) {
        /* Run with several mounts up and no TXFS_MOUNT: the transaction is
         * on the mount holding the current directory. */
        if (fs_tx_begin() != 0) {
            printf("begin %s: %s\n", strerror(errno), txfs_last_error());
            return 1;
        }
        int ok = write_file("cwd-chosen", "x") == 0;
        if (fs_tx_commit() != 0 || !ok) {
            printf("commit %s\n", strerror(errno));
            return 1;
        }
        printf("committed\n");
        return 0;
    }
    if (strcmp(what, "cwd-none") == 0) {
        errno = 0;
        int rc = fs_tx_begin();
        printf("begin %d %s: %s\n", rc, errno == ENOTUNIQ ? "ENOTUNIQ" : strerror(errno), txfs_last_error());
        return rc == -1 && errno == ENOTUNIQ ? 0 : 1;
    }
    if (strcmp(what, "fresh-fork") == 0) {
        /* a fork during the process's very first transaction */
        if (fs_tx_begin() != 0)
            return 10;
        pid_t pid = fork();
        if (pid == 0) {
            root_fds(&marked);
            _exit(marked == 0 ? 0 : 11);
        }
        int status;
        waitpid(pid, &status, 0);
        if (fs_tx_commit() != 0)
            return 12;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 13;
    }
    if (strcmp(what, "fresh-thread-exit") == 0) {
        /* a thread that exits inside the process's very first transaction */
        pthread_t t;
        void *r;
        if (pthread_create(&t, NULL, begin_and_exit_thread, NULL) != 0)
            return 20;
        pthread_join(t, &r);
        if (r != NULL)
            return 21;
        root_fds(&marked);
        return marked == 0 ? 0 : 22;
    }
    if (strcmp(what, "fresh-reopen") == 0) {
        /* Thread A's kept number is closed behind its back and another
         * thread's begin reopens it for the same root: A's exit must not
         * close it (found in review: same identity, so A took it for its
         * own). */
        int n = -1;
        char c;
        pthread_t a;
        void *r;
        if (pipe(reopen_up) != 0 || pipe(reopen_down) != 0 || pthread_create(&a, NULL, reopen_thread_a, &n) != 0)
            return 40;
        if (read(reopen_up[0], &c, 1) != 1 || n < 0)
            return 41;
        close(n);
        /* this thread is B */
        if (fs_tx_begin() != 0 || fs_tx_commit() != 0)
            return 43;
        root_fds(&marked);
        if (marked != 1 || marked_fd != n)
            return 44; /* B's descriptor is not n: the scenario did not happen */
        if (write(reopen_down[1], "x", 1) != 1)
            return 45;
        pthread_join(a, &r);
        if (r != NULL)
            return 46;
        root_fds(&marked);
        if (marked != 1 || marked_fd != n)
            return 47;
        return fs_tx_begin() == 0 && fs_tx_commit() == 0 ? 0 : 48;
    }
    if (strcmp(what, "fresh-hold") == 0) {
        /* run.sh: commit, say "ready"; then for each line on stdin (the
         * mount unmounted meanwhile, or another mounted) try again and
         * print "begin 0 write W commit C" or "begin ERRNAME". */
        char f[PATH_MAX], line[16];
        snprintf(f, sizeof f, "%s/held-%d", mnt, (int)getpid());
        if (fs_tx_begin() != 0 || write_file(f, "1") != 0 || fs_tx_commit() != 0)
            return 30;
        printf("ready\n");
        fflush(stdout);
        while (fgets(line, sizeof line, stdin)) {
            if (fs_tx_begin() != 0) {
                printf("begin %s\n", en(errno));
                fflush(stdout);
                continue;
            }
            int w = write_file(f, "2");
            int c = fs_tx_commit();
            printf("begin 0 write %d commit %d\n", w, c);
            fflush(stdout);
        }
        return 0;
    }
    return 99;
}

/* The fork handler and the thread-exit destructor are in place before the
 * first descriptor is opened (found in review: both were set up at the
 * first commit, so the first transaction's descriptor leaked). */
static int t_first_transaction_of_a_process(void)
{
    const char *cases[] = {"fresh-fork", "fresh-thread-exit", "fresh-reopen"};
    for (int i = 0; i < 3; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            execl("/proc/self/exe", "test_txfs", cases[i], (char *)NULL);
            _exit(98);
        }
        int status;
        waitpid(pid, &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 97;
        CHECK(code == 0,
              "%s: exit %d (11: the child inherited the descriptor; 22: the thread's stayed open; 47: a thread's "
              "exit closed another's descriptor)",
              cases[i], code);
    }
    return PASS;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        mnt = getenv("TXFS_MOUNT");
        return fresh(argv[1]);
    }
    signal(SIGALRM, on_alarm);
    setvbuf(stdout, NULL, _IOLBF, 0);
    mnt = getenv("TXFS_MOUNT");
    if (mnt && !*mnt)
        mnt = NULL;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/txfs-ctest-unit.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    srand((unsigned)getpid());

    run("mountinfo: no txfs mount -> ENODEV", t_mountinfo_none, 0);
    run("mountinfo: one txfs mount (escaped name)", t_mountinfo_one, 0);
    run("mountinfo: bind mounts of one txfs count once", t_mountinfo_binds, 0);
    run("mountinfo: several txfs mounts -> ENOTUNIQ", t_mountinfo_several, 0);
    run("mountinfo: path inside a mount, longest prefix", t_mountinfo_path, 0);
    run("mountinfo: several mounts: the current directory's, else all listed", t_mountinfo_cwd, 0);
    run("begin: bad TXFS_MOUNT -> ENOENT / ENOTTY", t_env_errors, 0);
    run("begin: no txfs mounted -> ENODEV", t_no_mount_enodev, 0);

    run("invisible to another process until commit", t_invisible_until_commit, 1);
    run("abort leaves nothing", t_abort_leaves_nothing, 1);
    run("nested begin/commit flattens", t_nested_flattens, 1);
    run("invisible to another thread until commit", t_thread_isolation, 1);
    run("conflicting read-modify-writes: one EDEADLK", t_conflict_edeadlk, 1);
    run("ordered commit, txfs_sync", t_ordered_and_sync, 1);
    run("txfs_begin(path in mount); bad nested path -> ENOTTY", t_begin_paths, 1);
    run("commit without a transaction fails", t_commit_without_begin, 1);
    run("forked child is not in the parent's transaction", t_fork_child_not_in_tx, 1);
    run("STATUS/STATE counters", t_status_counters, 1);
    run("txfs_changes lists the transaction and reads both sides", t_changes_lists_the_transaction, 1);
    run("txfs_changes pages through a long listing", t_changes_many_pages, 1);
    run("one kept descriptor serves every transaction of a thread", t_descriptor_is_kept_for_the_next_transaction, 1);
    run("a thread's kept descriptor closes when it exits", t_thread_exit_closes_its_descriptor, 1);
    run("a forked child inherits no kept descriptor", t_fork_child_holds_no_kept_descriptor, 1);
    run("a kept number the program reused is left alone", t_kept_number_reused_by_the_program, 1);
    run("the first transaction of a process: fork, thread exit", t_first_transaction_of_a_process, 1);

    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) {
    }
    if (skipped)
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else
        printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

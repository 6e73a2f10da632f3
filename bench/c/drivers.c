/* drivers: the hot loops of the benchmark suite (bench/run builds and runs them).
 *
 *   drivers SUBCOMMAND MODE DIR ARGS...
 *
 * MODE is "native" (the fsync protocol on a plain directory) or "txfs" (the
 * same work inside fs_tx_begin/fs_tx_commit on a txfs mount; $TXFS_MOUNT names
 * it). Each run checks its result (file contents, names left) and exits 1 on a
 * wrong one; on success it prints one JSON line: {"seconds": S, "ops": N, ...}
 * where S is the wall time of the measured part only (setup is not timed).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "txfs.h"

#define MiB (1024L * 1024L)

static int txmode;        /* 1: txfs transactions */
static const char *dir;   /* working directory */
static long conflicts;    /* retried transactions */

static void die(const char *what) {
    fprintf(stderr, "drivers: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void fail(const char *what) {
    fprintf(stderr, "drivers: check failed: %s\n", what);
    exit(1);
}

#define CK(x) \
    do { \
        if ((x) < 0) die(#x); \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* $BENCH_TRACE_ENABLE: the harness's ftrace "enable" file; the measured part
 * alone is traced (setup and checks are not). */
static void trace_set(const char *v) {
    const char *p = getenv("BENCH_TRACE_ENABLE");
    if (!p || !*p) return;
    int fd = open(p, O_WRONLY);
    if (fd < 0) return;
    if (write(fd, v, 1) < 0) { /* tracing is best effort */ }
    close(fd);
}

static double timed_start(void) {
    trace_set("1");
    return now();
}

static double timed_end(double t0) {
    double secs = now() - t0;
    trace_set("0");
    return secs;
}

static void tx_begin(void) {
    if (txmode) CK(fs_tx_begin());
}

/* 0: committed; -1: lost a conflict (aborted; run it again). */
static int tx_commit_flags(unsigned flags) {
    if (!txmode) return 0;
    if (txfs_commit(flags) == 0) return 0;
    if (errno != TXFS_ECONFLICT) die("fs_tx_commit");
    txfs_abort();
    __atomic_fetch_add(&conflicts, 1, __ATOMIC_RELAXED);
    return -1;
}
static int tx_commit(void) { return tx_commit_flags(0); }

static void path(char *buf, size_t n, const char *fmt, long a, long b) {
    if (strlen(dir) > 1024) fail("DIR too long");
    int k = snprintf(buf, n, "%s/", dir);
    snprintf(buf + k, n - k, fmt, a, b);
}

static int open_dir(const char *p) {
    int fd = open(p, O_RDONLY | O_DIRECTORY);
    if (fd < 0) die(p);
    return fd;
}

static void fill_file(const char *p, long bytes, int byte) {
    static char buf[MiB];
    memset(buf, byte, sizeof buf);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die(p);
    for (long off = 0; off < bytes; off += MiB) {
        long n = bytes - off < MiB ? bytes - off : MiB;
        if (pwrite(fd, buf, n, off) != n) die("pwrite");
    }
    CK(fsync(fd));
    close(fd);
}

/* Every byte of [off, off+len) of the file at p equals byte. */
static void expect_bytes(const char *p, long off, long len, int byte, const char *what) {
    static char buf[MiB];
    int fd = open(p, O_RDONLY);
    if (fd < 0) die(p);
    for (long o = 0; o < len; o += MiB) {
        long n = len - o < MiB ? len - o : MiB;
        if (pread(fd, buf, n, off + o) != n) fail(what);
        for (long i = 0; i < n; i++)
            if ((unsigned char)buf[i] != (unsigned char)byte) fail(what);
    }
    close(fd);
}

static long count_entries(const char *p) {
    DIR *d = opendir(p);
    if (!d) die(p);
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void mkdir_p(const char *p) {
    if (mkdir(p, 0755) < 0 && errno != EEXIST) die(p);
}

static void report(double secs, long ops, const char *extra) {
    printf("{\"seconds\": %.6f, \"ops\": %ld, \"conflicts\": %ld%s%s}\n", secs, ops, conflicts,
           extra && *extra ? ", " : "", extra ? extra : "");
}

/* ---- W1: create -> unlink -> fsync(dir), THREADS threads --------------- */
struct cu_arg {
    long t, n;
};

static void *cu_thread(void *p) {
    struct cu_arg *a = p;
    char d[2048], f[4096];
    path(d, sizeof d, "cu%ld", a->t, 0);
    int dfd = open_dir(d);
    for (long i = 0; i < a->n; i++) {
        do {
            tx_begin();
            snprintf(f, sizeof f, "%s/f%ld", d, i);
            int fd = open(f, O_WRONLY | O_CREAT | O_EXCL, 0644);
            if (fd < 0) die(f);
            close(fd);
            CK(unlink(f));
            CK(fsync(dfd));
        } while (tx_commit() < 0);
    }
    close(dfd);
    return NULL;
}

static int cmd_createunlink(long threads, long n) {
    char d[4096];
    pthread_t th[64];
    struct cu_arg a[64];
    for (long t = 0; t < threads; t++) {
        path(d, sizeof d, "cu%ld", t, 0);
        mkdir_p(d);
    }
    double t0 = timed_start();
    for (long t = 0; t < threads; t++) {
        a[t] = (struct cu_arg){t, n};
        pthread_create(&th[t], NULL, cu_thread, &a[t]);
    }
    for (long t = 0; t < threads; t++) pthread_join(th[t], NULL);
    double secs = timed_end(t0);
    for (long t = 0; t < threads; t++) {
        path(d, sizeof d, "cu%ld", t, 0);
        if (count_entries(d) != 0) fail("create/unlink left files behind");
    }
    report(secs, threads * n, NULL);
    return 0;
}

/* ---- W2: the logging protocol of TxFS Fig. 1b -------------------------- */
static int cmd_logproto(long n, long size, int withlog) {
    char data[4096], log[4096];
    long slots = 16;
    path(data, sizeof data, "data", 0, 0);
    path(log, sizeof log, "data.log", 0, 0);
    fill_file(data, slots * size, 0);
    int dfd = open_dir(dir);
    char *buf = malloc(size + 64);
    double t0 = timed_start();
    for (long i = 0; i < n; i++) {
        long off = (i % slots) * size;
        memset(buf, 'a' + i % 26, size + 64);
        do {
            tx_begin();
            if (withlog) {
                /* the log: offset + new contents, persisted with its name */
                int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (lfd < 0) die(log);
                memcpy(buf, &off, sizeof off);
                if (write(lfd, buf, size + 64) != size + 64) die("write log");
                CK(fsync(lfd));
                close(lfd);
                CK(fsync(dfd));
                memset(buf, 'a' + i % 26, 64);
            }
            int fd = open(data, O_WRONLY);
            if (fd < 0) die(data);
            if (pwrite(fd, buf, size, off) != size) die("pwrite data");
            if (withlog || !txmode) CK(fsync(fd));
            close(fd);
            if (withlog) {
                CK(unlink(log));
                CK(fsync(dfd));
            }
        } while (tx_commit() < 0);
    }
    double secs = timed_end(t0);
    for (long i = n - slots < 0 ? 0 : n - slots; i < n; i++)
        expect_bytes(data, (i % slots) * size, size, 'a' + i % 26, "data file holds the last updates");
    if (access(log, F_OK) == 0) fail("the log survived");
    report(secs, n, NULL);
    return 0;
}

/* ---- W3: ordering: three new files, then an update of a big file -------- */
static int cmd_ordering(long mb) {
    char big[4096], f[4096];
    path(big, sizeof big, "big", 0, 0);
    fill_file(big, 4 * mb * MiB, 'o');
    for (long k = 0; k < 3; k++) {
        path(f, sizeof f, "new%ld", k, 0);
        unlink(f);
    }
    int dfd = open_dir(dir);
    static char buf[MiB];
    double t0 = timed_start();
    for (long k = 0; k < 3; k++) {
        path(f, sizeof f, "new%ld", k, 0);
        memset(buf, '0' + k, MiB);
        do {
            tx_begin();
            int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0) die(f);
            for (long m = 0; m < mb; m++)
                if (write(fd, buf, MiB) != MiB) die("write");
            if (!txmode) {
                CK(fsync(fd));
                CK(fsync(dfd));
            }
            close(fd);
        } while (tx_commit_flags(TXFS_COMMIT_ORDERED) < 0);
    }
    memset(buf, 'u', MiB);
    do {
        tx_begin();
        int fd = open(big, O_WRONLY);
        if (fd < 0) die(big);
        for (long m = 0; m < mb; m++)
            if (pwrite(fd, buf, MiB, (mb + m) * MiB) != MiB) die("pwrite");
        if (!txmode) CK(fsync(fd));
        close(fd);
    } while (tx_commit() < 0); /* durable: and with it every ordered commit before */
    double secs = timed_end(t0);
    for (long k = 0; k < 3; k++) {
        path(f, sizeof f, "new%ld", k, 0);
        expect_bytes(f, 0, mb * MiB, '0' + k, "new file contents");
    }
    expect_bytes(big, mb * MiB, mb * MiB, 'u', "updated range");
    expect_bytes(big, 2 * mb * MiB, mb * MiB, 'o', "untouched range");
    report(secs, 1, NULL);
    return 0;
}

/* ---- W9: one 4 KiB durable update per transaction, THREADS committers --- */
struct c4_arg {
    long t, n;
    double lat_sum;
};

static void *c4_thread(void *p) {
    struct c4_arg *a = p;
    char f[4096], buf[4096];
    path(f, sizeof f, "c4k%ld", a->t, 0);
    int fd = open(f, O_RDWR);
    if (fd < 0) die(f);
    for (long i = 0; i < a->n; i++) {
        memset(buf, 'a' + i % 26, sizeof buf);
        double t0 = now();
        do {
            tx_begin();
            if (pwrite(fd, buf, 4096, (i % 4) * 4096) != 4096) die("pwrite");
            if (!txmode) CK(fdatasync(fd));
        } while (tx_commit() < 0);
        a->lat_sum += now() - t0;
    }
    close(fd);
    return NULL;
}

static int cmd_commit4k(long threads, long n) {
    char f[4096];
    pthread_t th[64];
    struct c4_arg a[64];
    for (long t = 0; t < threads; t++) {
        path(f, sizeof f, "c4k%ld", t, 0);
        fill_file(f, 4 * 4096, 0);
    }
    double t0 = timed_start();
    for (long t = 0; t < threads; t++) {
        a[t] = (struct c4_arg){t, n, 0};
        pthread_create(&th[t], NULL, c4_thread, &a[t]);
    }
    double lat = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        lat += a[t].lat_sum;
    }
    double secs = timed_end(t0);
    for (long t = 0; t < threads; t++) {
        path(f, sizeof f, "c4k%ld", t, 0);
        long i = n - 1;
        expect_bytes(f, (i % 4) * 4096, 4096, 'a' + i % 26, "last 4 KiB update");
    }
    char extra[128];
    snprintf(extra, sizeof extra, "\"latency_us\": %.2f", lat / (threads * n) * 1e6);
    report(secs, threads * n, extra);
    return 0;
}

/* ---- W12a (Faust): K 4 KiB writes per transaction vs K writes + fsync -- */
static int cmd_faust(long k, long n) {
    char f[4096], buf[4096];
    path(f, sizeof f, "faust", 0, 0);
    fill_file(f, k * 4096, 0);
    int fd = open(f, O_RDWR);
    if (fd < 0) die(f);
    double t0 = timed_start();
    for (long i = 0; i < n; i++) {
        memset(buf, 'a' + i % 26, sizeof buf);
        do {
            tx_begin();
            for (long j = 0; j < k; j++)
                if (pwrite(fd, buf, 4096, j * 4096) != 4096) die("pwrite");
            if (!txmode) CK(fsync(fd));
        } while (tx_commit() < 0);
    }
    double secs = timed_end(t0);
    close(fd);
    expect_bytes(f, 0, k * 4096, 'a' + (n - 1) % 26, "last transaction's writes");
    report(secs, n, NULL);
    return 0;
}

/* ---- W12b (Faust): remove N files in one transaction vs unlinkat + fsync(dir) */
static int cmd_rmfiles(long n) {
    char d[2048], f[4096];
    path(d, sizeof d, "rm", 0, 0);
    mkdir_p(d);
    for (long i = 0; i < n; i++) {
        snprintf(f, sizeof f, "%s/f%ld", d, i);
        int fd = open(f, O_WRONLY | O_CREAT, 0644);
        if (fd < 0) die(f);
        close(fd);
    }
    int dfd = open_dir(d);
    CK(fsync(dfd));
    double t0 = timed_start();
    /* By name relative to the directory, as rm -r does (unlinkat), both
       sides: a full path costs a lookup per component. */
    do {
        tx_begin();
        for (long i = 0; i < n; i++) {
            snprintf(f, sizeof f, "f%ld", i);
            if (unlinkat(dfd, f, 0) < 0 && errno != ENOENT) die(f);
        }
        if (!txmode) CK(fsync(dfd));
    } while (tx_commit() < 0);
    double secs = timed_end(t0);
    if (count_entries(d) != 0) fail("files left after removal");
    report(secs, n, NULL);
    return 0;
}

/* ---- W13 (Valor): P processes each overwriting its own file ------------ */
static void valor_fill(long procs, long mb) {
    char f[4096];
    for (long p = 0; p < procs; p++) {
        path(f, sizeof f, "valor%ld", p, 0);
        fill_file(f, mb * MiB, 0);
    }
}

/* With fill == 0 the files are already there (`valorfill` made them, and
 * the harness let the machine settle in between). */
static int cmd_valor(long procs, long mb, int fill) {
    char f[4096];
    if (fill) valor_fill(procs, mb);
    int go[2];
    CK(pipe(go));
    pid_t kids[64];
    for (long p = 0; p < procs; p++) {
        kids[p] = fork();
        if (kids[p] == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) < 0) _exit(2);
            static char buf[MiB];
            memset(buf, 'A' + p, MiB);
            path(f, sizeof f, "valor%ld", p, 0);
            do {
                tx_begin();
                int fd = open(f, O_WRONLY);
                if (fd < 0) die(f);
                for (long m = 0; m < mb; m++)
                    if (pwrite(fd, buf, MiB, m * MiB) != MiB) die("pwrite");
                if (!txmode) CK(fsync(fd));
                close(fd);
            } while (tx_commit() < 0);
            _exit(0);
        }
    }
    close(go[0]);
    double t0 = timed_start();
    close(go[1]); /* every child's read returns 0 at once */
    for (long p = 0; p < procs; p++) {
        int st;
        if (waitpid(kids[p], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) fail("a writer failed");
    }
    double secs = timed_end(t0);
    for (long p = 0; p < procs; p++) {
        path(f, sizeof f, "valor%ld", p, 0);
        expect_bytes(f, 0, mb * MiB, 'A' + p, "overwritten file");
    }
    char extra[64];
    snprintf(extra, sizeof extra, "\"mb\": %ld", procs * mb);
    report(secs, procs, extra);
    return 0;
}

/* ---- W8: non-transactional operations ----------------------------------- */
static int cmd_stat(long n) {
    char f[4096];
    path(f, sizeof f, "hot", 0, 0);
    int fd = open(f, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) die(f);
    close(fd);
    struct stat st;
    CK(stat(f, &st)); /* warm */
    double t0 = timed_start();
    for (long i = 0; i < n; i++) CK(stat(f, &st));
    report(timed_end(t0), n, NULL);
    return 0;
}

static int cmd_createunlink_plain(long n) {
    char d[2048], f[4096];
    path(d, sizeof d, "plain", 0, 0);
    mkdir_p(d);
    double t0 = timed_start();
    for (long i = 0; i < n; i++) {
        snprintf(f, sizeof f, "%s/f%ld", d, i);
        int fd = open(f, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0) die(f);
        close(fd);
    }
    for (long i = 0; i < n; i++) {
        snprintf(f, sizeof f, "%s/f%ld", d, i);
        CK(unlink(f));
    }
    double secs = timed_end(t0);
    if (count_entries(d) != 0) fail("files left");
    report(secs, 2 * n, NULL);
    return 0;
}

static int cmd_seqwrite(long mb, const char *name) {
    char f[4096];
    snprintf(f, sizeof f, "%s/%s", dir, name);
    static char buf[MiB];
    memset(buf, 's', MiB);
    unlink(f);
    double t0 = timed_start();
    int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die(f);
    for (long m = 0; m < mb; m++)
        if (write(fd, buf, MiB) != MiB) die("write");
    CK(fsync(fd));
    close(fd);
    double secs = timed_end(t0);
    struct stat st;
    CK(stat(f, &st));
    if (st.st_size != mb * MiB) fail("file size");
    report(secs, mb, NULL);
    return 0;
}

static int cmd_seqread(long mb) {
    char f[4096];
    snprintf(f, sizeof f, "%s/seq", dir);
    static char buf[MiB];
    double t0 = timed_start();
    int fd = open(f, O_RDONLY);
    if (fd < 0) die(f);
    long total = 0, r;
    while ((r = read(fd, buf, MiB)) > 0) {
        if (buf[0] != 's' || buf[r - 1] != 's') fail("contents");
        total += r;
    }
    close(fd);
    double secs = timed_end(t0);
    if (total != mb * MiB) fail("bytes read");
    report(secs, mb, NULL);
    return 0;
}

static int cmd_randread(long n, long mb) {
    char f[4096], buf[4096];
    snprintf(f, sizeof f, "%s/seq", dir);
    int fd = open(f, O_RDONLY);
    if (fd < 0) die(f);
    unsigned long x = 88172645463325252UL;
    long blocks = mb * MiB / 4096;
    double t0 = timed_start();
    for (long i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (pread(fd, buf, 4096, (long)(x % blocks) * 4096) != 4096) die("pread");
        if (buf[0] != 's') fail("contents");
    }
    double secs = timed_end(t0);
    close(fd);
    report(secs, n, NULL);
    return 0;
}

/* ---- W10: one big transaction; optionally SIGKILL a pid after commit ---- */
static int cmd_bigtx(long mb, const char *name, long killpid) {
    char f[4096];
    snprintf(f, sizeof f, "%s/%s", dir, name);
    static char buf[MiB];
    memset(buf, 'B', MiB);
    double t0 = timed_start();
    do {
        tx_begin();
        int fd = open(f, O_WRONLY | O_CREAT, 0644);
        if (fd < 0) die(f);
        for (long m = 0; m < mb; m++)
            if (pwrite(fd, buf, MiB, m * MiB) != MiB) die("pwrite");
        if (!txmode) CK(fsync(fd));
        close(fd);
    } while (tx_commit() < 0);
    double secs = timed_end(t0);
    if (killpid > 0) {
        CK(kill((pid_t)killpid, SIGKILL)); /* a crash right after the commit */
    } else {
        expect_bytes(f, 0, mb * MiB, 'B', "big transaction's file");
    }
    report(secs, mb, NULL);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: drivers CMD native|txfs DIR ARGS...\n");
        return 2;
    }
    const char *cmd = argv[1];
    txmode = strcmp(argv[2], "txfs") == 0;
    dir = argv[3];
    long a = argc > 4 ? atol(argv[4]) : 0, b = argc > 5 ? atol(argv[5]) : 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(cmd, "createunlink")) return cmd_createunlink(a, b);
    if (!strcmp(cmd, "logproto")) return cmd_logproto(a, b, argc > 6 && !strcmp(argv[6], "log"));
    if (!strcmp(cmd, "ordering")) return cmd_ordering(a);
    if (!strcmp(cmd, "commit4k")) return cmd_commit4k(a, b);
    if (!strcmp(cmd, "faust")) return cmd_faust(a, b);
    if (!strcmp(cmd, "rmfiles")) return cmd_rmfiles(a);
    if (!strcmp(cmd, "valor")) return cmd_valor(a, b, !(argc > 6 && !strcmp(argv[6], "nofill")));
    if (!strcmp(cmd, "valorfill")) return valor_fill(a, b), 0;
    if (!strcmp(cmd, "stat")) return cmd_stat(a);
    if (!strcmp(cmd, "createunlink1")) return cmd_createunlink_plain(a);
    if (!strcmp(cmd, "seqwrite")) return cmd_seqwrite(a, "seq");
    if (!strcmp(cmd, "seqread")) return cmd_seqread(a);
    if (!strcmp(cmd, "randread")) return cmd_randread(a, b);
    if (!strcmp(cmd, "bigtx")) return cmd_bigtx(a, argc > 5 ? argv[5] : "big", argc > 6 ? atol(argv[6]) : 0);
    fprintf(stderr, "drivers: unknown command %s\n", cmd);
    return 2;
}

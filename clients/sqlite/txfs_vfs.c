/* txfs_vfs.c — the SQLite "txfs" VFS: the porting thesis's FS journal mode
 * (seeds/txfs-porting-sqlite-openldap-thesis.txt §6.1) as a loadable
 * extension for stock SQLite.
 *
 *   .load /path/txfs_vfs                    (sqlite3 shell; Python: load_extension)
 *   .open file:/mnt/tx/app.db?vfs=txfs
 *
 * Each SQLite write transaction is one txfs transaction: no rollback journal,
 * no WAL, no fsync, no file locks. The ioctl protocol is clients/c/txfs.h,
 * issued on the database's own descriptor (so the database names the mount).
 *
 * ---- How SQLite's locks map to txfs transactions -------------------------
 *
 *   xLock NONE->SHARED       BEGIN: a read snapshot (one txfs nesting level)
 *   xLock ->EXCLUSIVE        SQLITE_BUSY while another connection of this
 *                            thread holds a level of its own (V3)
 *   FCNTL_SYNC (commit)      COMMIT: the durability point (V1)
 *   xUnlock ->SHARED         a write transaction ended; no commit seen and
 *                            file written: ABORT (undoes the writes, V4)
 *   xUnlock ->NONE           end of the level: ABORT if read-only outermost,
 *                            COMMIT (= leave one nesting level) otherwise
 *
 * V1  The commit point is SQLITE_FCNTL_SYNC, which the pager sends in
 *     sqlite3PagerCommitPhaseOne after writing every dirty page, whatever
 *     PRAGMA synchronous says. A failure there makes vdbeHalt roll the whole
 *     SQLite transaction back; we report conflicts as SQLITE_BUSY_SNAPSHOT
 *     (primary code SQLITE_BUSY) and not plain SQLITE_BUSY, because a plain
 *     BUSY from COMMIT keeps the SQLite transaction open for a retry of
 *     COMMIT alone, which would write pages computed from a lost snapshot.
 * V2  journal_mode=OFF and cache_spill=OFF are set on every connection whose
 *     main database uses this VFS (an auto-extension), and PRAGMAs that would
 *     undo them are refused (SQLITE_FCNTL_PRAGMA). With cache_spill off, no
 *     page reaches the file before the commit, so ROLLBACK has nothing to
 *     undo in the file; the pager in journal_mode=OFF drops its cache after a
 *     ROLLBACK (its ERROR state), so the next transaction re-reads the file.
 *     Journal and WAL files are never opened (xOpen refuses them).
 * V3  A txfs transaction belongs to a thread; nesting flattens. If the
 *     application (or `txfs run`) already had a transaction open when a
 *     connection began its level, the connection joins it: its commits only
 *     leave their level and the application's commit decides. Otherwise the
 *     first level on the thread is the outermost, and a write may commit only
 *     while it is the thread's sole level (else SQLITE_BUSY, as rollback-journal
 *     SQLite answers a writer while another connection holds SHARED).
 * V4  A cache change is trusted only within one snapshot. When a level ends
 *     while SQLite keeps its SHARED lock (another statement still reading)
 *     and a new level begins, the file change counter (bytes 24..39) is
 *     compared with the one this connection last saw: a difference means the
 *     page cache may be stale, and the operation fails with BUSY_SNAPSHOT.
 * V5  A commit that only left a nested level (the application's transaction
 *     decides) may still be aborted; SQLite believes it committed and keeps
 *     its pages and change counter, which another writer may reach too (the
 *     counter is then no proof of freshness). The same holds for a level
 *     that only read inside such a transaction: it may have cached another
 *     connection's uncommitted pages. So after such a commit the next
 *     cache check of the pager (its 16-byte read at offset 24 on taking the
 *     SHARED lock) is answered with a counter that differs from the one it
 *     holds: the pager drops its cache and re-reads — unless the daemon
 *     says (TXFS_IOC_BEGIN_STATE, when the next level begins) that the
 *     transaction is still the one that commit was in, or that it committed.
 * V7  With daemons that have them (TXFS_IOC_BEGIN_STATE, TXFS_IOC_COMMIT_IF)
 *     a level costs two ioctls, not four: the begin answers the state the
 *     V3 bookkeeping needs, and leaving a level inside the application's
 *     transaction commits only if that transaction is still the thread's
 *     (ESTALE: it ended under us). Older daemons answer ENOTTY and the VFS
 *     asks TXFS_IOC_STATE as before.
 * V9  Runs that do not continue one another go out together too: the VFS
 *     opens a second descriptor of the database and makes it a batch
 *     descriptor (TXFS_IOC_BATCH); the gathered runs (up to WRITE_RUN bytes
 *     with their headers) are one pwrite of a batch there, a single run a
 *     plain pwrite on the database's own descriptor. A daemon without
 *     batches (ENOTTY), a transaction view (no handles: EINVAL) or a batch
 *     the kernel would split (EINVAL, nothing applied) turn batching off for
 *     the file; the runs then go one pwrite each, as in V6.
 * V8  The pager asks whether `<db>-journal` and `<db>-wal` exist at every
 *     transaction (hot journal, WAL), a lookup per path component each
 *     inside a txfs transaction. No txfs connection creates them (V2), so
 *     for a database opened while neither existed the VFS answers "absent"
 *     itself for as long as it is open. One that had them at open (left by
 *     another VFS) is asked about every time, as before (and a hot journal
 *     fails to open, V2). Opening one database through this VFS and the
 *     default one at the same time is not supported anyway (no locks).
 * V6  Pages reach the daemon in runs, not one request each. The pager
 *     writes a transaction's dirty pages at its commit, sorted by page
 *     number; inside a level, writes that continue the previous one are
 *     gathered (up to WRITE_RUN bytes) and sent as one pwrite when a write
 *     does not continue the run, and before anything that could observe the
 *     file: a read, its size, a truncate, xSync, the commit point. An unlock
 *     or close without a commit (an abort) drops the run unsent. A failure
 *     of the deferred pwrite
 *     is reported by the call that sent it (a conflict as V1 says, so the
 *     commit fails and SQLite rolls back).
 * V10 A SQLite transaction's first two requests are its cache check (the
 *     16 bytes at offset 24) and the file size. With daemons that have
 *     TXFS_IOC_BEGIN_FILE the level's begin, issued on the database's
 *     descriptor, answers both as the new transaction sees them (the daemon
 *     reads them in it, so they are in its read set as the READ and GETATTR
 *     would be); the VFS hands each out once, to the level's first read of
 *     exactly those 16 bytes and its first size query, and forgets both at
 *     any other read, any write or truncate, and the level's end. Older
 *     daemons answer ENOTTY and the VFS uses TXFS_IOC_BEGIN_STATE (V7).
 * V11 A commit that freed pages ends with the pager truncating the file
 *     (commit phase two, auto_vacuum and VACUUM), after the commit point.
 *     Without locks another connection may have committed since, so the
 *     truncate goes into a level of its own (the tail level) whose begin
 *     finds the change counter this connection committed (V4's check: the
 *     bytes enter its read set, so a commit racing the truncate makes it
 *     conflict); it commits ORDERED at the unlock. If the counter differs,
 *     any call of the tail fails (a racing commit makes even the truncate's
 *     SETATTR conflict), or the tail's commit fails, the truncate is
 *     skipped: a file longer than its header's page count is valid SQLite,
 *     and the COMMIT, already made, reports success. (Before V11 the truncate's level was aborted, so a
 *     database never shrank.)
 */
#define _GNU_SOURCE
#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1

#include "txfs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

#define TXFS_VFS_NAME "txfs"
/* What a lost conflict looks like to SQLite (V1). */
#define TXFS_SQLITE_CONFLICT SQLITE_BUSY_SNAPSHOT

/* The database files this VFS opens itself. */
typedef struct TxfsFile {
    sqlite3_file base;
    int fd;
    const char *path;
    int lock;              /* SQLite lock level as reported to SQLite */
    unsigned commit_flags; /* 0 (durable) or TXFS_COMMIT_ORDERED */
    int in_level;          /* holds one nesting level of the thread's tx */
    unsigned gen;          /* tls.gen when the level began */
    pid_t tid;             /* thread that began the level */
    int wrote;             /* wrote the file in the current write tx */
    int committed;         /* the current write tx committed (V1) */
    int tail_skip;         /* V11: the shrink after this commit is skipped */
    int doomed;            /* saw EDEADLK in the current level */
    int have_vers;         /* vers holds the change counter last seen (V4) */
    int stale_cache;       /* V5: SQLite's cache may hold an aborted commit */
    uint64_t stale_tx;     /* V5: the transaction that commit was in (0: unknown) */
    uint64_t level_tx;     /* the transaction of the current level (0: unknown) */
    int v7;                /* this file's daemon has BEGIN_STATE and COMMIT_IF:
                              -1 not known yet, 0 no, 1 yes */
    int v10;               /* ... and BEGIN_FILE: -1 not known yet, 0 no, 1 yes */
    int pre_head_ok;       /* V10: pre_head is bytes 24..40 as the level began */
    int pre_size_ok;       /* V10: pre_size is the size as the level began */
    unsigned char pre_head[16];
    sqlite3_int64 pre_size;
    unsigned char vers[16];
    int no_sidecars;        /* V8: registered in `quiet` */
    int bfd;                /* V9: the batch descriptor, -1: none */
    char *run;              /* V6/V9: a batch being gathered (WRITE_RUN bytes, page aligned) */
    int run_len;            /* bytes used, the batch header included */
    int nrec;               /* runs in it */
    int last_rec;           /* where the last run's header is */
    sqlite3_int64 next_off; /* where a write continuing the last run starts */
} TxfsFile;

/* V6/V9: the most sent as one pwrite (the mount's max_write, TXFS_BATCH_MAX),
 * and the batch's and each run's header. */
#define WRITE_RUN ((int)TXFS_BATCH_MAX)
#define BATCH_HDR 16
#define RUN_HDR 16
/* What is gathered stays a page below WRITE_RUN, so that a single run (its
 * data 32 bytes into the page-aligned buffer) also spans at most WRITE_RUN
 * bytes of pages: one FUSE request, not two. */
#define GATHER_MAX (WRITE_RUN - 4096)

/* Per thread: the levels this VFS holds in the thread's txfs transaction. */
static __thread struct {
    pid_t tid;       /* guards against a forked child's copy */
    int levels;      /* levels held by connections of this VFS */
    int app;         /* the outermost level is the application's (V3) */
    uint64_t app_tx; /* the application's transaction id */
    unsigned gen;    /* bumped whenever the levels vanish together */
} tls;

static sqlite3_vfs *orig_vfs;

/* V8: open databases that had no -journal or -wal at open (a path, and how
 * many connections hold it). */
static struct quiet_db {
    struct quiet_db *next;
    int refs;
    int loud; /* a later open found a -journal or -wal: ask again */
    char path[];
} *quiet;
static pthread_mutex_t quiet_lock = PTHREAD_MUTEX_INITIALIZER;

static int quiet_add(const char *path)
{
    pthread_mutex_lock(&quiet_lock);
    struct quiet_db *q = quiet;
    while (q && strcmp(q->path, path) != 0)
        q = q->next;
    if (!q && (q = malloc(sizeof *q + strlen(path) + 1))) {
        strcpy(q->path, path);
        q->refs = 0;
        q->loud = 0;
        q->next = quiet;
        quiet = q;
    }
    if (q)
        q->refs++;
    pthread_mutex_unlock(&quiet_lock);
    return q != NULL;
}

static void quiet_drop(const char *path)
{
    pthread_mutex_lock(&quiet_lock);
    for (struct quiet_db **pq = &quiet; *pq; pq = &(*pq)->next) {
        if (strcmp((*pq)->path, path) == 0) {
            if (--(*pq)->refs == 0) {
                struct quiet_db *dead = *pq;
                *pq = dead->next;
                free(dead);
            }
            break;
        }
    }
    pthread_mutex_unlock(&quiet_lock);
}

/* V8: an open found a -journal or -wal next to `path`: whoever registered
 * it asks the file system again. */
static void quiet_spoil(const char *path)
{
    pthread_mutex_lock(&quiet_lock);
    for (struct quiet_db *q = quiet; q; q = q->next)
        if (strcmp(q->path, path) == 0)
            q->loud = 1;
    pthread_mutex_unlock(&quiet_lock);
}

/* V8: is `name` the -journal or -wal of a database in `quiet`? */
static int quiet_sidecar(const char *name)
{
    size_t n = strlen(name);
    size_t cut = 0;
    if (n > 8 && strcmp(name + n - 8, "-journal") == 0)
        cut = 8;
    else if (n > 4 && strcmp(name + n - 4, "-wal") == 0)
        cut = 4;
    if (!cut)
        return 0;
    int found = 0;
    pthread_mutex_lock(&quiet_lock);
    for (struct quiet_db *q = quiet; q && !found; q = q->next)
        found = !q->loud && strlen(q->path) == n - cut && strncmp(q->path, name, n - cut) == 0;
    pthread_mutex_unlock(&quiet_lock);
    return found;
}

static sqlite3_vfs txfs_vfs;

static pid_t current_tid(void) { return (pid_t)syscall(SYS_gettid); }

static void tls_sync(void)
{
    pid_t t = current_tid();
    if (tls.tid != t) {
        tls.tid = t;
        tls.levels = 0;
        tls.app = 0;
        tls.gen++;
    }
}

/* All levels of this thread are gone (aborted, or found missing). */
static void tls_forget(void)
{
    tls.levels = 0;
    tls.app = 0;
    tls.gen++;
}

static int ioc(int fd, unsigned long cmd, void *arg)
{
    return ioctl(fd, cmd, arg) < 0 ? errno : 0;
}

static int ioc_flags(int fd, unsigned long cmd, unsigned flags)
{
    struct txfs_ioc_flags a = {.flags = flags, .reserved = 0};
    return ioc(fd, cmd, &a);
}

static int ioc_state(int fd, struct txfs_ioc_state *st)
{
    memset(st, 0, sizeof *st);
    return ioc(fd, TXFS_IOC_STATE, st);
}

static int level_valid(TxfsFile *f)
{
    tls_sync();
    return f->in_level && f->gen == tls.gen && f->tid == tls.tid;
}

/* V3 bookkeeping at a begin, given the transaction the thread was in
 * before it (0: none). */
static void note_prior(uint64_t prior)
{
    if (tls.levels > 0 && (tls.app ? prior != tls.app_tx : prior == 0))
        tls_forget(); /* the transaction our levels lived in ended under us */
    if (tls.levels == 0) {
        tls.app = prior != 0;
        tls.app_tx = prior;
    }
}

/* V5 with V7: is SQLite's cache still exact after the nested commit made in
 * transaction f->stale_tx? now_tx: the transaction after this begin;
 * last_tx/last_ok: how f->stale_tx ended, if the daemon knows (last_tx 0:
 * it does not, or it has not ended). */
static void judge_stale(TxfsFile *f, uint64_t now_tx, uint64_t last_tx, int last_ok)
{
    if (!f->stale_tx)
        return; /* unknown: stale_cache stays as V5 set it */
    if (last_tx == f->stale_tx) {
        f->stale_cache = !last_ok; /* it ended: committed, or not */
        f->stale_tx = 0;
    } else if (now_tx == f->stale_tx) {
        f->stale_cache = 0; /* still inside it: the cache is its view */
    } else {
        f->stale_cache = 1; /* it ended, how is not known */
        f->stale_tx = 0;
    }
}

/* Begin this file's level (V3). */
static int level_begin(TxfsFile *f)
{
    tls_sync();
    f->pre_head_ok = f->pre_size_ok = 0;
    if (f->v7 != 0) {
        struct txfs_ioc_begin_state bs;
        memset(&bs, 0, sizeof bs);
        bs.last_tx = f->stale_tx; /* how did it end? (0: nothing to ask) */
        int e = ENOTTY;
        if (f->v10 != 0) {
            /* V10: the begin also answers the size and the change counter. */
            struct txfs_ioc_begin_file bf;
            memset(&bf, 0, sizeof bf);
            bf.bs = bs;
            e = ioc(f->fd, TXFS_IOC_BEGIN_FILE, &bf);
            if (e == 0) {
                f->v10 = 1;
                bs = bf.bs;
                if (bf.file_valid) {
                    memcpy(f->pre_head, bf.head, 16);
                    f->pre_size = (sqlite3_int64)bf.size;
                    f->pre_head_ok = f->pre_size_ok = 1;
                }
            } else if (e == ENOTTY || e == EINVAL || e == ENOSYS) {
                f->v10 = 0; /* a daemon without it */
            }
        }
        if (f->v10 == 0)
            e = ioc(f->fd, TXFS_IOC_BEGIN_STATE, &bs);
        if (e == 0) {
            f->v7 = 1;
            note_prior(bs.prior_tx);
            judge_stale(f, bs.tx, bs.last_tx, bs.last_committed != 0);
            f->level_tx = bs.tx;
            goto begun;
        }
        if (e == TXFS_ECONFLICT)
            return TXFS_SQLITE_CONFLICT;
        if (e != ENOTTY && e != EINVAL && e != ENOSYS) {
            sqlite3_log(SQLITE_IOERR_LOCK, "txfs: begin on %s: %s", f->path, strerror(e));
            return SQLITE_IOERR_LOCK;
        }
        f->v7 = 0; /* an older daemon */
    }
    struct txfs_ioc_state st;
    int e = ioc_state(f->fd, &st);
    if (e) {
        sqlite3_log(SQLITE_IOERR_LOCK, "txfs: state ioctl on %s: %s", f->path, strerror(e));
        return SQLITE_IOERR_LOCK;
    }
    note_prior(st.tx);
    e = ioc_flags(f->fd, TXFS_IOC_BEGIN, 0);
    if (e) {
        if (e == TXFS_ECONFLICT)
            return TXFS_SQLITE_CONFLICT;
        sqlite3_log(SQLITE_IOERR_LOCK, "txfs: begin on %s: %s", f->path, strerror(e));
        return SQLITE_IOERR_LOCK;
    }
    f->level_tx = 0;
begun:
    tls.levels++;
    f->in_level = 1;
    f->gen = tls.gen;
    f->tid = tls.tid;
    f->doomed = 0;
    return SQLITE_OK;
}

/* Abort the thread's whole transaction (every level, the application's too). */
static void abort_all(TxfsFile *f)
{
    (void)ioc_flags(f->fd, TXFS_IOC_ABORT, 0);
    f->in_level = 0;
    f->pre_head_ok = f->pre_size_ok = 0;
    tls_forget();
}

/* End this file's level. commit: a write transaction's commit point (V1);
 * flags: the outermost commit's (durable or TXFS_COMMIT_ORDERED). */
static int level_end_as(TxfsFile *f, int commit, unsigned flags)
{
    f->pre_head_ok = f->pre_size_ok = 0;
    if (!f->in_level)
        return commit ? TXFS_SQLITE_CONFLICT : SQLITE_OK;
    tls_sync();
    if (f->gen != tls.gen || f->tid != tls.tid) {
        f->in_level = 0; /* its transaction ended under it */
        return commit ? TXFS_SQLITE_CONFLICT : SQLITE_OK;
    }
    if (tls.app && f->v7 != 1) {
        struct txfs_ioc_state st;
        if (ioc_state(f->fd, &st) != 0 || st.tx != tls.app_tx || st.depth == 0) {
            f->in_level = 0;
            tls_forget();
            return commit ? TXFS_SQLITE_CONFLICT : SQLITE_OK;
        }
    } else if (!tls.app && commit && tls.levels > 1) {
        return SQLITE_BUSY; /* V3; xLock(EXCLUSIVE) normally caught it */
    }
    f->in_level = 0;
    tls.levels--;
    if (tls.app || tls.levels > 0) {
        /* Leave one level; the outermost one decides (nested commit).
         * V5, for readers too: a level nested in a transaction that may
         * still abort has read that transaction's view, which may hold
         * other connections' uncommitted pages. If it aborts and a later
         * commit brings the change counter back to the value cached under
         * (A-B-A), only this mark makes the pager drop those pages. */
        f->stale_cache = 1;
        f->stale_tx = f->level_tx;
        int e;
        if (tls.app && f->v7 == 1) {
            /* V7 (the level was begun through this file's daemon, which
             * has COMMIT_IF: the flag is per file, not per process). */
            struct txfs_ioc_commit_if ci = {.flags = 0, .reserved = 0, .tx = tls.app_tx};
            e = ioc(f->fd, TXFS_IOC_COMMIT_IF, &ci);
            if (e == ESTALE) { /* the application's transaction ended under us */
                tls_forget();
                return commit ? TXFS_SQLITE_CONFLICT : SQLITE_OK;
            }
        } else {
            e = ioc_flags(f->fd, TXFS_IOC_COMMIT, 0);
        }
        if (e == TXFS_ECONFLICT)
            return commit ? TXFS_SQLITE_CONFLICT : SQLITE_OK;
        if (e) {
            tls_forget();
            return commit ? SQLITE_IOERR_FSYNC : SQLITE_OK;
        }
        return SQLITE_OK;
    }
    if (!commit) {
        /* Outermost and read-only: abort, so no read set is validated. */
        (void)ioc_flags(f->fd, TXFS_IOC_ABORT, 0);
        return SQLITE_OK;
    }
    int e = ioc_flags(f->fd, TXFS_IOC_COMMIT, flags);
    if (e == 0)
        return SQLITE_OK;
    /* A failed outermost commit has ended the transaction; make sure. */
    (void)ioc_flags(f->fd, TXFS_IOC_ABORT, 0);
    if (e == TXFS_ECONFLICT)
        return TXFS_SQLITE_CONFLICT;
    sqlite3_log(SQLITE_IOERR_FSYNC, "txfs: commit of %s: %s", f->path, strerror(e));
    if (e == ENOSPC || e == EFBIG)
        return SQLITE_FULL;
    return SQLITE_IOERR_FSYNC;
}

static int level_end(TxfsFile *f, int commit) { return level_end_as(f, commit, f->commit_flags); }

static int read_full(int fd, void *buf, int amt, sqlite3_int64 off, int *got)
{
    int n = 0;
    while (n < amt) {
        ssize_t r = pread(fd, (char *)buf + n, (size_t)(amt - n), off + n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            *got = n;
            return errno;
        }
        if (r == 0)
            break;
        n += (int)r;
    }
    *got = n;
    return 0;
}

/* Remember the change counter (bytes 24..39) if [off, off+amt) covers it. */
static void note_vers(TxfsFile *f, const void *buf, int amt, sqlite3_int64 off)
{
    if (off <= 24 && off + amt >= 40) {
        memcpy(f->vers, (const char *)buf + (24 - off), 16);
        f->have_vers = 1;
    }
}

/* Make sure the file holds a valid level while SQLite holds a lock (V4). */
static int ensure_level(TxfsFile *f)
{
    if (level_valid(f))
        return SQLITE_OK;
    f->in_level = 0;
    int rc = level_begin(f);
    if (rc != SQLITE_OK)
        return rc;
    if (f->have_vers) {
        unsigned char now[16];
        int got = 0, e = 0;
        if (f->pre_head_ok) {
            memcpy(now, f->pre_head, 16); /* V10 */
            f->pre_head_ok = 0;
            got = 16;
        } else {
            e = read_full(f->fd, now, 16, 24, &got);
        }
        if (e || got != 16 || memcmp(now, f->vers, 16) != 0) {
            (void)level_end(f, 0);
            return TXFS_SQLITE_CONFLICT;
        }
    }
    return SQLITE_OK;
}

/* V11: a level for the pager's truncate after the commit point, if it is
 * safe: one whose begin finds the change counter this connection committed
 * (ensure_level's V4 check; the bytes enter the level's read set, so a
 * commit racing the truncate makes it conflict). 0: skip the truncate. */
static int tail_level(TxfsFile *f)
{
    if (f->tail_skip)
        return 0;
    if (level_valid(f))
        return 1;
    if (!f->have_vers || ensure_level(f) != SQLITE_OK) {
        f->tail_skip = 1;
        return 0;
    }
    f->wrote = 0; /* the tail level's own writes */
    return 1;
}

static void drop_run(TxfsFile *f);

/* V11: give the tail level up: its writes go, the file stays longer, and
 * the caller reports success (the COMMIT was made). */
static int tail_give_up(TxfsFile *f)
{
    f->tail_skip = 1;
    drop_run(f);
    if (level_valid(f))
        (void)level_end(f, 0);
    return SQLITE_OK;
}

static int map_errno(TxfsFile *f, int e, int dflt)
{
    if (e == TXFS_ECONFLICT) {
        f->doomed = 1;
        return TXFS_SQLITE_CONFLICT;
    }
    if (e == ENOSPC || e == EFBIG)
        return SQLITE_FULL;
    return dflt;
}

/* A transaction is one thread's: refuse I/O from another thread inside it. */
static int check_thread(TxfsFile *f)
{
    if (f->in_level && f->tid != current_tid()) {
        sqlite3_log(SQLITE_MISUSE,
                    "txfs: %s used from two threads within one transaction (a txfs transaction belongs to a thread)",
                    f->path);
        return SQLITE_MISUSE;
    }
    return SQLITE_OK;
}

static int pwrite_full(int fd, const void *buf, int amt, sqlite3_int64 off)
{
    int n = 0;
    while (n < amt) {
        ssize_t w = pwrite(fd, (const char *)buf + n, (size_t)(amt - n), off + n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        n += (int)w;
    }
    return 0;
}

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* V6/V9: each run of the batch as its own pwrite on the database. */
static int send_runs(TxfsFile *f, int len)
{
    for (int at = BATCH_HDR; at < len;) {
        const unsigned char *h = (const unsigned char *)f->run + at;
        int n = (int)get_le(h + 8, 4);
        int e = pwrite_full(f->fd, h + RUN_HDR, n, (sqlite3_int64)get_le(h, 8));
        if (e)
            return e;
        at += RUN_HDR + n;
    }
    return 0;
}

/* V6/V9: send what was gathered. */
static int flush_run(TxfsFile *f)
{
    if (f->nrec == 0)
        return SQLITE_OK;
    int len = f->run_len, nrec = f->nrec;
    f->nrec = 0;
    f->run_len = 0;
    int e = 0;
    if (nrec > 1 && f->bfd >= 0) {
        memcpy(f->run, TXFS_BATCH_MAGIC, 8);
        put_le((unsigned char *)f->run + 8, (uint64_t)len, 8);
        ssize_t w;
        do
            w = pwrite(f->bfd, f->run, (size_t)len, 0);
        while (w < 0 && errno == EINTR);
        if (w == len)
            return SQLITE_OK;
        e = w < 0 ? errno : EIO;
        if (e != EINVAL)
            return map_errno(f, e, SQLITE_IOERR_WRITE);
        /* Refused whole: no batches for this file from now on. */
        sqlite3_log(SQLITE_NOTICE, "txfs: %s: batch write refused, writing runs one by one", f->path);
        close(f->bfd);
        f->bfd = -1;
    }
    e = send_runs(f, len);
    return e ? map_errno(f, e, SQLITE_IOERR_WRITE) : SQLITE_OK;
}

/* V6: an abort took the transaction's writes; what was gathered goes too. */
static void drop_run(TxfsFile *f)
{
    f->nrec = 0;
    f->run_len = 0;
}

/* V6/V9: gather a write; 0 if it does not fit (nothing done). */
static int gather(TxfsFile *f, const void *buf, int amt, sqlite3_int64 off)
{
    if (f->nrec > 0 && off == f->next_off && f->run_len + amt <= GATHER_MAX) {
        unsigned char *h = (unsigned char *)f->run + f->last_rec;
        put_le(h + 8, get_le(h + 8, 4) + (uint64_t)amt, 4);
    } else if ((f->nrec == 0 || f->bfd >= 0) && (f->nrec ? f->run_len : BATCH_HDR) + RUN_HDR + amt <= GATHER_MAX) {
        if (f->nrec == 0)
            f->run_len = BATCH_HDR;
        unsigned char *h = (unsigned char *)f->run + f->run_len;
        put_le(h, (uint64_t)off, 8);
        put_le(h + 8, (uint64_t)amt, 4);
        put_le(h + 12, 0, 4);
        f->last_rec = f->run_len;
        f->run_len += RUN_HDR;
        f->nrec++;
    } else {
        return 0;
    }
    memcpy(f->run + f->run_len, buf, (size_t)amt);
    f->run_len += amt;
    f->next_off = off + amt;
    return 1;
}

/* ---- sqlite3_io_methods ------------------------------------------------ */

static int txfs_close(sqlite3_file *pf)
{
    TxfsFile *f = (TxfsFile *)pf;
    drop_run(f); /* nothing committed it: the level ends in an abort */
    if (f->no_sidecars)
        quiet_drop(f->path);
    f->no_sidecars = 0;
    if (f->in_level && level_valid(f))
        (void)level_end(f, 0);
    free(f->run);
    f->run = NULL;
    if (f->bfd >= 0)
        close(f->bfd);
    f->bfd = -1;
    close(f->fd);
    f->fd = -1;
    return SQLITE_OK;
}

static int txfs_read(sqlite3_file *pf, void *buf, int amt, sqlite3_int64 off)
{
    TxfsFile *f = (TxfsFile *)pf;
    int rc = check_thread(f);
    if (rc == SQLITE_OK && f->lock >= SQLITE_LOCK_SHARED)
        rc = ensure_level(f);
    if (rc == SQLITE_OK)
        rc = flush_run(f);
    if (rc != SQLITE_OK)
        return rc;
    int got = 0;
    if (f->pre_head_ok && off == 24 && amt == 16) {
        /* V10: the pager's cache check right after the begin. */
        memcpy(buf, f->pre_head, 16);
        f->pre_head_ok = 0;
        got = 16;
    } else {
        f->pre_head_ok = f->pre_size_ok = 0; /* only ever the level's first read */
        int e = read_full(f->fd, buf, amt, off, &got);
        if (e)
            return map_errno(f, e, SQLITE_IOERR_READ);
    }
    if (got < amt) {
        memset((char *)buf + got, 0, (size_t)(amt - got));
        return SQLITE_IOERR_SHORT_READ;
    }
    if (f->stale_cache && off == 24 && amt == 16 && f->lock == SQLITE_LOCK_SHARED) {
        /* V5: the pager's cache check; it holds the counter we last wrote. */
        f->stale_cache = 0;
        f->stale_tx = 0;
        if (f->have_vers)
            memcpy(buf, f->vers, 16);
        ((unsigned char *)buf)[3] ^= 0xff;
        return SQLITE_OK;
    }
    note_vers(f, buf, amt, off);
    return SQLITE_OK;
}

static int txfs_write(sqlite3_file *pf, const void *buf, int amt, sqlite3_int64 off)
{
    TxfsFile *f = (TxfsFile *)pf;
    int rc = check_thread(f);
    if (rc == SQLITE_OK && f->committed) {
        if (!tail_level(f))
            return SQLITE_OK; /* V11: the pager's grow after the commit, skipped */
    } else if (rc == SQLITE_OK && f->lock >= SQLITE_LOCK_SHARED) {
        rc = ensure_level(f);
    }
    if (rc != SQLITE_OK)
        return rc;
    f->wrote = 1;
    f->pre_head_ok = f->pre_size_ok = 0;
    note_vers(f, buf, amt, off);
    if (f->nrec > 0 && gather(f, buf, amt, off))
        return SQLITE_OK;
    if ((rc = flush_run(f)) != SQLITE_OK)
        return f->committed ? tail_give_up(f) : rc;
    if (level_valid(f)) {
        if (!f->run) {
            void *p = NULL;
            if (posix_memalign(&p, 4096, WRITE_RUN) != 0)
                return SQLITE_NOMEM;
            f->run = p;
        }
        if (gather(f, buf, amt, off))
            return SQLITE_OK;
    }
    int e = pwrite_full(f->fd, buf, amt, off);
    if (e && f->committed)
        return tail_give_up(f);
    return e ? map_errno(f, e, SQLITE_IOERR_WRITE) : SQLITE_OK;
}

static int txfs_truncate(sqlite3_file *pf, sqlite3_int64 size)
{
    TxfsFile *f = (TxfsFile *)pf;
    int rc = check_thread(f);
    if (rc != SQLITE_OK)
        return rc;
    /* Inside a level: part of the transaction. After the commit point (the
     * pager's shrink in commit phase two): in the tail level, or not at all
     * (V11); a file longer than its header's page count is valid SQLite. */
    if (f->committed && !tail_level(f))
        return SQLITE_OK;
    if (level_valid(f))
        f->wrote = 1;
    f->pre_head_ok = f->pre_size_ok = 0;
    if ((rc = flush_run(f)) != SQLITE_OK)
        return f->committed ? tail_give_up(f) : rc;
    if (ftruncate(f->fd, (off_t)size) != 0) {
        /* V11: in the tail a racing commit makes the SETATTR conflict
         * (EDEADLK from the daemon's eager check): skip, do not fail. */
        if (f->committed)
            return tail_give_up(f);
        return map_errno(f, errno, SQLITE_IOERR_TRUNCATE);
    }
    return SQLITE_OK;
}

static int txfs_xsync(sqlite3_file *pf, int flags)
{
    (void)flags;
    /* The txfs commit is the durability point (V1); the run must be in. */
    return flush_run((TxfsFile *)pf);
}

static int txfs_file_size(sqlite3_file *pf, sqlite3_int64 *size)
{
    TxfsFile *f = (TxfsFile *)pf;
    int rc = check_thread(f);
    if (rc == SQLITE_OK && f->committed)
        (void)tail_level(f); /* V11: else the size outside any level */
    else if (rc == SQLITE_OK && f->lock >= SQLITE_LOCK_SHARED)
        rc = ensure_level(f);
    if (rc == SQLITE_OK)
        rc = flush_run(f);
    if (rc != SQLITE_OK && f->committed) {
        *size = 0; /* whatever the pager then does to the file is skipped */
        return tail_give_up(f);
    }
    if (rc != SQLITE_OK)
        return rc;
    if (f->pre_size_ok) {
        /* V10: the size as the level began (nothing written since). */
        f->pre_size_ok = 0;
        *size = f->pre_size;
        return SQLITE_OK;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        if (f->committed) {
            *size = 0; /* as above */
            return tail_give_up(f);
        }
        return map_errno(f, errno, SQLITE_IOERR_FSTAT);
    }
    *size = st.st_size;
    return SQLITE_OK;
}

static int txfs_lock(sqlite3_file *pf, int level)
{
    TxfsFile *f = (TxfsFile *)pf;
    if (level <= f->lock)
        return SQLITE_OK;
    int rc;
    if (f->lock == SQLITE_LOCK_NONE) {
        f->in_level = 0;
        rc = level_begin(f);
        if (rc != SQLITE_OK)
            return rc;
        f->lock = SQLITE_LOCK_SHARED;
    }
    if (level >= SQLITE_LOCK_RESERVED && f->lock < SQLITE_LOCK_RESERVED) {
        if ((rc = check_thread(f)) != SQLITE_OK || (rc = ensure_level(f)) != SQLITE_OK)
            return rc;
        f->wrote = 0;
        f->committed = 0;
        f->tail_skip = 0;
    }
    if (level == SQLITE_LOCK_EXCLUSIVE) {
        if (!level_valid(f))
            return TXFS_SQLITE_CONFLICT;
        if (!tls.app && tls.levels > 1)
            return SQLITE_BUSY; /* V3 */
    }
    f->lock = level;
    return SQLITE_OK;
}

static int txfs_unlock(sqlite3_file *pf, int level)
{
    TxfsFile *f = (TxfsFile *)pf;
    if (level >= f->lock)
        return SQLITE_OK;
    if (f->lock >= SQLITE_LOCK_RESERVED && level <= SQLITE_LOCK_SHARED) {
        /* A write transaction ended. Without a commit, file writes must go:
         * abort — unless the application's transaction is already doomed,
         * whose own commit then fails with EDEADLK as it should (V2, V3). */
        if (!f->committed && f->wrote && level_valid(f) && !(tls.app && f->doomed))
            abort_all(f);
        if (f->committed && level_valid(f)) {
            /* V11: the tail level; a lost shrink is harmless, hence ORDERED,
             * and a failed one leaves the file longer. */
            if (flush_run(f) == SQLITE_OK)
                (void)level_end_as(f, f->wrote, TXFS_COMMIT_ORDERED);
            else
                (void)level_end(f, 0);
        }
        drop_run(f); /* unsent after the commit point: none; else aborted */
        f->committed = 0;
        f->wrote = 0;
        f->tail_skip = 0;
    }
    if (level == SQLITE_LOCK_NONE)
        (void)level_end(f, 0);
    f->lock = level;
    return SQLITE_OK;
}

static int txfs_check_reserved(sqlite3_file *pf, int *res)
{
    (void)pf;
    *res = 0; /* no locks, hence never a hot journal */
    return SQLITE_OK;
}

static int is_word(const char *s, const char *w) { return s && sqlite3_stricmp(s, w) == 0; }

static int is_off(const char *v) { return is_word(v, "off") || is_word(v, "0") || is_word(v, "false") || is_word(v, "no"); }

/* V2: refuse PRAGMAs that would bring back a journal, locks or spills. */
static int txfs_pragma(TxfsFile *f, char **a)
{
    const char *name = a[1], *val = a[2];
    const char *why = NULL;
    if (is_word(name, "journal_mode") && val && !is_word(val, "off") && !is_word(val, "memory"))
        why = "txfs: journal_mode stays OFF (each write transaction is a txfs transaction)";
    else if (is_word(name, "locking_mode") && val && !is_word(val, "normal"))
        why = "txfs: locking_mode=EXCLUSIVE would keep one txfs transaction open forever";
    else if (is_word(name, "cache_spill") && val && !is_off(val))
        why = "txfs: cache_spill stays OFF (no page may reach the file before the commit)";
    else if (is_word(name, "txfs_commit")) {
        if (val) {
            if (is_word(val, "ordered"))
                f->commit_flags = TXFS_COMMIT_ORDERED;
            else if (is_word(val, "durable"))
                f->commit_flags = 0;
            else
                why = "txfs: txfs_commit is 'durable' or 'ordered'";
        }
        if (!why) {
            a[0] = sqlite3_mprintf("%s", f->commit_flags ? "ordered" : "durable");
            return SQLITE_OK;
        }
    }
    if (why) {
        a[0] = sqlite3_mprintf("%s", why);
        return SQLITE_ERROR;
    }
    return SQLITE_NOTFOUND;
}

static int txfs_file_control(sqlite3_file *pf, int op, void *arg)
{
    TxfsFile *f = (TxfsFile *)pf;
    switch (op) {
    case SQLITE_FCNTL_SYNC: {
        /* The commit point (V1): every page of the transaction is written. */
        if (f->lock < SQLITE_LOCK_RESERVED)
            return SQLITE_OK;
        int rc = check_thread(f);
        if (rc == SQLITE_OK)
            rc = flush_run(f);
        if (rc == SQLITE_OK)
            rc = level_end(f, 1);
        if (rc == SQLITE_OK) {
            f->committed = 1;
            f->tail_skip = 0;
        }
        return rc;
    }
    case SQLITE_FCNTL_PRAGMA:
        return txfs_pragma(f, (char **)arg);
    case SQLITE_FCNTL_VFSNAME:
        *(char **)arg = sqlite3_mprintf("%s", TXFS_VFS_NAME);
        return SQLITE_OK;
    case SQLITE_FCNTL_HAS_MOVED: {
        struct stat a, b;
        *(int *)arg = fstat(f->fd, &a) != 0 || stat(f->path, &b) != 0 || a.st_ino != b.st_ino;
        return SQLITE_OK;
    }
    default:
        return SQLITE_NOTFOUND;
    }
}

static int txfs_sector_size(sqlite3_file *pf)
{
    (void)pf;
    return 4096;
}

static int txfs_device_characteristics(sqlite3_file *pf)
{
    (void)pf;
    return SQLITE_IOCAP_POWERSAFE_OVERWRITE;
}

/* Version 1: no xShm* (so no WAL, V2) and no xFetch (no mmap). */
static const sqlite3_io_methods txfs_io = {
    1,
    txfs_close,
    txfs_read,
    txfs_write,
    txfs_truncate,
    txfs_xsync,
    txfs_file_size,
    txfs_lock,
    txfs_unlock,
    txfs_check_reserved,
    txfs_file_control,
    txfs_sector_size,
    txfs_device_characteristics,
    0, 0, 0, 0, 0, 0,
};

/* ---- sqlite3_vfs ------------------------------------------------------- */

static int on_txfs(int fd)
{
    struct statfs sfs;
    struct txfs_ioc_state st;
    if (fstatfs(fd, &sfs) != 0 || sfs.f_type != FUSE_SUPER_MAGIC)
        return 0;
    return ioc_state(fd, &st) == 0;
}

static int txfs_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *pf, int flags, int *out_flags)
{
    (void)vfs;
    if (flags & (SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL | SQLITE_OPEN_SUPER_JOURNAL)) {
        sqlite3_log(SQLITE_CANTOPEN, "txfs: refusing to create %s: journal_mode must be OFF on a txfs database",
                    name ? name : "a journal");
        return SQLITE_CANTOPEN;
    }
    if (!(flags & SQLITE_OPEN_MAIN_DB) || !name)
        return orig_vfs->xOpen(orig_vfs, name, pf, flags, out_flags); /* temp files */

    TxfsFile *f = (TxfsFile *)pf;
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->bfd = -1;
    f->v7 = -1;
    f->v10 = -1;
    f->pre_head_ok = f->pre_size_ok = 0;
    int oflags = O_CLOEXEC | O_NOFOLLOW;
    if (flags & SQLITE_OPEN_READWRITE)
        oflags |= O_RDWR;
    else
        oflags |= O_RDONLY;
    if (flags & SQLITE_OPEN_CREATE)
        oflags |= O_CREAT;
    if (flags & SQLITE_OPEN_EXCLUSIVE)
        oflags |= O_EXCL;
    int fd = open(name, oflags, 0644);
    if (fd < 0 && (flags & SQLITE_OPEN_READWRITE) && (errno == EACCES || errno == EROFS || errno == EISDIR)) {
        fd = open(name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        flags = (flags & ~(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) | SQLITE_OPEN_READONLY;
    }
    if (fd < 0) {
        sqlite3_log(SQLITE_CANTOPEN, "txfs: open %s: %s", name, strerror(errno));
        return SQLITE_CANTOPEN;
    }
    if (!on_txfs(fd)) {
        close(fd);
        sqlite3_log(SQLITE_CANTOPEN, "txfs: %s is not on a txfs mount", name);
        return SQLITE_CANTOPEN;
    }
    f->fd = fd;
    f->path = name;
    /* V9: a batch descriptor, where the daemon has them. */
    if (flags & SQLITE_OPEN_READWRITE) {
        f->bfd = open(name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        if (f->bfd >= 0 && ioc_flags(f->bfd, TXFS_IOC_BATCH, 0) != 0) {
            close(f->bfd);
            f->bfd = -1;
        }
    }
    /* V8: no journal or WAL next to it now: none will appear. */
    char side[4096];
    int j = 1, w = 1;
    if (snprintf(side, sizeof side, "%s-journal", name) < (int)sizeof side &&
        orig_vfs->xAccess(orig_vfs, side, SQLITE_ACCESS_EXISTS, &j) == SQLITE_OK && !j &&
        snprintf(side, sizeof side, "%s-wal", name) < (int)sizeof side &&
        orig_vfs->xAccess(orig_vfs, side, SQLITE_ACCESS_EXISTS, &w) == SQLITE_OK && !w)
        f->no_sidecars = quiet_add(name);
    else
        quiet_spoil(name);
    const char *mode = sqlite3_uri_parameter(name, "txfs_commit");
    f->commit_flags = is_word(mode, "ordered") ? TXFS_COMMIT_ORDERED : 0;
    if (mode && !is_word(mode, "ordered") && !is_word(mode, "durable"))
        sqlite3_log(SQLITE_WARNING, "txfs: unknown txfs_commit=%s, using durable", mode);
    f->base.pMethods = &txfs_io;
    if (out_flags)
        *out_flags = flags;
    return SQLITE_OK;
}

static int txfs_delete(sqlite3_vfs *v, const char *name, int sync_dir)
{
    (void)v;
    return orig_vfs->xDelete(orig_vfs, name, sync_dir);
}

static int txfs_access(sqlite3_vfs *v, const char *name, int flags, int *res)
{
    (void)v;
    if (flags == SQLITE_ACCESS_EXISTS && quiet_sidecar(name)) {
        *res = 0; /* V8 */
        return SQLITE_OK;
    }
    return orig_vfs->xAccess(orig_vfs, name, flags, res);
}

static int txfs_full_pathname(sqlite3_vfs *v, const char *name, int n, char *out)
{
    (void)v;
    return orig_vfs->xFullPathname(orig_vfs, name, n, out);
}

static void *txfs_dlopen(sqlite3_vfs *v, const char *name)
{
    (void)v;
    return orig_vfs->xDlOpen(orig_vfs, name);
}

static void txfs_dlerror(sqlite3_vfs *v, int n, char *msg)
{
    (void)v;
    orig_vfs->xDlError(orig_vfs, n, msg);
}

static void (*txfs_dlsym(sqlite3_vfs *v, void *h, const char *sym))(void)
{
    (void)v;
    return orig_vfs->xDlSym(orig_vfs, h, sym);
}

static void txfs_dlclose(sqlite3_vfs *v, void *h)
{
    (void)v;
    orig_vfs->xDlClose(orig_vfs, h);
}

static int txfs_randomness(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return orig_vfs->xRandomness(orig_vfs, n, out);
}

static int txfs_sleep(sqlite3_vfs *v, int us)
{
    (void)v;
    return orig_vfs->xSleep(orig_vfs, us);
}

static int txfs_current_time(sqlite3_vfs *v, double *t)
{
    (void)v;
    return orig_vfs->xCurrentTime(orig_vfs, t);
}

static int txfs_get_last_error(sqlite3_vfs *v, int n, char *msg)
{
    (void)v;
    return orig_vfs->xGetLastError ? orig_vfs->xGetLastError(orig_vfs, n, msg) : 0;
}

static int txfs_current_time_int64(sqlite3_vfs *v, sqlite3_int64 *t)
{
    (void)v;
    return orig_vfs->xCurrentTimeInt64(orig_vfs, t);
}

/* Auto-extension: every connection whose main database is on this VFS gets
 * journal_mode=OFF and cache_spill=OFF before its first statement (V2). */
static int txfs_conn_init(sqlite3 *db, char **err, const sqlite3_api_routines *api)
{
    (void)api;
    sqlite3_vfs *v = NULL;
    if (sqlite3_file_control(db, "main", SQLITE_FCNTL_VFS_POINTER, &v) != SQLITE_OK || v != &txfs_vfs)
        return SQLITE_OK;
    /* Runs before the application can set a busy timeout: a commit racing
     * with this first read is retried here. */
    int rc = SQLITE_BUSY;
    for (int i = 0; i < 200 && (rc & 0xff) == SQLITE_BUSY; i++) {
        if (i > 0) {
            sqlite3_free(*err);
            *err = NULL;
            sqlite3_sleep(1 + i % 10);
        }
        rc = sqlite3_exec(db, "PRAGMA main.journal_mode=OFF; PRAGMA cache_spill=OFF; PRAGMA main.cache_size=-65536;", NULL, NULL, err);
    }
    return rc;
}

#ifdef _WIN32
__declspec(dllexport)
#endif
__attribute__((visibility("default"))) int sqlite3_txfsvfs_init(sqlite3 *db, char **err, const sqlite3_api_routines *api)
{
    SQLITE_EXTENSION_INIT2(api);
    if (!sqlite3_vfs_find(TXFS_VFS_NAME)) {
        orig_vfs = sqlite3_vfs_find(NULL);
        if (!orig_vfs || orig_vfs->iVersion < 2)
            return SQLITE_ERROR;
        sqlite3_vfs v = {
            2,
            (int)(sizeof(TxfsFile) > (size_t)orig_vfs->szOsFile ? sizeof(TxfsFile) : (size_t)orig_vfs->szOsFile),
            orig_vfs->mxPathname,
            NULL,
            TXFS_VFS_NAME,
            NULL,
            txfs_open,
            txfs_delete,
            txfs_access,
            txfs_full_pathname,
            txfs_dlopen,
            txfs_dlerror,
            txfs_dlsym,
            txfs_dlclose,
            txfs_randomness,
            txfs_sleep,
            txfs_current_time,
            txfs_get_last_error,
            txfs_current_time_int64,
            NULL, NULL, NULL,
        };
        txfs_vfs = v;
        int rc = sqlite3_vfs_register(&txfs_vfs, 0);
        if (rc != SQLITE_OK)
            return rc;
        rc = sqlite3_auto_extension((void (*)(void))txfs_conn_init);
        if (rc != SQLITE_OK)
            return rc;
    }
    /* The loading connection itself, should it be a txfs database. */
    if (db) {
        int rc = txfs_conn_init(db, err, api);
        if (rc != SQLITE_OK)
            return rc;
    }
    return SQLITE_OK_LOAD_PERMANENTLY;
}

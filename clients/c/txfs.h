/* txfs.h — transactions over a txfs mount (the txfs sources: README.md; the contract: docs/SPEC.md §2).
 *
 * Every call returns 0 on success, or -1 with errno set. A transaction
 * belongs to the calling thread, while that thread lives, and to the
 * credentials (fsuid, fsgid) it began with: the thread running with others
 * (a setuid or setgid program it executed) is outside the transaction, and
 * its begin, commit and abort fail with EPERM, unless root began it. A
 * transaction whose thread exited is aborted. Nested begins flatten into
 * the outer transaction; only the outermost commit commits.
 *
 * errno TXFS_ECONFLICT (== EDEADLK, "Resource deadlock avoided"): the
 * transaction lost a conflict and is doomed; every later operation of it
 * fails the same way. Abort it (fs_tx_abort) and run it again.
 *
 * Finding the mount (fs_tx_begin, txfs_begin(NULL, ...)):
 * $TXFS_MOUNT if set and non-empty (any path inside the mount), else the only
 * file system of type "fuse.txfs" in /proc/self/mountinfo (also accepted: type
 * "fuse" with source "txfs:BACKING"; bind mounts of one file system count
 * once), else, of several, the one holding the current directory (as `txfs
 * run` chooses). Errors of that step (txfs_last_error() says more):
 *   ENODEV    no txfs mount at all ($TXFS_MOUNT unset);
 *   ENOTUNIQ  several txfs mounts and the current directory in none of them
 *             (txfs_last_error() lists them): set $TXFS_MOUNT or use
 *             txfs_begin(path);
 *   ENOTTY    $TXFS_MOUNT or path_in_mount is not inside a txfs mount;
 *   ENOENT, EACCES, ...  from stat(2)/open(2) of that path.
 * Other errnos: EXDEV for a nested begin on another mount than the open
 * transaction's; anything else comes from the daemon (e.g. EINVAL: commit
 * or abort without a transaction; EIO: the daemon met an I/O error in its
 * journal or checkpoint and acknowledges nothing more until the mount is
 * mounted again). commit and abort go to the mount of the calling
 * thread's begin; with no begin recorded they use the mount found as above.
 */
#ifndef TXFS_H
#define TXFS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TXFS_ECONFLICT EDEADLK

/* txfs_commit flags */
#define TXFS_COMMIT_ORDERED 0x1u /* order fixed, durable later (txfs_sync) */

/* TxFS-compatible API. The mount is $TXFS_MOUNT, or the only txfs mount. */
int fs_tx_begin(void);
int fs_tx_commit(void); /* durable: returns after the commit is on disk */
int fs_tx_abort(void);

/* Explicit mount (any path inside it; NULL: as fs_tx_begin) and flags.
 * Flags are passed to the daemon unchanged. */
int txfs_begin(const char *path_in_mount, unsigned flags);
int txfs_commit(unsigned flags);
int txfs_abort(void);
/* Earlier commits become durable. NULL: the mount of the calling thread's
 * open transaction, else the mount found as for fs_tx_begin. */
int txfs_sync(const char *path_in_mount);

/* ---- the change set: what the transaction would commit ----------------
 *
 *   txfs_changes_t *it = txfs_changes();      // inside fs_tx_begin ... commit
 *   const struct txfs_change *c;
 *   while ((c = txfs_changes_next(it)))
 *       printf("%s\n", c->path);              // relative to the mount root
 *   if (errno) ...                            // ESTALE: list again from the start
 *   txfs_changes_free(it);
 *
 * The listing is a snapshot, taken by txfs_changes(), of the calling
 * thread's transaction (a begin of its own, or the process tree of a `txfs
 * run`), on the mount of the thread's open libtxfs transaction, else the
 * mount found as for fs_tx_begin. It is fetched a page at a time as
 * txfs_changes_next() consumes it; looking records no read, so it cannot
 * make the transaction conflict. One change a path, in path order (what
 * is below a directory right after it): a file created and deleted inside
 * the transaction is not there at all; a rename is one change at the new
 * path (`from` names the old one); below a created or deleted directory
 * every path is listed too (`files`, `dirs` count them on the directory's
 * change). Use an iterator from the thread that made it: the daemon
 * answers for the calling thread's transaction. */
typedef struct txfs_changes txfs_changes_t;

/* One change. Strings are NUL-terminated copies, "" when absent; all of it
 * is valid until the next txfs_changes_next() or txfs_changes_free() on its
 * iterator. */
struct txfs_change {
    uint32_t what;               /* TXFS_CHANGE_* bits */
    uint32_t kind;               /* S_IFMT bits of what `path` names (named
                                    before, if deleted) */
    uint32_t old_mode, new_mode; /* st_mode before and after; 0: nothing there */
    uint32_t old_uid, old_gid, new_uid, new_gid;
    uint64_t old_size, new_size;
    uint64_t bytes;              /* bytes the transaction wrote into the file
                                    (a new file: its size) */
    uint64_t files, dirs;        /* a created or deleted directory: what was
                                    created or deleted below it with it */
    const char *path;            /* below the mount root; a deletion: where it was */
    const char *from;            /* TXFS_CHANGE_RENAMED: where it was before */
    const char *old_target;      /* a symlink's target before ... */
    const char *target;          /* ... and after */
    const char *xattrs;          /* TXFS_CHANGE_XATTR: the names of extended
                                    attributes set or removed, each followed
                                    by a NUL, then one more NUL */
    size_t xattrs_len;           /* bytes of those names and their NULs, not
                                    counting the final NUL (0: none) */
    size_t index;                /* its position in the listing, from 0 */
};

/* A new listing (a new snapshot) of the calling thread's transaction; NULL
 * with errno set on error: EINVAL not in a transaction, ENOTTY a daemon
 * older than the change set, ENOMEM, or any error of finding the mount. A
 * new listing of the same transaction (from any iterator, or `txfs diff`)
 * replaces this one's snapshot on the daemon: reads through this iterator
 * that need the daemon then fail with ESTALE. */
txfs_changes_t *txfs_changes(void);

/* The next change, or NULL: at the end with errno 0, else with errno set
 * (ESTALE: a newer listing replaced this one's snapshot: free the iterator
 * and start again with txfs_changes(); EPROTO: the daemon's listing is not
 * made of whole records). After a failure every later call fails the same
 * way. */
const struct txfs_change *txfs_changes_next(txfs_changes_t *it);

/* Read up to `len` bytes at `offset` of one side of change `c` of `it`:
 * with `new_side` 0 the committed content (before; at `from` for a
 * rename), else the content the transaction would commit (after). Only
 * c->index is used, so a copy of an earlier change serves as well. Returns
 * the bytes read (fewer than `len` only at the end of the file, 0 past it),
 * or -1 with errno: ENOENT that side has no file (the old side of a created
 * file, the new side of a deleted one), EISDIR a directory, EINVAL another
 * kind (symlink, fifo, ...) or no such change, EACCES the caller may not
 * read that side by its mode, ESTALE a newer listing replaced this one. */
ssize_t txfs_change_read(txfs_changes_t *it, const struct txfs_change *c, int new_side, uint64_t offset, void *buf,
                         size_t len);

/* Whether the transaction had already lost a conflict when listed (its
 * commit will fail; run again, it may see other data): 1 or 0. */
int txfs_changes_lost(const txfs_changes_t *it);

/* Free the iterator (NULL: nothing). */
void txfs_changes_free(txfs_changes_t *it);

/* The calling thread's last message of finding a mount, for the ENODEV,
 * ENOTUNIQ (with the candidate mount points) and ENOTTY above; "" if that
 * step last succeeded. Never NULL; valid until the thread's next call. */
const char *txfs_last_error(void);

/* ---- wire protocol: ioctls on any file or directory of the mount ------ */
/* FUSE passes only "restricted" ioctls: sizes are encoded in the numbers.
 * The daemon's definition is crates/txfs/src/wire.rs; the test
 * crates/txfs/tests/wire_headers.rs fails if a number, struct size or field
 * offset here differs from it. */
#define TXFS_IOC_MAGIC 0xE7

struct txfs_ioc_flags {
    uint32_t flags;
    uint32_t reserved; /* 0 */
};

/* Make a process tree one transaction (used by `txfs run`). RUN_BEGIN
 * only by the child's parent (EPERM), which becomes the tree's owner; a
 * caller other than root gets EPERM for a child whose uids or gids are not
 * all its own. RUN_COMMIT and RUN_ABORT only by that live owner (EPERM). */
#define TXFS_RUN_BEGIN 1u
#define TXFS_RUN_COMMIT 2u
#define TXFS_RUN_ABORT 3u
struct txfs_ioc_run {
    uint32_t pid;   /* root of the tree: it and all its descendants */
    uint32_t op;    /* TXFS_RUN_* */
    uint32_t flags; /* TXFS_COMMIT_ORDERED for TXFS_RUN_COMMIT */
    uint32_t reserved; /* 0 (`txfs run` passes its view's descriptor here) */
};

struct txfs_ioc_status {
    uint64_t commits, aborts, conflicts, live_txs;
    uint64_t journal_bytes, journal_syncs, checkpoints, last_seq;
};

/* Whether the calling thread is in a transaction, and how deeply nested. */
struct txfs_ioc_state {
    uint64_t tx;    /* 0: none */
    uint32_t depth; /* nesting depth; 0: none */
    uint32_t flags; /* TXFS_STATE_DOOMED (0 from daemons before it) */
};
/* txfs_ioc_state.flags: the transaction lost a conflict; it can only abort. */
#define TXFS_STATE_DOOMED 0x1

/* TXFS_IOC_BEGIN_STATE: a begin answered with the calling thread's state
 * after it, and how one of the thread's recent transactions of its own (one
 * it began, not one it joined) ended. A daemon older than this ioctl
 * answers ENOTTY. */
struct txfs_ioc_begin_state {
    uint64_t tx;             /* out: the transaction now */
    uint32_t depth;          /* out: nesting depth now */
    uint32_t last_committed; /* out: 1 if last_tx committed */
    uint64_t last_tx;        /* in: the transaction to ask about, 0: the
                                thread's last; out: it, 0 if not known */
    uint64_t prior_tx;       /* out: the transaction the thread was in before
                                this begin (a `txfs run`'s too), 0: none */
};

/* TXFS_IOC_BEGIN_FILE: TXFS_IOC_BEGIN_STATE issued on a regular file, also
 * answering what the new transaction sees of that file — its size and bytes
 * 24..40 (SQLite's file change counter), both in the transaction's read set
 * as if read — so a SQLite transaction's first two requests need no round
 * trip. It needs a descriptor open for reading (EBADF) and a caller allowed
 * to read the file by its mode (EACCES); nothing is begun then. A daemon
 * older than this ioctl answers ENOTTY. */
struct txfs_ioc_begin_file {
    struct txfs_ioc_begin_state bs; /* in/out: as TXFS_IOC_BEGIN_STATE */
    uint64_t size;                  /* out: the file's size */
    unsigned char head[16];         /* out: its bytes 24..40 */
    uint32_t file_valid;            /* out: 1 if size and head are set (a
                                       regular file of at least 40 bytes) */
    uint32_t reserved;
};

/* TXFS_IOC_COMMIT_IF: commit (leave one level) only if the calling thread's
 * transaction is `tx`; ESTALE otherwise, changing nothing. */
struct txfs_ioc_commit_if {
    uint32_t flags; /* TXFS_COMMIT_ORDERED */
    uint32_t reserved;
    uint64_t tx;
};

/* TXFS_IOC_BATCH (struct txfs_ioc_flags, zeroed), issued on a descriptor of
 * a regular file opened for writing, makes every later write(2)/pwrite(2)
 * through that descriptor a *batch*: several writes to its file in one
 * request. A batch is "TXFSBAT1", its whole length as a uint64_t, then
 * records of {uint64_t offset; uint32_t length; uint32_t zero; bytes}, all
 * little-endian; write it at offset 0 from a 4 KiB-aligned buffer of at most
 * 1 MiB (a write the kernel splits is refused whole with EINVAL). Only inside
 * a transaction (else EINVAL: it could not be atomic), whose writes the
 * records become, in order; a batch that fails part-way (ENOSPC) may leave
 * its first records in the transaction: abort it. Not in a `txfs run` view
 * (EINVAL). A daemon older than this ioctl answers ENOTTY. */
#define TXFS_BATCH_MAGIC "TXFSBAT1"
#define TXFS_BATCH_MAX (1u << 20)

/* TXFS_IOC_CHANGES: a page of the caller's transaction's change set, or of
 * one side of one changed file (txfs_changes() above does the paging). LIST
 * from offset 0 takes a new snapshot of the change set and answers its
 * first page, the listing's length (`total`) and the snapshot (`snap`);
 * later pages pass `snap` and their offset. OLD and NEW read the committed
 * and the transaction's content of change `index` of snapshot `snap` at
 * file `offset` (`total`: the file's size). ESTALE: a newer LIST from 0
 * replaced that snapshot (start again). EINVAL: not in a transaction. The
 * listing is a sequence of records, all little-endian: uint32_t length of
 * the whole record, then uint32_t what, kind, old_mode, new_mode, old_uid,
 * old_gid, new_uid, new_gid, 0; uint64_t old_size, new_size, bytes, files,
 * dirs; then five strings, each a uint32_t length and its bytes (no NUL):
 * path, from, old_target, target, and the xattr names each followed by a
 * NUL. A record may straddle pages. A daemon older than this ioctl answers
 * ENOTTY. */
#define TXFS_CHANGES_LIST 1u /* op: a page of the listing */
#define TXFS_CHANGES_OLD 2u  /* op: committed content of a change's file */
#define TXFS_CHANGES_NEW 3u  /* op: its content as the transaction would commit it */
#define TXFS_CHANGES_LOST 0x1u /* flags, out: the transaction already lost a conflict */
#define TXFS_CHANGES_DATA 16320 /* bytes of data */
#define TXFS_CHANGE_HEAD 80 /* bytes of a record before its strings */
struct txfs_ioc_changes {
    uint32_t pid;    /* 0: the caller's own transaction; else the `txfs run`
                        tree of this pid, asked by the `txfs run` that
                        registered it */
    uint32_t op;     /* TXFS_CHANGES_LIST, _OLD or _NEW */
    uint64_t offset; /* LIST: a byte offset in the listing; OLD, NEW: in the file */
    uint64_t index;  /* OLD, NEW: the change's position in the listing */
    uint64_t total;  /* out: LIST: the listing's length; OLD, NEW: the file's size */
    uint32_t len;    /* out: bytes of data that are set */
    uint32_t snap;   /* in (LIST past offset 0, OLD, NEW) and out: the snapshot */
    uint32_t flags;  /* out: TXFS_CHANGES_LOST */
    uint32_t reserved;
    unsigned char data[16320]; /* TXFS_CHANGES_DATA */
};

/* struct txfs_change's `what` (and a record's): what happened to the path. */
#define TXFS_CHANGE_CREATED 0x1u   /* it names an object the transaction made */
#define TXFS_CHANGE_DELETED 0x2u   /* it no longer names anything */
#define TXFS_CHANGE_MODIFIED 0x4u  /* the file's bytes or size changed */
#define TXFS_CHANGE_RENAMED 0x8u   /* the object was at `from` before */
#define TXFS_CHANGE_LINKED 0x10u   /* a new name of an object that keeps its old one(s) */
#define TXFS_CHANGE_MODE 0x20u
#define TXFS_CHANGE_OWNER 0x40u
#define TXFS_CHANGE_XATTR 0x80u    /* extended attributes set or removed */
#define TXFS_CHANGE_TIMES 0x100u   /* times set explicitly (utimensat), not by a write */
#define TXFS_CHANGE_REPLACED 0x200u /* it names a different object than before
                                       (a new file renamed over the old, `ln -sf`) */

#define TXFS_IOC_BEGIN _IOW(TXFS_IOC_MAGIC, 1, struct txfs_ioc_flags)
#define TXFS_IOC_COMMIT _IOW(TXFS_IOC_MAGIC, 2, struct txfs_ioc_flags)
#define TXFS_IOC_ABORT _IOW(TXFS_IOC_MAGIC, 3, struct txfs_ioc_flags)
#define TXFS_IOC_SYNC _IOW(TXFS_IOC_MAGIC, 4, struct txfs_ioc_flags)
#define TXFS_IOC_RUN _IOW(TXFS_IOC_MAGIC, 5, struct txfs_ioc_run)
#define TXFS_IOC_STATUS _IOR(TXFS_IOC_MAGIC, 6, struct txfs_ioc_status)
#define TXFS_IOC_STATE _IOR(TXFS_IOC_MAGIC, 7, struct txfs_ioc_state)
#define TXFS_IOC_BEGIN_STATE _IOWR(TXFS_IOC_MAGIC, 8, struct txfs_ioc_begin_state)
#define TXFS_IOC_BEGIN_FILE _IOWR(TXFS_IOC_MAGIC, 11, struct txfs_ioc_begin_file)
#define TXFS_IOC_COMMIT_IF _IOW(TXFS_IOC_MAGIC, 9, struct txfs_ioc_commit_if)
#define TXFS_IOC_BATCH _IOW(TXFS_IOC_MAGIC, 10, struct txfs_ioc_flags)
#define TXFS_IOC_CHANGES _IOWR(TXFS_IOC_MAGIC, 14, struct txfs_ioc_changes)

#ifdef __cplusplus
}
#endif
#endif /* TXFS_H */

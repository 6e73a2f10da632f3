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
#include <stdint.h>
#include <sys/ioctl.h>

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
    uint32_t reserved;
};

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

#ifdef __cplusplus
}
#endif
#endif /* TXFS_H */

/* The setuid-root helper of reliability/hostile.py, built at run time with
 * cc and installed 4755 root outside the mount (a setuid program on a txfs
 * mount would need the mount's suid option; the question is what happens
 * to the caller's transaction, not where the program lives).
 *
 *     hostile_helper suid-append MOUNT FILE TAG
 *
 * Run by an unprivileged user who is inside a transaction of that mount
 * (a thread transaction carried over execve, or a `txfs run`-style process
 * tree): reports its effective uid and the transaction the daemon says it
 * is in (TXFS_IOC_STATE on MOUNT), then appends TAG and a newline to FILE,
 * a root-owned file the caller cannot write. Prints one line:
 *
 *     euid=0 tx=<id> depth=<n> append=ok|<errno number>
 *
 * Exit 0 if it ran (whatever it found), 2 on bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

struct txfs_ioc_state {
    uint64_t tx;
    uint32_t depth;
    uint32_t reserved;
};
#define TXFS_IOC_STATE _IOR(0xE7, 7, struct txfs_ioc_state)

int main(int argc, char **argv) {
    if (argc != 5 || strcmp(argv[1], "suid-append") != 0) {
        fprintf(stderr, "usage: %s suid-append MOUNT FILE TAG\n", argv[0]);
        return 2;
    }
    struct txfs_ioc_state st = {0, 0, 0};
    char state[64] = "tx=? depth=?";
    int d = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (d >= 0 && ioctl(d, TXFS_IOC_STATE, &st) == 0)
        snprintf(state, sizeof state, "tx=%llu depth=%u", (unsigned long long)st.tx, st.depth);
    else
        snprintf(state, sizeof state, "tx=? depth=? state=%s", strerror(errno));
    if (d >= 0)
        close(d);
    int err = 0;
    int fd = open(argv[3], O_WRONLY | O_APPEND);
    if (fd < 0) {
        err = errno;
    } else {
        char line[512];
        int n = snprintf(line, sizeof line, "%s\n", argv[4]);
        if (write(fd, line, (size_t)n) != n)
            err = errno ? errno : EIO;
        if (close(fd) != 0 && !err)
            err = errno;
    }
    if (err)
        printf("euid=%d %s append=%d\n", (int)geteuid(), state, err);
    else
        printf("euid=%d %s append=ok\n", (int)geteuid(), state);
    fflush(stdout);
    return 0;
}

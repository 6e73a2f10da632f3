/* rread FILE N MIB SEED: N random 4 KiB preads of FILE (MIB MiB of the byte 's'), each checked. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int c, char **v) {
    int fd = open(v[1], O_RDONLY); long n = atol(v[2]); long blocks = atol(v[3]) * 256;
    unsigned long x = 88172645463325252UL ^ (atol(v[4]) * 0x9E3779B97F4A7C15UL);
    char buf[4096];
    if (fd < 0) { perror(v[1]); return 1; }
    for (long i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (pread(fd, buf, 4096, (long)(x % blocks) * 4096) != 4096 || buf[0] != 's') { fprintf(stderr, "bad read\n"); return 1; }
    }
    return 0;
}

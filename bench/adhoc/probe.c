/* probe FILE SECS: pread 4 KiB of FILE every 0.5 ms for SECS; prints the worst latency. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int c, char **v) {
    int fd = open(v[1], O_RDONLY); double secs = atof(v[2]); char buf[4096];
    if (fd < 0) { perror(v[1]); return 1; }
    double end = now() + secs, worst = 0; long n = 0, slow = 0;
    while (now() < end) {
        double t0 = now();
        if (pread(fd, buf, sizeof buf, 0) < 0) { perror("pread"); return 1; }
        double dt = now() - t0;
        if (dt > worst) worst = dt;
        if (dt > 0.01) slow++;
        n++;
        usleep(500);
    }
    printf("reads %ld, over 10 ms %ld, worst %.1f ms\n", n, slow, worst * 1e3);
    return 0;
}

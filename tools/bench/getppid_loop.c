#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
/* The target of tools/bench/syscall_ab.py: prints "ready PID", then for each line read on stdin makes N raw
 * getppid calls and prints the thread CPU time per call in ns. */
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    char buf[64];
    printf("ready %d\n", getpid()); fflush(stdout);
    while (fgets(buf, sizeof buf, stdin)) {
        struct timespec a, b;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        for (long i = 0; i < n; i++) syscall(SYS_getppid);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n); fflush(stdout);
    }
    return 0;
}

/* Process-start cost with llmprof attached (docs/lab/stacks-threads-wire.md, "Process trees"): N x fork+_exit (or vfork+execve
 * /bin/true) + waitpid, timed after DELAY seconds. Usage: forkbench N EXEC(0|1) DELAY */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
static long long now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000LL+t.tv_nsec;}
int main(int c,char**v){int n=atoi(v[1]);int ex=atoi(v[2]);int delay=atoi(v[3]);sleep(delay);
 long long t0=now();
 for(int i=0;i<n;i++){pid_t p=ex?vfork():fork(); if(p==0){ if(ex){execl("/bin/true","true",(char*)0);} _exit(0);} int s;waitpid(p,&s,0);}
 long long t1=now(); printf("%s %.1f us/iter\n", ex?"vfork+exec":"fork+exit", (t1-t0)/1000.0/n); return 0;}

#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){ long N=1000000000; long x=0; double t=now();
 for(long i=0;i<N;i++){ __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
 double dt=now()-t; printf("%.3f ns per dependent add -> %.2f GHz\n", dt/(4.0*N)*1e9, 4.0*N/dt/1e9); return 0;}

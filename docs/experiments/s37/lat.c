#include <immintrin.h>
#include <x86intrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#define N (512ul<<20)
#define BLK 4096
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int hint = argc>1?atoi(argv[1]):1; int lines = argc>2?atoi(argv[2]):64; double wait_ns = argc>3?atof(argv[3]):2000;
  char* M=aligned_alloc(2<<20,N); madvise(M,N,MADV_HUGEPAGE); memset(M,1,N);
  size_t nblk=N/BLK; int trials=2000; double tot=0; srand(7);
  int order[64]; for(int i=0;i<64;i++) order[i]=i;
  for(int t=0;t<trials;t++){
    char* b = M + (size_t)(rand()%nblk)*BLK;
    // random cyclic chain over the first `lines` lines
    for(int i=lines-1;i>0;i--){int j=rand()%(i+1); int x=order[i]; order[i]=order[j]; order[j]=x;}
    for(int i=0;i<lines;i++) *(char**)(b+64*order[i]) = b+64*order[(i+1)%lines];
    for(int i=0;i<64;i++) _mm_clflush(b+64*i);
    _mm_mfence();
    // evict from everything: clflush does that. Now prefetch.
    if(hint>=0) for(int i=0;i<lines;i++){ if(hint==1) _mm_prefetch(b+64*i,_MM_HINT_T1); else if(hint==0) _mm_prefetch(b+64*i,_MM_HINT_T0); else if(hint==2) _mm_prefetch(b+64*i,_MM_HINT_T2); else _mm_prefetch(b+64*i,_MM_HINT_NTA);}
    double t0=now(); while((now()-t0)*1e9 < wait_ns);
    _mm_lfence(); unsigned long long c0=__rdtsc(); _mm_lfence(); char* p=b+64*order[0]; for(int i=0;i<lines;i++) p=*(char**)p; if(((long)p&1)==1) printf("y"); _mm_lfence(); unsigned int aux; unsigned long long c1=__rdtscp(&aux); _mm_lfence();
    if(p==0) printf("x");
    tot += (double)(c1-c0)/lines;
  }
  printf("hint %d lines %d wait %.0f ns: %.1f TSC ticks per dependent load\n", hint, lines, wait_ns, tot/trials);
}

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
  int hint = argc>1?atoi(argv[1]):1; int lines = argc>2?atoi(argv[2]):64; int stride=argc>3?atoi(argv[3]):1;
  char* M=aligned_alloc(2<<20,N); madvise(M,N,MADV_HUGEPAGE); memset(M,1,N);
  size_t nblk=N/BLK; int trials=3000; double lat[64]={0}; srand(7);
  for(int t=0;t<trials;t++){
    char* b = M + (size_t)(rand()%nblk)*BLK;
    for(int i=0;i<64;i++) _mm_clflush(b+64*i);
    _mm_mfence();
    for(int i=0;i<lines;i+=stride){ char* a=b+64*i; if(hint==1) _mm_prefetch(a,_MM_HINT_T1); else if(hint==0) _mm_prefetch(a,_MM_HINT_T0); else if(hint==2) _mm_prefetch(a,_MM_HINT_T2);}
    double t0=now(); while((now()-t0)*1e9 < 3000);
    // probe lines in a scrambled order so the probing itself trains nothing: step 37 mod 64
    for(int k=0;k<64;k++){ int i=(k*37)%64; volatile char* a=b+64*i;
      _mm_lfence(); unsigned aux; unsigned long long c0=__rdtscp(&aux); _mm_lfence(); char x=*a; (void)x; _mm_lfence(); unsigned long long c1=__rdtscp(&aux); lat[i]+=c1-c0; }
  }
  printf("hint %d lines %d stride %d:", hint, lines, stride);
  for(int i=0;i<64;i++){ if(i%16==0) printf("\n  "); printf("%4.0f", lat[i]/trials);} printf("\n");
}

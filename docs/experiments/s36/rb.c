#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#define N (512ul<<20)
static char *buf; static int nth=2; static int pf=0;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* rd(void*a){long id=(long)a; size_t per=N/nth; char*p=buf+id*per; __m512 s=_mm512_setzero_ps();
 for(size_t i=0;i<per;i+=256){ if(pf) _mm_prefetch(p+i+pf,_MM_HINT_T0);
  s=_mm512_add_ps(s,_mm512_load_ps((float*)(p+i)));s=_mm512_add_ps(s,_mm512_load_ps((float*)(p+i+64)));
  s=_mm512_add_ps(s,_mm512_load_ps((float*)(p+i+128)));s=_mm512_add_ps(s,_mm512_load_ps((float*)(p+i+192)));}
 static volatile float sink; sink=_mm512_reduce_add_ps(s); return 0;}
int main(int c,char**v){ if(c>1)nth=atoi(v[1]); if(c>2)pf=atoi(v[2]);
 buf=aligned_alloc(2<<20,N); madvise(buf,N,MADV_HUGEPAGE); memset(buf,1,N);
 char*dst=aligned_alloc(2<<20,N/2); madvise(dst,N/2,MADV_HUGEPAGE); memset(dst,0,N/2);
 for(int r=0;r<3;r++){ double t=now(); memcpy(dst,buf,N/2); t=now()-t; printf("memcpy 256MiB: %.1f GB/s (r+w)\n", 2.0*(N/2)/t/1e9);}
 for(int r=0;r<4;r++){ pthread_t th[8]; double t=now(); for(long i=0;i<nth;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(th[i],0); t=now()-t; printf("read %d thr pf=%d: %.1f GB/s\n",nth,pf,N/t/1e9);}
}

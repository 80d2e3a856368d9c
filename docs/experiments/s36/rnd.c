#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#define N (1024ul<<20)
#define BLK 4096
static char *K,*V; static int nth=2, pfd=0; static unsigned *perm; static size_t nb;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* rd(void*a){long id=(long)a; size_t per=nb/nth; unsigned*p=perm+id*per; __m512 s=_mm512_setzero_ps();
 for(size_t b=0;b<per;b++){ char*k=K+(size_t)p[b]*BLK,*v=V+(size_t)p[b]*BLK;
  if(pfd&&b+pfd<per){char*kk=K+(size_t)p[b+pfd]*BLK,*vv=V+(size_t)p[b+pfd]*BLK; for(int i=0;i<BLK;i+=64){_mm_prefetch(kk+i,_MM_HINT_T0);_mm_prefetch(vv+i,_MM_HINT_T0);}}
  for(int i=0;i<BLK;i+=64){s=_mm512_add_ps(s,_mm512_load_ps((float*)(k+i)));s=_mm512_add_ps(s,_mm512_load_ps((float*)(v+i)));}}
 static volatile float sink; sink=_mm512_reduce_add_ps(s); return 0;}
int main(int c,char**v){ if(c>1)nth=atoi(v[1]); if(c>2)pfd=atoi(v[2]);
 K=aligned_alloc(2<<20,N); V=aligned_alloc(2<<20,N); madvise(K,N,MADV_HUGEPAGE); madvise(V,N,MADV_HUGEPAGE); memset(K,1,N); memset(V,1,N);
 nb=N/BLK/8; perm=malloc(nb*4); /* use 1/8 of pool: 128 MiB each of K and V */
 unsigned *all=malloc(N/BLK*4); for(size_t i=0;i<N/BLK;i++)all[i]=i; srand(1); for(size_t i=N/BLK-1;i>0;i--){size_t j=rand()%(i+1);unsigned t=all[i];all[i]=all[j];all[j]=t;} memcpy(perm,all,nb*4);
 for(int r=0;r<4;r++){ pthread_t th[8]; double t=now(); for(long i=0;i<nth;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(th[i],0); t=now()-t; printf("rand4k K+V %d thr pfd=%d: %.1f GB/s\n",nth,pfd,2.0*nb*BLK/t/1e9);}
}

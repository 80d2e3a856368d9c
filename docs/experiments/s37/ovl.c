#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#define N (512ul<<20)
#define BLK 4096
static char *K,*V; static int nth=2, pfd=2, mode=0, reps=8; static unsigned *perm; static size_t nb;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void* rd(void*a){long id=(long)a; size_t per=nb/nth; unsigned*p=perm+id*per;
 __m512 acc[16]; for(int i=0;i<16;i++) acc[i]=_mm512_setzero_ps();
 __m512bh q=(__m512bh)_mm512_set1_epi32(0x3c003c00);
 for(size_t b=0;b<per;b++){ size_t blk = mode==2 ? p[b%16] : p[b];
  char*k=K+(size_t)blk*BLK,*v=V+(size_t)blk*BLK;
  char*kk=0,*vv=0; if(pfd && b+pfd<per && mode!=2){kk=K+(size_t)p[b+pfd]*BLK; vv=V+(size_t)p[b+pfd]*BLK;}
  __m512 a0=acc[0],a1=acc[1],a2=acc[2],a3=acc[3],a4=acc[4],a5=acc[5],a6=acc[6],a7=acc[7],a8=acc[8],a9=acc[9],a10=acc[10],a11=acc[11],a12=acc[12],a13=acc[13],a14=acc[14],a15=acc[15];
  for(int i=0;i<2*BLK;i+=128){ char* src = i<BLK ? k+i : v+i-BLK;
    if(kk){ char* pf = i<BLK ? kk+i : vv+i-BLK; _mm_prefetch(pf,_MM_HINT_T1); _mm_prefetch(pf+64,_MM_HINT_T1);}
    __m512bh x=(__m512bh)_mm512_load_si512((void*)src), y=(__m512bh)_mm512_load_si512((void*)(src+64));
    if(reps){
    a0=_mm512_dpbf16_ps(a0,x,q); a1=_mm512_dpbf16_ps(a1,x,q); a2=_mm512_dpbf16_ps(a2,x,q); a3=_mm512_dpbf16_ps(a3,x,q);
    a4=_mm512_dpbf16_ps(a4,x,q); a5=_mm512_dpbf16_ps(a5,x,q); a6=_mm512_dpbf16_ps(a6,x,q); a7=_mm512_dpbf16_ps(a7,x,q);
    a8=_mm512_dpbf16_ps(a8,y,q); a9=_mm512_dpbf16_ps(a9,y,q); a10=_mm512_dpbf16_ps(a10,y,q); a11=_mm512_dpbf16_ps(a11,y,q);
    a12=_mm512_dpbf16_ps(a12,y,q); a13=_mm512_dpbf16_ps(a13,y,q); a14=_mm512_dpbf16_ps(a14,y,q); a15=_mm512_dpbf16_ps(a15,y,q);
    for(int r=1;r<reps;r++){ __asm__ volatile("" ::: "memory");
    a0=_mm512_dpbf16_ps(a0,x,q); a1=_mm512_dpbf16_ps(a1,x,q); a2=_mm512_dpbf16_ps(a2,x,q); a3=_mm512_dpbf16_ps(a3,x,q);
    a4=_mm512_dpbf16_ps(a4,x,q); a5=_mm512_dpbf16_ps(a5,x,q); a6=_mm512_dpbf16_ps(a6,x,q); a7=_mm512_dpbf16_ps(a7,x,q);
    a8=_mm512_dpbf16_ps(a8,y,q); a9=_mm512_dpbf16_ps(a9,y,q); a10=_mm512_dpbf16_ps(a10,y,q); a11=_mm512_dpbf16_ps(a11,y,q);
    a12=_mm512_dpbf16_ps(a12,y,q); a13=_mm512_dpbf16_ps(a13,y,q); a14=_mm512_dpbf16_ps(a14,y,q); a15=_mm512_dpbf16_ps(a15,y,q); }
    } else { a0=_mm512_add_ps(a0,(__m512)x); a1=_mm512_add_ps(a1,(__m512)y); }
  }
  acc[0]=a0;acc[1]=a1;acc[2]=a2;acc[3]=a3;acc[4]=a4;acc[5]=a5;acc[6]=a6;acc[7]=a7;acc[8]=a8;acc[9]=a9;acc[10]=a10;acc[11]=a11;acc[12]=a12;acc[13]=a13;acc[14]=a14;acc[15]=a15;
  }
 float s=0; for(int i=0;i<16;i++) s+=_mm512_reduce_add_ps(acc[i]); static volatile float sink; sink=s; return 0;}
int main(int c,char**v){ if(c>1)nth=atoi(v[1]); if(c>2)pfd=atoi(v[2]); if(c>3)mode=atoi(v[3]); if(c>4)reps=atoi(v[4]);
 K=aligned_alloc(2<<20,N); V=aligned_alloc(2<<20,N); madvise(K,N,MADV_HUGEPAGE); madvise(V,N,MADV_HUGEPAGE); memset(K,1,N); memset(V,1,N);
 nb=N/BLK/4; perm=malloc(nb*4);
 unsigned *all=malloc(N/BLK*4); for(size_t i=0;i<N/BLK;i++)all[i]=i; srand(1); for(size_t i=N/BLK-1;i>0;i--){size_t j=rand()%(i+1);unsigned t=all[i];all[i]=all[j];all[j]=t;} memcpy(perm,all,nb*4);
 for(int r=0;r<3;r++){ pthread_t th[8]; double t=now(); for(long i=0;i<nth;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(th[i],0); t=now()-t;
  printf("thr %d pfd %d mode %d reps %d: %.1f GB/s, %.0f ns per 8 KiB block per thread\n",nth,pfd,mode,reps,2.0*nb*BLK/t/1e9, t/(nb/nth)*1e9);}
}

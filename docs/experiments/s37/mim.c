#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <sys/mman.h>
#define N (512ul<<20)
#define BLK 4096
static char *K,*V; static int nth=1, pfd=2, mode=0, hint=1, sp=0; static unsigned *perm; static size_t nb;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define PF(p) do{ if(hint==1)_mm_prefetch((p),_MM_HINT_T1); else if(hint==0)_mm_prefetch((p),_MM_HINT_T0); }while(0)
typedef struct { char* lines[128]; int next; } Pf;
static inline void pfstep(Pf* pf, int n){ for(int i=0;i<n && pf->next<128;i++) PF(pf->lines[pf->next++]); }
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void* rd(void*a){long id=(long)a; size_t per=nb/nth; unsigned*p=perm+id*per;
 __m512bh q0=(__m512bh)_mm512_set1_epi32(0x3c003c00),q1=q0,q2=q0,q3=q0;
 __m512 tot=_mm512_setzero_ps();
 for(size_t b=0;b<per;b++){ size_t blk = mode==2 ? p[b%8] : p[b];
  char*k=K+(size_t)blk*BLK,*v=V+(size_t)blk*BLK;
  Pf pf; pf.next=0; if(pfd && b+pfd<per && mode!=2){char*kk=K+(size_t)p[b+pfd]*BLK,*vv=V+(size_t)p[b+pfd]*BLK; for(int i=0;i<64;i++){pf.lines[i]=kk+64*i; pf.lines[64+i]=vv+64*i;}} else pf.next=128;
  if(sp==2) pfstep(&pf,128);
  for(int hg=0;hg<2;hg++) for(int rg=0;rg<4;rg++){
    __m512 a[16]; for(int i=0;i<16;i++) a[i]=_mm512_setzero_ps();
    for(int c=0;c<4;c++){
      for(int r=0;r<4;r++){ __m512bh x=(__m512bh)_mm512_load_si512((void*)(k+(sp==3 ? (rg*16+c*4+r)*64 : (rg*4+r)*256+c*64)));
        if(mode==3){ a[r]=_mm512_add_ps(a[r],(__m512)x); continue; }
        a[r*4+0]=_mm512_dpbf16_ps(a[r*4+0],x,q0); a[r*4+1]=_mm512_dpbf16_ps(a[r*4+1],x,q1); a[r*4+2]=_mm512_dpbf16_ps(a[r*4+2],x,q2); a[r*4+3]=_mm512_dpbf16_ps(a[r*4+3],x,q3);}
      pfstep(&pf, sp==1 ? 4 : 2);
    }
    __m512 s=a[0]; for(int i=1;i<16;i++) s=_mm512_add_ps(s,a[i]); tot=_mm512_add_ps(tot,s);
  }
  for(int hg=0;hg<2;hg++) for(int cb=0;cb<2;cb++){
    __m512 a[16]; for(int i=0;i<16;i++) a[i]=_mm512_setzero_ps();
    for(int pr=0;pr<8;pr++){
      for(int j=0;j<2;j++){ __m512i x=_mm512_load_si512((void*)(v+(sp==3 ? (cb*32+pr*4+j*2)*64 : (2*pr)*256+cb*128+j*64))), y=_mm512_load_si512((void*)(v+(sp==3 ? (cb*32+pr*4+j*2+1)*64 : (2*pr+1)*256+cb*128+j*64)));
        __m512bh lo=(__m512bh)_mm512_unpacklo_epi16(x,y), hi=(__m512bh)_mm512_unpackhi_epi16(x,y);
        if(mode==3){ a[j]=_mm512_add_ps(a[j],(__m512)lo); a[j+2]=_mm512_add_ps(a[j+2],(__m512)hi); continue; }
        for(int h=0;h<4;h++){ a[j*8+h*2]=_mm512_dpbf16_ps(a[j*8+h*2],lo,q0); a[j*8+h*2+1]=_mm512_dpbf16_ps(a[j*8+h*2+1],hi,q1);} }
      pfstep(&pf,2);
    }
    __m512 s=a[0]; for(int i=1;i<16;i++) s=_mm512_add_ps(s,a[i]); tot=_mm512_add_ps(tot,s);
  }
  pfstep(&pf,128);
 }
 static volatile float sink; sink=_mm512_reduce_add_ps(tot); return 0;}
int main(int c,char**v){ if(c>1)nth=atoi(v[1]); if(c>2)pfd=atoi(v[2]); if(c>3)mode=atoi(v[3]); if(c>4)hint=atoi(v[4]); if(c>5)sp=atoi(v[5]);
 K=aligned_alloc(2<<20,N); V=aligned_alloc(2<<20,N); madvise(K,N,MADV_HUGEPAGE); madvise(V,N,MADV_HUGEPAGE); memset(K,1,N); memset(V,1,N);
 nb=N/BLK/4; perm=malloc(nb*4);
 unsigned *all=malloc(N/BLK*4); for(size_t i=0;i<N/BLK;i++)all[i]=i; srand(1); for(size_t i=N/BLK-1;i>0;i--){size_t j=rand()%(i+1);unsigned t=all[i];all[i]=all[j];all[j]=t;} memcpy(perm,all,nb*4);
 for(int r=0;r<3;r++){ pthread_t th[8]; double t=now(); for(long i=0;i<nth;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(th[i],0); t=now()-t;
  if(r==2) printf("thr %d pfd %d mode %d hint %d sp %d: %.1f GB/s, %.0f ns per 8 KiB tile per thread\n",nth,pfd,mode,hint,sp,2.0*nb*BLK/t/1e9, t/(nb/nth)*1e9);}
}

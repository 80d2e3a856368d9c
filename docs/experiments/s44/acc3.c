// s44: as acc.c, the AMX order (per head and chunk, 16 rows at a 2 KiB stride),
// and ways of getting the tile DIST ahead into L2. Usage: acc3 THREADS MODE DIST [HEADLINES]
// MODE 0 none; 1 T1 every line, K then V; 2 T1 the first HEADLINES lines of each 4 KiB page;
// 3 T1 every line, K and V interleaved; 4 demand loads of every 2nd line, K and V interleaved.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#define N (1024ul<<20)
#define BLK 32768
static char *K,*V; static int nth=2, mode=1, dist=2, headlines=2; static unsigned *perm; static size_t nb;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* rd(void*a){long id=(long)a; size_t per=nb/nth; unsigned*p=perm+id*per; __m512 s=_mm512_setzero_ps(), s2=_mm512_setzero_ps();
 for(size_t b=0;b<per;b++){ char*k=K+(size_t)p[b]*BLK,*v=V+(size_t)p[b]*BLK; char*kk=0,*vv=0; int li=0;
  if(mode&&b+dist<per){kk=K+(size_t)p[b+dist]*BLK; vv=V+(size_t)p[b+dist]*BLK;}
  for(int x=0;x<2;x++){ char*base=x?v:k;
   for(int h=0;h<8;h++) for(int c=0;c<4;c++){
    if(kk) for(int j=0;j<16;j++,li++){
      switch(mode){
       case 1: _mm_prefetch((li<512?kk:vv)+(li%512)*64,_MM_HINT_T1); break;
       case 2: { int pg=li/ (64/1); /* unused */ (void)pg; int line=li%512; if((line%64)<headlines) _mm_prefetch((li<512?kk:vv)+line*64,_MM_HINT_T1); break; }
       case 3: _mm_prefetch(((li&1)?vv:kk)+(li/2)*64,_MM_HINT_T1); break;
       case 4: if(!(li&1)) { int l=li/2; s2=_mm512_add_ps(s2,_mm512_load_ps((float*)(((l&1)?vv:kk)+(l/2)*128))); } break;
      }}
    for(int t=0;t<16;t++){ size_t off = (size_t)t*2048+h*256+c*64; s=_mm512_add_ps(s,_mm512_load_ps((float*)(base+off))); }
   }}
 }
 static volatile float sink; sink=_mm512_reduce_add_ps(_mm512_add_ps(s,s2)); return 0;}
int main(int c,char**v){ if(c>1)nth=atoi(v[1]); if(c>2)mode=atoi(v[2]); if(c>3)dist=atoi(v[3]); if(c>4)headlines=atoi(v[4]);
 K=aligned_alloc(2<<20,N); V=aligned_alloc(2<<20,N); memset(K,1,N); memset(V,1,N);
 nb=N/BLK/4; perm=malloc(nb*4);
 unsigned *all=malloc(N/BLK*4); for(size_t i=0;i<N/BLK;i++)all[i]=i; srand(1); for(size_t i=N/BLK-1;i>0;i--){size_t j=rand()%(i+1);unsigned t=all[i];all[i]=all[j];all[j]=t;} memcpy(perm,all,nb*4);
 for(int r=0;r<4;r++){ pthread_t th[8]; double t=now(); for(long i=0;i<nth;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(th[i],0); t=now()-t; if(r) printf("thr %d mode %d dist %d head %d: %.1f GB/s\n",nth,mode,dist,headlines,2.0*nb*BLK/t/1e9);}
}

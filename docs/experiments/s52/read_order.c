// s52: two threads (or one) read K and V of Llama-3-8B (8 KV heads, d = 128, bf16, 16-token
// blocks at shuffled places) in the AVX2 kernel's order with no arithmetic; also a sequential
// read of the same bytes. Prints GB/s read against one thread's memcpy (read + write).
// Usage: rd THREADS MODE   MODE 0: no prefetch, 1: T1 two tiles ahead (K,V interleaved), 2: sequential read of the same bytes
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#define NBLK 4096            /* blocks of 16 tokens: 4096*32 KiB = 128 MiB of K, 128 of V */
#define BLK 32768
static char *K,*V; static int nth=2, mode=1; static unsigned perm[NBLK];
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* rd(void*a){ long id=(long)a; __m256 s=_mm256_setzero_ps();
  int h0 = (nth==2)? id*4 : 0, nh = (nth==2)? 4 : 8;   // each thread half the KV heads, all tokens (B=1)
  if(mode==2){ size_t per=(size_t)NBLK*BLK/nth; for(int x=0;x<2;x++){ char*b=(x?V:K)+id*per; for(size_t o=0;o<per;o+=32) s=_mm256_add_ps(s,_mm256_load_ps((float*)(b+o))); } }
  else for(int b=0;b<NBLK;b++){ char*k=K+(size_t)perm[b]*BLK,*v=V+(size_t)perm[b]*BLK;
    if(mode==1 && b+2<NBLK){ char*kk=K+(size_t)perm[b+2]*BLK+h0*256,*vv=V+(size_t)perm[b+2]*BLK+h0*256;
      for(int t=0;t<16;t++) for(int l=0;l<nh*4;l++){ _mm_prefetch(kk+t*2048+l*64,_MM_HINT_T1); _mm_prefetch(vv+t*2048+l*64,_MM_HINT_T1);} }
    for(int h=h0;h<h0+nh;h++){ for(int x=0;x<2;x++){ char*base=x?v:k;
      for(int t=0;t<16;t++) for(int c=0;c<256;c+=32) s=_mm256_add_ps(s,_mm256_load_ps((float*)(base+t*2048+h*256+c))); } } }
  static volatile float sink; float o[8]; _mm256_storeu_ps(o,s); sink=o[0]; return 0; }
int main(int argc,char**argv){ nth=atoi(argv[1]); mode=atoi(argv[2]);
  K=aligned_alloc(4096,(size_t)NBLK*BLK); V=aligned_alloc(4096,(size_t)NBLK*BLK); memset(K,1,(size_t)NBLK*BLK); memset(V,1,(size_t)NBLK*BLK);
  for(int i=0;i<NBLK;i++)perm[i]=i; srand(1); for(int i=NBLK-1;i>0;i--){int j=rand()%(i+1);unsigned t=perm[i];perm[i]=perm[j];perm[j]=t;}
  char*dst=aligned_alloc(4096,256<<20); double best=1e9;
  for(int r=0;r<5;r++){double t0=now(); memcpy(dst,K,128<<20); double t=now()-t0; if(t<best)best=t;}
  double copy=2.0*(128<<20)/best/1e9;
  for(int r=0;r<5;r++){ pthread_t th[8]; double t0=now(); for(long i=0;i<nth;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(th[i],0); double t=now()-t0;
    printf("threads %d mode %d: read %.2f GB/s = %.1f%% of copy %.2f GB/s (read+write)\n",nth,mode,2.0*NBLK*BLK/t/1e9,2.0*NBLK*BLK/t/1e9/copy*100,copy); }
}

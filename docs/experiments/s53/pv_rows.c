// s53: a C model of avx2.rs's P.V loop (4 heads, d = 128, bf16 rows at a 2 KiB stride, in L1)
// over 16, 32 or 64 rows per column block, one row or two an iteration, against an FMA-peak loop
// timed in the same run. The model ran 6-15% faster over 32-64 rows than over 16; the same change
// in the kernel (P.V once per pair of tiles) did not carry over (docs/PERFORMANCE.md, s53).
// Build: gcc -O3 -mavx2 -mfma -o pv_rows pv_rows.c; run: ./pv_rows.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define D 128
#define TMAX 64
static float acc[4*D] __attribute__((aligned(64)));
static float p[4*TMAX] __attribute__((aligned(64)));
const uint16_t* rows[TMAX];
volatile int maskbits = 0xffff0000;
static inline __attribute__((always_inline)) void pv_block(int c, int T){
  __m256 a00=_mm256_loadu_ps(acc+c),a01=_mm256_loadu_ps(acc+c+8),a10=_mm256_loadu_ps(acc+D+c),a11=_mm256_loadu_ps(acc+D+c+8),a20=_mm256_loadu_ps(acc+2*D+c),a21=_mm256_loadu_ps(acc+2*D+c+8),a30=_mm256_loadu_ps(acc+3*D+c),a31=_mm256_loadu_ps(acc+3*D+c+8);
  __m256i mask=_mm256_set1_epi32(maskbits);
  for(int i=0;i<T;i++){
    __m256 pb[4]; for(int h=0;h<4;h++)pb[h]=_mm256_broadcast_ss(p+h*TMAX+i);
    __m256i pr=_mm256_loadu_si256((const __m256i*)(rows[i]+c));
    __m256 v0=_mm256_castsi256_ps(_mm256_slli_epi32(pr,16));
    __m256 v1=_mm256_castsi256_ps(_mm256_and_si256(pr,mask));
    a00=_mm256_fmadd_ps(pb[0],v0,a00);a01=_mm256_fmadd_ps(pb[0],v1,a01);a10=_mm256_fmadd_ps(pb[1],v0,a10);a11=_mm256_fmadd_ps(pb[1],v1,a11);a20=_mm256_fmadd_ps(pb[2],v0,a20);a21=_mm256_fmadd_ps(pb[2],v1,a21);a30=_mm256_fmadd_ps(pb[3],v0,a30);a31=_mm256_fmadd_ps(pb[3],v1,a31);
  }
  _mm256_storeu_ps(acc+c,a00);_mm256_storeu_ps(acc+c+8,a01);_mm256_storeu_ps(acc+D+c,a10);_mm256_storeu_ps(acc+D+c+8,a11);_mm256_storeu_ps(acc+2*D+c,a20);_mm256_storeu_ps(acc+2*D+c+8,a21);_mm256_storeu_ps(acc+3*D+c,a30);_mm256_storeu_ps(acc+3*D+c+8,a31);
}
// two column blocks interleaved per row: 16 accumulators would spill; so H2 x C4 over 2 passes is pv2 in s52. Here: rows unrolled by 2.
static inline __attribute__((always_inline)) void pv_block_u2(int c, int T){
  __m256 a00=_mm256_loadu_ps(acc+c),a01=_mm256_loadu_ps(acc+c+8),a10=_mm256_loadu_ps(acc+D+c),a11=_mm256_loadu_ps(acc+D+c+8),a20=_mm256_loadu_ps(acc+2*D+c),a21=_mm256_loadu_ps(acc+2*D+c+8),a30=_mm256_loadu_ps(acc+3*D+c),a31=_mm256_loadu_ps(acc+3*D+c+8);
  __m256i mask=_mm256_set1_epi32(maskbits);
  for(int i=0;i<T;i+=2){
    for(int u=0;u<2;u++){
    __m256 pb[4]; for(int h=0;h<4;h++)pb[h]=_mm256_broadcast_ss(p+h*TMAX+i+u);
    __m256i pr=_mm256_loadu_si256((const __m256i*)(rows[i+u]+c));
    __m256 v0=_mm256_castsi256_ps(_mm256_slli_epi32(pr,16));
    __m256 v1=_mm256_castsi256_ps(_mm256_and_si256(pr,mask));
    a00=_mm256_fmadd_ps(pb[0],v0,a00);a01=_mm256_fmadd_ps(pb[0],v1,a01);a10=_mm256_fmadd_ps(pb[1],v0,a10);a11=_mm256_fmadd_ps(pb[1],v1,a11);a20=_mm256_fmadd_ps(pb[2],v0,a20);a21=_mm256_fmadd_ps(pb[2],v1,a21);a30=_mm256_fmadd_ps(pb[3],v0,a30);a31=_mm256_fmadd_ps(pb[3],v1,a31);
    }
  }
  _mm256_storeu_ps(acc+c,a00);_mm256_storeu_ps(acc+c+8,a01);_mm256_storeu_ps(acc+D+c,a10);_mm256_storeu_ps(acc+D+c+8,a11);_mm256_storeu_ps(acc+2*D+c,a20);_mm256_storeu_ps(acc+2*D+c+8,a21);_mm256_storeu_ps(acc+3*D+c,a30);_mm256_storeu_ps(acc+3*D+c+8,a31);
}
__attribute__((noinline)) void pv_all(int T){ for(int c=0;c<D;c+=16) pv_block(c,T); }
__attribute__((noinline)) void pv_all_u2(int T){ for(int c=0;c<D;c+=16) pv_block_u2(c,T); }
int main(){
  uint8_t* vb=aligned_alloc(4096,1<<20);
  for(size_t i=0;i<(1<<20);i++){vb[i]=rand()&0x3f;}
  for(int i=0;i<TMAX;i++){rows[i]=(const uint16_t*)(vb+i*2048);}
  for(int i=0;i<4*D;i++){acc[i]=0;} for(int i=0;i<4*TMAX;i++)p[i]=1e-6f;
  __m256 a[10]; for(int i=0;i<10;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-3f);
  __m256 b=_mm256_set1_ps(0.999999f), cc=_mm256_set1_ps(1e-7f);
  long n=50000000; double t0=now();
  for(long i=0;i<n;i++){ for(int j=0;j<10;j++) a[j]=_mm256_fmadd_ps(a[j],b,cc);}
  double pk=(now()-t0)/(n*10.0); float sink=0; for(int j=0;j<10;j++){float x[8];_mm256_storeu_ps(x,a[j]);sink+=x[0];}
  for(int round=0;round<2;round++) for(int u=0;u<2;u++) for(int T=16;T<=64;T*=2){
    double best=1e9; int reps=100000*16/T;
    for(int k=0;k<5;k++){ t0=now(); for(int r=0;r<reps;r++){ if(u) pv_all_u2(T); else pv_all(T); __asm__ volatile(""::"r"(acc):"memory");} double t=(now()-t0)/reps; if(t<best)best=t;}
    printf("r%d %s T=%d: %.1f ns per 16 rows, %.0f%% of FMA peak\n",round,u?"unroll2":"plain  ",T,best*1e9*16/T,1024*pk/(best*16/T)*100);
  }
  return sink==12345;
}

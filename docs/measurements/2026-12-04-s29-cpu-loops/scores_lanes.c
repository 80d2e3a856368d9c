// s29: a tile's scores at 8 query heads, d = 128, bf16 K (16 rows), in L1.
// A: one head per lane, 8 rows a pass, a pair broadcast then a shift and a mask.
// B: A's shape without the decode (the pair broadcast as a float: wrong values).
// C: even and odd elements in separate sums, 4 rows a pass.
// E: two broadcasts and two masks a pair.
// D: independent FMAs in 10 chains (the peak), 1280 of them, printed per 2048.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
#include <string.h>
static uint16_t krow[16][128] __attribute__((aligned(64)));
static float qt[128*8] __attribute__((aligned(64)));
float out[16*8];
#define ITERS 200000
typedef void (*fn)(void);
// variant A: current score loop: 8 rows, pair per iter, 8 acc
__attribute__((noinline)) void score_A(void){
  for (int r0=0;r0<16;r0+=8){
    __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
    const __m256i mask=_mm256_set1_epi32(0xffff0000);
    for(int j=0;j<128;j+=2){
      __m256 qe=_mm256_load_ps(qt+j*8), qo=_mm256_load_ps(qt+j*8+8);
#define ROW(r,a) { __m256i w=_mm256_set1_epi32(*(int*)&krow[r0+r][j]); __m256 e=_mm256_castsi256_ps(_mm256_slli_epi32(w,16)); __m256 o=_mm256_castsi256_ps(_mm256_and_si256(w,mask)); a=_mm256_fmadd_ps(qe,e,a); a=_mm256_fmadd_ps(qo,o,a);}
      ROW(0,a0)ROW(1,a1)ROW(2,a2)ROW(3,a3)ROW(4,a4)ROW(5,a5)ROW(6,a6)ROW(7,a7)
    }
    _mm256_storeu_ps(out+0,a0);_mm256_storeu_ps(out+8,a1);_mm256_storeu_ps(out+16,a2);_mm256_storeu_ps(out+24,a3);
    _mm256_storeu_ps(out+32,a4);_mm256_storeu_ps(out+40,a5);_mm256_storeu_ps(out+48,a6);_mm256_storeu_ps(out+56,a7);
  }
}
// variant B: no decode (bcast as float directly: wrong values but same FMA structure)
__attribute__((noinline)) void score_B(void){
  for (int r0=0;r0<16;r0+=8){
    __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
    for(int j=0;j<128;j+=2){
      __m256 qe=_mm256_load_ps(qt+j*8), qo=_mm256_load_ps(qt+j*8+8);
#define ROWB(r,a) { __m256 w=_mm256_broadcast_ss((float*)&krow[r0+r][j]); a=_mm256_fmadd_ps(qe,w,a); a=_mm256_fmadd_ps(qo,w,a);}
      ROWB(0,a0)ROWB(1,a1)ROWB(2,a2)ROWB(3,a3)ROWB(4,a4)ROWB(5,a5)ROWB(6,a6)ROWB(7,a7)
    }
    _mm256_storeu_ps(out+0,a0);_mm256_storeu_ps(out+8,a1);_mm256_storeu_ps(out+16,a2);_mm256_storeu_ps(out+24,a3);
    _mm256_storeu_ps(out+32,a4);_mm256_storeu_ps(out+40,a5);_mm256_storeu_ps(out+48,a6);_mm256_storeu_ps(out+56,a7);
  }
}
// variant C: separate even/odd accumulators, 6 rows? use 5 rows x 2 = 10 acc; 16 rows = 5+5+6? do 4 rows x2 = 8 acc (same chains count) 
__attribute__((noinline)) void score_C(void){
  for (int r0=0;r0<16;r0+=4){
    __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,b0=a0,b1=a0,b2=a0,b3=a0;
    const __m256i mask=_mm256_set1_epi32(0xffff0000);
    for(int j=0;j<128;j+=2){
      __m256 qe=_mm256_load_ps(qt+j*8), qo=_mm256_load_ps(qt+j*8+8);
#define ROWC(r,a,b) { __m256i w=_mm256_set1_epi32(*(int*)&krow[r0+r][j]); __m256 e=_mm256_castsi256_ps(_mm256_slli_epi32(w,16)); __m256 o=_mm256_castsi256_ps(_mm256_and_si256(w,mask)); a=_mm256_fmadd_ps(qe,e,a); b=_mm256_fmadd_ps(qo,o,b);}
      ROWC(0,a0,b0)ROWC(1,a1,b1)ROWC(2,a2,b2)ROWC(3,a3,b3)
    }
    _mm256_storeu_ps(out+0,_mm256_add_ps(a0,b0));_mm256_storeu_ps(out+8,_mm256_add_ps(a1,b1));_mm256_storeu_ps(out+16,_mm256_add_ps(a2,b2));_mm256_storeu_ps(out+24,_mm256_add_ps(a3,b3));
  }
}
// variant D: pure FMA 8 chains x 2 per iter without loads (peak check)
__attribute__((noinline)) void fma_D(void){
  __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0;
  __m256 x=_mm256_set1_ps(1.0001f), y=_mm256_set1_ps(0.999f);
  for(int j=0;j<128*2;j+=2){
    a0=_mm256_fmadd_ps(x,y,a0);a1=_mm256_fmadd_ps(x,y,a1);a2=_mm256_fmadd_ps(x,y,a2);a3=_mm256_fmadd_ps(x,y,a3);a4=_mm256_fmadd_ps(x,y,a4);
    a5=_mm256_fmadd_ps(x,y,a5);a6=_mm256_fmadd_ps(x,y,a6);a7=_mm256_fmadd_ps(x,y,a7);a8=_mm256_fmadd_ps(x,y,a8);a9=_mm256_fmadd_ps(x,y,a9);
    __asm__ volatile("" : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7),"+x"(a8),"+x"(a9));
  }
  _mm256_storeu_ps(out,_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0,a1),_mm256_add_ps(a2,a3)),_mm256_add_ps(_mm256_add_ps(a4,a5),_mm256_add_ps(_mm256_add_ps(a6,a7),_mm256_add_ps(a8,a9)))));
}
// variant E: A but decode only with shifts (odd via srli then slli? no: use two broadcasts: even from (addr-2)&mask, odd from addr & mask) => 2 loads + 2 ands
__attribute__((noinline)) void score_E(void){
  for (int r0=0;r0<16;r0+=8){
    __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
    const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
    for(int j=0;j<128;j+=2){
      __m256 qe=_mm256_load_ps(qt+j*8), qo=_mm256_load_ps(qt+j*8+8);
#define ROWE(r,a) { const char* p=(const char*)&krow[r0+r][j]; __m256 e=_mm256_and_ps(_mm256_broadcast_ss((const float*)(p-2)),mask); __m256 o=_mm256_and_ps(_mm256_broadcast_ss((const float*)p),mask); a=_mm256_fmadd_ps(qe,e,a); a=_mm256_fmadd_ps(qo,o,a);}
      ROWE(0,a0)ROWE(1,a1)ROWE(2,a2)ROWE(3,a3)ROWE(4,a4)ROWE(5,a5)ROWE(6,a6)ROWE(7,a7)
    }
    _mm256_storeu_ps(out+0,a0);_mm256_storeu_ps(out+8,a1);_mm256_storeu_ps(out+16,a2);_mm256_storeu_ps(out+24,a3);
    _mm256_storeu_ps(out+32,a4);_mm256_storeu_ps(out+40,a5);_mm256_storeu_ps(out+48,a6);_mm256_storeu_ps(out+56,a7);
  }
}
static double bench(fn f){ double best=1e30; for(int rep=0;rep<7;rep++){ uint64_t t0=__rdtsc(); for(int i=0;i<20000;i++){ f(); __asm__ volatile("" ::: "memory"); } uint64_t t1=__rdtsc(); double c=(double)(t1-t0)/20000; if(c<best)best=c;} return best; }
int main(){ for(int r=0;r<16;r++)for(int j=0;j<128;j++)krow[r][j]=0x3f80+(j&7); for(int i=0;i<1024;i++)qt[i]=0.001f*i;
  printf("A current lanes: %.0f tsc/tile (2048 FMA)\n", bench(score_A));
  printf("B no decode:     %.0f\n", bench(score_B));
  printf("C even/odd acc:  %.0f\n", bench(score_C));
  printf("E 2 bcast+and:   %.0f\n", bench(score_E));
  printf("D pure FMA (per 2048): %.0f\n", bench(fma_D) * 2048.0 / 1280.0);
  float s=0; for(int i=0;i<128;i++) s+=out[i]; printf("%g\n",s); return 0; }

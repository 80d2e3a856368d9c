// s29: lanes over the head dim, 8 heads on one decoded 8-element chunk:
// sc8 (scores, queries as memory operands, a horizontal-add tree a row) and
// v8h (V, weights pre-broadcast as memory operands).
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
static uint16_t krow[16][128] __attribute__((aligned(64)));
static float q[8][128] __attribute__((aligned(64)));   // pair order per 16-group
static float pb[16][8][8] __attribute__((aligned(64))); // p broadcast [t][h][8]
float acc[8][128] __attribute__((aligned(64)));
float s[16][8];
typedef void (*fn)(void);
static inline __m256 hsum8(__m256 a0,__m256 a1,__m256 a2,__m256 a3,__m256 a4,__m256 a5,__m256 a6,__m256 a7){
  __m256 t0=_mm256_hadd_ps(a0,a1),t1=_mm256_hadd_ps(a2,a3),t2=_mm256_hadd_ps(a4,a5),t3=_mm256_hadd_ps(a6,a7);
  __m256 u0=_mm256_hadd_ps(t0,t1),u1=_mm256_hadd_ps(t2,t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0,u1,0x20),_mm256_permute2f128_ps(u0,u1,0x31));
}
// scores: per row, 8 heads acc, q from memory operand, K chunk decoded once
__attribute__((noinline)) void sc8(void){
  const __m256 maskf=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int t=0;t<16;t++){
    __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
    _Pragma("GCC unroll 16") for(int c=0;c<128;c+=16){
      __m256i w=_mm256_loadu_si256((const __m256i*)&krow[t][c]);
      __m256 e=_mm256_castsi256_ps(_mm256_slli_epi32(w,16));
      __m256 o=_mm256_and_ps(_mm256_castsi256_ps(w),maskf);
#define H(h,a) a=_mm256_fmadd_ps(e,_mm256_load_ps(&q[h][c]),a);
      H(0,a0)H(1,a1)H(2,a2)H(3,a3)H(4,a4)H(5,a5)H(6,a6)H(7,a7)
#undef H
#define H(h,a) a=_mm256_fmadd_ps(o,_mm256_load_ps(&q[h][c+8]),a);
      H(0,a0)H(1,a1)H(2,a2)H(3,a3)H(4,a4)H(5,a5)H(6,a6)H(7,a7)
#undef H
    }
    _mm256_storeu_ps(s[t],hsum8(a0,a1,a2,a3,a4,a5,a6,a7));
  }
}
// V: lanes over d; 8 heads per decoded chunk; p pre-broadcast memory operand
__attribute__((noinline)) void v8h(void){
  const __m256 maskf=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int c=0;c<128;c+=16){ for(int half=0;half<2;half++){
    __m256 a0=_mm256_load_ps(&acc[0][c+8*half]),a1=_mm256_load_ps(&acc[1][c+8*half]),a2=_mm256_load_ps(&acc[2][c+8*half]),a3=_mm256_load_ps(&acc[3][c+8*half]),
           a4=_mm256_load_ps(&acc[4][c+8*half]),a5=_mm256_load_ps(&acc[5][c+8*half]),a6=_mm256_load_ps(&acc[6][c+8*half]),a7=_mm256_load_ps(&acc[7][c+8*half]);
    _Pragma("GCC unroll 16") for(int t=0;t<16;t++){
      __m256i w=_mm256_loadu_si256((const __m256i*)&krow[t][c]);
      __m256 v= half? _mm256_and_ps(_mm256_castsi256_ps(w),maskf) : _mm256_castsi256_ps(_mm256_slli_epi32(w,16));
#define H(h,a) a=_mm256_fmadd_ps(v,_mm256_load_ps(pb[t][h]),a);
      H(0,a0)H(1,a1)H(2,a2)H(3,a3)H(4,a4)H(5,a5)H(6,a6)H(7,a7)
#undef H
    }
    _mm256_store_ps(&acc[0][c+8*half],a0);_mm256_store_ps(&acc[1][c+8*half],a1);_mm256_store_ps(&acc[2][c+8*half],a2);_mm256_store_ps(&acc[3][c+8*half],a3);
    _mm256_store_ps(&acc[4][c+8*half],a4);_mm256_store_ps(&acc[5][c+8*half],a5);_mm256_store_ps(&acc[6][c+8*half],a6);_mm256_store_ps(&acc[7][c+8*half],a7);
  }}
}
static double bench(fn f){ double best=1e30; for(int rep=0;rep<9;rep++){ uint64_t t0=__rdtsc(); for(int i=0;i<20000;i++){ f(); __asm__ volatile("":::"memory");} uint64_t t1=__rdtsc(); double c=(double)(t1-t0)/20000; if(c<best)best=c;} return best; }
int main(){ for(int r=0;r<16;r++)for(int j=0;j<128;j++)krow[r][j]=0x3f80+(j&7); for(int h=0;h<8;h++)for(int j=0;j<128;j++)q[h][j]=1e-3f*j;
  for(int t=0;t<16;t++)for(int h=0;h<8;h++)for(int l=0;l<8;l++)pb[t][h][l]=1e-7f*(t+h);
  printf("sc8 (8 heads/row, q mem): %.0f tsc per 2048 FMA\n", bench(sc8));
  printf("v8h (8 heads, p mem):     %.0f\n", bench(v8h));
  float z=0; for(int i=0;i<128;i++) z+=s[i/8][i%8]+acc[i/128][i%128]; printf("%g\n",z); return 0; }

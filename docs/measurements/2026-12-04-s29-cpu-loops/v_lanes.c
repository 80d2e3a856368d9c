// s29: a tile's V accumulation at 8 query heads, d = 128, bf16 V (16 rows),
// in L1, one head per lane: 8, 10 or 12 columns a block, and 8 without the
// decode (the pair broadcast as a float: wrong values, same shape).
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
static uint16_t vrow[16][128] __attribute__((aligned(64)));
static float p[16*8] __attribute__((aligned(64)));
float acc[128*8] __attribute__((aligned(64)));
typedef void (*fn)(void);
#define DEC(w,e,o) __m256 e=_mm256_castsi256_ps(_mm256_slli_epi32(w,16)); __m256 o=_mm256_and_ps(_mm256_castsi256_ps(w),maskf);
// 8 columns per block
__attribute__((noinline)) void v8(void){
  const __m256 maskf=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int c0=0;c0<128;c0+=8){
    __m256 a[8]; _Pragma("GCC unroll 16") for(int i=0;i<8;i++) a[i]=_mm256_load_ps(acc+(c0+i)*8);
    for(int t=0;t<16;t++){ __m256 pt=_mm256_load_ps(p+t*8);
      _Pragma("GCC unroll 16") for(int pr=0;pr<4;pr++){ __m256i w=_mm256_set1_epi32(*(int*)&vrow[t][c0+2*pr]); DEC(w,e,o) a[2*pr]=_mm256_fmadd_ps(pt,e,a[2*pr]); a[2*pr+1]=_mm256_fmadd_ps(pt,o,a[2*pr+1]); } }
    _Pragma("GCC unroll 16") for(int i=0;i<8;i++) _mm256_store_ps(acc+(c0+i)*8,a[i]);
  }
}
// 10 columns per block (12 blocks) + 8
#define VBLK(NC) { __m256 a[NC]; _Pragma("GCC unroll 16") for(int i=0;i<NC;i++) a[i]=_mm256_load_ps(acc+(c0+i)*8); \
    for(int t=0;t<16;t++){ __m256 pt=_mm256_load_ps(p+t*8); \
      _Pragma("GCC unroll 16") for(int pr=0;pr<NC/2;pr++){ __m256i w=_mm256_set1_epi32(*(int*)&vrow[t][c0+2*pr]); DEC(w,e,o) a[2*pr]=_mm256_fmadd_ps(pt,e,a[2*pr]); a[2*pr+1]=_mm256_fmadd_ps(pt,o,a[2*pr+1]); } } \
    _Pragma("GCC unroll 16") for(int i=0;i<NC;i++) _mm256_store_ps(acc+(c0+i)*8,a[i]); c0+=NC; }
__attribute__((noinline)) void v10(void){
  const __m256 maskf=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  int c0=0; while(c0+10<=128) VBLK(10) if(c0<128) VBLK(8)
}
__attribute__((noinline)) void v12(void){
  const __m256 maskf=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  int c0=0; while(c0+12<=128) VBLK(12) if(c0<128) VBLK(8)
}
// 8 columns, 2 rows per step into separate acc sets? (16 acc) skip. no-decode 8 cols
__attribute__((noinline)) void v8nodec(void){
  for(int c0=0;c0<128;c0+=8){
    __m256 a[8]; _Pragma("GCC unroll 16") for(int i=0;i<8;i++) a[i]=_mm256_load_ps(acc+(c0+i)*8);
    for(int t=0;t<16;t++){ __m256 pt=_mm256_load_ps(p+t*8);
      _Pragma("GCC unroll 16") for(int pr=0;pr<4;pr++){ __m256 w=_mm256_broadcast_ss((float*)&vrow[t][c0+2*pr]); a[2*pr]=_mm256_fmadd_ps(pt,w,a[2*pr]); a[2*pr+1]=_mm256_fmadd_ps(pt,w,a[2*pr+1]); } }
    _Pragma("GCC unroll 16") for(int i=0;i<8;i++) _mm256_store_ps(acc+(c0+i)*8,a[i]);
  }
}
static double bench(fn f){ double best=1e30; for(int rep=0;rep<7;rep++){ uint64_t t0=__rdtsc(); for(int i=0;i<20000;i++){ f(); __asm__ volatile("":::"memory");} uint64_t t1=__rdtsc(); double c=(double)(t1-t0)/20000; if(c<best)best=c;} return best; }
int main(){ for(int r=0;r<16;r++)for(int j=0;j<128;j++)vrow[r][j]=0x3f80+(j&7); for(int i=0;i<128;i++)p[i]=1e-6f*i;
  printf("v8:      %.0f tsc/tile (2048 FMA)\n", bench(v8));
  printf("v10:     %.0f\n", bench(v10));
  printf("v12:     %.0f\n", bench(v12));
  printf("v8nodec: %.0f\n", bench(v8nodec));
  float s=0; for(int i=0;i<1024;i++) s+=acc[i]; printf("%g\n",s); return 0; }

// s53: what bf16's odd-element mask costs avx2.rs's loops on Zen 1 (C models, 4 heads, d = 128,
// 16 rows, in L1): vpand, vandps, two shifts, the odd elements shifted out of a load 2 bytes on,
// or no mask at all (wrong values; the cost's bound).
// Build: gcc -O3 -mavx2 -mfma -o odd_mask odd_mask.c; run: ./odd_mask.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define D 128
#define T 16
static float acc[4*D] __attribute__((aligned(64)));
static float p[4*T] __attribute__((aligned(64)));
static float q[4*D] __attribute__((aligned(64)));
static float s[4*T] __attribute__((aligned(64)));
const uint16_t* rows[T]; const uint16_t* krows[T];
#define ODD2(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)(k+c+1)),16))
volatile int maskbits = 0xffff0000;
#define PV(NAME, ODD) __attribute__((noinline)) void NAME(int c){ \
  __m256 a[4][2]; for(int h=0;h<4;h++)for(int j=0;j<2;j++)a[h][j]=_mm256_loadu_ps(acc+h*D+c+8*j); \
  __m256i mask=_mm256_set1_epi32(maskbits); (void)mask; \
  for(int i=0;i<T;i++){ \
    __m256 pb[4]; for(int h=0;h<4;h++)pb[h]=_mm256_broadcast_ss(p+h*T+i); \
    __m256i pr=_mm256_loadu_si256((const __m256i*)(rows[i]+c)); \
    __m256 v0=_mm256_castsi256_ps(_mm256_slli_epi32(pr,16)); \
    __m256 v1=ODD; \
    for(int h=0;h<4;h++){a[h][0]=_mm256_fmadd_ps(pb[h],v0,a[h][0]);a[h][1]=_mm256_fmadd_ps(pb[h],v1,a[h][1]);} \
  } \
  for(int h=0;h<4;h++)for(int j=0;j<2;j++)_mm256_storeu_ps(acc+h*D+c+8*j,a[h][j]); }
PV(pv_and, _mm256_castsi256_ps(_mm256_and_si256(pr,mask)))
PV(pv_andps, _mm256_and_ps(_mm256_castsi256_ps(pr),_mm256_castsi256_ps(mask)))
PV(pv_shsh, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(pr,16),16)))
PV(pv_none, _mm256_castsi256_ps(pr))
PV(pv_off2, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)(rows[i]+c+1)),16)))
void run_pv(void(*f)(int)){ for(int c=0;c<D;c+=16) f(c); }
void a5(){run_pv(pv_off2);} void a1(){run_pv(pv_and);} void a2(){run_pv(pv_andps);} void a3(){run_pv(pv_shsh);} void a4(){run_pv(pv_none);}
#define SC(NAME, ODD) __attribute__((noinline)) void NAME(){ \
  __m256i mask=_mm256_set1_epi32(maskbits); (void)mask; \
  for(int r0=0;r0<T;r0+=2){ \
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();} \
    for(int c=0;c<D;c+=16){ \
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c)); \
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16)); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);} \
      __m256i pr=k0; __m256 o0=ODD; pr=k1; __m256 o1=ODD; \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);} \
    } \
    for(int h=0;h<4;h++){_mm256_storeu_ps(s+8*(2*h), _mm256_add_ps(a[h][0],a[h][1]));} \
  } }
#define SC2(NAME) __attribute__((noinline)) void NAME(){ \
  __m256i mask=_mm256_set1_epi32(maskbits); (void)mask; \
  for(int r0=0;r0<T;r0+=2){ \
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();} \
    for(int c=0;c<D;c+=16){ \
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c)); \
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16)); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);} \
      __m256 o0=ODD2(krows[r0]), o1=ODD2(krows[r0+1]); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);} \
    } \
    for(int h=0;h<4;h++){_mm256_storeu_ps(s+8*(2*h), _mm256_add_ps(a[h][0],a[h][1]));} \
  } }
SC(sc_and, _mm256_castsi256_ps(_mm256_and_si256(pr,mask)))
SC(sc_andps, _mm256_and_ps(_mm256_castsi256_ps(pr),_mm256_castsi256_ps(mask)))
SC(sc_shsh, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(pr,16),16)))
SC(sc_none, _mm256_castsi256_ps(pr))
SC2(sc_off2)
int main(){
  uint8_t* kb=aligned_alloc(4096, 1<<20); uint8_t* vb=aligned_alloc(4096,1<<20);
  for(size_t i=0;i<(1<<20);i++){kb[i]=rand();vb[i]=rand()&0x3f;}
  for(int i=0;i<T;i++){rows[i]=(const uint16_t*)(vb+i*2048); krows[i]=(const uint16_t*)(kb+i*2048);}
  for(int i=0;i<4*D;i++){acc[i]=0;q[i]=0.01f*i;} for(int i=0;i<4*T;i++)p[i]=1e-6f;
  __m256 a[10]; for(int i=0;i<10;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-3f);
  __m256 b=_mm256_set1_ps(0.999999f), cc=_mm256_set1_ps(1e-7f);
  long n=50000000; double t0=now();
  for(long i=0;i<n;i++){ for(int j=0;j<10;j++) a[j]=_mm256_fmadd_ps(a[j],b,cc);}
  double pk=(now()-t0)/(n*10.0); float sink=0; for(int j=0;j<10;j++){float x[8];_mm256_storeu_ps(x,a[j]);sink+=x[0];}
  void (*fs[10])()={a1,a2,a3,a4,a5,sc_and,sc_andps,sc_shsh,sc_none,sc_off2};
  const char* names[10]={"pv and","pv andps","pv srl+sll","pv raw(no mask)","pv load+2,sll","sc and","sc andps","sc srl+sll","sc raw(no mask)","sc load+2,sll"};
  for(int round=0;round<3;round++) for(int v=0;v<10;v++){
    double best=1e9; int reps=100000;
    for(int k=0;k<5;k++){ t0=now(); for(int r=0;r<reps;r++){ fs[v](); __asm__ volatile(""::"r"(acc),"r"(s):"memory");} double t=(now()-t0)/reps; if(t<best)best=t;}
    printf("r%d %-16s %.1f ns/tile  %.0f%% of FMA peak (peak %.3f ns)\n",round,names[v],best*1e9,1024*pk/best*100,pk*1e9);
  }
  return sink==12345;
}

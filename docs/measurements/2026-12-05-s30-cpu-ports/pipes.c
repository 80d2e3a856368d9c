// s30: which vector ops share the FMA pipes on this Zen 2 core. 10 independent
// FMA chains per iteration, plus a few ops of one kind on their own chains;
// TSC ticks per iteration, best of 9 runs of 100000 iterations.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
// 10 FMA chains + K extra ALU ops of kind X per 10 FMAs; ticks per 10 FMA.
#define N 100000
#define FMAS a0=_mm256_fmadd_ps(x,y,a0);a1=_mm256_fmadd_ps(x,y,a1);a2=_mm256_fmadd_ps(x,y,a2);a3=_mm256_fmadd_ps(x,y,a3);a4=_mm256_fmadd_ps(x,y,a4);a5=_mm256_fmadd_ps(x,y,a5);a6=_mm256_fmadd_ps(x,y,a6);a7=_mm256_fmadd_ps(x,y,a7);a8=_mm256_fmadd_ps(x,y,a8);a9=_mm256_fmadd_ps(x,y,a9);
#define BODY(EXTRA) { __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0; __m256 x=_mm256_set1_ps(1.0001f), y=_mm256_set1_ps(0.999f); __m256i i0=_mm256_set1_epi32(1),i1=i0,i2=i0,i3=i0; __m256i m=_mm256_set1_epi32(0xffff0000); \
 uint64_t t0=__rdtsc(); for(int it=0;it<N;it++){ FMAS EXTRA __asm__ volatile("" : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7),"+x"(a8),"+x"(a9),"+x"(i0),"+x"(i1),"+x"(i2),"+x"(i3)); } uint64_t t1=__rdtsc(); \
 float o[8]; _mm256_storeu_ps(o,_mm256_add_ps(a0,_mm256_add_ps(a9,_mm256_castsi256_ps(_mm256_add_epi32(i0,_mm256_add_epi32(i1,_mm256_add_epi32(i2,i3))))))); sink+=o[1]; return (double)(t1-t0)/N; }
float sink;
double f0(void) BODY()
double f_sll2(void) BODY(i0=_mm256_slli_epi32(i0,1);i1=_mm256_slli_epi32(i1,1);)
double f_sll4(void) BODY(i0=_mm256_slli_epi32(i0,1);i1=_mm256_slli_epi32(i1,1);i2=_mm256_slli_epi32(i2,1);i3=_mm256_slli_epi32(i3,1);)
double f_and4(void) BODY(i0=_mm256_and_si256(i0,m);i1=_mm256_and_si256(i1,m);i2=_mm256_and_si256(i2,m);i3=_mm256_and_si256(i3,m);)
double f_andps4(void) BODY(i0=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i0),_mm256_castsi256_ps(m)));i1=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i1),_mm256_castsi256_ps(m)));i2=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i2),_mm256_castsi256_ps(m)));i3=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i3),_mm256_castsi256_ps(m)));)
double f_blend4(void) BODY(i0=_mm256_blend_epi16(i0,m,0xaa);i1=_mm256_blend_epi16(i1,m,0xaa);i2=_mm256_blend_epi16(i2,m,0xaa);i3=_mm256_blend_epi16(i3,m,0xaa);)
double f_unpck4(void) BODY(i0=_mm256_unpacklo_epi16(i0,m);i1=_mm256_unpackhi_epi16(i1,m);i2=_mm256_unpacklo_epi16(i2,m);i3=_mm256_unpackhi_epi16(i3,m);)
double f_add4(void) BODY(i0=_mm256_add_epi32(i0,m);i1=_mm256_add_epi32(i1,m);i2=_mm256_add_epi32(i2,m);i3=_mm256_add_epi32(i3,m);)
double f_shsh4(void) BODY(i0=_mm256_slli_epi32(_mm256_srli_epi32(i0,16),16);i1=_mm256_slli_epi32(_mm256_srli_epi32(i1,16),16);i2=_mm256_slli_epi32(_mm256_srli_epi32(i2,16),16);i3=_mm256_slli_epi32(_mm256_srli_epi32(i3,16),16);)
double f_sll8(void) BODY(i0=_mm256_slli_epi32(i0,1);i1=_mm256_slli_epi32(i1,1);i2=_mm256_slli_epi32(i2,1);i3=_mm256_slli_epi32(i3,1);i0=_mm256_slli_epi32(i0,1);i1=_mm256_slli_epi32(i1,1);i2=_mm256_slli_epi32(i2,1);i3=_mm256_slli_epi32(i3,1);)
double f_and8(void) BODY(i0=_mm256_and_si256(i0,m);i1=_mm256_and_si256(i1,m);i2=_mm256_and_si256(i2,m);i3=_mm256_and_si256(i3,m);i0=_mm256_and_si256(i0,m);i1=_mm256_and_si256(i1,m);i2=_mm256_and_si256(i2,m);i3=_mm256_and_si256(i3,m);)
double f_andps8(void) BODY(i0=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i0),_mm256_castsi256_ps(m)));i1=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i1),_mm256_castsi256_ps(m)));i2=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i2),_mm256_castsi256_ps(m)));i3=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i3),_mm256_castsi256_ps(m)));i0=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i0),_mm256_castsi256_ps(m)));i1=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i1),_mm256_castsi256_ps(m)));i2=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i2),_mm256_castsi256_ps(m)));i3=_mm256_castps_si256(_mm256_and_ps(_mm256_castsi256_ps(i3),_mm256_castsi256_ps(m)));)
double best(double(*f)(void)){double b=1e30;for(int r=0;r<9;r++){double c=f();if(c<b)b=c;}return b;}
int main(){
 printf("10 FMA alone        %.2f ticks\n",best(f0));
 printf("+2 vpslld           %.2f\n",best(f_sll2));
 printf("+4 vpslld           %.2f\n",best(f_sll4));
 printf("+4 vpand            %.2f\n",best(f_and4));
 printf("+4 vandps           %.2f\n",best(f_andps4));
 printf("+4 vpblendw         %.2f\n",best(f_blend4));
 printf("+4 vpunpck         %.2f\n",best(f_unpck4));
 printf("+4 vpaddd           %.2f\n",best(f_add4));
 printf("+4 srl+sll pairs    %.2f\n",best(f_shsh4));
 printf("+8 vpslld           %.2f\n",best(f_sll8));
 printf("+8 vpand            %.2f\n",best(f_and8));
 printf("+8 vandps           %.2f\n",best(f_andps8));
 printf("%g\n",sink); }

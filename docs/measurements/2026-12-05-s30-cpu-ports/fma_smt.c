// Ticks (TSC) per 10 independent 256-bit FMAs, best of 20 runs of 2M iterations.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
float sink;
static double run(void){
  __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0;
  __m256 x=_mm256_set1_ps(1.0001f), y=_mm256_set1_ps(0.999f);
  uint64_t t0=__rdtsc();
  for(int i=0;i<2000000;i++){
    a0=_mm256_fmadd_ps(x,y,a0);a1=_mm256_fmadd_ps(x,y,a1);a2=_mm256_fmadd_ps(x,y,a2);a3=_mm256_fmadd_ps(x,y,a3);a4=_mm256_fmadd_ps(x,y,a4);
    a5=_mm256_fmadd_ps(x,y,a5);a6=_mm256_fmadd_ps(x,y,a6);a7=_mm256_fmadd_ps(x,y,a7);a8=_mm256_fmadd_ps(x,y,a8);a9=_mm256_fmadd_ps(x,y,a9);
    __asm__ volatile("" : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7),"+x"(a8),"+x"(a9));
  }
  uint64_t t1=__rdtsc();
  float o[8]; _mm256_storeu_ps(o,_mm256_add_ps(a0,a9)); sink+=o[0];
  return (double)(t1-t0)/2000000;
}
int main(){ double b=1e30, sum=0; for(int r=0;r<20;r++){double c=run(); sum+=c; if(c<b)b=c;} printf("best %.2f mean %.2f ticks per 10 FMA\n", b, sum/20); return sink==1234.5; }

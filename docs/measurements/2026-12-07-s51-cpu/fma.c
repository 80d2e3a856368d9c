#include <immintrin.h>
#include <stdio.h>
#include <time.h>
int main(){
  __m256 a[10]; for(int i=0;i<10;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-3f);
  __m256 b=_mm256_set1_ps(0.999999f), c=_mm256_set1_ps(1e-7f);
  long n=200000000; struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
  for(long i=0;i<n;i++){ for(int j=0;j<10;j++) a[j]=_mm256_fmadd_ps(a[j],b,c); }
  clock_gettime(CLOCK_MONOTONIC,&t1);
  double s=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; float r=0; for(int j=0;j<10;j++){float x[8];_mm256_storeu_ps(x,a[j]);r+=x[0];}
  printf("%.2f GFMA/s (8-lane FMAs x8) sum %f\n", n*10.0*8/s/1e9, r);
}

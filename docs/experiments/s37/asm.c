#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define R16(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11) op(12) op(13) op(14) op(15)
#define DP(i) "vdpbf16ps %%zmm16, %%zmm17, %%zmm" #i "\n\t"
#define FZ(i) "vfmadd231ps %%zmm16, %%zmm17, %%zmm" #i "\n\t"
#define FY(i) "vfmadd231ps %%ymm16, %%ymm17, %%ymm" #i "\n\t"
#define MIXZ(i) "vdpbf16ps %%zmm16, %%zmm17, %%zmm" #i "\n\t" "vfmadd231ps %%zmm18, %%zmm19, %%zmm" #i "\n\t"
#define RUN(name, body, per) { long N=20000000; double t=now(); for(long n=0;n<N;n++){ __asm__ volatile(R16(body) ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15"); } double dt=now()-t; printf("%-22s %.2f cycles per instruction\n", name, dt/(N*16.0*per)*1e9*3.66); }
int main(){
  __asm__ volatile("vpxord %%zmm16,%%zmm16,%%zmm16\n\tvpxord %%zmm17,%%zmm17,%%zmm17\n\tvpxord %%zmm18,%%zmm18,%%zmm18\n\tvpxord %%zmm19,%%zmm19,%%zmm19":::"xmm16","xmm17","xmm18","xmm19");
  RUN("vdpbf16ps zmm", DP, 1)
  RUN("vfmadd231ps zmm", FZ, 1)
  RUN("vfmadd231ps ymm", FY, 1)
  RUN("dpbf16+fma zmm (dep)", MIXZ, 2)
  return 0;
}

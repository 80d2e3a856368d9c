#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static char buf[8192] __attribute__((aligned(64)));
#define CLOB "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22"
// One chunk step as in scores_heads<4> R=4: load 4 q (regs 16-19) from memory, then for 4 rows: load k -> 20, 4 dpbf16
#define ROW(o, a0,a1,a2,a3) "vmovups " #o "(%0), %%zmm20\n\t" "vdpbf16ps %%zmm20, %%zmm16, %%zmm" #a0 "\n\t" "vdpbf16ps %%zmm20, %%zmm17, %%zmm" #a1 "\n\t" "vdpbf16ps %%zmm20, %%zmm18, %%zmm" #a2 "\n\t" "vdpbf16ps %%zmm20, %%zmm19, %%zmm" #a3 "\n\t"
#define QLOAD "vmovups 1024(%0), %%zmm16\n\t vmovups 1088(%0), %%zmm17\n\t vmovups 1152(%0), %%zmm18\n\t vmovups 1216(%0), %%zmm19\n\t"
#define STEP QLOAD ROW(0,0,1,2,3) ROW(256,4,5,6,7) ROW(512,8,9,10,11) ROW(768,12,13,14,15)
#define STEPNOQ ROW(0,0,1,2,3) ROW(256,4,5,6,7) ROW(512,8,9,10,11) ROW(768,12,13,14,15)
int main(){
  for(int i=0;i<8192;i++) buf[i]=(char)(i*7);
  long N=20000000; double t, dt;
  t=now(); for(long n=0;n<N;n++){ __asm__ volatile(STEP STEP STEP STEP :: "r"(buf) : CLOB); } dt=now()-t;
  printf("scores-like (q+k loads): %.2f cycles per dpbf16\n", dt/(N*64.0)*1e9*3.66);
  t=now(); for(long n=0;n<N;n++){ __asm__ volatile(STEPNOQ STEPNOQ STEPNOQ STEPNOQ :: "r"(buf) : CLOB); } dt=now()-t;
  printf("scores-like (k loads only): %.2f cycles per dpbf16\n", dt/(N*64.0)*1e9*3.66);
  return 0;
}

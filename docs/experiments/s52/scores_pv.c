// s52: C models of the AVX2 path's two loops for 4 query heads a KV head (Llama-3-8B), d = 128,
// 16 bf16 rows at a 2 KiB stride, in L1, against an FMA-peak loop timed in the same run.
// Build: gcc -O3 -mavx2 -mfma -o pv scores_pv.c; run: ./pv [ROW_STRIDE_BYTES [V_OFFSET]].
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define D 128
#define T 16
static float acc[4*D] __attribute__((aligned(64)));
static float p[4*T] __attribute__((aligned(64)));
static float q[4*D] __attribute__((aligned(64)));
static float s[4*T] __attribute__((aligned(64)));
const uint16_t* rows[T]; const uint16_t* krows[T];
__attribute__((noinline)) void pv_block(int c){ // H=4,C=2 current
  __m256 a[4][2]; for(int h=0;h<4;h++)for(int j=0;j<2;j++)a[h][j]=_mm256_loadu_ps(acc+h*D+c+8*j);
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int i=0;i<T;i++){
    __m256 pb[4]; for(int h=0;h<4;h++)pb[h]=_mm256_broadcast_ss(p+h*T+i);
    __m256i pr=_mm256_loadu_si256((const __m256i*)(rows[i]+c));
    __m256 v0=_mm256_castsi256_ps(_mm256_slli_epi32(pr,16));
    __m256 v1=_mm256_castsi256_ps(_mm256_and_si256(pr,mask));
    for(int h=0;h<4;h++){a[h][0]=_mm256_fmadd_ps(pb[h],v0,a[h][0]);a[h][1]=_mm256_fmadd_ps(pb[h],v1,a[h][1]);}
  }
  for(int h=0;h<4;h++)for(int j=0;j<2;j++)_mm256_storeu_ps(acc+h*D+c+8*j,a[h][j]);
}
void pv(){ for(int c=0;c<D;c+=16) pv_block(c); }
// rows outer in pairs of column blocks? variant: C=4 H=2 (line-wide)
__attribute__((noinline)) void pv_block2(int c,int h0){
  __m256 a[2][4]; for(int h=0;h<2;h++)for(int j=0;j<4;j++)a[h][j]=_mm256_loadu_ps(acc+(h0+h)*D+c+8*j);
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int i=0;i<T;i++){
    __m256 pb0=_mm256_broadcast_ss(p+h0*T+i), pb1=_mm256_broadcast_ss(p+(h0+1)*T+i);
    for(int g=0;g<2;g++){
      __m256i pr=_mm256_loadu_si256((const __m256i*)(rows[i]+c+16*g));
      __m256 v0=_mm256_castsi256_ps(_mm256_slli_epi32(pr,16));
      __m256 v1=_mm256_castsi256_ps(_mm256_and_si256(pr,mask));
      a[0][2*g]=_mm256_fmadd_ps(pb0,v0,a[0][2*g]); a[1][2*g]=_mm256_fmadd_ps(pb1,v0,a[1][2*g]);
      a[0][2*g+1]=_mm256_fmadd_ps(pb0,v1,a[0][2*g+1]); a[1][2*g+1]=_mm256_fmadd_ps(pb1,v1,a[1][2*g+1]);
    }
  }
  for(int h=0;h<2;h++)for(int j=0;j<4;j++)_mm256_storeu_ps(acc+(h0+h)*D+c+8*j,a[h][j]);
}
void pv2(){ for(int h0=0;h0<4;h0+=2) for(int c=0;c<D;c+=32) pv_block2(c,h0); }
static inline __m256 tsum(__m256* a){
  __m256 t0=_mm256_hadd_ps(a[0],a[1]),t1=_mm256_hadd_ps(a[2],a[3]),t2=_mm256_hadd_ps(a[4],a[5]),t3=_mm256_hadd_ps(a[6],a[7]);
  __m256 u0=_mm256_hadd_ps(t0,t1),u1=_mm256_hadd_ps(t2,t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0,u1,0x20),_mm256_permute2f128_ps(u0,u1,0x31));
}
__attribute__((noinline)) void scores(){ // H=4 R=2
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int r0=0;r0<T;r0+=2){
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();}
    for(int c=0;c<D;c+=16){
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c));
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);}
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);}
    }
    float out[8]; __m256 f[8]={a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]};
    _mm256_storeu_ps(out,tsum(f));
    for(int h=0;h<4;h++){s[h*T+r0]=out[2*h];s[h*T+r0+1]=out[2*h+1];}
  }
}

__attribute__((noinline)) void scores_h2r4(){
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int h0=0;h0<4;h0+=2)
  for(int r0=0;r0<T;r0+=4){
    __m256 a[2][4]; for(int h=0;h<2;h++)for(int r=0;r<4;r++)a[h][r]=_mm256_setzero_ps();
    for(int c=0;c<D;c+=16){
      __m256 q0=_mm256_loadu_ps(q+h0*D+c), q1=_mm256_loadu_ps(q+(h0+1)*D+c);
      __m256i k[4]; for(int r=0;r<4;r++) k[r]=_mm256_loadu_si256((const __m256i*)(krows[r0+r]+c));
      for(int r=0;r<4;r++){__m256 e=_mm256_castsi256_ps(_mm256_slli_epi32(k[r],16)); a[0][r]=_mm256_fmadd_ps(q0,e,a[0][r]); a[1][r]=_mm256_fmadd_ps(q1,e,a[1][r]);}
      q0=_mm256_loadu_ps(q+h0*D+c+8); q1=_mm256_loadu_ps(q+(h0+1)*D+c+8);
      for(int r=0;r<4;r++){__m256 o=_mm256_castsi256_ps(_mm256_and_si256(k[r],mask)); a[0][r]=_mm256_fmadd_ps(q0,o,a[0][r]); a[1][r]=_mm256_fmadd_ps(q1,o,a[1][r]);}
    }
    float out[8]; __m256 f[8]={a[0][0],a[0][1],a[0][2],a[0][3],a[1][0],a[1][1],a[1][2],a[1][3]};
    _mm256_storeu_ps(out,tsum(f));
    for(int r=0;r<4;r++){s[h0*T+r0+r]=out[r];s[(h0+1)*T+r0+r]=out[4+r];}
  }
}
static __m256 part[8][8];
__attribute__((noinline)) void scores_late(){ // H4R2, reductions batched at the end
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int r0=0;r0<T;r0+=2){
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();}
    for(int c=0;c<D;c+=16){
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c));
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);}
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);}
    }
    for(int h=0;h<4;h++){part[r0/2][2*h]=a[h][0];part[r0/2][2*h+1]=a[h][1];}
  }
  for(int p8=0;p8<8;p8++){float out[8]; _mm256_storeu_ps(out,tsum(part[p8])); for(int h=0;h<4;h++){s[h*T+2*p8]=out[2*h];s[h*T+2*p8+1]=out[2*h+1];}}
}

__attribute__((noinline)) void scores_nodec(){
  for(int r0=0;r0<T;r0+=2){
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();}
    for(int c=0;c<D;c+=16){
      __m256 e0=_mm256_loadu_ps((const float*)(krows[r0]+c)), e1=_mm256_loadu_ps((const float*)(krows[r0+1]+c));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);}
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,e1,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e0,a[h][1]);}
    }
    float out[8]; __m256 f[8]={a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]};
    _mm256_storeu_ps(out,tsum(f));
    for(int h=0;h<4;h++){s[h*T+r0]=out[2*h];s[h*T+r0+1]=out[2*h+1];}
  }
}
__attribute__((noinline)) void scores_noq(){
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int r0=0;r0<T;r0+=2){
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();}
    __m256 qv[4]; for(int h=0;h<4;h++) qv[h]=_mm256_loadu_ps(q+h*D+r0);
    for(int c=0;c<D;c+=16){
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c));
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16));
      for(int h=0;h<4;h++){a[h][0]=_mm256_fmadd_ps(qv[h],e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv[h],e1,a[h][1]);}
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask));
      for(int h=0;h<4;h++){a[h][0]=_mm256_fmadd_ps(qv[h],o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv[h],o1,a[h][1]);}
    }
    float out[8]; __m256 f[8]={a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]};
    _mm256_storeu_ps(out,tsum(f));
    for(int h=0;h<4;h++){s[h*T+r0]=out[2*h];s[h*T+r0+1]=out[2*h+1];}
  }
}

__attribute__((noinline)) void scores_notsum(){
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int r0=0;r0<T;r0+=2){
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();}
    for(int c=0;c<D;c+=16){
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c));
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);}
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);}
    }
    for(int h=0;h<4;h++){_mm256_storeu_ps(s+8*(2*h), _mm256_add_ps(a[h][0],a[h][1]));}
  }
}

static inline __m256 tsum2(__m256* a){
  __m128 t[8]; for(int i=0;i<8;i++) t[i]=_mm_add_ps(_mm256_castps256_ps128(a[i]),_mm256_extractf128_ps(a[i],1));
  __m128 u0=_mm_hadd_ps(t[0],t[1]),u1=_mm_hadd_ps(t[2],t[3]),u2=_mm_hadd_ps(t[4],t[5]),u3=_mm_hadd_ps(t[6],t[7]);
  __m128 w0=_mm_hadd_ps(u0,u1),w1=_mm_hadd_ps(u2,u3);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(w0),w1,1);
}
static inline __m128 sum4(__m128 t0,__m128 t1,__m128 t2,__m128 t3){
  __m128 s01=_mm_add_ps(_mm_unpacklo_ps(t0,t1),_mm_unpackhi_ps(t0,t1));
  __m128 s23=_mm_add_ps(_mm_unpacklo_ps(t2,t3),_mm_unpackhi_ps(t2,t3));
  return _mm_add_ps(_mm_movelh_ps(s01,s23),_mm_movehl_ps(s23,s01));
}
static inline __m256 tsum3(__m256* a){
  __m128 t[8]; for(int i=0;i<8;i++) t[i]=_mm_add_ps(_mm256_castps256_ps128(a[i]),_mm256_extractf128_ps(a[i],1));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(sum4(t[0],t[1],t[2],t[3])),sum4(t[4],t[5],t[6],t[7]),1);
}
#define SCORESV(NAME,TS) __attribute__((noinline)) void NAME(){ \
  __m256i mask=_mm256_set1_epi32(0xffff0000); \
  for(int r0=0;r0<T;r0+=2){ \
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();} \
    for(int c=0;c<D;c+=16){ \
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c)); \
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16)); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);} \
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask)); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);} \
    } \
    float out[8]; __m256 f[8]={a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]}; \
    _mm256_storeu_ps(out,TS(f)); \
    for(int h=0;h<4;h++){s[h*T+r0]=out[2*h];s[h*T+r0+1]=out[2*h+1];} \
  } }
SCORESV(scores_ts2,tsum2)
SCORESV(scores_ts3,tsum3)

#define SCORESP(NAME,TS) __attribute__((noinline)) void NAME(){ \
  __m256i mask=_mm256_set1_epi32(0xffff0000); \
  for(int r0=0;r0<T;r0+=2){ \
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();} \
    for(int c=0;c<D;c+=16){ \
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c)); \
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16)); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);} \
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask)); \
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);} \
    } \
    __m256 f[8]={a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]}; \
    _mm256_storeu_ps(s+4*r0,TS(f)); \
  } }
SCORESP(scores_p1,tsum)
SCORESP(scores_p3,tsum3)

__attribute__((noinline)) void scores_direct(){
  __m256i mask=_mm256_set1_epi32(0xffff0000);
  for(int r0=0;r0<T;r0+=2){
    __m256 a[4][2]; for(int h=0;h<4;h++){a[h][0]=_mm256_setzero_ps();a[h][1]=_mm256_setzero_ps();}
    for(int c=0;c<D;c+=16){
      __m256i k0=_mm256_loadu_si256((const __m256i*)(krows[r0]+c)), k1=_mm256_loadu_si256((const __m256i*)(krows[r0+1]+c));
      __m256 e0=_mm256_castsi256_ps(_mm256_slli_epi32(k0,16)), e1=_mm256_castsi256_ps(_mm256_slli_epi32(k1,16));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c); a[h][0]=_mm256_fmadd_ps(qv,e0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,e1,a[h][1]);}
      __m256 o0=_mm256_castsi256_ps(_mm256_and_si256(k0,mask)), o1=_mm256_castsi256_ps(_mm256_and_si256(k1,mask));
      for(int h=0;h<4;h++){__m256 qv=_mm256_loadu_ps(q+h*D+c+8); a[h][0]=_mm256_fmadd_ps(qv,o0,a[h][0]); a[h][1]=_mm256_fmadd_ps(qv,o1,a[h][1]);}
    }
    __m128 t[8]; __m256 f[8]={a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]};
    for(int i=0;i<8;i++) t[i]=_mm_add_ps(_mm256_castps256_ps128(f[i]),_mm256_extractf128_ps(f[i],1));
    __m128 w0=sum4(t[0],t[1],t[2],t[3]), w1=sum4(t[4],t[5],t[6],t[7]);
    _mm_storel_pi((__m64*)(s+0*T+r0),w0); _mm_storeh_pi((__m64*)(s+1*T+r0),w0);
    _mm_storel_pi((__m64*)(s+2*T+r0),w1); _mm_storeh_pi((__m64*)(s+3*T+r0),w1);
  }
}
int main(int argc,char**argv){
  size_t stride = argc>1? atoi(argv[1]) : 2048; // bytes between rows
  size_t voff = argc>2? atoi(argv[2]) : 0;     // extra offset of V buffer
  uint8_t* kb=aligned_alloc(4096, 1<<20); uint8_t* vb=aligned_alloc(4096,(1<<20)+8192);
  for(size_t i=0;i<(1<<20);i++){kb[i]=rand();vb[i]=rand();}
  for(int i=0;i<T;i++){rows[i]=(const uint16_t*)(vb+voff+i*stride); krows[i]=(const uint16_t*)(kb+i*stride);}
  for(int i=0;i<4*D;i++){acc[i]=0;q[i]=0.01f*i;} for(int i=0;i<4*T;i++)p[i]=1e-6f;
  // fma peak
  __m256 a[10]; for(int i=0;i<10;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-3f);
  __m256 b=_mm256_set1_ps(0.999999f), cc=_mm256_set1_ps(1e-7f);
  long n=50000000; double t0=now();
  for(long i=0;i<n;i++){ for(int j=0;j<10;j++) a[j]=_mm256_fmadd_ps(a[j],b,cc);}
  double pk=(now()-t0)/(n*10.0); float sink=0; for(int j=0;j<10;j++){float x[8];_mm256_storeu_ps(x,a[j]);sink+=x[0];}
  int reps=200000;
  for(int v=0;v<13;v++){
    double best=1e9;
    for(int k=0;k<5;k++){ t0=now(); for(int r=0;r<reps;r++){ if(v==0)pv(); else if(v==1) pv2(); else if(v==2) scores(); else if(v==3) scores_h2r4(); else if(v==4) scores_late(); else if(v==5) scores_nodec(); else if(v==6) scores_noq(); else if(v==7) scores_notsum(); else if(v==8) scores_ts2(); else if(v==9) scores_ts3(); else if(v==10) scores_p1(); else if(v==11) scores_p3(); else scores_direct(); __asm__ volatile(""::"r"(acc),"r"(s):"memory");} double t=(now()-t0)/reps; if(t<best)best=t;}
    printf("stride %zu voff %zu %s: %.1f ns/tile, %.0f%% of FMA peak (peak %.3f ns/vFMA)\n",stride,voff,v==0?"pv H4C2":v==1?"pv H2C4":v==2?"scores H4R2":v==3?"scores H2R4":v==4?"scores late":v==5?"scores nodecode":v==6?"scores noqload":v==7?"scores notsum":v==8?"scores tsum-xmm-hadd":v==9?"scores tsum-xmm-unpack":v==10?"scores passmajor tsum":v==11?"scores passmajor unpack":"scores direct64 unpack",best*1e9,1024*pk/best*100,pk*1e9);
  }
  return sink==12345;
}

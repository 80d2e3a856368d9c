// s30: a 70B tile's two loops (8 query heads, d = 128, 16 bf16 rows) timed alone in L1.
// TSC ticks per tile (2048 FMAs of 8 lanes: 1024 scores + 1024 V), best of 9.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
#define D 128
#define T 16
static uint16_t krow[T][D] __attribute__((aligned(64)));   // bf16 K (and V) rows
static float qbuf[8][D] __attribute__((aligned(64)));      // queries, pair order
static float pbuf[8][T] __attribute__((aligned(64)));      // weights [h][t]
static float pbb[T][8][8] __attribute__((aligned(64)));    // weights pre-broadcast [t][h][lane]
static float accbuf[8][D] __attribute__((aligned(64)));
float scores[8][T];
static const float * volatile qsrc = &qbuf[0][0];
static float * volatile accdst = &accbuf[0][0];
#define OPAQUE(p) __asm__ volatile("" : "+r"(p))
static inline __m256 even(const uint16_t* p){ return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)p),16)); }
static inline __m256 odd(const uint16_t* p, __m256 mask){ return _mm256_and_ps(_mm256_loadu_ps((const float*)p), mask); }
static inline __m256 tsum(__m256 a0,__m256 a1,__m256 a2,__m256 a3,__m256 a4,__m256 a5,__m256 a6,__m256 a7){
  __m256 t0=_mm256_hadd_ps(a0,a1),t1=_mm256_hadd_ps(a2,a3),t2=_mm256_hadd_ps(a4,a5),t3=_mm256_hadd_ps(a6,a7);
  __m256 u0=_mm256_hadd_ps(t0,t1),u1=_mm256_hadd_ps(t2,t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0,u1,0x20),_mm256_permute2f128_ps(u0,u1,0x31)); }
// S0: main's loop: groups of 4 heads, 2 rows a pass, the 4 query chunks in registers per chunk.
__attribute__((noinline)) void s0(void){
  const float* q=qsrc; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int g=0; g<8; g+=4) for(int r=0;r<T;r+=2){
    OPAQUE(q);
    __m256 a[4][2]; for(int h=0;h<4;h++) a[h][0]=a[h][1]=_mm256_setzero_ps();
    for(int c=0;c<D;c+=16){
      __m256 k0e=even(&krow[r][c]), k1e=even(&krow[r+1][c]);
      for(int h=0;h<4;h++){ __m256 qq=_mm256_load_ps(q+(g+h)*D+c); a[h][0]=_mm256_fmadd_ps(qq,k0e,a[h][0]); a[h][1]=_mm256_fmadd_ps(qq,k1e,a[h][1]); }
      __m256 k0o=odd(&krow[r][c],mask), k1o=odd(&krow[r+1][c],mask);
      for(int h=0;h<4;h++){ __m256 qq=_mm256_load_ps(q+(g+h)*D+c+8); a[h][0]=_mm256_fmadd_ps(qq,k0o,a[h][0]); a[h][1]=_mm256_fmadd_ps(qq,k1o,a[h][1]); }
    }
    __m256 s=tsum(a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]);
    _mm256_storeu_ps(&scores[g][r*0]+r*8/2, s);
  }
}
// S1: all 8 heads on each decoded chunk, one row a pass, queries as memory operands.
__attribute__((noinline)) void s1(void){
  const float* q=qsrc; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int r=0;r<T;r++){
    OPAQUE(q);
    __m256 a[8]; for(int h=0;h<8;h++) a[h]=_mm256_setzero_ps();
    for(int c=0;c<D;c+=16){
      __m256 ke=even(&krow[r][c]);
      for(int h=0;h<8;h++) a[h]=_mm256_fmadd_ps(ke,_mm256_load_ps(q+h*D+c),a[h]);
      __m256 ko=odd(&krow[r][c],mask);
      for(int h=0;h<8;h++) a[h]=_mm256_fmadd_ps(ko,_mm256_load_ps(q+h*D+c+8),a[h]);
    }
    _mm256_storeu_ps(&scores[0][0]+r*8, tsum(a[0],a[1],a[2],a[3],a[4],a[5],a[6],a[7]));
  }
}
// S2: 2 rows a pass (16 sums), queries as memory operands, 8 heads: too many registers; use 6 heads x 2 rows + 2 heads x 4 rows.
__attribute__((noinline)) void s2(void){
  const float* q=qsrc; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int r=0;r<T;r+=2){
    OPAQUE(q);
    __m256 a[6][2]; for(int h=0;h<6;h++) a[h][0]=a[h][1]=_mm256_setzero_ps();
    for(int c=0;c<D;c+=16){
      __m256 k0=even(&krow[r][c]), k1=even(&krow[r+1][c]);
      for(int h=0;h<6;h++){ a[h][0]=_mm256_fmadd_ps(k0,_mm256_load_ps(q+h*D+c),a[h][0]); a[h][1]=_mm256_fmadd_ps(k1,_mm256_load_ps(q+h*D+c),a[h][1]); }
      k0=odd(&krow[r][c],mask); k1=odd(&krow[r+1][c],mask);
      for(int h=0;h<6;h++){ a[h][0]=_mm256_fmadd_ps(k0,_mm256_load_ps(q+h*D+c+8),a[h][0]); a[h][1]=_mm256_fmadd_ps(k1,_mm256_load_ps(q+h*D+c+8),a[h][1]); }
    }
    _mm256_storeu_ps(&scores[0][0]+r*4, tsum(a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]));
    _mm256_storeu_ps(&scores[4][0]+r*4, tsum(a[4][0],a[4][1],a[5][0],a[5][1],a[4][0],a[4][1],a[5][0],a[5][1]));
  }
  for(int r=0;r<T;r+=4){
    OPAQUE(q);
    __m256 a[2][4]; for(int h=0;h<2;h++) for(int j=0;j<4;j++) a[h][j]=_mm256_setzero_ps();
    for(int c=0;c<D;c+=16){
      for(int half=0;half<2;half++){
        __m256 k[4]; for(int j=0;j<4;j++) k[j]= half? odd(&krow[r+j][c],mask) : even(&krow[r+j][c]);
        for(int h=0;h<2;h++){ __m256 qq=_mm256_load_ps(q+(6+h)*D+c+8*half); for(int j=0;j<4;j++) a[h][j]=_mm256_fmadd_ps(qq,k[j],a[h][j]); }
      }
    }
    _mm256_storeu_ps(&scores[6][0]+r*2, tsum(a[0][0],a[0][1],a[0][2],a[0][3],a[1][0],a[1][1],a[1][2],a[1][3]));
  }
}
// V0: main's loop: groups of 4 heads, 16 columns (2 registers) a head, weights broadcast from memory.
__attribute__((noinline)) void v0(void){
  float* acc=accdst; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int g=0; g<8; g+=4) for(int c=0;c<D;c+=16){
    OPAQUE(acc);
    __m256 a[4][2]; for(int h=0;h<4;h++){ a[h][0]=_mm256_load_ps(acc+(g+h)*D+c); a[h][1]=_mm256_load_ps(acc+(g+h)*D+c+8); }
    for(int t=0;t<T;t++){
      __m256 ve=even(&krow[t][c]), vo=odd(&krow[t][c],mask);
      for(int h=0;h<4;h++){ __m256 p=_mm256_broadcast_ss(&pbuf[g+h][t]); a[h][0]=_mm256_fmadd_ps(p,ve,a[h][0]); a[h][1]=_mm256_fmadd_ps(p,vo,a[h][1]); }
    }
    for(int h=0;h<4;h++){ _mm256_store_ps(acc+(g+h)*D+c,a[h][0]); _mm256_store_ps(acc+(g+h)*D+c+8,a[h][1]); }
  }
}
// V1: 8 heads, 8 columns a head (one half of a pair group), weights pre-broadcast as memory operands.
__attribute__((noinline)) void v1(void){
  float* acc=accdst; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int c=0;c<D;c+=16) for(int half=0;half<2;half++){
    OPAQUE(acc);
    __m256 a[8]; for(int h=0;h<8;h++) a[h]=_mm256_load_ps(acc+h*D+c+8*half);
    for(int t=0;t<T;t++){
      __m256 v= half? odd(&krow[t][c],mask) : even(&krow[t][c]);
      for(int h=0;h<8;h++) a[h]=_mm256_fmadd_ps(v,_mm256_load_ps(pbb[t][h]),a[h]);
    }
    for(int h=0;h<8;h++) _mm256_store_ps(acc+h*D+c+8*half,a[h]);
  }
}
// V2: 6 heads x 16 columns (12 sums), then 2 heads x 32 columns (8 sums), weights pre-broadcast as memory operands.
__attribute__((noinline)) void v2(void){
  float* acc=accdst; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int c=0;c<D;c+=16){
    OPAQUE(acc);
    __m256 a[6][2]; for(int h=0;h<6;h++){ a[h][0]=_mm256_load_ps(acc+h*D+c); a[h][1]=_mm256_load_ps(acc+h*D+c+8); }
    for(int t=0;t<T;t++){
      __m256 ve=even(&krow[t][c]), vo=odd(&krow[t][c],mask);
      for(int h=0;h<6;h++){ a[h][0]=_mm256_fmadd_ps(ve,_mm256_load_ps(pbb[t][h]),a[h][0]); a[h][1]=_mm256_fmadd_ps(vo,_mm256_load_ps(pbb[t][h]),a[h][1]); }
    }
    for(int h=0;h<6;h++){ _mm256_store_ps(acc+h*D+c,a[h][0]); _mm256_store_ps(acc+h*D+c+8,a[h][1]); }
  }
  for(int c=0;c<D;c+=32){
    OPAQUE(acc);
    __m256 a[2][4]; for(int h=0;h<2;h++) for(int j=0;j<4;j++) a[h][j]=_mm256_load_ps(acc+(6+h)*D+c+8*j);
    for(int t=0;t<T;t++){
      __m256 v[4]={even(&krow[t][c]),odd(&krow[t][c],mask),even(&krow[t][c+16]),odd(&krow[t][c+16],mask)};
      for(int h=0;h<2;h++){ __m256 p=_mm256_broadcast_ss(&pbuf[6+h][t]); for(int j=0;j<4;j++) a[h][j]=_mm256_fmadd_ps(p,v[j],a[h][j]); }
    }
    for(int h=0;h<2;h++) for(int j=0;j<4;j++) _mm256_store_ps(acc+(6+h)*D+c+8*j,a[h][j]);
  }
}

// S3: S0 with each pair of halves summed apart: x = qe*ke; x += qo*ko; a += x (one add on a's chain per 16 dims).
__attribute__((noinline)) void s3(void){
  const float* q=qsrc; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int g=0; g<8; g+=4) for(int r=0;r<T;r+=2){
    OPAQUE(q);
    __m256 a[4][2]; for(int h=0;h<4;h++) a[h][0]=a[h][1]=_mm256_setzero_ps();
    for(int c=0;c<D;c+=16){
      __m256 k0e=even(&krow[r][c]), k1e=even(&krow[r+1][c]);
      __m256 k0o=odd(&krow[r][c],mask), k1o=odd(&krow[r+1][c],mask);
      for(int h=0;h<4;h++){ __m256 qe=_mm256_load_ps(q+(g+h)*D+c), qo=_mm256_load_ps(q+(g+h)*D+c+8);
        __m256 x=_mm256_fmadd_ps(qo,k0o,_mm256_mul_ps(qe,k0e)); a[h][0]=_mm256_add_ps(a[h][0],x);
        __m256 y=_mm256_fmadd_ps(qo,k1o,_mm256_mul_ps(qe,k1e)); a[h][1]=_mm256_add_ps(a[h][1],y); }
    }
    __m256 s=tsum(a[0][0],a[0][1],a[1][0],a[1][1],a[2][0],a[2][1],a[3][0],a[3][1]);
    _mm256_storeu_ps(&scores[g][r*0]+r*8/2, s);
  }
}
// V4: V0 with each pair of tokens summed apart: x = p_t*v_t; x += p_t1*v_t1; a += x.
__attribute__((noinline)) void v4(void){
  float* acc=accdst; const __m256 mask=_mm256_castsi256_ps(_mm256_set1_epi32(0xffff0000));
  for(int g=0; g<8; g+=4) for(int c=0;c<D;c+=16){
    OPAQUE(acc);
    __m256 a[4][2]; for(int h=0;h<4;h++){ a[h][0]=_mm256_load_ps(acc+(g+h)*D+c); a[h][1]=_mm256_load_ps(acc+(g+h)*D+c+8); }
    for(int t=0;t<T;t+=2){
      __m256 ve0=even(&krow[t][c]), vo0=odd(&krow[t][c],mask), ve1=even(&krow[t+1][c]), vo1=odd(&krow[t+1][c],mask);
      for(int h=0;h<4;h++){ __m256 p0=_mm256_broadcast_ss(&pbuf[g+h][t]), p1=_mm256_broadcast_ss(&pbuf[g+h][t+1]);
        a[h][0]=_mm256_add_ps(a[h][0],_mm256_fmadd_ps(p1,ve1,_mm256_mul_ps(p0,ve0)));
        a[h][1]=_mm256_add_ps(a[h][1],_mm256_fmadd_ps(p1,vo1,_mm256_mul_ps(p0,vo0))); }
    }
    for(int h=0;h<4;h++){ _mm256_store_ps(acc+(g+h)*D+c,a[h][0]); _mm256_store_ps(acc+(g+h)*D+c+8,a[h][1]); }
  }
}
typedef void (*fn)(void);
static double bench(fn f){ double best=1e30; for(int rep=0;rep<9;rep++){ uint64_t t0=__rdtsc(); for(int i=0;i<20000;i++){ f(); __asm__ volatile("":::"memory"); } uint64_t t1=__rdtsc(); double c=(double)(t1-t0)/20000; if(c<best)best=c;} return best; }
static void peak(void){ __m256 a0=_mm256_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0; __m256 x=_mm256_set1_ps(1.0001f), y=_mm256_set1_ps(0.999f);
  for(int j=0;j<1024/10;j++){ a0=_mm256_fmadd_ps(x,y,a0);a1=_mm256_fmadd_ps(x,y,a1);a2=_mm256_fmadd_ps(x,y,a2);a3=_mm256_fmadd_ps(x,y,a3);a4=_mm256_fmadd_ps(x,y,a4);a5=_mm256_fmadd_ps(x,y,a5);a6=_mm256_fmadd_ps(x,y,a6);a7=_mm256_fmadd_ps(x,y,a7);a8=_mm256_fmadd_ps(x,y,a8);a9=_mm256_fmadd_ps(x,y,a9);
    __asm__ volatile("" : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7),"+x"(a8),"+x"(a9)); }
  _mm256_storeu_ps(&scores[0][0],_mm256_add_ps(a0,a9)); }
int main(){
  for(int r=0;r<T;r++)for(int j=0;j<D;j++)krow[r][j]=0x3f80+(j&7);
  for(int h=0;h<8;h++)for(int j=0;j<D;j++)qbuf[h][j]=1e-3f*j;
  for(int t=0;t<T;t++)for(int h=0;h<8;h++){pbuf[h][t]=1e-7f*(t+h);for(int l=0;l<8;l++)pbb[t][h][l]=pbuf[h][t];}
  double pk=bench(peak)*2048.0/1020.0;
  printf("peak (per 2048 FMAs): %.0f ticks\n", pk);
  struct { const char* name; fn f; } v[]={{"S0 main: 4 heads x 2 rows, q in registers",s0},{"S1 8 heads x 1 row, q memory operands",s1},{"S2 6 heads x 2 rows + 2 x 4, q memory",s2},
    {"V0 main: 4 heads x 16 columns, p broadcast",v0},{"V1 8 heads x 8 columns, p pre-broadcast memory",v1},{"V2 6 heads x 16 columns + 2 x 32, p pre-broadcast",v2},{"S3 S0, halves summed apart",s3},{"V4 V0, token pairs summed apart",v4}};
  for(int i=0;i<8;i++){ double t=bench(v[i].f); printf("%-52s %5.0f ticks  %3.0f%% of peak\n", v[i].name, t, 100*pk/t); }
  return 0; }

// da_portable.h: the one small portable layer under the kernels of kernels/hip.
//
// The same kernel source builds three ways, and this header is all that
// differs between them:
//   * HIP  (clang -x hip --offload-device-only, or hiprtc): AMD builtins only,
//          no HIP header needed (clang's HIP wrapper supplies __global__ and
//          __shared__); wave size 64 on gfx9 (__AMDGCN_WAVEFRONT_SIZE).
//   * CUDA (nvcc or NVRTC): no system header at all; inline PTX for what the
//          CUDA headers would otherwise provide (conversions, ex2, ld.nc).
//          Wave (warp) size 32.
//   * CPU emulation (kernels/cuda/test/cuda_emu.h included first, with
//          DA_EMULATE_PORTABLE defined): fibers; wave size DA_EMU_WAVE (32 or
//          64), so both wave widths' index arithmetic is testable on a CPU.
//
// What it provides (all names dap_* / DAP_*, plus DA_DEVICE and DA_KERNEL):
//   DAP_WAVE                      lanes per wavefront (compile-time constant)
//   dap_tid(), dap_bid_x/y/z()    thread index in the block, block indices
//   dap_barrier()                 __syncthreads (workgroup barrier + LDS fences)
//   dap_wave_sync()               __syncwarp: orders the wavefront's LDS accesses
//                                 (shuffles do not; compute-sanitizer's racecheck
//                                 counts the difference)
//   dap_uniform(v)                v, which the caller knows is the same in the whole wavefront
//   dap_xor_exchange<N>(v, o, m)  o[i] = v[i] of lane (lane ^ m), m < DAP_WAVE
//   dap_xor_sum/max<LO, HI, N>    butterfly over masks LO, 2 LO, ..., < HI
//   dap_exp2(x)                   2^x, exp2(-inf) = 0 (approximate, ~1 ulp)
//   dap_log2(x)                   log2 x (approximate, no denormal care: for x
//                                 of 0, NaN or >= 1, as a softmax sum is)
//   dap_u4, dap_ld16, dap_ld_stream16, dap_st16   16-byte vectors, loads, stores
//   dap_bf16/f16 <-> f32          conversions (round to nearest even)
//   DAP_LAUNCH_BOUNDS(threads, min_blocks_per_sm)
//   dap_gather_u32<N>(v, o, src)  o[j] = v of lane src[j] (same wavefront)
// and, only where DAP_MFMA is defined (gfx90a / gfx942, or the emulation with
// kernels/hip/test/mfma_emu.h at wave 64), the wave-64 matrix cores:
//   dap_f32x4                     4 floats (the accumulator of one lane)
//   dap_mfma_16x16x16_f16/bf16(c, a0, a1, b0, b1)  D = A B + C, 16x16x16,
//                                 each operand's 4 16-bit elements of a lane
//                                 packed in two words (element 0 in a0's low half)
#pragma once

#if defined(DA_EMULATE_PORTABLE)
// ============================================================================
// CPU emulation: cuda_emu.h (already included) runs a block as fibers.
// ============================================================================
#ifndef DA_EMU_WAVE
#error "include kernels/cuda/test/cuda_emu.h (which defines DA_EMU_WAVE) first"
#endif
#define DAP_WAVE DA_EMU_WAVE
#define DA_KERNEL extern "C"
#define DAP_LAUNCH_BOUNDS(threads, min_blocks)
#define DAP_HOST_DEVICE

struct alignas(16) dap_u4 {
    unsigned x, y, z, w;
};
inline int dap_tid() { return (int)threadIdx.x; }
inline int dap_bid_x() { return (int)blockIdx.x; }
inline int dap_bid_y() { return (int)blockIdx.y; }
inline int dap_bid_z() { return (int)blockIdx.z; }
inline void dap_barrier() { __syncthreads(); }
inline void dap_wave_sync() { emu::yield_as(emu::AT_WARP_BARRIER); }
inline int dap_uniform(int v) { return v; }
inline float dap_u2f(unsigned u) { return __uint_as_float(u); }
inline unsigned dap_f2u(float f) { return __float_as_uint(f); }
inline float dap_exp2(float x) { return std::exp2(x); }
inline float dap_log2(float x) { return std::log2(x); }
inline float dap_fmax(float a, float b) { return std::fmax(a, b); }
inline float dap_fma(float a, float b, float c) { return std::fma(a, b, c); }
inline int dap_ld_i32(const int* p) { return *p; }
inline dap_u4 dap_ld16(const void* p) {
    dap_u4 r;
    memcpy(&r, p, 16);
    return r;
}
inline dap_u4 dap_ld_stream16(const void* p) { return dap_ld16(p); }
inline void dap_st16(void* p, dap_u4 v) { memcpy(p, &v, 16); }
// One exchange of a whole array costs two fiber switches, not 2 N.
template <int N>
inline void dap_xor_exchange(const float (&v)[N], float (&o)[N], int mask) {
    static float buf[emu::kMaxThreads][N];
    const int t = emu::cur;
    for (int i = 0; i < N; ++i) buf[t][i] = v[i];
    emu::yield_as(emu::AT_WARP_BARRIER);
    const int src = (t & ~(DAP_WAVE - 1)) | ((t & (DAP_WAVE - 1)) ^ mask);
    for (int i = 0; i < N; ++i) o[i] = buf[src][i];
    emu::yield_as(emu::AT_WARP_BARRIER);
}
template <int N>
inline void dap_gather_u32(unsigned v, unsigned (&o)[N], const int (&src)[N]) {
    static unsigned buf[emu::kMaxThreads];
    const int t = emu::cur;
    buf[t] = v;
    emu::yield_as(emu::AT_WARP_BARRIER);
    for (int j = 0; j < N; ++j) o[j] = buf[(t & ~(DAP_WAVE - 1)) | (src[j] & (DAP_WAVE - 1))];
    emu::yield_as(emu::AT_WARP_BARRIER);
}
inline float dap_bf16_to_f32(unsigned short h) { return host_bf16_to_f32(h); }
inline float dap_f16_to_f32(unsigned short h) { return host_f16_to_f32(h); }
inline unsigned short dap_f32_to_bf16(float x) { return host_f32_to_bf16(x); }
inline unsigned short dap_f32_to_f16(float x) { return host_f32_to_f16(x); }
// The matrix cores come from a test header (kernels/hip/test/mfma_emu.h, which
// defines DA_EMU_MFMA, dap_f32x4 and dap_mfma_*), wave 64 only.
#if defined(DA_EMU_MFMA) && DA_EMU_WAVE == 64
#define DAP_MFMA 1
#endif

#elif defined(__HIP__) || defined(__HIPCC_RTC__)
// ============================================================================
// HIP (AMD): builtins only.
// ============================================================================
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define DAP_WAVE __AMDGCN_WAVEFRONT_SIZE
#else
#define DAP_WAVE 64
#endif
#define DA_DEVICE __device__ inline __attribute__((always_inline))
#define DA_KERNEL extern "C" __global__
#define DAP_HOST_DEVICE __host__ __device__
#ifndef __launch_bounds__
#define __launch_bounds__(threads, ...) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#endif
// min_blocks workgroups a CU: as many waves per SIMD (EU) as each workgroup
// puts on one, which bounds VGPRs (512 / waves on gfx90a / gfx942).
#define DAP_LAUNCH_BOUNDS(threads, min_blocks)                          \
    __attribute__((amdgpu_flat_work_group_size(1, threads),            \
                   amdgpu_waves_per_eu((min_blocks) * (((threads) + 4 * DAP_WAVE - 1) / (4 * DAP_WAVE)))))

struct alignas(16) dap_u4 {
    unsigned x, y, z, w;
};
typedef unsigned dap_v4u __attribute__((ext_vector_type(4)));

DA_DEVICE int dap_tid() { return (int)__builtin_amdgcn_workitem_id_x(); }
DA_DEVICE int dap_bid_x() { return (int)__builtin_amdgcn_workgroup_id_x(); }
DA_DEVICE int dap_bid_y() { return (int)__builtin_amdgcn_workgroup_id_y(); }
DA_DEVICE int dap_bid_z() { return (int)__builtin_amdgcn_workgroup_id_z(); }
// What HIP's __syncthreads is: LDS release, s_barrier, LDS acquire.
DA_DEVICE void dap_barrier() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// A wavefront runs in lockstep on gfx9; this keeps the compiler from moving
// LDS accesses across the point.
DA_DEVICE void dap_wave_sync() { __builtin_amdgcn_wave_barrier(); }
// A value the same in every lane, as the compiler cannot prove (scalar registers, uniform branches).
DA_DEVICE int dap_uniform(int v) { return __builtin_amdgcn_readfirstlane(v); }
DA_DEVICE float dap_u2f(unsigned u) { return __builtin_bit_cast(float, u); }
DA_DEVICE unsigned dap_f2u(float f) { return __builtin_bit_cast(unsigned, f); }
#if __has_builtin(__builtin_amdgcn_exp2f)
DA_DEVICE float dap_exp2(float x) { return __builtin_amdgcn_exp2f(x); }  // v_exp_f32
#else
// ROCm 5's hiprtc (clang 15) lacks the builtin; the library exp2 lowers to the same instruction.
DA_DEVICE float dap_exp2(float x) { return __builtin_exp2f(x); }
#endif
#if __has_builtin(__builtin_amdgcn_logf)
DA_DEVICE float dap_log2(float x) { return __builtin_amdgcn_logf(x); }  // v_log_f32
#else
DA_DEVICE float dap_log2(float x) { return __builtin_log2f(x); }
#endif
DA_DEVICE float dap_fmax(float a, float b) { return __builtin_fmaxf(a, b); }
DA_DEVICE float dap_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
DA_DEVICE int dap_ld_i32(const int* p) { return *p; }
DA_DEVICE dap_u4 dap_ld16(const void* p) {
    const dap_v4u v = *reinterpret_cast<const dap_v4u*>(p);
    return dap_u4{v.x, v.y, v.z, v.w};
}
// KV is read once: a non-temporal load (glc/slc-style streaming hint).
DA_DEVICE dap_u4 dap_ld_stream16(const void* p) {
    const dap_v4u v = __builtin_nontemporal_load(reinterpret_cast<const dap_v4u*>(p));
    return dap_u4{v.x, v.y, v.z, v.w};
}
DA_DEVICE void dap_st16(void* p, dap_u4 v) {
    const dap_v4u w = {v.x, v.y, v.z, v.w};
    *reinterpret_cast<dap_v4u*>(p) = w;
}
DA_DEVICE float dap_shfl_xor(float v, int mask) {
    const int lane = (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, __builtin_bit_cast(int, v)));
}
template <int N>
DA_DEVICE void dap_xor_exchange(const float (&v)[N], float (&o)[N], int mask) {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = dap_shfl_xor(v[i], mask);
}
template <int N>
DA_DEVICE void dap_gather_u32(unsigned v, unsigned (&o)[N], const int (&src)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = (unsigned)__builtin_amdgcn_ds_bpermute(src[j] << 2, (int)v);
}
DA_DEVICE float dap_bf16_to_f32(unsigned short h) { return dap_u2f((unsigned)h << 16); }
DA_DEVICE float dap_f16_to_f32(unsigned short h) { return (float)__builtin_bit_cast(_Float16, h); }
DA_DEVICE unsigned short dap_f32_to_f16(float x) { return __builtin_bit_cast(unsigned short, (_Float16)x); }
DA_DEVICE unsigned short dap_f32_to_bf16(float x) {
    unsigned u = dap_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                                   // nearest even
    return (unsigned short)(u >> 16);
}
// Matrix cores (CDNA2 / CDNA3, wave 64): v_mfma_f32_16x16x16f16 and
// v_mfma_f32_16x16x16bf16_1k (gfx942 spells them v_mfma_f32_16x16x16_f16 /
// _bf16); the same operand layouts on both.
#if (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)) && DAP_WAVE == 64
#define DAP_MFMA 1
typedef float dap_f32x4 __attribute__((ext_vector_type(4)));
typedef _Float16 dap_f16x4 __attribute__((ext_vector_type(4)));
typedef short dap_i16x4 __attribute__((ext_vector_type(4)));
typedef unsigned dap_u32x2 __attribute__((ext_vector_type(2)));
DA_DEVICE dap_f32x4 dap_mfma_16x16x16_f16(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    const dap_u32x2 a = {a0, a1}, b = {b0, b1};
    return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(dap_f16x4, a), __builtin_bit_cast(dap_f16x4, b),
                                                 c, 0, 0, 0);
}
DA_DEVICE dap_f32x4 dap_mfma_16x16x16_bf16(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    const dap_u32x2 a = {a0, a1}, b = {b0, b1};
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(dap_i16x4, a),
                                                     __builtin_bit_cast(dap_i16x4, b), c, 0, 0, 0);
}
#endif

#else
// ============================================================================
// CUDA (nvcc, NVRTC): no headers; PTX where the CUDA headers would be used.
// ============================================================================
#define DAP_WAVE 32
#define DA_DEVICE __device__ __forceinline__
#define DA_KERNEL extern "C" __global__
#define DAP_HOST_DEVICE __host__ __device__
#define DAP_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)

struct __align__(16) dap_u4 {
    unsigned x, y, z, w;
};
DA_DEVICE int dap_tid() { return (int)threadIdx.x; }
DA_DEVICE int dap_bid_x() { return (int)blockIdx.x; }
DA_DEVICE int dap_bid_y() { return (int)blockIdx.y; }
DA_DEVICE int dap_bid_z() { return (int)blockIdx.z; }
DA_DEVICE void dap_barrier() { __syncthreads(); }
DA_DEVICE void dap_wave_sync() { __syncwarp(); }
DA_DEVICE int dap_uniform(int v) { return v; }
DA_DEVICE float dap_u2f(unsigned u) { return __uint_as_float(u); }
DA_DEVICE unsigned dap_f2u(float f) { return __float_as_uint(f); }
DA_DEVICE float dap_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
DA_DEVICE float dap_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
DA_DEVICE float dap_fmax(float a, float b) { return fmaxf(a, b); }
DA_DEVICE float dap_fma(float a, float b, float c) { return fmaf(a, b, c); }
DA_DEVICE int dap_ld_i32(const int* p) { return __ldg(p); }
DA_DEVICE dap_u4 dap_ld16(const void* p) {
    dap_u4 r;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
// KV is read once: keep it out of L1.
DA_DEVICE dap_u4 dap_ld_stream16(const void* p) {
    dap_u4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
DA_DEVICE void dap_st16(void* p, dap_u4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
template <int N>
DA_DEVICE void dap_xor_exchange(const float (&v)[N], float (&o)[N], int mask) {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = __shfl_xor_sync(0xffffffffu, v[i], mask);
}
template <int N>
DA_DEVICE void dap_gather_u32(unsigned v, unsigned (&o)[N], const int (&src)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = __shfl_sync(0xffffffffu, v, src[j]);
}
DA_DEVICE float dap_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
DA_DEVICE float dap_f16_to_f32(unsigned short h) {
    float f;
    asm("{ .reg .f16 t;\n mov.b16 t, %1;\n cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}
DA_DEVICE unsigned short dap_f32_to_bf16(float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
DA_DEVICE unsigned short dap_f32_to_f16(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
#endif

#if defined(DA_EMULATE_PORTABLE)
#undef DA_DEVICE
#define DA_DEVICE inline
#endif

// ---------------------------------------------------------------------------
// Shared by all three.
// ---------------------------------------------------------------------------
DA_DEVICE float dap_neg_inf() { return dap_u2f(0xff800000u); }
DA_DEVICE float dap_nan() { return dap_u2f(0x7fffffffu); }
DA_DEVICE int dap_min(int a, int b) { return a < b ? a : b; }
DA_DEVICE long long dap_min_ll(long long a, long long b) { return a < b ? a : b; }
DA_DEVICE int dap_lane() { return dap_tid() & (DAP_WAVE - 1); }
DA_DEVICE int dap_wave() { return dap_tid() / DAP_WAVE; }

// Butterflies over the xor masks LO, 2 LO, ..., below HI (powers of two): with
// LO = 1, HI = W, every lane of each aligned group of W lanes ends with the
// group's total; with LO = W, HI = DAP_WAVE, the lanes at the same position of
// every group do.
template <int LO, int HI, int N>
DA_DEVICE void dap_xor_sum(float (&v)[N]) {
#pragma unroll
    for (int m = LO; m < HI; m <<= 1) {
        float o[N];
        dap_xor_exchange<N>(v, o, m);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] += o[i];
    }
}
template <int LO, int HI, int N>
DA_DEVICE void dap_xor_max(float (&v)[N]) {
#pragma unroll
    for (int m = LO; m < HI; m <<= 1) {
        float o[N];
        dap_xor_exchange<N>(v, o, m);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = dap_fmax(v[i], o[i]);
    }
}

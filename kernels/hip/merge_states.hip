// merge_states.hip: the two-way attention-state merge, one source for HIP
// (gfx90a, gfx942; clang or hiprtc), CUDA (sm_80, sm_90; nvcc or NVRTC) and
// the CPU emulation of kernels/hip/test/merge_test.cu. Everything
// vendor-specific is in da_portable.h, plus the three helpers below (mst_exp,
// mst_log, mst_ld_f32). The launch ABI (MergeParams) is
// kernels/cuda/decode_params.h.
//
// Semantics are those of merge_attn_states_<T> in kernels/cuda/decode.cu and
// of decode_attn_core::merge::merge_state, row by row (a row is one token and
// one head; LSEs in natural log):
//   m = fmax(la, lb)                 (a NaN operand is ignored, as fmaxf does)
//   m == -inf or m is NaN:           out = +0 everywhere, out_lse = -inf
//                                    (neither state is read)
//   else wa = exp(la - m), wb = exp(lb - m), total = wa + wb,
//        out = (wa * a + wb * b) / total, out_lse = m + log(total)
// so one NaN LSE beside a finite one gives a NaN row and a NaN LSE, an empty
// state (-inf) beside a finite one gives the other state exactly, and two
// +inf LSEs give NaN. out_lse may be null (then only out is written).
// Any head_dim >= 0 (0 writes only out_lse); f32, f16 and bf16.
//
// Entry points (extern "C", `const MergeParams p` by value):
//   merge_states_<T>, T in {f32, f16, bf16}
// Block MERGE_STATES_THREADS = 256 threads, no shared memory. The work is
// cut into chunks: a row of head_dim elements is ceil(head_dim / EPC) chunks
// (EPC = 16 bytes of elements: 4 f32 or 8 f16/bf16; a row of head_dim 0 is
// one chunk, which writes the LSE), and chunk c of the num_tokens *
// num_heads rows, row-major, is taken by thread
//   c = (blockIdx.y * MERGE_STATES_GRID_X + blockIdx.x) * 256 + threadIdx.x
// The host launches workgroups = ceil(rows * chunks / 256) as the grid
//   (min(workgroups, MERGE_STATES_GRID_X), ceil(workgroups / MERGE_STATES_GRID_X), 1)
// (threads past the end return at once). No gridDim is read, so nothing
// depends on the wave size. Chunks move as 16-byte loads and stores when the
// row length is a multiple of 16 bytes and the three tensors are 16-byte
// aligned; otherwise element by element. The thread of chunk 0 of a row
// writes its LSE.
#include "da_portable.h"
#include "decode_params.h"

#define MERGE_STATES_THREADS 256
// Workgroups per grid row (a test may shrink it to exercise the y wrap).
#ifndef MERGE_STATES_GRID_X
#define MERGE_STATES_GRID_X 65536
#endif

// ---------------------------------------------------------------------------
// Helpers this file needs beyond da_portable.h: accurate natural exp and log
// (as expf / logf in the CUDA kernel, not the approximate exp2 of the decode
// kernels), and a plain f32 load.
// ---------------------------------------------------------------------------
#if defined(DA_EMULATE_PORTABLE)
inline float mst_exp(float x) { return std::exp(x); }
inline float mst_log(float x) { return std::log(x); }
#elif defined(__HIP__) || defined(__HIPCC_RTC__)
DA_DEVICE float mst_exp(float x) { return __builtin_expf(x); }
DA_DEVICE float mst_log(float x) { return __builtin_logf(x); }
#else
DA_DEVICE float mst_exp(float x) { return expf(x); }
DA_DEVICE float mst_log(float x) { return logf(x); }
#endif
DA_DEVICE bool mst_isnan(float x) { return x != x; }
DA_DEVICE float mst_ld_f32(const float* p, long long i) { return p[i]; }

// ---------------------------------------------------------------------------
// Element types (16-bit ones as bit patterns).
// ---------------------------------------------------------------------------
struct mst_f32 {};
struct mst_f16 {};
struct mst_bf16 {};

template <typename T>
struct MstElem;

template <>
struct MstElem<mst_f32> {
    static constexpr int BYTES = 4;
    static constexpr int EPC = 4;  // elements per 16 bytes
    DA_DEVICE static float load1(const void* base, long long i) { return reinterpret_cast<const float*>(base)[i]; }
    DA_DEVICE static void store1(void* base, long long i, float v) { reinterpret_cast<float*>(base)[i] = v; }
    DA_DEVICE static void unpack(const dap_u4& r, float* f) {
        f[0] = dap_u2f(r.x);
        f[1] = dap_u2f(r.y);
        f[2] = dap_u2f(r.z);
        f[3] = dap_u2f(r.w);
    }
    DA_DEVICE static dap_u4 pack(const float* f) {
        return dap_u4{dap_f2u(f[0]), dap_f2u(f[1]), dap_f2u(f[2]), dap_f2u(f[3])};
    }
};

// What f16 and bf16 share: 8 elements a chunk, two a 32-bit word.
template <typename Conv>
struct MstElem16 {
    static constexpr int BYTES = 2;
    static constexpr int EPC = 8;
    DA_DEVICE static float load1(const void* base, long long i) {
        return Conv::to_f32(reinterpret_cast<const unsigned short*>(base)[i]);
    }
    DA_DEVICE static void store1(void* base, long long i, float v) {
        reinterpret_cast<unsigned short*>(base)[i] = Conv::from_f32(v);
    }
    DA_DEVICE static void unpack2(unsigned w, float* f) {
        f[0] = Conv::to_f32((unsigned short)(w & 0xffffu));
        f[1] = Conv::to_f32((unsigned short)(w >> 16));
    }
    DA_DEVICE static void unpack(const dap_u4& r, float* f) {
        unpack2(r.x, f);
        unpack2(r.y, f + 2);
        unpack2(r.z, f + 4);
        unpack2(r.w, f + 6);
    }
    DA_DEVICE static unsigned pack2(float a, float b) {
        return (unsigned)Conv::from_f32(a) | ((unsigned)Conv::from_f32(b) << 16);
    }
    DA_DEVICE static dap_u4 pack(const float* f) {
        return dap_u4{pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7])};
    }
};
struct MstConvF16 {
    DA_DEVICE static float to_f32(unsigned short h) { return dap_f16_to_f32(h); }
    DA_DEVICE static unsigned short from_f32(float x) { return dap_f32_to_f16(x); }
};
struct MstConvBf16 {
    DA_DEVICE static float to_f32(unsigned short h) { return dap_bf16_to_f32(h); }
    DA_DEVICE static unsigned short from_f32(float x) { return dap_f32_to_bf16(x); }
};
template <>
struct MstElem<mst_f16> : MstElem16<MstConvF16> {};
template <>
struct MstElem<mst_bf16> : MstElem16<MstConvBf16> {};

// ---------------------------------------------------------------------------
// The merge: one thread per chunk of EPC elements of a row.
// ---------------------------------------------------------------------------
template <typename T>
DA_DEVICE void merge_states_body(const MergeParams& p) {
    typedef MstElem<T> E;
    constexpr int EPC = E::EPC;
    const int head_dim = p.head_dim;
    const long long rows = (long long)p.num_tokens * p.num_heads;
    const long long chunks_per_row = head_dim > 0 ? (head_dim + EPC - 1) / EPC : 1;
    const long long c =
        ((long long)dap_bid_y() * MERGE_STATES_GRID_X + dap_bid_x()) * MERGE_STATES_THREADS + dap_tid();
    if (head_dim < 0 || c >= rows * chunks_per_row) return;
    const long long row = c / chunks_per_row;
    const int d0 = (int)(c - row * chunks_per_row) * EPC;

    const float la = mst_ld_f32(p.prefix_lse, row);
    const float lb = mst_ld_f32(p.suffix_lse, row);
    const float m = dap_fmax(la, lb);
    const bool empty = m == dap_neg_inf() || mst_isnan(m);
    float wa = 0.f, wb = 0.f, total = 1.f;
    if (!empty) {
        wa = mst_exp(la - m);
        wb = mst_exp(lb - m);
        total = wa + wb;
    }
    if (d0 == 0 && p.out_lse != nullptr) p.out_lse[row] = empty ? dap_neg_inf() : m + mst_log(total);
    if (d0 >= head_dim) return;  // head_dim 0: the LSE was all

    const long long first = row * head_dim + d0;  // element index of the chunk
    const unsigned long long addresses = (unsigned long long)p.prefix | (unsigned long long)p.suffix |
                                         (unsigned long long)p.out;
    if (head_dim % EPC == 0 && (addresses & 15u) == 0) {
        char* out = reinterpret_cast<char*>(p.out) + first * E::BYTES;
        float o[EPC];
        if (empty) {
#pragma unroll
            for (int i = 0; i < EPC; ++i) o[i] = 0.f;
        } else {
            float a[EPC], b[EPC];
            E::unpack(dap_ld_stream16(reinterpret_cast<const char*>(p.prefix) + first * E::BYTES), a);
            E::unpack(dap_ld_stream16(reinterpret_cast<const char*>(p.suffix) + first * E::BYTES), b);
#pragma unroll
            for (int i = 0; i < EPC; ++i) o[i] = (wa * a[i] + wb * b[i]) / total;
        }
        dap_st16(out, E::pack(o));
        return;
    }
    const int n = dap_min(EPC, head_dim - d0);
    for (int i = 0; i < n; ++i) {
        float o = 0.f;
        if (!empty) o = (wa * E::load1(p.prefix, first + i) + wb * E::load1(p.suffix, first + i)) / total;
        E::store1(p.out, first + i, o);
    }
}

// ---------------------------------------------------------------------------
// Entry points. Few registers: launch bounds (256, 4) cap them at 64 on
// NVIDIA and ask for 4 waves a SIMD on AMD, well above what the body needs.
// ---------------------------------------------------------------------------
#define MST_ENTRY(TNAME, TYPE)                                                                              \
    DA_KERNEL void DAP_LAUNCH_BOUNDS(MERGE_STATES_THREADS, 4) merge_states_##TNAME(const MergeParams p) { \
        merge_states_body<TYPE>(p);                                                                         \
    }

MST_ENTRY(f32, mst_f32)
MST_ENTRY(f16, mst_f16)
MST_ENTRY(bf16, mst_bf16)

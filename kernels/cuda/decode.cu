// decode.cu: FlashDecoding-class decode attention over a paged KV cache.
//
// One query token per sequence, long KV. The launch ABI (DecodeParams,
// MergeParams, the tensor layouts, the split rule and the guards) is in
// decode_params.h; this file includes nothing else, so that it compiles both
// with nvcc and with NVRTC at run time.
//
// Entry points (extern "C", params by value, DECODE_THREADS = 128 threads),
// T in {f32, f16, bf16}, D in {64, 80, 96, 112, 120, 128, 192, 256}:
//   decode_mma_<T>_d<D>[_anyblock|_packed|_batch]  the tensor-core kernel
//       (decode_mma.cuh; f16 and bf16, D <= 128 and 256): auto's default
//   decode_stream_<T>_d<D>, decode_stream_reduce[_wide|_batch]_<T>_d<D>
//       the streaming kernel and the split reducers (decode_stream.cuh):
//       what the tensor-core kernel does not take, and its reducers
//   decode_attn_<T>_d<D>, decode_attn_reduce_<T>_d<D>  the staged kernel
//       below and its reducer (opt-in)
//   merge_attn_states_<T>        grid (num_tokens, num_heads)
// The staged and stream kernels' shared memory is static and below 48 KB;
// the tensor-core kernel's ring is dynamic (the host sets its maximum).
//
// Design of decode_attn (one CTA = one sequence, one KV head, one split):
//  * GQA packing: the CTA serves the g = num_q_heads / num_kv_heads query
//    heads of its KV head; each K and V byte is read from global memory once.
//  * Q of the g heads is staged in shared memory as f32, pre-scaled by
//    scale_log2, so scores come out in log2 units (exp2 throughout).
//  * The split's tokens stream through a ring of STAGES shared-memory stages
//    of TILE tokens (K and V rows, each row padded to an odd number of
//    16-byte chunks so that rows fall on distinct banks), filled with 16-byte
//    cp.async.cg; the slot of each token is looked up two stages ahead of
//    its copy, and the copy STAGES-1 stages ahead of its use.
//  * QK: thread (token tt, head lane hh) computes the scores of its token for
//    heads hh, hh + 128/TILE, ... reading its K row and the (broadcast) Q rows
//    from shared memory (small groups split each dot product over 2-8 lanes
//    of a warp instead of idling); the online softmax (max by shuffles across
//    the TILE lanes of a head) leaves p = 2^(s - m) in shared memory, with the
//    rescale factor and the running max of each head.
//  * PV: thread (head row hr, dim slice dc) owns 8 output dims of heads
//    hr, hr + rows, ...: rescales its f32 accumulators and adds p * v (and p,
//    for the denominator) for the stage's tokens, reading V rows from shared
//    memory (small groups split the tokens over 2-4 phases, added at the end).
//  * Unsplit (num_splits == 1): out = acc / l (and, where out_lse is not
//    null, the row's LSE (m + log2 l) ln 2). Split: unnormalised acc and
//    (m, l) per row; decode_attn_reduce merges the active rows and writes
//    out and the LSE.
//  * A slot outside the pool is never read (zero-filled instead); it raises a
//    flag that turns the CTA's outputs into NaN.
#include "decode_params.h"

#define DECODE_THREADS 128
#define DECODE_MAX_QK_ELEMS 4096  // g * head_dim served by one CTA, at most
#ifndef QK_CHUNK_UNROLL
#define QK_CHUNK_UNROLL 1
#endif

// ---------------------------------------------------------------------------
// Portable layer: everything that a HIP port has to redefine (a port, or the
// CPU emulation of test/cuda_emu.h, defines DA_PORTABLE_LAYER and supplies
// these itself). Wave size, shuffles, exp2, the async copy, conversions.
// ---------------------------------------------------------------------------
#ifndef DA_PORTABLE_LAYER
#define DA_DEVICE __device__ __forceinline__
// A device function compiled on its own, called rather than inlined.
#define DA_DEVICE_CALLED __device__ __noinline__
#define DA_WARP_SIZE 32

DA_DEVICE float da_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }

// 2^x; ex2(-inf) = +0.
DA_DEVICE float da_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// log2(x), for the LSE epilogues only: the approximate instruction (2 ulp
// on normal inputs; the sums it takes are >= 1), not log2f's ~40-instruction
// software log on the reducer's tail. log2(0) = -inf.
DA_DEVICE float da_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// *at = v where pred holds, as one predicated store: where the value is
// computed only for the storing thread, the compiler puts a branch around
// it (BSSY/BSYNC), which every thread pays.
DA_DEVICE void da_store_if(bool pred, float* at, float v) {
    asm volatile("{ .reg .pred p; setp.ne.u32 p, %0, 0; @p st.global.f32 [%1], %2; }" ::"r"((unsigned)pred), "l"(at),
                 "f"(v)
                 : "memory");
}

DA_DEVICE float da_neg_inf() { return __int_as_float(0xff800000); }
DA_DEVICE float da_nan() { return __int_as_float(0x7fffffff); }
DA_DEVICE bool da_isnan(float x) { return x != x; }

DA_DEVICE int da_min(int a, int b) { return a < b ? a : b; }
DA_DEVICE int da_max(int a, int b) { return a > b ? a : b; }

DA_DEVICE unsigned da_smem_addr(const void* ptr) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(ptr));
    return addr;
}

// 16-byte global -> shared copy (both 16-byte aligned); src_bytes 0 writes zeros and reads nothing.
DA_DEVICE void da_cp_async16(void* smem_dst, const void* global_src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(da_smem_addr(smem_dst)), "l"(global_src),
                 "r"(src_bytes)
                 : "memory");
}
// The same copy to a 32-bit shared-memory address (da_smem_addr), so that
// callers can do the address arithmetic outside the asm.
DA_DEVICE void da_cp_async16_shared(unsigned smem_dst, const void* global_src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(global_src), "r"(src_bytes)
                 : "memory");
}
DA_DEVICE void da_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
DA_DEVICE void da_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}


DA_DEVICE uint4 da_ldg16(const void* ptr) { return __ldg(reinterpret_cast<const uint4*>(ptr)); }
// The position of the lowest set bit, from 1; 0 for x = 0.
DA_DEVICE int da_ffs(int x) { return __ffs(x); }

// bf16 / f16 <-> f32 without cuda_bf16.h / cuda_fp16.h.
DA_DEVICE float da_bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
DA_DEVICE float da_bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
DA_DEVICE void da_f16x2_to_f32(unsigned w, float& lo, float& hi) {
    asm("{ .reg .f16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b; }"
        : "=f"(lo), "=f"(hi)
        : "r"(w));
}
DA_DEVICE float da_f16_to_f32(unsigned short h) {
    float f;
    asm("{ .reg .f16 a;\n mov.b16 a, %1;\n cvt.f32.f16 %0, a; }" : "=f"(f) : "h"(h));
    return f;
}
DA_DEVICE unsigned da_f32x2_to_bf16x2(float lo, float hi) {
    unsigned w;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
}
DA_DEVICE unsigned da_f32x2_to_f16x2(float lo, float hi) {
    unsigned w;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
}
DA_DEVICE unsigned short da_f32_to_bf16(float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
DA_DEVICE unsigned short da_f32_to_f16(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
#endif  // DA_PORTABLE_LAYER

// Phase stamps for kernels/cuda/probe/timeline.cu (which defines DA_TIMELINE
// and supplies da_timeline_stamp); nothing otherwise.
#ifdef DA_TIMELINE
#define DA_STAMP(grid, event) da_timeline_stamp(p, grid, event)
#else
#define DA_STAMP(grid, event) \
    do {                      \
    } while (0)
#endif

// ---------------------------------------------------------------------------
// Element types: f32, f16 and bf16 (the last two as their 16-bit patterns).
// ---------------------------------------------------------------------------
struct da_f16 {
    unsigned short bits;
};
struct da_bf16 {
    unsigned short bits;
};

template <typename T>
struct Elem;

template <>
struct Elem<float> {
    static constexpr int BYTES = 4;
    static constexpr int PER_CHUNK = 4;  // elements in 16 bytes
    DA_DEVICE static void unpack(uint4 r, float* f) {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    }
    DA_DEVICE static uint4 pack(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    }
    DA_DEVICE static float load(const void* base, long long i) { return reinterpret_cast<const float*>(base)[i]; }
    DA_DEVICE static void store(void* base, long long i, float v) { reinterpret_cast<float*>(base)[i] = v; }
};

template <>
struct Elem<da_bf16> {
    static constexpr int BYTES = 2;
    static constexpr int PER_CHUNK = 8;
    DA_DEVICE static void unpack(uint4 r, float* f) {
        f[0] = da_bf16_lo(r.x);
        f[1] = da_bf16_hi(r.x);
        f[2] = da_bf16_lo(r.y);
        f[3] = da_bf16_hi(r.y);
        f[4] = da_bf16_lo(r.z);
        f[5] = da_bf16_hi(r.z);
        f[6] = da_bf16_lo(r.w);
        f[7] = da_bf16_hi(r.w);
    }
    DA_DEVICE static uint4 pack(const float* f) {
        return make_uint4(da_f32x2_to_bf16x2(f[0], f[1]), da_f32x2_to_bf16x2(f[2], f[3]),
                          da_f32x2_to_bf16x2(f[4], f[5]), da_f32x2_to_bf16x2(f[6], f[7]));
    }
    DA_DEVICE static float load(const void* base, long long i) {
        return __uint_as_float((unsigned)reinterpret_cast<const unsigned short*>(base)[i] << 16);
    }
    DA_DEVICE static void store(void* base, long long i, float v) {
        reinterpret_cast<unsigned short*>(base)[i] = da_f32_to_bf16(v);
    }
};

template <>
struct Elem<da_f16> {
    static constexpr int BYTES = 2;
    static constexpr int PER_CHUNK = 8;
    DA_DEVICE static void unpack(uint4 r, float* f) {
        da_f16x2_to_f32(r.x, f[0], f[1]);
        da_f16x2_to_f32(r.y, f[2], f[3]);
        da_f16x2_to_f32(r.z, f[4], f[5]);
        da_f16x2_to_f32(r.w, f[6], f[7]);
    }
    DA_DEVICE static uint4 pack(const float* f) {
        return make_uint4(da_f32x2_to_f16x2(f[0], f[1]), da_f32x2_to_f16x2(f[2], f[3]),
                          da_f32x2_to_f16x2(f[4], f[5]), da_f32x2_to_f16x2(f[6], f[7]));
    }
    DA_DEVICE static float load(const void* base, long long i) {
        return da_f16_to_f32(reinterpret_cast<const unsigned short*>(base)[i]);
    }
    DA_DEVICE static void store(void* base, long long i, float v) {
        reinterpret_cast<unsigned short*>(base)[i] = da_f32_to_f16(v);
    }
};

// ---------------------------------------------------------------------------
// The output row's log-sum-exp (DecodeParams::out_lse, natural log) from its
// (max in log2 units, sum): ln(l 2^m) = (m + log2 l) ln 2; -inf for a row of
// no token (l = 0), NaN where l is. Epilogue code only: the main loops carry
// (m, l) as they did.
// ---------------------------------------------------------------------------
DA_DEVICE float da_row_lse(float m, float l) {
    return l == 0.f ? da_neg_inf() : (m + da_log2(l)) * 0.693147180559945309f;
}

// ---------------------------------------------------------------------------
// Per-variant geometry, all compile-time.
// ---------------------------------------------------------------------------
__host__ __device__ constexpr int da_cdiv(int a, int b) { return (a + b - 1) / b; }

// Tokens per pipeline stage: large enough to keep 128 threads busy in QK,
// small enough that STAGES >= 3 (>= 2 for wide f32 rows) fit beside the f32 Q.
__host__ __device__ constexpr int da_stage_tokens(int elem_bytes, int head_dim) {
    return elem_bytes == 2 ? (head_dim <= 128 ? 16 : 8) : (head_dim <= 64 ? 16 : head_dim <= 128 ? 8 : 4);
}

template <typename T, int HEAD_DIM>
struct DecodeGeometry {
    static constexpr int THREADS = DECODE_THREADS;
    static constexpr int ELEM_BYTES = Elem<T>::BYTES;
    static constexpr int ELEMS_PER_CHUNK = Elem<T>::PER_CHUNK;          // 16 bytes
    static constexpr int CHUNKS_PER_ROW = HEAD_DIM * ELEM_BYTES / 16;     // one K or V row of one head
    // Rows padded to an odd count of 16-byte chunks: 8 consecutive rows at one
    // column hit 8 distinct groups of 4 banks.
    static constexpr int ROW_CHUNKS = CHUNKS_PER_ROW + (CHUNKS_PER_ROW % 2 == 0 ? 1 : 2);
    static constexpr int ROW_BYTES = ROW_CHUNKS * 16;
    static constexpr int MAX_GROUP = DECODE_MAX_QK_ELEMS / HEAD_DIM;   // largest g

    static constexpr int TILE = da_stage_tokens(ELEM_BYTES, HEAD_DIM);  // tokens per stage
    static constexpr int QK_HEAD_LANES = THREADS / TILE;                // threads per token in QK
    static constexpr int QK_MAX_HEADS = da_cdiv(MAX_GROUP, QK_HEAD_LANES);
    static constexpr int PV_DIM_SLICES = HEAD_DIM / 8;                  // 8 output dims per thread
    static constexpr int PV_HEAD_ROWS = THREADS / PV_DIM_SLICES;
    static constexpr int PV_MAX_HEADS = da_cdiv(MAX_GROUP, PV_HEAD_ROWS);
    static constexpr int QK_DIM_PARTS = DA_WARP_SIZE / TILE;            // most lanes per dot product

    static constexpr int STAGE_BYTES = 2 * TILE * ROW_BYTES;            // K rows then V rows
    static constexpr int Q_BYTES = MAX_GROUP * HEAD_DIM * 4;
    static constexpr int P_BYTES = MAX_GROUP * TILE * 4;
    static constexpr int HEAD_BYTES = da_cdiv(MAX_GROUP * 4, 16) * 16;  // one f32 per head

    __host__ __device__ static constexpr int fixed_bytes(int stages) {
        return Q_BYTES + P_BYTES + 3 * HEAD_BYTES + (stages + 1) * TILE * 8 + 16 + stages * STAGE_BYTES;
    }
    __host__ __device__ static constexpr int pick_stages() {
        int s = 2;
        while (s < 6 && fixed_bytes(s + 1) <= 48 * 1024) ++s;
        return s;
    }
    static constexpr int STAGES = pick_stages();
    static constexpr int SLOT_RING = STAGES + 1;  // stages whose slots are known

    // Shared-memory carve-up (offsets in bytes, all 16-byte aligned).
    static constexpr int HEAD_FLOATS = HEAD_BYTES / 4;
    static constexpr int Q_OFF = 0;
    static constexpr int KV_OFF = Q_OFF + Q_BYTES;
    static constexpr int P_OFF = KV_OFF + STAGES * STAGE_BYTES;
    static constexpr int ALPHA_OFF = P_OFF + P_BYTES;
    static constexpr int M_OFF = ALPHA_OFF + HEAD_BYTES;  // [2][HEAD_FLOATS]: running max, by stage parity
    static constexpr int SLOT_OFF = M_OFF + 2 * HEAD_BYTES;
    static constexpr int FLAG_OFF = SLOT_OFF + SLOT_RING * TILE * 8;
    static constexpr int SMEM_BYTES = FLAG_OFF + 16;

    // 16-byte copies per thread per stage, of K and of V each.
    static constexpr int COPIES = da_cdiv(TILE * CHUNKS_PER_ROW, THREADS);

    static_assert(HEAD_DIM % 8 == 0, "head_dim must be a multiple of 8");
    static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory above 48 KB");
    static_assert(STAGES >= 2, "need a double buffer at least");
    static_assert(TILE >= 4 && TILE <= DA_WARP_SIZE && DA_WARP_SIZE % TILE == 0, "a head's tokens share a warp");
    static_assert(THREADS % TILE == 0, "");
    static_assert(QK_MAX_HEADS <= 8 && PV_MAX_HEADS <= 8, "dispatch covers at most 8 heads per thread");
    static_assert(STAGES * STAGE_BYTES >= THREADS * 9 * 4, "the PV phase scratch reuses the KV ring");
    static_assert(KV_OFF % 16 == 0 && P_OFF % 16 == 0 && SLOT_OFF % 16 == 0 && FLAG_OFF % 16 == 0, "alignment");
};

// ---------------------------------------------------------------------------
// Sequence guards and the split rule (decode_attn_core::plan::SplitRule).
// ---------------------------------------------------------------------------
struct SeqInfo {
    int len;
    long long index_start;  // layout 1: kv_indptr[b]
    bool ok;
};

// Calls visit(b) for this thread's sequences b = t, t + THREADS, ... (t its
// index in the CTA), in order, until visit returns false; the first outside
// the loop, whose counter then starts at THREADS, not at t. The batch entry
// points walk the lengths with it: with the loop over `b = t; b < n; b +=
// THREADS` in a CTA's prologue, ptxas compiled the tensor-core kernel's main
// loop unlike the plain entry point's, 833 instructions a tile against 798,
// the thread index read 4 times a tile and 205 registers against 221 (sm_90,
// nvcc 13.0); with this walk, 801 and 222. The `_packed` entry points keep
// the plain loop: their code stays version 27's, the one timed (s29,
// docs/experiments/packed-ctas).
template <int THREADS, class Visit>
DA_DEVICE void for_each_own_seq(int num_seqs, Visit visit) {
    const int t = threadIdx.x;
    if (t >= num_seqs || !visit(t)) return;
#pragma unroll 1
    for (int b = THREADS; b < num_seqs; b += THREADS) {
        if (b + t >= num_seqs || !visit(b + t)) return;
    }
}

DA_DEVICE SeqInfo seq_info(const DecodeParams& p, int b) {
    SeqInfo s;
    s.len = __ldg(p.seq_lens + b);
    s.index_start = 0;
    s.ok = s.len >= 0;
    if (p.layout == DECODE_LAYOUT_BLOCK_TABLE) {
        s.ok = s.ok && p.block_size > 0 && p.max_blocks_per_seq >= 0 &&
               (long long)s.len <= (long long)p.max_blocks_per_seq * p.block_size;
    } else if (p.layout == DECODE_LAYOUT_TOKEN_INDICES) {
        s.index_start = __ldg(p.kv_indptr + b);
        s.ok = s.ok && s.index_start >= 0 && s.index_start + s.len <= p.num_indices;
    } else {
        s.ok = false;
    }
    return s;
}

struct SeqSplit {
    unsigned long long tiles;
    unsigned long long tiles_per_split;
    unsigned long long active_splits;
};

// tiles = ceil(len / 16); splits = short_splits where 0 < short_splits <
// num_splits and tiles < short_below_tiles, else num_splits; tiles_per_split =
// max(min_tiles_per_split, 1, ceil(tiles / splits)); active_splits = ceil(tiles
// / tiles_per_split). For 0 <= len (every caller checks it first).
//
// In 32 bits, which hold every operand (tiles < 2^27, the rest below 2^31):
// a 64-bit division is a subroutine of about a hundred instructions, and
// this runs between a CTA's length load and its first block-table load. A
// 32-bit division's reciprocal is computed from the divisor alone, so for
// num_splits (a parameter) it is ready before the length arrives; so is
// short_splits's, and both divisions are made before the length picks one.
// Callers on that path test a split against `tiles` with a multiplication,
// so the second division (by the per-sequence tiles_per_split) stays off it.
DA_DEVICE SeqSplit split_rule(const DecodeParams& p, int len) {
    const unsigned tiles = ((unsigned)len + DECODE_TILE_TOKENS - 1) / DECODE_TILE_TOKENS;
    const unsigned num_splits = p.num_splits > 0 ? (unsigned)p.num_splits : 1u;
    const bool has_short = p.short_splits > 0 && (unsigned)p.short_splits < num_splits;
    const unsigned short_splits = has_short ? (unsigned)p.short_splits : num_splits;
    unsigned per = p.min_tiles_per_split > 0 ? (unsigned)p.min_tiles_per_split : 1u;
    const unsigned even_long = (tiles + num_splits - 1) / num_splits;
    const unsigned even_short = (tiles + short_splits - 1) / short_splits;
    const bool is_short = has_short && p.short_below_tiles > 0 && tiles < (unsigned)p.short_below_tiles;
    const unsigned even = is_short ? even_short : even_long;
    if (even > per) per = even;
    SeqSplit s;
    s.tiles = tiles;
    s.tiles_per_split = per;
    s.active_splits = (tiles + per - 1) / per;
    return s;
}

// Cut by the batch (batch_splits > 0, decode_params.h): the split length that
// split_rule, with batch_splits for num_splits, gives a sequence of the
// batch's mean length...
DA_DEVICE unsigned batch_rule_tiles_per_split(const DecodeParams& p, unsigned mean_tiles) {
    const unsigned batch_splits = (unsigned)p.batch_splits;
    const bool has_short = p.short_splits > 0 && (unsigned)p.short_splits < batch_splits;
    const bool is_short = has_short && p.short_below_tiles > 0 && mean_tiles < (unsigned)p.short_below_tiles;
    const unsigned splits = is_short ? (unsigned)p.short_splits : batch_splits;
    const unsigned per = p.min_tiles_per_split > 0 ? (unsigned)p.min_tiles_per_split : 1u;
    const unsigned even = (mean_tiles + splits - 1) / splits;
    return even > per ? even : per;
}

// ...and one sequence's cut at that length (`batch_per_split` >= 1), into no
// more than num_splits splits (the workspace's rows).
DA_DEVICE SeqSplit batch_split_rule(const DecodeParams& p, int len, unsigned batch_per_split) {
    const unsigned tiles = ((unsigned)len + DECODE_TILE_TOKENS - 1) / DECODE_TILE_TOKENS;
    const unsigned num_splits = p.num_splits > 0 ? (unsigned)p.num_splits : 1u;
    const unsigned even = (tiles + num_splits - 1) / num_splits;
    SeqSplit s;
    s.tiles = tiles;
    s.tiles_per_split = even > batch_per_split ? even : batch_per_split;
    s.active_splits = (tiles + s.tiles_per_split - 1) / s.tiles_per_split;
    return s;
}

// The batch's split length, computed by every CTA that needs it from the
// lengths it reads (so a captured graph replayed with other lengths cuts
// them anew): every thread of the CTA calls it. The mean is the tiles of all
// sequences (a bad one counts none), summed, over num_seqs, rounded up.
// All in 32 bits, with no 64-bit division (a called subroutine, and
// registers the reducer does not have): a thread's sum stays below 2^31
// (at most DECODE_PACK_MAX_SEQS / THREADS <= 16 sequences of < 2^27 tiles),
// and is added in two halves, high (>> 16) and low 16 bits, through float
// shuffles (exact: each warp's sum < 2^24) and then as integers (each CTA
// total < 2^24); the mean, below 2^27, is then
// (high / n) * 2^16 + ceil(((high % n) * 2^16 + low) / n).
template <int THREADS>
DA_DEVICE unsigned batch_tiles_per_split(const DecodeParams& p) {
    static_assert(DECODE_PACK_MAX_SEQS / THREADS <= 16, "a thread's sum of tiles stays below 2^31");
    constexpr int WARPS = THREADS / DA_WARP_SIZE;
    __shared__ float warp_low[WARPS], warp_high[WARPS];
    unsigned mine = 0;
    for_each_own_seq<THREADS>(p.num_seqs, [&](int b) {
        const SeqInfo s = seq_info(p, b);
        if (s.ok) mine += ((unsigned)s.len + DECODE_TILE_TOKENS - 1) / DECODE_TILE_TOKENS;
        return true;
    });
    float low = (float)(mine & 0xffffu), high = (float)(mine >> 16);
#pragma unroll
    for (int o = DA_WARP_SIZE / 2; o > 0; o >>= 1) {
        low += da_shfl_xor(low, o);
        high += da_shfl_xor(high, o);
    }
    const int warp = threadIdx.x / DA_WARP_SIZE, lane = threadIdx.x % DA_WARP_SIZE;
    __syncthreads();  // a previous call's sums are read
    if (lane == 0) {
        warp_low[warp] = low;
        warp_high[warp] = high;
    }
    __syncthreads();
    unsigned total_low = 0, total_high = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        total_low += (unsigned)warp_low[w];
        total_high += (unsigned)warp_high[w];
    }
    const unsigned n = p.num_seqs > 0 ? (unsigned)p.num_seqs : 1u;
    const unsigned rest = (total_high % n) * 65536u + total_low;  // < 2^27 + 2^24
    const unsigned mean = (total_high / n) * 65536u + (rest + n - 1) / n;
    return batch_rule_tiles_per_split(p, mean);
}

// ---------------------------------------------------------------------------
// Token -> slot lookup.
// ---------------------------------------------------------------------------
// The index row of sequence b: its block-table row (layout 0) or its first token index (layout 1).
DA_DEVICE const int* index_row(const DecodeParams& p, int b, const SeqInfo& s) {
    return p.layout == DECODE_LAYOUT_BLOCK_TABLE ? p.block_table + (long long)b * p.max_blocks_per_seq
                                                 : p.kv_indices + s.index_start;
}

// The raw entry of token tok (0 <= tok < len): a block id (layout 0) or a slot (layout 1).
DA_DEVICE int load_raw_index(const DecodeParams& p, const int* row, int tok) {
    return __ldg(row + (p.layout == DECODE_LAYOUT_BLOCK_TABLE ? tok / p.block_size : tok));
}

// The byte offset (slot * slot_bytes) of token tok from its raw entry, or -1 (raising
// *bad_s) if the slot falls outside the pool.
DA_DEVICE long long resolve_offset(const DecodeParams& p, int raw, int tok, long long slot_bytes, int* bad_s) {
    const long long slot =
        p.layout == DECODE_LAYOUT_BLOCK_TABLE ? (long long)raw * p.block_size + tok % p.block_size : (long long)raw;
    if (raw < 0 || slot >= p.num_slots) {
        *bad_s = 1;
        return -1;
    }
    return slot * slot_bytes;
}

// ---------------------------------------------------------------------------
// QK and the online softmax of one stage.
// ---------------------------------------------------------------------------
// The thread's QK role: token tt of the stage, head lane hh, and dim part dp of ds.
// Heads hh + j * QK_HEAD_LANES (j < NH), except that the last one (j = NH-1) is
// last_head (computed once, outside the stage loop): it is head g-1 again when
// hh + (NH-1) * QK_HEAD_LANES passes g, and then its results are dropped. With
// ds > 1 (small groups: NH is then 1), the ds lanes of a (token, head) each take
// every ds-th 16-byte chunk of the dot product and add up by shuffles.
struct QkRole {
    int tt, hh, dp, ds, last_head;
};

// Heads j in [J0, J0 + NJ) of the thread's NH.
template <typename T, int HEAD_DIM, int J0, int NJ, int NH>
DA_DEVICE void qk_softmax_part(const float* __restrict__ q_s, const unsigned char* __restrict__ krow,
                               const QkRole& r, int g, bool valid, const float* __restrict__ m_prev,
                               float* __restrict__ m_next, float* __restrict__ p_s, float* __restrict__ alpha_s) {
    using G = DecodeGeometry<T, HEAD_DIM>;
    constexpr int EPC = G::ELEMS_PER_CHUNK;
    int qhead[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) qhead[j] = J0 + j < NH - 1 ? r.hh + (J0 + j) * G::QK_HEAD_LANES : r.last_head;

    // One head: two partial sums for a shorter dependency chain.
    constexpr int PARTS = NJ == 1 ? 2 : 1;
    float s[NJ][PARTS];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int k = 0; k < PARTS; ++k) s[j][k] = 0.f;

    constexpr int CHUNK_UNROLL = QK_CHUNK_UNROLL;
#pragma unroll CHUNK_UNROLL
    for (int c = r.dp; c < G::CHUNKS_PER_ROW; c += r.ds) {
        float k[EPC];
        Elem<T>::unpack(*reinterpret_cast<const uint4*>(krow + c * 16), k);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
#pragma unroll
            for (int e = 0; e < EPC; e += 4) {
                const float4 q = *reinterpret_cast<const float4*>(q_s + qhead[j] * HEAD_DIM + c * EPC + e);
                s[j][0] = fmaf(q.x, k[e + 0], s[j][0]);
                s[j][PARTS - 1] = fmaf(q.y, k[e + 1], s[j][PARTS - 1]);
                s[j][0] = fmaf(q.z, k[e + 2], s[j][0]);
                s[j][PARTS - 1] = fmaf(q.w, k[e + 3], s[j][PARTS - 1]);
            }
        }
    }

#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        float sc = PARTS == 2 ? s[j][0] + s[j][PARTS - 1] : s[j][0];
        for (int o = G::TILE; o < G::TILE * r.ds; o <<= 1) sc += da_shfl_xor(sc, o);  // the dim parts
        const float score = valid ? sc : da_neg_inf();
        float tile_max = score;
#pragma unroll
        for (int o = G::TILE / 2; o > 0; o >>= 1) tile_max = fmaxf(tile_max, da_shfl_xor(tile_max, o));
        const float m_old = m_prev[qhead[j]];
        const float m_new = fmaxf(m_old, tile_max);
        const float alpha = da_exp2(m_old - m_new);  // 0 on the first stage
        const float pr = da_exp2(score - m_new);
        const int h = r.hh + (J0 + j) * G::QK_HEAD_LANES;
        if (h < g && r.dp == 0) {
            p_s[h * G::TILE + r.tt] = pr;
            if (r.tt == 0) {
                alpha_s[h] = alpha;
                m_next[h] = m_new;
            }
        }
    }
}

// QK and the online softmax of one stage for the thread's NH heads, at most 4 at a time
// (more would hold too many scores in registers; K is re-read from shared memory instead).
template <typename T, int HEAD_DIM, int NH>
DA_DEVICE void qk_softmax(const float* __restrict__ q_s, const unsigned char* __restrict__ krow, const QkRole& r,
                          int g, bool valid, const float* __restrict__ m_prev, float* __restrict__ m_next,
                          float* __restrict__ p_s, float* __restrict__ alpha_s) {
    if constexpr (NH <= 4) {
        qk_softmax_part<T, HEAD_DIM, 0, NH, NH>(q_s, krow, r, g, valid, m_prev, m_next, p_s, alpha_s);
    } else {
        qk_softmax_part<T, HEAD_DIM, 0, NH / 2, NH>(q_s, krow, r, g, valid, m_prev, m_next, p_s, alpha_s);
        qk_softmax_part<T, HEAD_DIM, NH / 2, NH - NH / 2, NH>(q_s, krow, r, g, valid, m_prev, m_next, p_s, alpha_s);
    }
}

// ---------------------------------------------------------------------------
// PV of one stage.
// ---------------------------------------------------------------------------
// The thread's PV role: dim slice dc (8 output dims); head row hr of hrows; token
// phase tp of ts. Heads hr + j * hrows (j < NH), the last one being last_head as
// in QK. With ts > 1 (small groups: NH is then 1), the ts phases of a (head, dim
// slice) take turns over groups of 4 tokens, and add up once at the end.
struct PvRole {
    int dc, hr, hrows, tp, ts, last_head;
};

// The element offset (in a row) of the k-th 4-dim group (k = 0, 1) of dim slice dc.
// 16-bit rows: the 8 dims are contiguous (one 16-byte chunk); f32 rows: two
// 16-byte chunks dc and dc + D/8, so that a quarter warp reads consecutive chunks.
template <typename T, int HEAD_DIM>
DA_DEVICE int pv_dim(int dc, int k) {
    return Elem<T>::BYTES == 2 ? dc * 8 + 4 * k : (dc + k * (HEAD_DIM / 8)) * 4;
}

template <typename T, int HEAD_DIM>
DA_DEVICE void load_v8(const unsigned char* vrow, int dc, float* v) {
    if constexpr (Elem<T>::BYTES == 2) {
        Elem<T>::unpack(*reinterpret_cast<const uint4*>(vrow + dc * 16), v);
    } else {
        Elem<T>::unpack(*reinterpret_cast<const uint4*>(vrow + pv_dim<T, HEAD_DIM>(dc, 0) * 4), v);
        Elem<T>::unpack(*reinterpret_cast<const uint4*>(vrow + pv_dim<T, HEAD_DIM>(dc, 1) * 4), v + 4);
    }
}

template <typename T, int HEAD_DIM, int NH>
DA_DEVICE void pv_update(float (*acc)[8], float* l, const float* __restrict__ p_s, const float* __restrict__ alpha_s,
                         const unsigned char* __restrict__ vstage, const PvRole& r, int n_valid) {
    using G = DecodeGeometry<T, HEAD_DIM>;
    // With NH > 1, ts is 1 and hrows is PV_HEAD_ROWS.
    int prow[NH];
#pragma unroll
    for (int j = 0; j < NH; ++j) {
        const int h = j < NH - 1 ? r.hr + j * G::PV_HEAD_ROWS : r.last_head;
        prow[j] = h * G::TILE;
        const float a = alpha_s[h];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[j][e] *= a;
        l[j] *= a;
    }
    // Tokens in groups of TG (p of TG tokens per load); rows past n_valid hold zeros and p = 0.
    constexpr int TG = NH >= 4 ? 2 : 4;
    for (int t0 = r.tp * TG; t0 < n_valid; t0 += TG * r.ts) {
        float pr[NH][TG];
#pragma unroll
        for (int j = 0; j < NH; ++j) {
            if constexpr (TG == 4) {
                const float4 q = *reinterpret_cast<const float4*>(p_s + prow[j] + t0);
                pr[j][0] = q.x, pr[j][1] = q.y, pr[j][2] = q.z, pr[j][TG - 1] = q.w;
                l[j] += (q.x + q.y) + (q.z + q.w);  // the softmax denominator, as p . 1
            } else {
                const float2 q = *reinterpret_cast<const float2*>(p_s + prow[j] + t0);
                pr[j][0] = q.x, pr[j][TG - 1] = q.y;
                l[j] += q.x + q.y;
            }
        }
#pragma unroll
        for (int u = 0; u < TG; ++u) {
            float v[8];
            load_v8<T, HEAD_DIM>(vstage + (t0 + u) * G::ROW_BYTES, r.dc, v);
#pragma unroll
            for (int j = 0; j < NH; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[j][e] = fmaf(pr[j][u], v[e], acc[j][e]);
        }
    }
}

// Writes `value` to every element of the g output rows of (b, kv head), and
// `lse` to their LSEs (where out_lse is not null).
template <typename T, int HEAD_DIM>
DA_DEVICE void fill_out(const DecodeParams& p, int b, int q_head0, int g, float value, float lse) {
    const long long row0 = (long long)b * p.num_q_heads + q_head0;
    const long long base = row0 * HEAD_DIM;
    for (int i = threadIdx.x; i < g * HEAD_DIM; i += DECODE_THREADS) Elem<T>::store(p.out, base + i, value);
    if (p.out_lse != nullptr)
        for (int h = threadIdx.x; h < g; h += DECODE_THREADS) p.out_lse[row0 + h] = lse;
}

// ---------------------------------------------------------------------------
// The decode kernel.
// ---------------------------------------------------------------------------
template <typename T, int HEAD_DIM>
DA_DEVICE void decode_attn_body(const DecodeParams& p) {
    using G = DecodeGeometry<T, HEAD_DIM>;
    constexpr int TILE = G::TILE;
    constexpr int STAGES = G::STAGES;
    constexpr int EPC = G::ELEMS_PER_CHUNK;
    __shared__ __align__(16) unsigned char smem[G::SMEM_BYTES];

    const int tid = threadIdx.x;
    const int b = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int split = blockIdx.z;
    const bool unsplit = p.num_splits <= 1;
    const int g = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
    const int q_head0 = kv_head * g;

    const SeqInfo seq = seq_info(p, b);
    if (g < 1 || g > G::MAX_GROUP || !seq.ok) {
        // Split: the reducer sees the same guard and writes the NaNs.
        if (unsplit && g >= 1) fill_out<T, HEAD_DIM>(p, b, q_head0, g, da_nan(), da_nan());
        return;
    }
    const SeqSplit rule = split_rule(p, seq.len);
    if ((unsigned long long)split >= rule.active_splits) {
        // Surplus split, or an empty sequence (active_splits 0).
        if (unsplit) fill_out<T, HEAD_DIM>(p, b, q_head0, g, 0.f, da_neg_inf());
        return;
    }
    // Tokens [begin, end) of the sequence, split j: [j * per, min((j + 1) * per, len)).
    const unsigned long long per_tokens = rule.tiles_per_split * DECODE_TILE_TOKENS;
    const int begin = (int)((unsigned long long)split * per_tokens);  // < len since split < active
    const unsigned long long end_ull = (unsigned long long)(split + 1) * per_tokens;
    const int end = end_ull < (unsigned long long)seq.len ? (int)end_ull : seq.len;
    const int num_stages = (end - begin + TILE - 1) / TILE;
    const int* idx_row = index_row(p, b, seq);

    float* q_s = reinterpret_cast<float*>(smem + G::Q_OFF);                 // [g][HEAD_DIM], pre-scaled
    unsigned char* kv_s = smem + G::KV_OFF;                                 // [STAGES][K|V][TILE][ROW_BYTES]
    float* p_s = reinterpret_cast<float*>(smem + G::P_OFF);                 // [g][TILE]
    float* alpha_s = reinterpret_cast<float*>(smem + G::ALPHA_OFF);         // [g]
    float* m_s = reinterpret_cast<float*>(smem + G::M_OFF);                 // [2][HEAD_FLOATS]
    long long* slot_s = reinterpret_cast<long long*>(smem + G::SLOT_OFF);   // [SLOT_RING][TILE] byte offsets
    int* bad_s = reinterpret_cast<int*>(smem + G::FLAG_OFF);                // a slot outside the pool

    // --- Prologue: slots of stages 0..STAGES, raw entry of stage STAGES+1, Q, m = -inf. ---
    const long long slot_bytes = (long long)p.num_kv_heads * HEAD_DIM * G::ELEM_BYTES;  // one slot, all KV heads
    if (tid == 0) *bad_s = 0;
    __syncthreads();  // bad_s is cleared before anyone raises it
    int next_raw = 0;  // tid < TILE: raw entry of token tid of the stage two ahead of the next copy
    if (tid < TILE) {
        const int tok = begin + (STAGES + 1) * TILE + tid;
        if (tok < end) next_raw = load_raw_index(p, idx_row, tok);
    }
    for (int e = tid; e < (STAGES + 1) * TILE; e += DECODE_THREADS) {
        const int tok = begin + e;  // stage e / TILE, row e % TILE
        slot_s[e] = tok < end ? resolve_offset(p, load_raw_index(p, idx_row, tok), tok, slot_bytes, bad_s) : -1;
    }
    {
        const unsigned char* q_g = reinterpret_cast<const unsigned char*>(p.q) +
                                   ((long long)b * p.num_q_heads + q_head0) * HEAD_DIM * G::ELEM_BYTES;
        const float scale = p.scale_log2;
        for (int c = tid; c < g * G::CHUNKS_PER_ROW; c += DECODE_THREADS) {
            float f[EPC];
            Elem<T>::unpack(da_ldg16(q_g + c * 16), f);
#pragma unroll
            for (int e = 0; e < EPC; e += 4)
                *reinterpret_cast<float4*>(q_s + c * EPC + e) =
                    make_float4(f[e] * scale, f[e + 1] * scale, f[e + 2] * scale, f[e + 3] * scale);
        }
    }
    for (int h = tid; h < g; h += DECODE_THREADS) m_s[h] = da_neg_inf();  // parity 0
    __syncthreads();  // slot_s, q_s and m_s visible

    // Byte offset of (slot 0, this KV head).
    const long long head_offset = (long long)kv_head * HEAD_DIM * G::ELEM_BYTES;
    const unsigned char* k_base = reinterpret_cast<const unsigned char*>(p.k_cache) + head_offset;
    const unsigned char* v_base = reinterpret_cast<const unsigned char*>(p.v_cache) + head_offset;

    // Issues the 16-byte copies of stage st (< num_stages) into its ring buffer: thread
    // tid copies chunk c = tid + i * THREADS (row c / CHUNKS_PER_ROW) of K and of V.
    // Rows past the split's end (offset -1) are zero-filled without a read.
    auto issue_stage = [&](int st) {
        const long long* offs = slot_s + (st % G::SLOT_RING) * TILE;
        unsigned char* dst_stage = kv_s + (st % STAGES) * G::STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < G::COPIES; ++i) {
            const int c = tid + i * DECODE_THREADS;
            if (G::COPIES * DECODE_THREADS == TILE * G::CHUNKS_PER_ROW || c < TILE * G::CHUNKS_PER_ROW) {
                const int row = c / G::CHUNKS_PER_ROW;
                const int col = c - row * G::CHUNKS_PER_ROW;
                const long long off = offs[row];
                unsigned char* dst = dst_stage + row * G::ROW_BYTES + col * 16;
                const int bytes = off >= 0 ? 16 : 0;
                const long long src_off = off >= 0 ? off + col * 16 : 0;
                da_cp_async16(dst, k_base + src_off, bytes);
                da_cp_async16(dst + TILE * G::ROW_BYTES, v_base + src_off, bytes);
            }
        }
    };

    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < num_stages) issue_stage(st);
        da_cp_async_commit();
    }

    // QK roles (block-uniform counts): tid = lane * TILE + tt, lane = hh * ds + dp. Small
    // groups split each dot product over ds lanes of one warp (lanes TILE apart).
    QkRole qk;
    qk.tt = tid % TILE;
    qk.ds = 1;
    while (qk.ds * 2 <= G::QK_DIM_PARTS && g * qk.ds * 2 <= G::QK_HEAD_LANES) qk.ds *= 2;
    qk.dp = (tid / TILE) % qk.ds;
    qk.hh = tid / TILE / qk.ds;
    const int qk_lanes = G::QK_HEAD_LANES / qk.ds;  // head lanes
    const int qk_heads = (g + qk_lanes - 1) / qk_lanes;
    qk.last_head = da_min(qk.hh + (qk_heads - 1) * qk_lanes, g - 1);
    // PV roles: tid = (tp * hrows + hr) * PV_DIM_SLICES + dc. Small groups split each
    // head's tokens over ts phases.
    PvRole pv;
    pv.dc = tid % G::PV_DIM_SLICES;
    pv.ts = 1;
    while (pv.ts * 2 <= G::TILE / 4 && g * pv.ts * 2 <= G::PV_HEAD_ROWS) pv.ts *= 2;
    pv.hrows = G::PV_HEAD_ROWS / pv.ts;
    const int pv_row = tid / G::PV_DIM_SLICES;
    pv.hr = pv_row % pv.hrows;
    pv.tp = pv_row / pv.hrows;
    const bool pv_thread = pv_row < pv.hrows * pv.ts;
    const int pv_heads = (g + pv.hrows - 1) / pv.hrows;
    pv.last_head = da_min(pv.hr + (pv_heads - 1) * pv.hrows, g - 1);
    float acc[G::PV_MAX_HEADS][8];  // unnormalised sum of p * v
    float l_acc[G::PV_MAX_HEADS];   // sum of p
#pragma unroll
    for (int j = 0; j < G::PV_MAX_HEADS; ++j) {
        l_acc[j] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[j][e] = 0.f;
    }

    for (int it = 0; it < num_stages; ++it) {
        da_cp_async_wait<STAGES - 2>();  // this thread's copies of stage it have landed
        __syncthreads();                 // everyone's have, and stage it-1 is consumed

        if (it + STAGES - 1 < num_stages) issue_stage(it + STAGES - 1);
        da_cp_async_commit();
        if (tid < TILE) {
            // Slot of stage it+STAGES+1 (first read at iteration it+2); raw entry of stage it+STAGES+2.
            const int st = it + STAGES + 1;
            const int tok = begin + st * TILE + tid;
            if (st < num_stages)
                slot_s[(st % G::SLOT_RING) * TILE + tid] =
                    tok < end ? resolve_offset(p, next_raw, tok, slot_bytes, bad_s) : -1;
            if (tok + TILE < end) next_raw = load_raw_index(p, idx_row, tok + TILE);
        }

        const unsigned char* kstage = kv_s + (it % STAGES) * G::STAGE_BYTES;
        const unsigned char* vstage = kstage + TILE * G::ROW_BYTES;
        const int stage_begin = begin + it * TILE;
        const bool valid = stage_begin + qk.tt < end;
        const unsigned char* krow = kstage + qk.tt * G::ROW_BYTES;
        const float* m_prev = m_s + (it & 1) * G::HEAD_FLOATS;
        float* m_next = m_s + ((it + 1) & 1) * G::HEAD_FLOATS;
        switch (qk_heads) {
#define DA_QK_CASE(n)                                                                                       \
    case n:                                                                                                 \
        if constexpr (n <= G::QK_MAX_HEADS)                                                                 \
            qk_softmax<T, HEAD_DIM, n>(q_s, krow, qk, g, valid, m_prev, m_next, p_s, alpha_s);                \
        break;
            DA_QK_CASE(1) DA_QK_CASE(2) DA_QK_CASE(3) DA_QK_CASE(4)
            DA_QK_CASE(5) DA_QK_CASE(6) DA_QK_CASE(7) DA_QK_CASE(8)
#undef DA_QK_CASE
            default: break;
        }
        __syncthreads();  // p_s, alpha_s and m_next ready

        if (pv_thread) {
            const int n_valid = da_min(TILE, end - stage_begin);
            switch (pv_heads) {
#define DA_PV_CASE(n)                                                                                 \
    case n:                                                                                           \
        if constexpr (n <= G::PV_MAX_HEADS)                                                           \
            pv_update<T, HEAD_DIM, n>(acc, l_acc, p_s, alpha_s, vstage, pv, n_valid);                \
        break;
                DA_PV_CASE(1) DA_PV_CASE(2) DA_PV_CASE(3) DA_PV_CASE(4)
                DA_PV_CASE(5) DA_PV_CASE(6) DA_PV_CASE(7) DA_PV_CASE(8)
#undef DA_PV_CASE
                default: break;
            }
        }
    }

    // --- Epilogue: PV threads hold acc and l of their heads (phase 0 adds the other
    // phases' through shared memory, reusing the KV ring); m is in m_s. ---
    __syncthreads();  // bad_s final; the KV ring is free
    const bool bad = *bad_s != 0;
    if (pv.ts > 1) {  // then pv_heads == 1
        float* part = reinterpret_cast<float*>(kv_s);  // [ts - 1][hrows * PV_DIM_SLICES][9]
        const int slot = (pv.hr * G::PV_DIM_SLICES + pv.dc) * 9;
        const int phase_floats = pv.hrows * G::PV_DIM_SLICES * 9;
        if (pv_thread && pv.tp > 0) {
#pragma unroll
            for (int e = 0; e < 8; ++e) part[(pv.tp - 1) * phase_floats + slot + e] = acc[0][e];
            part[(pv.tp - 1) * phase_floats + slot + 8] = l_acc[0];
        }
        __syncthreads();
        if (pv_thread && pv.tp == 0) {
            for (int t = 1; t < pv.ts; ++t) {
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[0][e] += part[(t - 1) * phase_floats + slot + e];
                l_acc[0] += part[(t - 1) * phase_floats + slot + 8];
            }
        }
    }
    const float nan = da_nan();
    const long long row0 = (long long)b * p.num_q_heads + q_head0;  // first output row of this CTA
    const float* m_final = m_s + (num_stages & 1) * G::HEAD_FLOATS;
    if (pv_thread && pv.tp == 0) {
        const int dc = pv.dc;
#pragma unroll
        for (int j = 0; j < G::PV_MAX_HEADS; ++j) {
            const int h = pv.hr + j * G::PV_HEAD_ROWS;  // j > 0 only when hrows == PV_HEAD_ROWS
            if (j < pv_heads && h < g) {
                if (unsplit) {
                    float o[8];
#pragma unroll
                    for (int e = 0; e < 8; ++e) o[e] = bad ? nan : acc[j][e] / l_acc[j];
                    unsigned char* orow =
                        reinterpret_cast<unsigned char*>(p.out) + (row0 + h) * HEAD_DIM * G::ELEM_BYTES;
                    if constexpr (G::ELEM_BYTES == 2) {
                        *reinterpret_cast<uint4*>(orow + dc * 16) = Elem<T>::pack(o);
                    } else {
                        *reinterpret_cast<uint4*>(orow + pv_dim<T, HEAD_DIM>(dc, 0) * 4) = Elem<T>::pack(o);
                        *reinterpret_cast<uint4*>(orow + pv_dim<T, HEAD_DIM>(dc, 1) * 4) = Elem<T>::pack(o + 4);
                    }
                    if (dc == 0 && p.out_lse != nullptr)
                        p.out_lse[row0 + h] = bad ? nan : da_row_lse(m_final[h], l_acc[j]);
                } else {
                    const long long prow = (row0 + h) * p.num_splits + split;  // partial row
                    float* arow = p.partial_acc + prow * HEAD_DIM;
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        const int d = pv_dim<T, HEAD_DIM>(dc, k);
                        *reinterpret_cast<float4*>(arow + d) =
                            bad ? make_float4(nan, nan, nan, nan)
                                : make_float4(acc[j][4 * k], acc[j][4 * k + 1], acc[j][4 * k + 2], acc[j][4 * k + 3]);
                    }
                    if (dc == 0) {
                        float* ml = p.partial_ml + prow * 2;
                        ml[0] = bad ? nan : m_final[h];
                        ml[1] = bad ? nan : l_acc[j];
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The split reducer: one CTA per (sequence, query head).
// ---------------------------------------------------------------------------
DA_DEVICE float block_reduce_max(float v, float* red) {
#pragma unroll
    for (int o = DA_WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, da_shfl_xor(v, o));
    const int warp = threadIdx.x / DA_WARP_SIZE, lane = threadIdx.x % DA_WARP_SIZE;
    __syncthreads();  // red is free
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int w = 1; w < DECODE_THREADS / DA_WARP_SIZE; ++w) v = fmaxf(v, red[w]);
    return v;
}

DA_DEVICE float block_reduce_sum(float v, float* red) {
#pragma unroll
    for (int o = DA_WARP_SIZE / 2; o > 0; o >>= 1) v += da_shfl_xor(v, o);
    const int warp = threadIdx.x / DA_WARP_SIZE, lane = threadIdx.x % DA_WARP_SIZE;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int w = 1; w < DECODE_THREADS / DA_WARP_SIZE; ++w) v += red[w];
    return v;
}

template <typename T, int HEAD_DIM>
DA_DEVICE void decode_reduce_body(const DecodeParams& p) {
    constexpr int DIMS_PER_THREAD = (HEAD_DIM + DECODE_THREADS - 1) / DECODE_THREADS;
    __shared__ float red[DECODE_THREADS / DA_WARP_SIZE];
    __shared__ float w_s[DECODE_THREADS];

    const int tid = threadIdx.x;
    const int b = blockIdx.x;
    const int h = blockIdx.y;
    const long long lse_index = (long long)b * p.num_q_heads + h;
    const long long out_row = lse_index * HEAD_DIM;
    const int g = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
    const SeqInfo seq = seq_info(p, b);
    if (g < 1 || g * HEAD_DIM > DECODE_MAX_QK_ELEMS || !seq.ok) {
        for (int d = tid; d < HEAD_DIM; d += DECODE_THREADS) Elem<T>::store(p.out, out_row + d, da_nan());
        if (p.out_lse != nullptr && tid == 0) p.out_lse[lse_index] = da_nan();
        return;
    }
    const int active = (int)split_rule(p, seq.len).active_splits;  // <= num_splits
    if (active == 0) {
        for (int d = tid; d < HEAD_DIM; d += DECODE_THREADS) Elem<T>::store(p.out, out_row + d, 0.f);
        if (p.out_lse != nullptr && tid == 0) p.out_lse[lse_index] = da_neg_inf();
        return;
    }
    const long long row0 = ((long long)b * p.num_q_heads + h) * p.num_splits;
    const float* ml = p.partial_ml + row0 * 2;
    const float* acc = p.partial_acc + row0 * HEAD_DIM;

    float m = da_neg_inf();
    for (int j = tid; j < active; j += DECODE_THREADS) m = fmaxf(m, __ldg(ml + 2 * j));
    const float m_max = block_reduce_max(m, red);

    float l = 0.f;
    for (int j = tid; j < active; j += DECODE_THREADS) l += __ldg(ml + 2 * j + 1) * da_exp2(__ldg(ml + 2 * j) - m_max);
    const float l_sum = block_reduce_sum(l, red);

    float o[DIMS_PER_THREAD];
#pragma unroll
    for (int k = 0; k < DIMS_PER_THREAD; ++k) o[k] = 0.f;
    for (int j0 = 0; j0 < active; j0 += DECODE_THREADS) {
        const int n = da_min(DECODE_THREADS, active - j0);
        __syncthreads();  // w_s is free
        if (tid < n) w_s[tid] = da_exp2(__ldg(ml + 2 * (j0 + tid)) - m_max);
        __syncthreads();
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
            const float w = w_s[j];
            const float* a = acc + (long long)(j0 + j) * HEAD_DIM;
#pragma unroll
            for (int k = 0; k < DIMS_PER_THREAD; ++k) {
                const int d = tid + k * DECODE_THREADS;
                if (d < HEAD_DIM) o[k] = fmaf(w, __ldg(a + d), o[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < DIMS_PER_THREAD; ++k) {
        const int d = tid + k * DECODE_THREADS;
        if (d < HEAD_DIM) Elem<T>::store(p.out, out_row + d, o[k] / l_sum);
    }
    if (p.out_lse != nullptr && tid == 0) p.out_lse[lse_index] = da_row_lse(m_max, l_sum);
}

// ---------------------------------------------------------------------------
// The two-way state merge (natural-log LSEs).
// ---------------------------------------------------------------------------
template <typename T>
DA_DEVICE void merge_attn_states_body(const MergeParams& p) {
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    const long long idx = (long long)t * p.num_heads + h;
    const long long row = idx * p.head_dim;
    const float la = p.prefix_lse[idx];
    const float lb = p.suffix_lse[idx];
    const float m = fmaxf(la, lb);
    if (m == da_neg_inf() || da_isnan(m)) {
        for (int d = threadIdx.x; d < p.head_dim; d += DECODE_THREADS) Elem<T>::store(p.out, row + d, 0.f);
        if (p.out_lse != nullptr && threadIdx.x == 0) p.out_lse[idx] = da_neg_inf();
        return;
    }
    const float wa = expf(la - m);
    const float wb = expf(lb - m);
    const float total = wa + wb;
    for (int d = threadIdx.x; d < p.head_dim; d += DECODE_THREADS) {
        const float a = Elem<T>::load(p.prefix, row + d);
        const float bb = Elem<T>::load(p.suffix, row + d);
        Elem<T>::store(p.out, row + d, (wa * a + wb * bb) / total);
    }
    if (p.out_lse != nullptr && threadIdx.x == 0) p.out_lse[idx] = m + logf(total);
}

// ---------------------------------------------------------------------------
// Entry points.
// ---------------------------------------------------------------------------
#define DA_DECODE_ENTRY(TNAME, TYPE, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 4) decode_attn_##TNAME##_d##D(const DecodeParams p) { \
        decode_attn_body<TYPE, D>(p);                                                                    \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS)                                         \
        decode_attn_reduce_##TNAME##_d##D(const DecodeParams p) {                                        \
        decode_reduce_body<TYPE, D>(p);                                                                  \
    }

// Parts. Built whole (nvcc, the tests, the probes) the file defines every
// entry point. The NVRTC path compiles it one part at a time, on first use of
// that part (crates/cuda/src/parts.rs; `KernelPart` in core's kernel_part.rs):
// the whole file takes NVRTC minutes, one part seconds, and an engine uses one
// or two. A part is one element type and one head dim, chosen by
// -DDA_PART_TYPE=1|2|3 (f32, f16, bf16) and -DDA_PART_HEAD_DIM=D; head dim 0
// is the type's merge_attn_states_<T> alone.
#define DA_TYPE_F32 1
#define DA_TYPE_F16 2
#define DA_TYPE_BF16 3
#if defined(DA_PART_TYPE) != defined(DA_PART_HEAD_DIM)
#error "a part names both DA_PART_TYPE and DA_PART_HEAD_DIM"
#endif
#ifdef DA_PART_TYPE
#define DA_PART_HAS_TYPE(T) (DA_PART_TYPE == (T))
#define DA_PART_HAS_DIM(D) (DA_PART_HEAD_DIM == (D))
#else
#define DA_PART_HAS_TYPE(T) 1
#define DA_PART_HAS_DIM(D) 1
#endif

// The head dims the kernels are instantiated for (core's SUPPORTED_HEAD_DIMS;
// the mma kernel stops at 128), or the part's alone:
// ENTRY(A, B, D) for each, A and B passed through.
#ifndef DA_PART_HEAD_DIM
#define DA_DIMS_TO_128(ENTRY, A, B) \
    ENTRY(A, B, 64) ENTRY(A, B, 80) ENTRY(A, B, 96) ENTRY(A, B, 112) ENTRY(A, B, 120) ENTRY(A, B, 128)
#define DA_ALL_DIMS(ENTRY, A, B) DA_DIMS_TO_128(ENTRY, A, B) ENTRY(A, B, 192) ENTRY(A, B, 256)
#else
// One more level, so that DA_PART_HEAD_DIM is replaced by its number before
// ENTRY pastes it into a name.
#define DA_PART_ENTRY(ENTRY, A, B, D) ENTRY(A, B, D)
#if DA_PART_HEAD_DIM > 0 && DA_PART_HEAD_DIM <= 128
#define DA_DIMS_TO_128(ENTRY, A, B) DA_PART_ENTRY(ENTRY, A, B, DA_PART_HEAD_DIM)
#else
#define DA_DIMS_TO_128(ENTRY, A, B)
#endif
#if DA_PART_HEAD_DIM > 0
#define DA_ALL_DIMS(ENTRY, A, B) DA_PART_ENTRY(ENTRY, A, B, DA_PART_HEAD_DIM)
#else
#define DA_ALL_DIMS(ENTRY, A, B)
#endif
#endif

#if DA_PART_HAS_TYPE(DA_TYPE_F32)
DA_ALL_DIMS(DA_DECODE_ENTRY, f32, float)
#endif
#if DA_PART_HAS_TYPE(DA_TYPE_F16)
DA_ALL_DIMS(DA_DECODE_ENTRY, f16, da_f16)
#endif
#if DA_PART_HAS_TYPE(DA_TYPE_BF16)
DA_ALL_DIMS(DA_DECODE_ENTRY, bf16, da_bf16)
#endif

#define DA_MERGE_ENTRY(TNAME, TYPE)                                                                      \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS) merge_attn_states_##TNAME(const MergeParams p) { \
        merge_attn_states_body<TYPE>(p);                                                                 \
    }

#if DA_PART_HAS_DIM(0) && DA_PART_HAS_TYPE(DA_TYPE_F32)
DA_MERGE_ENTRY(f32, float)
#endif
#if DA_PART_HAS_DIM(0) && DA_PART_HAS_TYPE(DA_TYPE_F16)
DA_MERGE_ENTRY(f16, da_f16)
#endif
#if DA_PART_HAS_DIM(0) && DA_PART_HAS_TYPE(DA_TYPE_BF16)
DA_MERGE_ENTRY(bf16, da_bf16)
#endif

// ---------------------------------------------------------------------------
// The streaming kernel (decode_stream.cuh): f32, and the shapes the
// tensor-core kernel below does not take; its reducers merge both's splits.
// ---------------------------------------------------------------------------
#include "decode_stream.cuh"

#if DA_PART_HAS_TYPE(DA_TYPE_F32)
DA_ALL_DIMS(DA_STREAM_ENTRIES, float, f32)
#endif
#if DA_PART_HAS_TYPE(DA_TYPE_F16)
DA_ALL_DIMS(DA_STREAM_ENTRIES, da_f16, f16)
#endif
#if DA_PART_HAS_TYPE(DA_TYPE_BF16)
DA_ALL_DIMS(DA_STREAM_ENTRIES, da_bf16, bf16)
#endif

// ---------------------------------------------------------------------------
// The tensor-core kernel (decode_mma.cuh): the default for f16 and bf16 with
// head_dim <= 128; its splits are merged by decode_stream_reduce_*.
// ---------------------------------------------------------------------------
#include "decode_mma.cuh"

#if DA_PART_HAS_TYPE(DA_TYPE_F16)
DA_DIMS_TO_128(DA_MMA_ENTRY, da_f16, f16)
DA_DIMS_TO_128(DA_MMA_PACKED_ENTRY, da_f16, f16)
DA_DIMS_TO_128(DA_BATCH_REDUCE_ENTRY, da_f16, f16)
#if DA_PART_HAS_DIM(256)
DA_MMA_ENTRY(da_f16, f16, 256)
#endif
#endif
#if DA_PART_HAS_TYPE(DA_TYPE_BF16)
DA_DIMS_TO_128(DA_MMA_ENTRY, da_bf16, bf16)
DA_DIMS_TO_128(DA_MMA_PACKED_ENTRY, da_bf16, bf16)
DA_DIMS_TO_128(DA_BATCH_REDUCE_ENTRY, da_bf16, bf16)
#if DA_PART_HAS_DIM(256)
DA_MMA_ENTRY(da_bf16, bf16, 256)
#endif
#endif

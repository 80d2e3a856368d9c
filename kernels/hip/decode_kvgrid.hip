// decode_kvgrid.hip: the kv-head-grid partitioned decode kernel (vLLM
// paged_attention_v2's grid), one source for HIP (gfx90a, gfx942) and CUDA
// (sm_80, sm_90; nvcc or NVRTC): everything vendor-specific is in
// da_portable.h. The launch ABI (DecodeParams, layouts, split rule, guards)
// is kernels/cuda/decode_params.h.
//
// Entry points (extern "C", `const DecodeParams p` by value), T in {f32, f16,
// bf16}, D in {64, 80, 96, 112, 120, 128, 192, 256}:
//   decode_kvgrid_<T>_d<D>         grid (num_seqs, num_splits, num_kv_heads)
//   decode_kvgrid_reduce_<T>_d<D>  grid (num_seqs, num_q_heads), only when num_splits > 1
// Both: block DECODE_KVGRID_THREADS = 256 threads (4 wavefronts of 64 on AMD,
// 8 warps of 32 on NVIDIA), static shared memory only, below 48 KB (the host
// sets no attribute): decode_kvgrid_*_d<D> 13,520 bytes (D = 64), 14,544
// (80), 15,568 (96), 16,592 (112), 17,104 (120), 17,616 (128), 21,712 (192),
// 25,808 (256), the same for every T (kvgrid_smem_bytes<T, D>()), except the
// MFMA variant's (f16, bf16 on gfx90a / gfx942; see below); the reducer
// 8,256 bytes on NVIDIA, 8,224 on AMD.
//
// Semantics are those of decode_stream.cuh: num_splits == 1 writes the
// normalised output (zeros for length 0, NaN for a bad sequence); num_splits
// > 1 writes unnormalised partial_acc and partial_ml = (max in log2 units,
// sum) for the active splits only (surplus splits exit at once; a bad
// sequence has no active split and its reducer writes NaN), and the reducer
// merges the active rows (NaN for a bad sequence or num_splits >
// DECODE_MAX_SPLITS, zeros when no split is active). Where out_lse is not
// null, whoever writes an output row (the unsplit workgroup, else the
// reducer) writes its LSE next to it, (m + log2 l) ln 2: -inf for zeros, NaN
// for NaN rows. Only the epilogues read out_lse.
//
// One workgroup = (sequence b, split j, KV head): it serves the whole query
// group g = num_q_heads / num_kv_heads of its KV head and reads each K and V
// byte of its token range once. The entry dispatches g to the template
// parameter GQA in buckets {1, 2, 4, 8, 16}: the smallest bucket >= g, with
// the runtime g (nheads <= GQA) masking the rest (their q is zero, softmax
// skips them, nothing is written for them); groups above 16 run in passes of
// 16 heads, the last one partial (each pass reads the KV range again: from
// L2, in practice). Why buckets and not one instantiation per g in 1..16:
// every instantiation is inlined into the one entry, and 16 of them made
// compiles take 4-5 min per gfx arch (clang) and 9-10 min per sm arch (nvcc)
// and the entries 168-214 registers; five take ~0.5 min per arch and fit
// 128 registers on NVIDIA (launch bounds (256, 2), see KVG_MB below). A g
// inside a bucket costs the bucket's QK / PV arithmetic (g = 3 pays for 4,
// g = 9 for 16), not its memory traffic: K and V are still read once.
// The per-workgroup setup (guards, split range, index row) is computed once
// in the entry (KvgWork), before the dispatch.
//
// Inside the workgroup the split's tokens go in chunks of CHUNK = 128:
//   1. QK: each wavefront takes CHUNK / waves consecutive tokens; a K row is
//      spread over LPR lanes as 16-byte chunks (RG = wave / LPR tokens per
//      load, U loads in flight); all g scores of a token come out of the same
//      K registers (q pre-scaled by scale_log2, so scores are in log2 units),
//      summed over the row's lanes by xor butterflies, and go to LDS with the
//      token's byte offset.
//   2. Softmax: wavefront w owns heads w, w + waves, ...: chunk max, new
//      running max m, rescale alpha = 2^(m_old - m), p = 2^(s - m) in place,
//      l = l alpha + sum p. One (m, l) per head for the whole workgroup.
//   3. PV: thread (token group tg, head group hg, 16-byte dim chunk c) owns
//      HPL heads (hg, hg + HG, ...) x one dim chunk in f32 registers (at most
//      32 floats), and adds p * v over tokens tg, tg + TG, ... (V loaded with
//      16-byte loads; the HG head groups of a token load the same bytes in
//      the same instruction).
// At the end the TG token groups are summed by a tree through LDS (no
// rescale: m is workgroup-wide) and token group 0 writes the outputs.
// Three barriers per chunk, no per-wave softmax state, no spills.
//
// Guards as decode_params.h: a bad length or index range reads nothing; a slot
// outside the pool is never read (its K and V count as zeros) and turns the
// workgroup's outputs into NaN.
//
// Matrix cores (KVG_MFMA): on gfx90a and gfx942 the f16 and bf16 entries run
// an MFMA variant instead; f32, every other target and CUDA keep the generic
// path above (-DKVG_NO_MFMA keeps it everywhere). Instructions:
// v_mfma_f32_16x16x16f16 and v_mfma_f32_16x16x16bf16_1k (wave 64, f32
// accumulate; lane layouts in test/mfma_emu.h, which models them for the CPU
// test). One 16-row MFMA tile serves any group up to 16, so no GQA buckets
// (groups above 16: passes of 16 as above); the tile's arithmetic is cheap
// next to its memory traffic even for g = 1. Each wavefront runs its own
// online softmax over the split's 16-token tiles wave, wave + 4, ... (no
// barrier in the loop); lane (qd = lane / 16, n = lane % 16) plays:
//   QK: S^T[16 tokens, 16 heads] = K Q^T, 2 ceil(D/32) MFMAs a tile. The lane
//       loads the K row of token n, 16-byte chunks qd + 4c, straight into the
//       A operand (the contraction order is free as long as both operands
//       agree: Q of head n in the same chunks, kept in registers, is B).
//   Softmax: the lane holds tokens 4 qd + i of head n, so a head's tile max is
//       4 registers and 2 xor shuffles; scores are scaled to log2 units after
//       the MFMA.
//   PV: O^T[dims, 16 heads] += V^T P^T, 8 ceil(D/128) MFMAs a tile. P^T,
//       rounded to T (as FlashAttention-2 does), is the B operand exactly as
//       the S^T accumulator left it; the lane loads the V rows of tokens
//       4 qd + j, chunk n + 16c, and element e of those 4 chunks (16-bit
//       halves paired) is the A operand of m-tile (c, e), whose row n is dim
//       8 (n + 16c) + e.
// Why the transposed products: a lane's softmax state (m, l) and its
// accumulator rows are then the same head n, so rescaling needs no shuffle.
// The V offsets come from the lanes that located those tokens (a gather
// shuffle); K and V go straight from 16-byte loads into registers (no LDS),
// for D <= 128 one tile ahead. At the end the 4 wavefronts' (m, l) meet in
// LDS, each rescales to the common max, the O^T sums pass through LDS in turn
// (wavefront 0 stores, 1 and 2 add, 3 adds into its registers), and
// wavefront 3 writes the outputs (a lane: head n, whole chunks 4 qd + i +
// 16c). Static shared memory 8,720 bytes (D <= 128) or 16,912 (192, 256).
// Semantics, guards and the partial-state layout are the generic path's.
#include "da_portable.h"
#include "decode_params.h"

#define DECODE_KVGRID_THREADS 256
#define DECODE_KVGRID_MAX_GQA 16  // query heads per pass
#define DECODE_KVGRID_CHUNK 128   // tokens per QK / softmax / PV round

// ---------------------------------------------------------------------------
// Element types (16-bit ones as bit patterns).
// ---------------------------------------------------------------------------
struct kvg_f32 {};
struct kvg_f16 {};
struct kvg_bf16 {};

template <typename T>
struct KvgElem;

template <>
struct KvgElem<kvg_f32> {
    static constexpr int BYTES = 4;
    static constexpr int EPC = 4;  // elements per 16 bytes
    DA_DEVICE static void unpack(const dap_u4& r, float* f) {
        f[0] = dap_u2f(r.x);
        f[1] = dap_u2f(r.y);
        f[2] = dap_u2f(r.z);
        f[3] = dap_u2f(r.w);
    }
    DA_DEVICE static dap_u4 pack(const float* f) { return dap_u4{dap_f2u(f[0]), dap_f2u(f[1]), dap_f2u(f[2]), dap_f2u(f[3])}; }
    DA_DEVICE static void store1(void* base, long long i, float v) { reinterpret_cast<float*>(base)[i] = v; }
};

template <>
struct KvgElem<kvg_bf16> {
    static constexpr int BYTES = 2;
    static constexpr int EPC = 8;
    DA_DEVICE static void unpack2(unsigned w, float* f) {
        f[0] = dap_u2f(w << 16);
        f[1] = dap_u2f(w & 0xffff0000u);
    }
    DA_DEVICE static void unpack(const dap_u4& r, float* f) {
        unpack2(r.x, f);
        unpack2(r.y, f + 2);
        unpack2(r.z, f + 4);
        unpack2(r.w, f + 6);
    }
    DA_DEVICE static unsigned pack2(float a, float b) {
        return (unsigned)dap_f32_to_bf16(a) | ((unsigned)dap_f32_to_bf16(b) << 16);
    }
    DA_DEVICE static dap_u4 pack(const float* f) {
        return dap_u4{pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7])};
    }
    DA_DEVICE static void store1(void* base, long long i, float v) {
        reinterpret_cast<unsigned short*>(base)[i] = dap_f32_to_bf16(v);
    }
#ifdef DAP_MFMA
    DA_DEVICE static dap_f32x4 mfma(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
        return dap_mfma_16x16x16_bf16(c, a0, a1, b0, b1);
    }
#endif
};

template <>
struct KvgElem<kvg_f16> {
    static constexpr int BYTES = 2;
    static constexpr int EPC = 8;
    DA_DEVICE static void unpack2(unsigned w, float* f) {
        f[0] = dap_f16_to_f32((unsigned short)(w & 0xffffu));
        f[1] = dap_f16_to_f32((unsigned short)(w >> 16));
    }
    DA_DEVICE static void unpack(const dap_u4& r, float* f) {
        unpack2(r.x, f);
        unpack2(r.y, f + 2);
        unpack2(r.z, f + 4);
        unpack2(r.w, f + 6);
    }
    DA_DEVICE static unsigned pack2(float a, float b) {
        return (unsigned)dap_f32_to_f16(a) | ((unsigned)dap_f32_to_f16(b) << 16);
    }
    DA_DEVICE static dap_u4 pack(const float* f) {
        return dap_u4{pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7])};
    }
    DA_DEVICE static void store1(void* base, long long i, float v) {
        reinterpret_cast<unsigned short*>(base)[i] = dap_f32_to_f16(v);
    }
#ifdef DAP_MFMA
    DA_DEVICE static dap_f32x4 mfma(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
        return dap_mfma_16x16x16_f16(c, a0, a1, b0, b1);
    }
#endif
};

// ---------------------------------------------------------------------------
// The output rows' log-sum-exp (DecodeParams::out_lse, epilogues only).
// ---------------------------------------------------------------------------
// ln(sum_t exp(softmax_scale q . k_t)) of a row whose (max in log2 units, sum
// of 2^(s - m)) is (m, l): (m + log2 l) ln 2; -inf for l = 0 (no token: the
// row is zeros); NaN for a NaN l (a poisoned partial row). l is 0, NaN or
// >= 1 here (the row's max token adds 2^0), as dap_log2 needs.
DA_DEVICE float kvg_lse(float m, float l) {
    return l == 0.f ? dap_neg_inf() : (m + dap_log2(l)) * 0.693147180559945309f;
}

// ---------------------------------------------------------------------------
// Sequence guards, the split rule, token -> byte offset (decode_params.h).
// ---------------------------------------------------------------------------
struct KvgSeq {
    int len;                // valid only when ok
    long long index_start;  // layout 1: kv_indptr[b]
    bool ok;
};

DA_DEVICE KvgSeq kvg_seq(const DecodeParams& p, int b) {
    KvgSeq s;
    s.len = dap_ld_i32(p.seq_lens + b);
    s.index_start = 0;
    bool ok = s.len >= 0;
    if (p.layout == DECODE_LAYOUT_BLOCK_TABLE) {
        ok = ok && p.block_size > 0 && p.max_blocks_per_seq >= 0 &&
             (long long)s.len <= (long long)p.max_blocks_per_seq * p.block_size;
    } else if (p.layout == DECODE_LAYOUT_TOKEN_INDICES) {
        if (ok) s.index_start = dap_ld_i32(p.kv_indptr + b);
        ok = ok && s.index_start >= 0 && s.index_start + s.len <= p.num_indices;
    } else {
        ok = false;
    }
    s.ok = ok;
    return s;
}

struct KvgCut {
    long long split_tokens;  // tiles_per_split * 16
    long long active;        // active splits
};

// tiles = ceil(len / 16); splits = short_splits where 0 < short_splits <
// num_splits and tiles < short_below_tiles, else num_splits;
// per = max(min_tiles_per_split, 1, ceil(tiles / splits)); active = ceil(tiles / per).
DA_DEVICE KvgCut kvg_cut(const DecodeParams& p, int len) {
    const long long tiles = ((long long)len + DECODE_TILE_TOKENS - 1) / DECODE_TILE_TOKENS;
    long long splits = p.num_splits > 0 ? (long long)p.num_splits : 1;
    if (p.short_splits > 0 && p.short_splits < splits && tiles < (long long)p.short_below_tiles) {
        splits = p.short_splits;
    }
    long long per = p.min_tiles_per_split > 1 ? (long long)p.min_tiles_per_split : 1;
    const long long even = (tiles + splits - 1) / splits;
    if (even > per) per = even;
    KvgCut c;
    c.split_tokens = per * DECODE_TILE_TOKENS;
    c.active = (tiles + per - 1) / per;
    return c;
}

// Byte offset (slot * slot_bytes) of token tok (0 <= tok < len), or -1 when
// its slot is outside the pool (then *bad = 1).
DA_DEVICE long long kvg_offset(const DecodeParams& p, const int* row, int tok, long long slot_bytes, int* bad) {
    long long slot;
    int raw;
    if (p.layout == DECODE_LAYOUT_BLOCK_TABLE) {
        raw = dap_ld_i32(row + tok / p.block_size);
        slot = (long long)raw * p.block_size + tok % p.block_size;
    } else {
        raw = dap_ld_i32(row + tok);
        slot = raw;
    }
    if (raw < 0 || slot >= p.num_slots) {
        *bad = 1;
        return -1;
    }
    return slot * slot_bytes;
}

// ---------------------------------------------------------------------------
// Geometry, all compile-time.
// ---------------------------------------------------------------------------
DAP_HOST_DEVICE constexpr int kvg_cdiv(int a, int b) { return (a + b - 1) / b; }
DAP_HOST_DEVICE constexpr int kvg_pow2_ceil(int x) { return x <= 1 ? 1 : 2 * kvg_pow2_ceil((x + 1) / 2); }
DAP_HOST_DEVICE constexpr int kvg_pow2_floor(int x) { return x < 2 ? 1 : 2 * kvg_pow2_floor(x / 2); }
DAP_HOST_DEVICE constexpr int kvg_max(int a, int b) { return a > b ? a : b; }
DAP_HOST_DEVICE constexpr int kvg_min(int a, int b) { return a < b ? a : b; }

// Register budgets (floats a thread): they bound every GQA bucket, and the
// entry's dispatch makes the kernel's register count the largest of them.
#ifndef KVG_ACC
#define KVG_ACC 16     // PV accumulators
#endif
#ifndef KVG_Q_REGS
#define KVG_Q_REGS 32  // q kept in registers up to this many floats, else read from LDS
#endif
#ifndef KVG_SCORES
#define KVG_SCORES 16  // scores in flight in QK (U tokens x GQA heads)
#endif
#ifndef KVG_MFMA_PREFETCH_REGS
#define KVG_MFMA_PREFETCH_REGS 32  // MFMA path: a tile's K and V up to this many words a lane load one tile ahead
#endif

// Fewest head groups (a power of two) that keep HPL * EPC <= KVG_ACC accumulators a thread.
DAP_HOST_DEVICE constexpr int kvg_head_groups(int gqa, int epc) {
    int hg = 1;
    while (kvg_cdiv(gqa, hg) * epc > KVG_ACC) hg *= 2;
    return hg;
}

template <typename T, int D, int GQA>
struct KvgGeo {
    static constexpr int THREADS = DECODE_KVGRID_THREADS;
    static constexpr int WAVE = DAP_WAVE;
    static constexpr int NW = THREADS / WAVE;  // wavefronts
    static constexpr int EB = KvgElem<T>::BYTES;
    static constexpr int EPC = KvgElem<T>::EPC;
    static constexpr int CH = D * EB / 16;  // 16-byte chunks per row
    static constexpr int C = DECODE_KVGRID_CHUNK;
    // QK: a row over LPR lanes, CPL chunks a lane, RG rows per wave-wide load.
    static constexpr int LPR = kvg_pow2_ceil(CH) < WAVE ? kvg_pow2_ceil(CH) : WAVE;
    static constexpr int CPL = kvg_cdiv(CH, LPR);
    static constexpr int RG = WAVE / LPR;
    static constexpr int CW = C / NW;       // tokens per wavefront per chunk
    static constexpr int LOADS = CW / RG;   // row loads per lane per chunk
    // Row loads in flight: at most 4 chunks of K, and at most KVG_SCORES scores, a lane.
    static constexpr int U_WANT = kvg_pow2_floor(kvg_max(1, kvg_min(4 / CPL, KVG_SCORES / GQA)));
    static constexpr int U = kvg_min(U_WANT, LOADS);
    static constexpr bool Q_REGS = GQA * CPL * EPC <= KVG_Q_REGS;  // q in registers, else read from LDS
    static constexpr int HPW = kvg_cdiv(GQA, NW);          // softmax heads per wavefront
    // PV: thread (tg, hg, c).
    static constexpr int SLOTS = THREADS / CH;
    static constexpr int HG = kvg_head_groups(GQA, EPC);
    static constexpr int HPL = kvg_cdiv(GQA, HG);
    static constexpr int ACC = HPL * EPC;
    static constexpr int TG = kvg_pow2_floor(SLOTS / HG);
    static constexpr int PV_THREADS = TG * HG * CH;
    static constexpr int PVU = 4;  // V loads in flight a thread
    static constexpr int RED_THREADS = (TG / 2) * HG * CH;
    static constexpr int RED_FLOATS = ACC * RED_THREADS;
    static constexpr int UNION_FLOATS = kvg_max(GQA * C, RED_FLOATS);

    static_assert(D % 8 == 0 && CH * 16 == D * EB, "rows are whole 16-byte chunks");
    static_assert(C % NW == 0 && CW % RG == 0 && LOADS % U == 0, "QK tiling");
    static_assert(HG <= SLOTS, "PV tiling");
    static_assert(PV_THREADS <= THREADS && ACC <= KVG_ACC, "PV tiling");
};

template <typename T, int D, int GQA>
struct alignas(16) KvgSmem {
    using G = KvgGeo<T, D, GQA>;
    float q[GQA * D];             // pre-scaled q (f32)
    float u[G::UNION_FLOATS];     // scores / p [GQA][C]; at the end the token-group sums
    long long off[G::C];          // byte offset of each token of the chunk (-1: none)
    float m[GQA], l[GQA], alpha[GQA];
    int bad;
};

// ---------------------------------------------------------------------------
// The matrix-core variant (see the top): 16-bit types on a wave-64 target
// with MFMA (gfx90a, gfx942; the emulation with test/mfma_emu.h).
// -DKVG_NO_MFMA keeps the generic path everywhere.
// ---------------------------------------------------------------------------
#if defined(DAP_MFMA) && DAP_WAVE == 64 && !defined(KVG_NO_MFMA)
#define KVG_MFMA 1
#else
#define KVG_MFMA 0
#endif

template <typename T>
DAP_HOST_DEVICE constexpr bool kvg_uses_mfma() {
    return KVG_MFMA && KvgElem<T>::BYTES == 2;
}

// Lane (quad qd = lane / 16, column n = lane % 16) of a wavefront; one tile =
// 16 tokens. QK (S^T = K Q^T): the lane loads K of token n, chunks qd + 4c
// (KC of them); PV (O^T += V^T P^T): V of tokens 4 qd + j (j < 4), chunks
// n + 16c (VC of them), the 8 elements of a chunk being 8 m-tiles.
template <int D>
struct KvgMfmaGeo {
    static constexpr int WAVE = 64;
    static constexpr int NW = DECODE_KVGRID_THREADS / WAVE;
    static constexpr int TILE = 16;
    static constexpr int CH = D / 8;              // 16-byte chunks of a row
    static constexpr int KC = kvg_cdiv(CH, 4);    // K chunks a lane: 2 KC MFMAs per tile (k = 4 dims each)
    static constexpr int VC = kvg_cdiv(CH, 16);   // V chunks a lane and token
    static constexpr int MT = 8 * VC;             // PV m-tiles (16 dims each): MT MFMAs per tile
    static constexpr int ACC = 4 * MT;            // O^T floats a lane
    static_assert(D % 8 == 0, "rows are whole 16-byte chunks");
};

template <int D>
struct alignas(16) KvgMfmaSmem {
    using G = KvgMfmaGeo<D>;
    float acc[G::ACC][G::WAVE];  // the wavefronts' O^T, summed in turn (lane-major: no bank conflicts)
    float m[G::NW][16], l[G::NW][16];  // each wavefront's (max, sum) per head
    int badw[G::NW];                    // each wavefront met a slot outside the pool
};

// Static shared memory of decode_kvgrid_<T>_d<D>, in bytes: one buffer that
// every GQA bucket of the entry's dispatch shares (separate __shared__
// variables in each instantiation would be allocated side by side).
template <typename T, int D>
DAP_HOST_DEVICE constexpr int kvgrid_smem_bytes() {
    return kvg_uses_mfma<T>()
               ? (int)sizeof(KvgMfmaSmem<D>)
               : kvg_max(kvg_max(kvg_max((int)sizeof(KvgSmem<T, D, 1>), (int)sizeof(KvgSmem<T, D, 2>)),
                                 kvg_max((int)sizeof(KvgSmem<T, D, 4>), (int)sizeof(KvgSmem<T, D, 8>))),
                         (int)sizeof(KvgSmem<T, D, 16>));
}

// ---------------------------------------------------------------------------
// The decode body: one pass over heads [head0, head0 + nheads) of KV head kvh
// (nheads <= GQA; heads past nheads are computed on zero q and dropped).
// ---------------------------------------------------------------------------
// What a workgroup (sequence b, split) reads, the same for every pass:
// tokens [start, end) and the row of its block table / token indices.
struct KvgWork {
    long long start, end;
    const int* index;
    bool ok;       // the sequence passed the guards
    bool active;   // not a surplus split (the unsplit workgroup always is)
};

DA_DEVICE KvgWork kvg_work(const DecodeParams& p, int b, int split) {
    const KvgSeq seq = kvg_seq(p, b);
    const int len = seq.ok ? seq.len : 0;
    const KvgCut cut = kvg_cut(p, len);
    KvgWork w;
    w.ok = seq.ok;
    w.active = p.num_splits == 1 || (long long)split < cut.active;
    w.start = (long long)split * cut.split_tokens;
    w.end = dap_min_ll(len, w.start + cut.split_tokens);
    w.index = p.layout == DECODE_LAYOUT_BLOCK_TABLE ? p.block_table + (long long)b * p.max_blocks_per_seq
                                                    : p.kv_indices + seq.index_start;
    return w;
}

// The generic path's LSEs (unsplit calls with an out_lse): thread h < nheads
// writes head h's from the final (m, l, bad) in LDS, once the PV loop is done
// (sm.m, sm.l and sm.bad stay as they are until the next pass). Where in the
// epilogue is the register allocators' call, each build checked for spills
// and for spill code in the main loops: before the token-group sums on
// wave-64 targets (gfx90a, gfx942: after the outputs, f32 d256 on gfx90a got
// SGPR reloads inside the QK loop), after the outputs elsewhere (NVIDIA:
// before the sums, sm_90's f32 d192 spilled 8 bytes). Either place is
// correct; -DKVG_LSE_EARLY=0/1 picks one.
#ifndef KVG_LSE_EARLY
#define KVG_LSE_EARLY (DAP_WAVE == 64)
#endif

template <typename S>
DA_DEVICE void kvg_body_lse(const DecodeParams& p, const S& sm, int b, int head0, int nheads, int tid) {
    if (p.num_splits == 1 && tid < nheads && p.out_lse != nullptr)
        p.out_lse[(long long)b * p.num_q_heads + head0 + tid] = sm.bad != 0 ? dap_nan() : kvg_lse(sm.m[tid], sm.l[tid]);
}

template <typename T, int D, int GQA>
DA_DEVICE void kvgrid_body(const DecodeParams& p, const KvgWork& w, int kvh, int head0, int nheads,
                           unsigned char* smem) {
    using G = KvgGeo<T, D, GQA>;
    using E = KvgElem<T>;
    constexpr int EPC = G::EPC, CH = G::CH, C = G::C, LPR = G::LPR, CPL = G::CPL, U = G::U;
    KvgSmem<T, D, GQA>& sm = *reinterpret_cast<KvgSmem<T, D, GQA>*>(smem);

    const int tid = dap_tid();
    const int b = dap_bid_x();
    const int split = dap_bid_y();
    const bool unsplit = p.num_splits == 1;
    const long long start = w.start, end = w.end;

    dap_barrier();  // a previous pass (g > 16) is done with sm
    // Stage q (pre-scaled, f32); init the softmax state.
    for (int i = tid; i < GQA * CH; i += G::THREADS) {
        const int h = i / CH, c = i % CH;
        float f[EPC];
        if (h < nheads) {
            const char* src = reinterpret_cast<const char*>(p.q) +
                              (((long long)b * p.num_q_heads + head0 + h) * D + c * EPC) * G::EB;
            E::unpack(dap_ld16(src), f);
        } else {
#pragma unroll
            for (int e = 0; e < EPC; ++e) f[e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < EPC; ++e) sm.q[h * D + c * EPC + e] = f[e] * p.scale_log2;
    }
    if (tid < GQA) {
        sm.m[tid] = dap_neg_inf();
        sm.l[tid] = 0.f;
        sm.alpha[tid] = 0.f;
    }
    if (tid == 0) sm.bad = w.ok ? 0 : 1;
    dap_barrier();

    // QK roles.
    const int wave = tid / G::WAVE;
    const int lane = tid % G::WAVE;
    const int row = lane / LPR;
    const int col = lane % LPR;
    float qr[G::Q_REGS ? GQA : 1][CPL][EPC];
    if constexpr (G::Q_REGS) {
#pragma unroll
        for (int h = 0; h < GQA; ++h)
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int chunk = col + c * LPR;
#pragma unroll
                for (int e = 0; e < EPC; ++e) qr[h][c][e] = chunk < CH ? sm.q[h * D + chunk * EPC + e] : 0.f;
            }
    }
    // PV roles.
    const int tg = tid / (G::HG * CH);
    const int hg = (tid / CH) % G::HG;
    const int pc = tid % CH;
    const bool pv_thread = tid < G::PV_THREADS;
    int hidx[G::HPL];  // this thread's PV heads (clamped: rows past GQA read head GQA-1 and are dropped)
#pragma unroll
    for (int j = 0; j < G::HPL; ++j) hidx[j] = dap_min(hg + j * G::HG, GQA - 1);
    float acc[G::HPL][EPC];
#pragma unroll
    for (int j = 0; j < G::HPL; ++j)
#pragma unroll
        for (int e = 0; e < EPC; ++e) acc[j][e] = 0.f;

    const long long slot_bytes = (long long)p.num_kv_heads * D * G::EB;
    const char* k_base = reinterpret_cast<const char*>(p.k_cache) + (long long)kvh * D * G::EB;
    const char* v_base = reinterpret_cast<const char*>(p.v_cache) + (long long)kvh * D * G::EB;
    const int* index = w.index;

    for (long long c0 = start; c0 < end; c0 += C) {
        const int n = (int)dap_min_ll(C, end - c0);  // tokens of this chunk
        dap_barrier();                                // the previous chunk's PV is done with sm.u and sm.off

        // ---- 1. QK: scores of the wavefront's tokens, all heads. ----
        for (int i0 = 0; i0 < G::LOADS; i0 += U) {
            if (wave * G::CW + i0 * G::RG >= n) break;  // uniform over the wavefront
            dap_u4 kraw[U][CPL];
            int tok[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                tok[u] = wave * G::CW + (i0 + u) * G::RG + row;
                long long off = -1;
                if (tok[u] < n) off = kvg_offset(p, index, (int)(c0 + tok[u]), slot_bytes, &sm.bad);
                if (col == 0 && tok[u] < n) sm.off[tok[u]] = off;
#pragma unroll
                for (int c = 0; c < CPL; ++c) {
                    const int chunk = col + c * LPR;
                    if (off >= 0 && chunk < CH) kraw[u][c] = dap_ld_stream16(k_base + off + chunk * 16);
                    else kraw[u][c] = dap_u4{0u, 0u, 0u, 0u};
                }
            }
            float s[U * GQA];
#pragma unroll
            for (int i = 0; i < U * GQA; ++i) s[i] = 0.f;
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int chunk = col + c * LPR;
                if (chunk >= CH) continue;  // only where CH is not a power of two
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float k[EPC];
                    E::unpack(kraw[u][c], k);
#pragma unroll
                    for (int h = 0; h < GQA; ++h) {
                        float a = s[u * GQA + h];
#pragma unroll
                        for (int e = 0; e < EPC; ++e) {
                            const float qv = G::Q_REGS ? qr[G::Q_REGS ? h : 0][c][e] : sm.q[h * D + chunk * EPC + e];
                            a = dap_fma(qv, k[e], a);
                        }
                        s[u * GQA + h] = a;
                    }
                }
            }
            dap_xor_sum<1, LPR>(s);
            if (col == 0) {
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (tok[u] < n)
#pragma unroll
                        for (int h = 0; h < GQA; ++h) sm.u[h * C + tok[u]] = s[u * GQA + h];
            }
        }
        dap_barrier();

        // ---- 2. Softmax over the chunk, one wavefront per head. ----
        {
            float mx[G::HPW];
#pragma unroll
            for (int j = 0; j < G::HPW; ++j) {
                const int h = wave + j * G::NW;
                float v = dap_neg_inf();
                if (h < nheads)  // masked heads (past g) keep m = -inf, l = 0, alpha = 0
                    for (int t = lane; t < n; t += G::WAVE) v = dap_fmax(v, sm.u[h * C + t]);
                mx[j] = v;
            }
            dap_xor_max<1, G::WAVE>(mx);
            float sum[G::HPW], m_old[G::HPW];
#pragma unroll
            for (int j = 0; j < G::HPW; ++j) {
                const int h = wave + j * G::NW;
                sum[j] = 0.f;
                m_old[j] = 0.f;
                if (h < nheads) {
                    m_old[j] = sm.m[h];
                    mx[j] = dap_fmax(m_old[j], mx[j]);  // the new running max
                    for (int t = lane; t < n; t += G::WAVE) {
                        const float pr = dap_exp2(sm.u[h * C + t] - mx[j]);
                        sm.u[h * C + t] = pr;
                        sum[j] += pr;
                    }
                }
            }
            dap_xor_sum<1, G::WAVE>(sum);
            // Every lane read sm.m[h] above; lane 0 rewrites it below. The
            // shuffles between do not order the two (compute-sanitizer's
            // racecheck reported it, s34); keeping the state in registers
            // instead cost the kernels at the 128-register cap a spill.
            dap_wave_sync();
            if (lane == 0) {
#pragma unroll
                for (int j = 0; j < G::HPW; ++j) {
                    const int h = wave + j * G::NW;
                    if (h < nheads) {
                        const float alpha = dap_exp2(m_old[j] - mx[j]);  // 0 on the first chunk
                        sm.alpha[h] = alpha;
                        sm.m[h] = mx[j];
                        sm.l[h] = sm.l[h] * alpha + sum[j];
                    }
                }
            }
        }
        dap_barrier();

        // ---- 3. PV: rescale, then acc += p * v over this thread's tokens. ----
        if (pv_thread) {
#pragma unroll
            for (int j = 0; j < G::HPL; ++j) {
                const float a = sm.alpha[hidx[j]];
#pragma unroll
                for (int e = 0; e < EPC; ++e) acc[j][e] *= a;
            }
            for (int t0 = tg; t0 < n; t0 += G::TG * G::PVU) {
                dap_u4 vraw[G::PVU];
#pragma unroll
                for (int u = 0; u < G::PVU; ++u) {
                    const int t = t0 + u * G::TG;
                    const long long off = t < n ? sm.off[t] : -1;
                    if (off >= 0) vraw[u] = dap_ld_stream16(v_base + off + pc * 16);
                    else vraw[u] = dap_u4{0u, 0u, 0u, 0u};
                }
#pragma unroll
                for (int u = 0; u < G::PVU; ++u) {
                    const int t = t0 + u * G::TG;
                    if (t < n) {
                        float v[EPC];
                        E::unpack(vraw[u], v);
#pragma unroll
                        for (int j = 0; j < G::HPL; ++j) {
                            const float pr = sm.u[hidx[j] * C + t];
#pragma unroll
                            for (int e = 0; e < EPC; ++e) acc[j][e] = dap_fma(pr, v[e], acc[j][e]);
                        }
                    }
                }
            }
        }
    }
    dap_barrier();  // PV done: sm.u is free; sm.bad, sm.m, sm.l final
#if KVG_LSE_EARLY
    kvg_body_lse(p, sm, b, head0, nheads, tid);
#endif

    // ---- Sum the token groups: a tree through LDS (layout [ACC][RED_THREADS]). ----
#pragma unroll
    for (int step = G::TG / 2; step >= 1; step /= 2) {
        const int span = step * G::HG * CH;  // threads of `step` token groups
        if (pv_thread && tg >= step && tg < 2 * step) {
#pragma unroll
            for (int j = 0; j < G::HPL; ++j)
#pragma unroll
                for (int e = 0; e < EPC; ++e) sm.u[(j * EPC + e) * G::RED_THREADS + (tid - span)] = acc[j][e];
        }
        dap_barrier();
        if (tg < step) {
#pragma unroll
            for (int j = 0; j < G::HPL; ++j)
#pragma unroll
                for (int e = 0; e < EPC; ++e) acc[j][e] += sm.u[(j * EPC + e) * G::RED_THREADS + tid];
        }
        dap_barrier();
    }

    // ---- Outputs: token group 0 holds the sums. ----
    if (tg == 0) {
        const bool bad = sm.bad != 0;
        const float nan = dap_nan();
#pragma unroll
        for (int j = 0; j < G::HPL; ++j) {
            const int h = hg + j * G::HG;
            if (h >= nheads) continue;
            const long long q_head = (long long)b * p.num_q_heads + head0 + h;
            const float l = sm.l[h];
            if (unsplit) {
                float o[EPC];
#pragma unroll
                for (int e = 0; e < EPC; ++e) o[e] = bad ? nan : l == 0.f ? 0.f : acc[j][e] / l;
                char* dst = reinterpret_cast<char*>(p.out) + (q_head * D + pc * EPC) * G::EB;
                dap_st16(dst, E::pack(o));
            } else {
                const long long prow = q_head * p.num_splits + split;
                float* dst = p.partial_acc + prow * D + pc * EPC;
#pragma unroll
                for (int e = 0; e < EPC; e += 4) {
                    float o[4];
#pragma unroll
                    for (int k = 0; k < 4; ++k) o[k] = bad ? nan : acc[j][e + k];
                    dap_st16(dst + e, dap_u4{dap_f2u(o[0]), dap_f2u(o[1]), dap_f2u(o[2]), dap_f2u(o[3])});
                }
                if (pc == 0) {
                    // A bad sequence poisons its rows: l = NaN makes the reducer's sum NaN.
                    p.partial_ml[2 * prow] = bad ? 0.f : sm.m[h];
                    p.partial_ml[2 * prow + 1] = bad ? nan : l;
                }
            }
        }
    }
#if !KVG_LSE_EARLY
    kvg_body_lse(p, sm, b, head0, nheads, tid);
#endif
}

#if KVG_MFMA
DA_DEVICE unsigned kvg_word(const dap_u4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
// The low (hi_half = 0) or high 16-bit halves of two words, as one word (first one low).
DA_DEVICE unsigned kvg_halves(unsigned first, unsigned second, int hi_half) {
    return hi_half ? (first >> 16) | (second & 0xffff0000u) : (first & 0xffffu) | (second << 16);
}

// One tile's K and V as this lane loads them (raw 16-bit bits).
template <int D>
struct KvgMfmaTile {
    dap_u4 k[KvgMfmaGeo<D>::KC];     // token n, chunks qd + 4c
    dap_u4 v[4][KvgMfmaGeo<D>::VC];  // tokens 4 qd + j, chunks n + 16c
};

// One pass over heads [head0, head0 + nheads) (nheads <= 16) of KV head kvh.
// Each wavefront runs its own online softmax over tiles wave, wave + NW, ...
// of the split (no barrier in the loop); the NW states are merged at the end.
template <typename T, int D>
DA_DEVICE void kvgrid_mfma_body(const DecodeParams& p, const KvgWork& w, int kvh, int head0, int nheads,
                                unsigned char* smem) {
    using G = KvgMfmaGeo<D>;
    using E = KvgElem<T>;
    constexpr int KC = G::KC, VC = G::VC, MT = G::MT, CH = G::CH, NW = G::NW, TILE = G::TILE;
    // Load the next tile while this one is computed, where registers allow it.
    constexpr bool PREFETCH = (KC + 4 * VC) * 4 <= KVG_MFMA_PREFETCH_REGS;
    KvgMfmaSmem<D>& sm = *reinterpret_cast<KvgMfmaSmem<D>*>(smem);

    const int tid = dap_tid();
    const int wave = dap_uniform(tid / G::WAVE), lane = tid % G::WAVE;  // uniform: scalar tile loop
    const int qd = lane / 16, n = lane % 16;
    const int b = dap_bid_x();
    const int split = dap_bid_y();
    const bool unsplit = p.num_splits == 1;
    const long long start = w.start, end = w.end;
    const dap_u4 zero16 = {0u, 0u, 0u, 0u};
    const dap_f32x4 zero4 = {0.f, 0.f, 0.f, 0.f};

    dap_barrier();  // a previous pass (g > 16) is done with sm

    // Q of head n (zeros past the group) in this lane's K chunks: QK's B operand.
    dap_u4 qv[KC];
#pragma unroll
    for (int c = 0; c < KC; ++c) {
        const int chunk = qd + 4 * c;
        qv[c] = zero16;
        if (n < nheads && chunk < CH)
            qv[c] = dap_ld16(reinterpret_cast<const char*>(p.q) +
                             ((long long)b * p.num_q_heads + head0 + n) * D * 2 + chunk * 16);
    }

    const long long slot_bytes = (long long)p.num_kv_heads * D * 2;
    const char* k_base = reinterpret_cast<const char*>(p.k_cache) + (long long)kvh * D * 2;
    const char* v_base = reinterpret_cast<const char*>(p.v_cache) + (long long)kvh * D * 2;
    int bad = 0;
    // The tile at t0: K of token t0 + n, V of tokens t0 + 4 qd + j (their
    // offsets from the lanes that located them); zeros past the end or for a
    // bad slot.
    auto load = [&](long long t0, KvgMfmaTile<D>& t) {
        long long off = -1;
        if (t0 + n < end) off = kvg_offset(p, w.index, (int)(t0 + n), slot_bytes, &bad);
        int src[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) src[j] = (lane & 48) | (4 * qd + j);
        unsigned lo[4], hi[4];
        dap_gather_u32<4>((unsigned)off, lo, src);
        dap_gather_u32<4>((unsigned)((unsigned long long)off >> 32), hi, src);
        // One branch per row (not per load): zeros first, then the row's loads.
#pragma unroll
        for (int c = 0; c < KC; ++c) t.k[c] = zero16;
        if (off >= 0) {
#pragma unroll
            for (int c = 0; c < KC; ++c)
                if (qd + 4 * c < CH) t.k[c] = dap_ld_stream16(k_base + off + (qd + 4 * c) * 16);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long voff = (long long)(((unsigned long long)hi[j] << 32) | lo[j]);
#pragma unroll
            for (int c = 0; c < VC; ++c) t.v[j][c] = zero16;
            if (voff >= 0) {
#pragma unroll
                for (int c = 0; c < VC; ++c)
                    if (n + 16 * c < CH) t.v[j][c] = dap_ld_stream16(v_base + voff + (n + 16 * c) * 16);
            }
        }
    };

    // Softmax state of head n (m, l: this quad's share) and O^T[dims][head n].
    float m = dap_neg_inf(), l = 0.f;
    dap_f32x4 o[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) o[mt] = zero4;

    const long long step = (long long)NW * TILE;
    long long t0 = start + (long long)wave * TILE;
    KvgMfmaTile<D> cur;
    load(t0, cur);
    for (; t0 < end; t0 += step) {  // uniform over the wavefront
        KvgMfmaTile<D> nxt;
        if constexpr (PREFETCH) load(t0 + step, nxt);
        // S^T[token 4 qd + i][head n] = K Q^T; k-step (c, h) is dims 8 (qd + 4c) + 4h + (0..3) of every quad.
        dap_f32x4 s = zero4;
#pragma unroll
        for (int c = 0; c < KC; ++c) {
            s = E::mfma(s, cur.k[c].x, cur.k[c].y, qv[c].x, qv[c].y);
            s = E::mfma(s, cur.k[c].z, cur.k[c].w, qv[c].z, qv[c].w);
        }
        // Log2 units, tokens past the end masked; the head's max over the tile's 16 tokens (4 quads).
        float sv[4], mx[1] = {dap_neg_inf()};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            sv[i] = t0 + 4 * qd + i < end ? s[i] * p.scale_log2 : dap_neg_inf();
            mx[0] = dap_fmax(mx[0], sv[i]);
        }
        dap_xor_max<16, 64>(mx);
        const float m_new = dap_fmax(m, mx[0]);  // finite: the tile has a live token
        const float alpha = dap_exp2(m - m_new);  // 0 on the first tile
        m = m_new;
        float pr[4], sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            pr[i] = dap_exp2(sv[i] - m);
            sum += pr[i];
        }
        l = l * alpha + sum;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) o[mt] *= alpha;
        // P^T (rounded to T, as FlashAttention-2 does) is PV's B operand as it
        // stands: lane (qd, n) holds tokens 4 qd + j of head n.
        const unsigned b0 = E::pack2(pr[0], pr[1]), b1 = E::pack2(pr[2], pr[3]);
        // O^T += V^T P^T; m-tile (c, e) row n is dim 8 (n + 16c) + e: element e of the lane's chunk.
#pragma unroll
        for (int c = 0; c < VC; ++c)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const unsigned a0 = kvg_halves(kvg_word(cur.v[0][c], e / 2), kvg_word(cur.v[1][c], e / 2), e & 1);
                const unsigned a1 = kvg_halves(kvg_word(cur.v[2][c], e / 2), kvg_word(cur.v[3][c], e / 2), e & 1);
                o[8 * c + e] = E::mfma(o[8 * c + e], a0, a1, b0, b1);
            }
        if constexpr (PREFETCH) cur = nxt;
        else load(t0 + step, cur);
    }

    // ---- Merge the wavefronts: a common max, then O^T summed through LDS. ----
    float red[2] = {l, 0.f};
    dap_xor_sum<16, 64>(red);  // head n's l over the quads
    float anybad[1] = {bad ? 1.f : 0.f};
    dap_xor_max<1, 64>(anybad);
    if (qd == 0) {
        sm.m[wave][n] = m;
        sm.l[wave][n] = red[0];
    }
    if (lane == 0) sm.badw[wave] = anybad[0] != 0.f ? 1 : 0;
    dap_barrier();
    float big_m = dap_neg_inf();
#pragma unroll
    for (int v = 0; v < NW; ++v) big_m = dap_fmax(big_m, sm.m[v][n]);
    float big_l = 0.f, f = 0.f;
    bool is_bad = !w.ok;
#pragma unroll
    for (int v = 0; v < NW; ++v) {
        const float mv = sm.m[v][n];
        const float fv = mv == dap_neg_inf() ? 0.f : dap_exp2(mv - big_m);  // a wavefront without tokens: 0
        big_l += sm.l[v][n] * fv;
        if (v == wave) f = fv;
        is_bad = is_bad || sm.badw[v] != 0;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) o[mt] *= f;
    // Wavefront 0 stores its O^T, the middle ones add theirs in place, the last one adds into its registers.
#pragma unroll
    for (int v = 0; v < NW; ++v) {
        if (wave == v) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float a = o[mt][i];
                    if (v > 0) a += sm.acc[4 * mt + i][lane];
                    if (v < NW - 1) sm.acc[4 * mt + i][lane] = a;
                    o[mt][i] = a;
                }
        }
        if (v < NW - 1) dap_barrier();
    }

    // ---- Outputs: the last wavefront; lane (qd, n) holds head n, chunks 4 qd + i + 16c. ----
    if (wave == NW - 1 && n < nheads) {
        const float nan = dap_nan();
        const long long q_head = (long long)b * p.num_q_heads + head0 + n;
        const long long prow = q_head * p.num_splits + split;
#pragma unroll
        for (int c = 0; c < VC; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int chunk = 4 * qd + i + 16 * c;
                if (chunk >= CH) continue;
                float o8[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) o8[e] = is_bad ? nan : o[8 * c + e][i];
                if (unsplit) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) o8[e] = is_bad ? nan : big_l == 0.f ? 0.f : o8[e] / big_l;
                    dap_st16(reinterpret_cast<char*>(p.out) + (q_head * D + chunk * 8) * 2, E::pack(o8));
                } else {
                    float* dst = p.partial_acc + prow * D + chunk * 8;
                    dap_st16(dst, dap_u4{dap_f2u(o8[0]), dap_f2u(o8[1]), dap_f2u(o8[2]), dap_f2u(o8[3])});
                    dap_st16(dst + 4, dap_u4{dap_f2u(o8[4]), dap_f2u(o8[5]), dap_f2u(o8[6]), dap_f2u(o8[7])});
                }
            }
        if (unsplit && qd == 0 && p.out_lse != nullptr) p.out_lse[q_head] = is_bad ? nan : kvg_lse(big_m, big_l);
        if (!unsplit && qd == 0) {
            // A bad sequence poisons its rows: l = NaN makes the reducer's sum NaN.
            p.partial_ml[2 * prow] = is_bad ? 0.f : big_m;
            p.partial_ml[2 * prow + 1] = is_bad ? nan : big_l;
        }
    }
}
#endif

template <typename T, int D>
DA_DEVICE void kvgrid_entry(const DecodeParams& p) {
    constexpr int SMEM = kvgrid_smem_bytes<T, D>();
    static_assert(SMEM <= 48 * 1024, "static shared memory above 48 KB");
    struct alignas(16) Buf {
        unsigned char bytes[SMEM];
    };
    __shared__ Buf smem_buf;
    unsigned char* smem = smem_buf.bytes;
    const int kvh = dap_bid_z();
    const int g = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
    const int head0 = kvh * g;
    const KvgWork w = kvg_work(p, dap_bid_x(), dap_bid_y());
    // Surplus splits exit at once (uniform); g < 1 writes nothing (no head to write).
    if (!w.active || g < 1) return;
#if KVG_MFMA
    if constexpr (kvg_uses_mfma<T>()) {
        // One 16-row MFMA tile serves any group up to 16: no buckets, passes of 16 above.
        for (int h = 0; h < g; h += DECODE_KVGRID_MAX_GQA)
            kvgrid_mfma_body<T, D>(p, w, kvh, head0 + h, dap_min(DECODE_KVGRID_MAX_GQA, g - h), smem);
        return;
    }
#endif
    // The smallest bucket >= g; above 16, passes of 16 (the last one partial).
    if (g == 1) {
        kvgrid_body<T, D, 1>(p, w, kvh, head0, 1, smem);
    } else if (g == 2) {
        kvgrid_body<T, D, 2>(p, w, kvh, head0, 2, smem);
    } else if (g <= 4) {
        kvgrid_body<T, D, 4>(p, w, kvh, head0, g, smem);
    } else if (g <= 8) {
        kvgrid_body<T, D, 8>(p, w, kvh, head0, g, smem);
    } else {
        for (int h = 0; h < g; h += DECODE_KVGRID_MAX_GQA)
            kvgrid_body<T, D, DECODE_KVGRID_MAX_GQA>(p, w, kvh, head0 + h, dap_min(DECODE_KVGRID_MAX_GQA, g - h),
                                                     smem);
    }
}

// ---------------------------------------------------------------------------
// The split reducer: one workgroup per (sequence, query head).
// ---------------------------------------------------------------------------
template <typename T, int D>
DA_DEVICE void kvgrid_reduce_body(const DecodeParams& p) {
    constexpr int THREADS = DECODE_KVGRID_THREADS;
    constexpr int NW = THREADS / DAP_WAVE;
    constexpr int RT = D / 4;              // threads per partial row (float4 each)
    constexpr int SG = THREADS / RT;       // rows summed in parallel
    struct Smem {
        float w[DECODE_MAX_SPLITS];  // split weights 2^(m_j - M)
        float part[SG * D];          // per-row-group sums
        float red[2 * NW];
    };
    __shared__ Smem sm;
    static_assert(SG * D <= 1024 && SG >= 1, "reducer tiling");

    const int tid = dap_tid();
    const int b = dap_bid_x();
    const int head = dap_bid_y();
    const long long q_head = (long long)b * p.num_q_heads + head;
    const KvgSeq seq = kvg_seq(p, b);
    if (!seq.ok || p.num_splits > DECODE_MAX_SPLITS) {
        for (int d = tid; d < D; d += THREADS) KvgElem<T>::store1(p.out, q_head * D + d, dap_nan());
        if (tid == 0 && p.out_lse != nullptr) p.out_lse[q_head] = dap_nan();
        return;
    }
    const int active = (int)kvg_cut(p, seq.len).active;  // <= num_splits
    const float* ml = p.partial_ml + 2 * q_head * p.num_splits;
    const int wave = tid / DAP_WAVE, lane = tid % DAP_WAVE;

    float mx[1] = {dap_neg_inf()};
    for (int j = tid; j < active; j += THREADS) mx[0] = dap_fmax(mx[0], ml[2 * j]);
    dap_xor_max<1, DAP_WAVE>(mx);
    if (lane == 0) sm.red[wave] = mx[0];
    dap_barrier();
    float big_m = sm.red[0];
#pragma unroll
    for (int w = 1; w < NW; ++w) big_m = dap_fmax(big_m, sm.red[w]);

    float ls[1] = {0.f};
    for (int j = tid; j < active; j += THREADS) {
        const float w = dap_exp2(ml[2 * j] - big_m);
        sm.w[j] = w;
        ls[0] += ml[2 * j + 1] * w;
    }
    dap_xor_sum<1, DAP_WAVE>(ls);
    if (lane == 0) sm.red[NW + wave] = ls[0];
    dap_barrier();  // also orders the weights before their reads
    float big_l = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) big_l += sm.red[NW + w];
    // The row's LSE (here, not after the sum below, so that big_m need not
    // live through it): -inf when no split is active (zeros), NaN for a
    // poisoned row (NaN l).
    if (tid == 0 && p.out_lse != nullptr) p.out_lse[q_head] = kvg_lse(big_m, big_l);

    // Rows j = sg, sg + SG, ... summed by row group sg, a float4 of dims a thread.
    const int sg = tid / RT, q4 = tid % RT;
    if (sg < SG) {
        const float* acc = p.partial_acc + q_head * p.num_splits * D + q4 * 4;
        float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
        for (int j = sg; j < active; j += SG) {
            const float w = sm.w[j];
            const dap_u4 r = dap_ld16(acc + (long long)j * D);
            a[0] = dap_fma(w, dap_u2f(r.x), a[0]);
            a[1] = dap_fma(w, dap_u2f(r.y), a[1]);
            a[2] = dap_fma(w, dap_u2f(r.z), a[2]);
            a[3] = dap_fma(w, dap_u2f(r.w), a[3]);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) sm.part[sg * D + q4 * 4 + k] = a[k];
    }
    dap_barrier();
    for (int d = tid; d < D; d += THREADS) {
        float a = 0.f;
#pragma unroll
        for (int s = 0; s < SG; ++s) a += sm.part[s * D + d];
        // `== 0`, not `> 0`: a NaN sum (a poisoned row) stays NaN; no active split gives zeros.
        KvgElem<T>::store1(p.out, q_head * D + d, big_l == 0.f ? 0.f : a / big_l);
    }
}

// ---------------------------------------------------------------------------
// Entry points.
// ---------------------------------------------------------------------------
// Workgroups an SM / CU the build asks registers for (launch bounds (256,
// MB)). MB = 2: at most 128 registers on NVIDIA (two workgroups an SM), 256
// VGPRs on gfx90a / gfx942. Every 16-bit entry, and f32 at d = 64, 80, 96,
// 128, 192, fits 128 registers on sm_80 and sm_90 without spills; f32 d = 112
// and 120 (12 bytes on sm_90) and d = 256 (28 bytes on sm_80) spill there, so
// they keep MB = 1 (no cap below the hardware's). On gfx90a / gfx942 the
// MFMA entries (f16, bf16) take 162-235 / 170-250 VGPRs (no AGPRs, no
// scratch; clang-19), under MB = 2's 256. -DKVG_MIN_BLOCKS=n sets every
// entry to n.
#ifdef KVG_MIN_BLOCKS
#define KVG_MB KVG_MIN_BLOCKS
#define KVG_MB_F32_WIDE KVG_MIN_BLOCKS
#else
#define KVG_MB 2
#define KVG_MB_F32_WIDE 1  // f32 d112, d120, d256
#endif

#define KVG_ENTRIES_MB(TNAME, TYPE, D, MB)                                                          \
    DA_KERNEL void DAP_LAUNCH_BOUNDS(DECODE_KVGRID_THREADS, MB) decode_kvgrid_##TNAME##_d##D(const DecodeParams p) { \
        kvgrid_entry<TYPE, D>(p);                                                                   \
    }                                                                                               \
    DA_KERNEL void DAP_LAUNCH_BOUNDS(DECODE_KVGRID_THREADS, 1)                                      \
        decode_kvgrid_reduce_##TNAME##_d##D(const DecodeParams p) {                                 \
        kvgrid_reduce_body<TYPE, D>(p);                                                             \
    }

#define KVG_ALL_DIMS(TNAME, TYPE, MB)                                                               \
    KVG_ENTRIES_MB(TNAME, TYPE, 64, MB)                                                             \
    KVG_ENTRIES_MB(TNAME, TYPE, 80, MB)                                                             \
    KVG_ENTRIES_MB(TNAME, TYPE, 96, MB)                                                             \
    KVG_ENTRIES_MB(TNAME, TYPE, 112, MB)                                                            \
    KVG_ENTRIES_MB(TNAME, TYPE, 120, MB)                                                            \
    KVG_ENTRIES_MB(TNAME, TYPE, 128, MB)                                                            \
    KVG_ENTRIES_MB(TNAME, TYPE, 192, MB)                                                            \
    KVG_ENTRIES_MB(TNAME, TYPE, 256, MB)

#if defined(DA_PART_TYPE) && !defined(DA_KVGRID_ONLY)
// One part of the file: one element type at one head dim, as decode.cu's
// "Parts" (-DDA_PART_TYPE=1|2|3 for f32, f16, bf16, -DDA_PART_HEAD_DIM=D),
// for NVRTC (crates/cuda/src/parts.rs) and hiprtc (crates/hip/src/lib.rs),
// which compile a part when it is first needed (`KernelPart`, in core's
// kernel_part.rs). Each entry point as in the whole list below (a test
// compares their preprocessed text), f32's launch bounds included. Head
// dim 0 (the merge's part in decode.cu) is empty here.
// One more level, so that DA_PART_HEAD_DIM is a number before it is pasted.
#define KVG_PART_ENTRIES(TNAME, TYPE, D, MB) KVG_ENTRIES_MB(TNAME, TYPE, D, MB)
#if DA_PART_HEAD_DIM == 0
#elif DA_PART_TYPE == 1 && (DA_PART_HEAD_DIM == 112 || DA_PART_HEAD_DIM == 120 || DA_PART_HEAD_DIM == 256)
KVG_PART_ENTRIES(f32, kvg_f32, DA_PART_HEAD_DIM, KVG_MB_F32_WIDE)
#elif DA_PART_TYPE == 1
KVG_PART_ENTRIES(f32, kvg_f32, DA_PART_HEAD_DIM, KVG_MB)
#elif DA_PART_TYPE == 2
KVG_PART_ENTRIES(f16, kvg_f16, DA_PART_HEAD_DIM, KVG_MB)
#elif DA_PART_TYPE == 3
KVG_PART_ENTRIES(bf16, kvg_bf16, DA_PART_HEAD_DIM, KVG_MB)
#endif
#elif !defined(DA_KVGRID_ONLY)  // a test can instantiate a subset
KVG_ENTRIES_MB(f32, kvg_f32, 64, KVG_MB)
KVG_ENTRIES_MB(f32, kvg_f32, 80, KVG_MB)
KVG_ENTRIES_MB(f32, kvg_f32, 96, KVG_MB)
KVG_ENTRIES_MB(f32, kvg_f32, 112, KVG_MB_F32_WIDE)
KVG_ENTRIES_MB(f32, kvg_f32, 120, KVG_MB_F32_WIDE)
KVG_ENTRIES_MB(f32, kvg_f32, 128, KVG_MB)
KVG_ENTRIES_MB(f32, kvg_f32, 192, KVG_MB)
KVG_ENTRIES_MB(f32, kvg_f32, 256, KVG_MB_F32_WIDE)
KVG_ALL_DIMS(f16, kvg_f16, KVG_MB)
KVG_ALL_DIMS(bf16, kvg_bf16, KVG_MB)
#endif

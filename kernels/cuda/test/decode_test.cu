// decode_test.cu: a standalone check of kernels/cuda/decode.cu against a CPU
// reference (double accumulation), plus a few bandwidth timings on a GPU.
//
// On a GPU:
//   nvcc -std=c++17 -O2 -arch=sm_90 -I kernels/cuda kernels/cuda/test/decode_test.cu -o /tmp/decode_test
//   /tmp/decode_test            # correctness, then timings
//   /tmp/decode_test quick      # correctness only
// Without one (the kernels on CPU fibers, see cuda_emu.h; correctness only):
//   g++ -std=c++17 -O1 -DDA_EMULATE -x c++ -I kernels/cuda kernels/cuda/test/decode_test.cu -o /tmp/decode_emu
//   /tmp/decode_emu             # about 2 minutes: 696 cases (252 stream, 182 mma)
// (`cargo test` runs it so: tests/tests/emulated_kernels.rs.)
//   /tmp/decode_emu mma [heads|warps]  # the tensor-core kernel only; `heads`: its grids
//                               # heads first; `warps`: a split per warp
//   /tmp/decode_emu [quick|mma ...] wide  # every split case through the wide reducer
//
// It includes decode.cu directly and launches its entry points with <<<>>>,
// exactly as the host ABI (decode_params.h) says, each case through both
// kernels: the staged one (decode_attn_*: grid (num_seqs, num_kv_heads,
// num_splits) x 128 threads, then the reducer (num_seqs, num_q_heads) when
// num_splits > 1) and the stream one, the CUDA backend's default, launched as
// crates/cuda/src/lib.rs decode() does (decode_stream_*_h<HEADS>: HEADS the
// smallest of 1, 2, 4, 8 that holds the group g, capped at 8 (or at the
// case's heads cap, as DECODE_ATTN_CUDA_HEADS_PER_CTA does); grid (num_seqs,
// num_kv_heads * ceil(g / HEADS), num_splits) x 128 threads with
// DECODE_STREAM_RING_BYTES of dynamic shared memory; then
// decode_stream_reduce_* (num_seqs, num_q_heads) when num_splits > 1).
// Stream-only cases (g * head_dim above the staged kernel's 4096) skip the
// staged kernel.
//
// Every case passes out_lse (poisoned with NaN) and checks it against the
// f64 reference's LSE: within 1e-3 max(1, |ref|), exactly -inf for an empty
// sequence, NaN (written, not the poison) where the output is NaN; every
// NULL_LSE_EVERY-th run of a kernel repeats with out_lse null (check_one).
#ifdef DA_EMULATE
#include "cuda_emu.h"
#include "mma_emu.h"
#define DA_LAUNCH(kernel, grid, threads, stream, params) emu_launch(kernel, grid, threads, params)
#define DA_LAUNCH_DYN(kernel, grid, threads, smem, stream, params)                            \
    do {                                                                                      \
        if ((size_t)(smem) > emu::kDynamicSharedBytes) {                                        \
            fprintf(stderr, "emu: %d bytes of dynamic shared memory asked\n", (int)(smem));    \
            exit(2);                                                                          \
        }                                                                                     \
        emu_launch(kernel, grid, threads, params);                                            \
    } while (0)
#else
#include <cuda_runtime.h>
#define DA_LAUNCH(kernel, grid, threads, stream, params) kernel<<<grid, threads, 0, stream>>>(params)
// Above 48 KB of dynamic shared memory needs the per-function opt-in (as lib.rs does).
#define DA_LAUNCH_DYN(kernel, grid, threads, smem, stream, params)                                          \
    do {                                                                                                    \
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem)));         \
        kernel<<<grid, threads, smem, stream>>>(params);                                                    \
    } while (0)
#endif
#include "../decode.cu"
#include "host_ref.h"
#ifdef DA_EMULATE
static_assert(emu::kDynamicSharedBytes >= DECODE_STREAM_RING_BYTES && emu::kDynamicSharedBytes >= DECODE_MMA_RING_BYTES,
              "cuda_emu.h's dynamic shared memory holds either kernel's ring");
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));         \
            exit(2);                                                                                   \
        }                                                                                              \
    } while (0)

typedef void (*Kern)(const DecodeParams);
typedef void (*MergeKern)(const MergeParams);
struct KernPair {
    int dt, d;
    Kern decode, reduce;
};
#define KP(TN, DTV, D) {DTV, D, decode_attn_##TN##_d##D, decode_attn_reduce_##TN##_d##D}
#define KP_ALL(TN, DTV) \
    KP(TN, DTV, 64), KP(TN, DTV, 80), KP(TN, DTV, 96), KP(TN, DTV, 112), KP(TN, DTV, 120), KP(TN, DTV, 128), \
        KP(TN, DTV, 192), KP(TN, DTV, 256)
static KernPair kernels[] = {KP_ALL(f32, F32), KP_ALL(f16, F16), KP_ALL(bf16, BF16)};
// The stream kernel: one entry per HEADS in {1, 2, 4, 8}, and its reducer.
struct StreamKerns {
    int dt, d;
    Kern heads[4];  // HEADS = 1, 2, 4, 8
    Kern reduce, reduce_wide;
};
#define SK(TN, DTV, D)                                                                                     \
    {DTV, D, {decode_stream_##TN##_d##D##_h1, decode_stream_##TN##_d##D##_h2, decode_stream_##TN##_d##D##_h4, \
              decode_stream_##TN##_d##D##_h8},                                                            \
     decode_stream_reduce_##TN##_d##D, decode_stream_reduce_wide_##TN##_d##D}
#define SK_ALL(TN, DTV) \
    SK(TN, DTV, 64), SK(TN, DTV, 80), SK(TN, DTV, 96), SK(TN, DTV, 112), SK(TN, DTV, 120), SK(TN, DTV, 128), \
        SK(TN, DTV, 192), SK(TN, DTV, 256)
static StreamKerns stream_kernels[] = {SK_ALL(f32, F32), SK_ALL(f16, F16), SK_ALL(bf16, BF16)};
static StreamKerns find_stream_kernels(int dt, int d) {
    for (auto& k : stream_kernels)
        if (k.dt == dt && k.d == d) return k;
    fprintf(stderr, "no stream kernel %d %d\n", dt, d);
    exit(2);
}
// The tensor-core kernel (f16/bf16, d <= 128 and 256); its splits use the stream reducer.
typedef void (*MmaKern)(const DecodeParams);
struct MmaKerns {
    int dt, d;
    MmaKern kernel;    // power-of-two block sizes, token indices
    MmaKern anyblock;  // any block size (a multiple of 16)
    MmaKern packed;    // the first over packed (sequence, split) pairs
    MmaKern batch;         // one packed pair per CTA, for plans cut by the batch
    MmaKern batch_reduce;  // the stream reducer of plans cut by the batch
};
#define MK(TN, DTV, D)                                                                                        \
    {DTV, D, decode_mma_##TN##_d##D, decode_mma_##TN##_d##D##_anyblock, decode_mma_##TN##_d##D##_packed, \
     decode_mma_##TN##_d##D##_batch, decode_stream_reduce_batch_##TN##_d##D}
#define MK256(TN, DTV) {DTV, 256, decode_mma_##TN##_d256, decode_mma_##TN##_d256_anyblock, nullptr, nullptr, nullptr}
#define MK_ALL(TN, DTV) \
    MK(TN, DTV, 64), MK(TN, DTV, 80), MK(TN, DTV, 96), MK(TN, DTV, 112), MK(TN, DTV, 120), MK(TN, DTV, 128), MK256(TN, DTV)
static MmaKerns mma_kernels[] = {MK_ALL(f16, F16), MK_ALL(bf16, BF16)};
static bool has_mma_kernel(int dt, int d) {
    for (auto& k : mma_kernels)
        if (k.dt == dt && k.d == d) return true;
    return false;
}
// As lib.rs mma_function: the anyblock entry for block sizes that are not
// powers of two, unless `pow2_entry` (a test that it rejects them).
static bool pow2_entry = false;
// As lib.rs reduce_function: the wide reducer where the narrow one's first
// round of loads holds fewer rows than the plan has splits; `wide` as the
// last argument takes it for every split case.
static bool force_wide_reduce = false;
static Kern reducer(const StreamKerns& sk, int d, int num_splits) {
    return force_wide_reduce || num_splits > decode_reduce_narrow_rows(d) ? sk.reduce_wide : sk.reduce;
}
// Tensor-core grids launched heads first (DECODE_GRID_HEADS_FIRST): `mma heads`.
static bool heads_first = false;
// The tensor-core kernel with one split per warp (DecodeParams::splits_per_cta = WARPS) in split calls.
static bool warp_splits = false;
static MmaKern find_mma_kernel(int dt, int d, int layout, int bs, bool packed = false) {
    const bool anyblock = layout == DECODE_LAYOUT_BLOCK_TABLE && (bs & (bs - 1)) != 0 && !pow2_entry;
    for (auto& k : mma_kernels)
        if (k.dt == dt && k.d == d && (k.packed || !packed)) return packed ? k.packed : anyblock ? k.anyblock : k.kernel;
    fprintf(stderr, "no mma kernel %d %d\n", dt, d);
    exit(2);
}
// lib.rs stream_heads_per_cta, then .min(max_heads_per_cta).
static int stream_heads(int g, int cap) {
    const int h = g == 1 ? 1 : g == 2 ? 2 : g <= 4 ? 4 : 8;
    return std::min(h, cap);
}

static KernPair find_kernels(int dt, int d) {
    for (auto& k : kernels)
        if (k.dt == dt && k.d == d) return k;
    fprintf(stderr, "no kernel %d %d\n", dt, d);
    exit(2);
}

enum Corrupt { NONE = 0, NEG_LEN, TOO_LONG, BAD_SLOT, BAD_INDPTR };

struct Case {
    int dt, d, hkv, g, layout, bs;
    std::vector<int> lens;
    int num_splits, min_tiles;
    std::vector<int> corrupt;  // per sequence
    float qscale = 2.0f;
    int heads_cap = 8;  // the stream kernel's query heads per CTA, at most (DECODE_ATTN_CUDA_HEADS_PER_CTA)
    int packed = 0;     // the tensor-core kernel: > 0 launches this many CTAs per head CTA over packed pairs
    int batch_splits = 0;  // > 0 (packed only): the rule cuts by the batch's mean length (decode_params.h)
};

enum Kernel { STAGED = 0, STREAM = 1, MMA = 2 };
static const char* kernel_name[] = {"staged", "stream", "mma"};

template <typename T>
static T* dalloc(size_t n) {
    T* p = nullptr;
    CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    return p;
}

static std::mt19937_64 rng(12345);
static float urand() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }

struct Problem {
    Case c;
    int B, hq;
    long long num_slots = 0, num_indices = 0;
    int mbps = 0;
    std::vector<int> table, indptr, indices, seq_lens;
    std::vector<float> q, k, v;  // rounded
    std::vector<unsigned char> qb, kb, vb;
};

static Problem build(const Case& c) {
    Problem P;
    P.c = c;
    P.B = (int)c.lens.size();
    P.hq = c.hkv * c.g;
    P.seq_lens = c.lens;
    long long total = 0;
    for (int l : c.lens) total += std::max(l, 0);
    if (c.layout == 0) {
        int nblocks = 0;
        for (int l : c.lens) {
            int nb = (std::max(l, 0) + c.bs - 1) / c.bs;
            P.mbps = std::max(P.mbps, nb);
            nblocks += nb;
        }
        P.mbps += 1;
        nblocks += 3;
        std::vector<int> ids(nblocks);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        P.table.assign((size_t)P.B * P.mbps, -1);
        int next = 0;
        for (int b = 0; b < P.B; ++b) {
            int nb = (std::max(c.lens[b], 0) + c.bs - 1) / c.bs;
            for (int i = 0; i < nb; ++i) P.table[(size_t)b * P.mbps + i] = ids[next++];
        }
        P.num_slots = (long long)nblocks * c.bs;
    } else {
        P.num_slots = total + 7;
        std::vector<int> perm(P.num_slots);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        P.indptr.push_back(0);
        for (int b = 0; b < P.B; ++b) {
            for (int t = 0; t < std::max(c.lens[b], 0); ++t) P.indices.push_back(perm[P.indices.size()]);
            P.indptr.push_back((int)P.indices.size());
        }
        P.num_indices = (long long)P.indices.size();
    }
    // Corruptions.
    for (int b = 0; b < P.B; ++b) {
        int k = c.corrupt.empty() ? NONE : c.corrupt[b];
        int len = c.lens[b];
        if (k == NEG_LEN) P.seq_lens[b] = -5;
        if (k == TOO_LONG) {
            if (c.layout == 0) P.seq_lens[b] = P.mbps * c.bs + 1;
            else P.seq_lens[b] = len + (int)(P.num_indices - P.indptr[b]) + 1;
        }
        if (k == BAD_SLOT && len > 0) {
            int t = len / 2;
            if (c.layout == 0) P.table[(size_t)b * P.mbps + t / c.bs] = (b & 1) ? -1 : (int)(P.num_slots / c.bs);
            else P.indices[P.indptr[b] + t] = (b & 1) ? -1 : (int)P.num_slots;
        }
        if (k == BAD_INDPTR && c.layout == 1) P.indptr[b] = (b & 1) ? -3 : (int)P.num_indices;
    }
    std::vector<float> qf((size_t)P.B * P.hq * c.d), kf((size_t)P.num_slots * c.hkv * c.d), vf(kf.size());
    for (auto& x : qf) x = urand() * c.qscale;
    for (auto& x : kf) x = urand();
    for (auto& x : vf) x = urand();
    encode(c.dt, qf, P.qb, P.q);
    encode(c.dt, kf, P.kb, P.k);
    encode(c.dt, vf, P.vb, P.v);
    return P;
}

struct DeviceProblem {
    void *q, *k, *v, *out;
    int *lens, *table, *indptr, *indices;
    float *pacc, *pml;
    float* lse = nullptr;  // [B, hq], the out_lse of cases that ask for it
};

// The floor on tiles per split the rule gives every sequence of the batch:
// min_tiles, or (batch_splits > 0) the split length of the batch's mean
// length, as decode.cu's batch_tiles_per_split computes it (a sequence whose
// length or index range the kernels reject counts no tiles).
static long long batch_min_tiles(const Problem& P) {
    const Case& c = P.c;
    if (c.batch_splits <= 0) return c.min_tiles;
    long long tiles = 0;
    for (int b = 0; b < P.B; ++b) {
        const int kind = c.corrupt.empty() ? NONE : c.corrupt[b];
        const bool rejected = kind == NEG_LEN || kind == TOO_LONG || (kind == BAD_INDPTR && c.layout == 1);
        if (!rejected) tiles += (c.lens[b] + 15) / 16;
    }
    const long long mean = (tiles + P.B - 1) / P.B;
    return host_split_rule(mean * 16, c.batch_splits, c.min_tiles).per;
}

static DecodeParams make_params(const Problem& P, DeviceProblem& D) {
    const Case& c = P.c;
    DecodeParams p;
    memset(&p, 0, sizeof(p));
    p.q = D.q;
    p.k_cache = D.k;
    p.v_cache = D.v;
    p.out = D.out;
    p.seq_lens = D.lens;
    p.block_table = c.layout == 0 ? D.table : nullptr;
    p.kv_indptr = c.layout == 1 ? D.indptr : nullptr;
    p.kv_indices = c.layout == 1 ? D.indices : nullptr;
    p.partial_acc = c.num_splits > 1 ? D.pacc : nullptr;
    p.partial_ml = c.num_splits > 1 ? D.pml : nullptr;
    p.out_lse = D.lse;
    p.num_slots = P.num_slots;
    p.num_indices = P.num_indices;
    p.num_seqs = P.B;
    p.num_q_heads = P.hq;
    p.num_kv_heads = c.hkv;
    p.layout = c.layout;
    p.block_size = c.bs;
    p.max_blocks_per_seq = P.mbps;
    p.num_splits = c.num_splits;
    p.min_tiles_per_split = c.min_tiles;
    p.batch_splits = c.batch_splits;
    p.scale_log2 = (float)(1.0 / std::sqrt((double)c.d) * 1.4426950408889634);
    return p;
}

// Fills every buffer the kernels write with its poison: the output with 0x7f
// bytes (garbage that is not NaN-free zeros), the workspace and the LSE with
// NaN (0xff bytes), so that a reducer reading an unwritten partial row, or an
// LSE left unwritten, shows.
static void poison_outputs(const Problem& P, DeviceProblem& D) {
    const size_t rows = (size_t)P.B * P.hq * P.c.num_splits;
    CK(cudaMemset(D.out, 0x7f, P.qb.size()));
    CK(cudaMemset(D.pacc, 0xff, rows * P.c.d * 4));
    CK(cudaMemset(D.pml, 0xff, rows * 2 * 4));
    CK(cudaMemset(D.lse, 0xff, (size_t)P.B * P.hq * 4));
}

static DeviceProblem upload(const Problem& P) {
    DeviceProblem D;
    const Case& c = P.c;
    D.q = dalloc<unsigned char>(P.qb.size());
    D.k = dalloc<unsigned char>(P.kb.size());
    D.v = dalloc<unsigned char>(P.vb.size());
    D.out = dalloc<unsigned char>(P.qb.size());
    CK(cudaMemcpy(D.q, P.qb.data(), P.qb.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(D.k, P.kb.data(), P.kb.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(D.v, P.vb.data(), P.vb.size(), cudaMemcpyHostToDevice));
    D.lens = dalloc<int>(P.B);
    CK(cudaMemcpy(D.lens, P.seq_lens.data(), P.B * 4, cudaMemcpyHostToDevice));
    D.table = dalloc<int>(P.table.size());
    if (!P.table.empty()) CK(cudaMemcpy(D.table, P.table.data(), P.table.size() * 4, cudaMemcpyHostToDevice));
    D.indptr = dalloc<int>(P.indptr.size());
    if (!P.indptr.empty()) CK(cudaMemcpy(D.indptr, P.indptr.data(), P.indptr.size() * 4, cudaMemcpyHostToDevice));
    D.indices = dalloc<int>(P.indices.size());
    if (!P.indices.empty())
        CK(cudaMemcpy(D.indices, P.indices.data(), P.indices.size() * 4, cudaMemcpyHostToDevice));
    size_t rows = (size_t)P.B * P.hq * c.num_splits;
    D.pacc = dalloc<float>(rows * c.d);
    D.pml = dalloc<float>(rows * 2);
    D.lse = dalloc<float>((size_t)P.B * P.hq);
    poison_outputs(P, D);
    return D;
}

static void release(DeviceProblem& D) {
    for (void* p : {D.q, D.k, D.v, D.out, (void*)D.lens, (void*)D.table, (void*)D.indptr, (void*)D.indices,
                    (void*)D.pacc, (void*)D.pml, (void*)D.lse})
        cudaFree(p);
}

static void launch(const Problem& P, const DecodeParams& p, cudaStream_t s = 0, int kernel = STAGED) {
    if (kernel == MMA) {
        const StreamKerns sk = find_stream_kernels(P.c.dt, P.c.d);
        const int head_groups = (P.c.g + DECODE_MMA_HEADS - 1) / DECODE_MMA_HEADS;
        const int head_ctas = P.c.hkv * head_groups;
        DecodeParams q = p;
        q.grid_order = heads_first ? DECODE_GRID_HEADS_FIRST : DECODE_GRID_SEQS_FIRST;
        const int warps = DECODE_THREADS / DA_WARP_SIZE;
        q.splits_per_cta = warp_splits && P.c.num_splits > 1 ? warps : 1;
        const int split_ctas = (P.c.num_splits + q.splits_per_cta - 1) / q.splits_per_cta;
        // Packed (as lib.rs launches a ragged split plan): heads first, the
        // pairs in y, one split per CTA.
        const bool packed = P.c.packed > 0 && P.c.num_splits > 1;
        if (packed) q.splits_per_cta = 1;
        // Cut by the batch (as lib.rs launches it): the `_batch` entry, one
        // pair per CTA, num_seqs * (batch_splits + 1) of them.
        const bool batch = packed && P.c.batch_splits > 0;
        const dim3 grid = batch         ? dim3(head_ctas, P.B * (P.c.batch_splits + 1), 1)
                          : packed      ? dim3(head_ctas, P.c.packed, 1)
                          : heads_first ? dim3(head_ctas, P.B, split_ctas)
                                        : dim3(P.B, head_ctas, split_ctas);
        MmaKern main = find_mma_kernel(P.c.dt, P.c.d, P.c.layout, P.c.bs, packed);
        if (batch)
            for (auto& k : mma_kernels)
                if (k.dt == P.c.dt && k.d == P.c.d) main = k.batch;
        DA_LAUNCH_DYN(main, grid, DECODE_THREADS, P.c.d > 128 ? MmaGeometry<256>::SMEM_BYTES : MmaGeometry<128>::SMEM_BYTES,
                      s, q);
        // The reducer gets the decode kernel's parameters, as the backend
        // passes them: splits_per_cta tells it which rows a CTA wrote itself.
        if (P.c.num_splits > 1) {
            Kern reduce = reducer(sk, P.c.d, P.c.num_splits);
            if (packed && P.c.batch_splits > 0)
                for (auto& k : mma_kernels)
                    if (k.dt == P.c.dt && k.d == P.c.d) reduce = k.batch_reduce;
            DA_LAUNCH(reduce, dim3(P.B, P.hq), DECODE_REDUCE_THREADS, s, q);
        }
        return;
    }
    if (kernel == STREAM) {
        const StreamKerns sk = find_stream_kernels(P.c.dt, P.c.d);
        const int heads = stream_heads(P.c.g, P.c.heads_cap);
        const int slot = heads == 1 ? 0 : heads == 2 ? 1 : heads == 4 ? 2 : 3;
        const int head_groups = (P.c.g + heads - 1) / heads;
        DA_LAUNCH_DYN(sk.heads[slot], dim3(P.B, P.c.hkv * head_groups, P.c.num_splits), DECODE_THREADS,
                      DECODE_STREAM_RING_BYTES, s, p);
        if (P.c.num_splits > 1) DA_LAUNCH(reducer(sk, P.c.d, P.c.num_splits), dim3(P.B, P.hq), DECODE_REDUCE_THREADS, s, p);
        return;
    }
    KernPair kp = find_kernels(P.c.dt, P.c.d);
    DA_LAUNCH(kp.decode, dim3(P.B, P.c.hkv, P.c.num_splits), DECODE_THREADS, s, p);
    if (P.c.num_splits > 1) DA_LAUNCH(kp.reduce, dim3(P.B, P.hq), DECODE_THREADS, s, p);
}

// Reference output for (b, h) and its LSE (natural log, -inf for an empty
// sequence), or false (a NaN row and LSE) if the sequence is corrupt.
static bool reference(const Problem& P, int b, int h, std::vector<double>& o, double& lse) {
    const Case& c = P.c;
    o.assign(c.d, 0.0);
    lse = NAN;
    int kind = c.corrupt.empty() ? NONE : c.corrupt[b];
    if (kind == BAD_INDPTR && c.layout != 1) kind = NONE;
    if (kind == BAD_SLOT && c.lens[b] == 0) kind = NONE;
    if (kind != NONE) return false;
    auto slot_of = [&](int t) -> long long {
        return c.layout == 0 ? (long long)P.table[(size_t)b * P.mbps + t / c.bs] * c.bs + t % c.bs
                             : P.indices[P.indptr[b] + t];
    };
    reference_attention(&P.q[((size_t)b * P.hq + h) * c.d], P.k.data(), P.v.data(), c.lens[b], c.d, c.hkv, h / c.g,
                        slot_of, o, &lse);
    return true;
}

static int failures = 0, cases_run = 0;
static int stream_cases = 0, stream_failures = 0;
static double stream_worst[3] = {0, 0, 0};  // per dtype
static int mma_cases = 0, mma_failures = 0;
static double mma_worst[3] = {0, 0, 0};
static double lse_worst = 0;  // max |lse - ref| over every kernel and case

static void check_one(const Case& c, const char* label, int kernel);

// Every case through both kernels (the staged one only where its group fits
// one CTA); `kernels` (bit 1 << STAGED, 1 << STREAM, 1 << MMA) narrows that for the few
// cases too slow to emulate twice.
static int kernel_filter = 7;  // `decode_test mma`: the tensor-core kernel's cases only
static void check_case(const Case& c, const char* label, int kernels = 7) {
    kernels &= kernel_filter;
    // `wide` and `mma warps` rerun only the cases they change: split cases
    // through the stream and tensor-core kernels' reducer (the staged kernel
    // and the batch rule have reducers of their own, an unsplit case none),
    // and split cases with a split per warp (an unsplit CTA has no warp split).
    if ((force_wide_reduce || warp_splits) && c.num_splits <= 1) return;
    if (force_wide_reduce) {
        if (c.batch_splits > 0) return;
        kernels &= ~(1 << STAGED);
    }
    if ((kernels >> STAGED & 1) && c.g * c.d <= DECODE_MAX_QK_ELEMS && c.heads_cap == 8) check_one(c, label, STAGED);
    if (kernels >> STREAM & 1) check_one(c, label, STREAM);
    if ((kernels >> MMA & 1) && c.heads_cap == 8 && has_mma_kernel(c.dt, c.d)) check_one(c, label, MMA);
}

// Every check runs with out_lse (poisoned with NaN first) and checks it; every
// NULL_LSE_EVERY-th check runs once more with out_lse null (out and the
// workspace poisoned again), so the kernels' default path keeps its coverage.
#define NULL_LSE_EVERY 3
static int checks_run = 0;

static void check_one(const Case& c, const char* label, int kernel) {
    Problem P = build(c);
    DeviceProblem D = upload(P);
    const bool null_too = checks_run++ % NULL_LSE_EVERY == 0;
    int bad = 0;
    double worst = 0, worst_lse = 0;
    for (int pass = 0; pass < (null_too ? 2 : 1); ++pass) {
        const bool with_lse = pass == 0;
        if (pass > 0) poison_outputs(P, D);
        DecodeParams p = make_params(P, D);
        if (!with_lse) p.out_lse = nullptr;
        launch(P, p, 0, kernel);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<unsigned char> out(P.qb.size());
        CK(cudaMemcpy(out.data(), D.out, out.size(), cudaMemcpyDeviceToHost));
        std::vector<float> lse((size_t)P.B * P.hq);
        CK(cudaMemcpy(lse.data(), D.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
        const char* pass_name = with_lse ? "" : " (out_lse null)";
        if (c.num_splits > 1) {
            // Surplus splits write nothing: their partial rows keep the 0xff fill.
            // Nor does a lone split on the stream and tensor-core kernels where a
            // CTA takes one split: its CTA writes the output (cta_writes_output).
            const bool per_warp = kernel == MMA && warp_splits;
            const bool lone_direct = kernel != STAGED && !per_warp;
            std::vector<unsigned> ml((size_t)P.B * P.hq * c.num_splits * 2);
            CK(cudaMemcpy(ml.data(), D.pml, ml.size() * 4, cudaMemcpyDeviceToHost));
            for (int b = 0; b < P.B; ++b) {
                if (!c.corrupt.empty() && c.corrupt[b] != NONE) continue;
                unsigned active = (unsigned)host_split_rule(c.lens[b], c.num_splits, batch_min_tiles(P)).active;
                for (int h = 0; h < P.hq; ++h)
                    for (int j = 0; j < c.num_splits; ++j) {
                        unsigned m = ml[(((size_t)b * P.hq + h) * c.num_splits + j) * 2];
                        bool written = m != 0xffffffffu;
                        bool expected = j < (int)active && !(lone_direct && active == 1);
                        if (written != expected && bad++ < 5)
                            printf("    b=%d h=%d split %d of %u active: written=%d%s\n", b, h, j, active,
                                   (int)written, pass_name);
                    }
            }
        }
        const double atol = c.dt == F32 ? 2e-5 : c.dt == F16 ? 2e-3 : 1.6e-2;
        const double rtol = c.dt == F32 ? 2e-5 : c.dt == F16 ? 2e-3 : 1.6e-2;
        std::vector<double> ref;
        double ref_lse = 0;
        // The tensor-core kernel's power-of-two entry point reports any other
        // block size as bad input (the host sends those to the anyblock entry).
        const bool mma_rejects =
            kernel == MMA && pow2_entry && c.layout == DECODE_LAYOUT_BLOCK_TABLE && (c.bs & (c.bs - 1)) != 0;
        for (int b = 0; b < P.B; ++b)
            for (int h = 0; h < P.hq; ++h) {
                bool ok = reference(P, b, h, ref, ref_lse) && !mma_rejects;
                for (int i = 0; i < c.d; ++i) {
                    const unsigned char* elem = &out[(((size_t)b * P.hq + h) * c.d + i) * dt_size(c.dt)];
                    float got = decode_elem(c.dt, elem);
                    if (!ok) {
                        if (!std::isnan(got)) {
                            if (bad++ < 5) printf("    b=%d h=%d i=%d: want NaN, got %g%s\n", b, h, i, got, pass_name);
                        }
                        // The poison's bytes (0x7f) are a NaN in f16: the row must be written.
                        if (std::all_of(elem, elem + dt_size(c.dt), [](unsigned char x) { return x == 0x7f; }) &&
                            bad++ < 5)
                            printf("    b=%d h=%d i=%d: want NaN, left unwritten%s\n", b, h, i, pass_name);
                        continue;
                    }
                    double err = std::fabs(got - ref[i]);
                    if (!(err <= atol + rtol * std::fabs(ref[i]))) {
                        if (bad++ < 5) printf("    b=%d h=%d i=%d: got %g want %g%s\n", b, h, i, got, ref[i], pass_name);
                    }
                    if (std::isfinite(err)) worst = std::max(worst, err);
                }
                // The LSE: NaN where the output is, exactly -inf for an empty
                // sequence, else within 1e-3 max(1, |ref|). The poison (0xff
                // bytes) is a NaN with its sign bit set, the kernels' NaNs
                // (da_nan(), and arithmetic on it) have it clear: so an LSE
                // left unwritten shows where NaN is wanted too. With out_lse
                // null, the buffer keeps its poison bit for bit.
                const float got = lse[(size_t)b * P.hq + h];
                unsigned got_bits;
                memcpy(&got_bits, &got, 4);
                bool lse_ok;
                if (!with_lse) {
                    lse_ok = got_bits == 0xffffffffu;
                } else if (!ok) {
                    lse_ok = std::isnan(got) && !std::signbit(got);
                } else if (std::isinf(ref_lse)) {
                    lse_ok = std::isinf(got) && got < 0;
                } else {
                    const double err = std::fabs((double)got - ref_lse);
                    lse_ok = err <= 1e-3 * std::max(1.0, std::fabs(ref_lse));
                    if (std::isfinite(err)) worst_lse = std::max(worst_lse, err);
                }
                if (!lse_ok && bad++ < 5)
                    printf("    b=%d h=%d lse: got %g (0x%08x) want %g%s\n", b, h, got, got_bits,
                           ok && with_lse ? ref_lse : NAN, pass_name);
            }
    }
    ++cases_run;
    if (kernel == STREAM) {
        ++stream_cases;
        stream_failures += bad != 0;
        stream_worst[c.dt] = std::max(stream_worst[c.dt], worst);
    }
    if (kernel == MMA) {
        ++mma_cases;
        mma_failures += bad != 0;
        mma_worst[c.dt] = std::max(mma_worst[c.dt], worst);
    }
    lse_worst = std::max(lse_worst, worst_lse);
    std::string lens;
    for (size_t i = 0; i < c.lens.size() && i < 6; ++i) lens += std::to_string(c.lens[i]) + ",";
    char heads[16] = "";
    if (kernel == STREAM) snprintf(heads, sizeof heads, " H=%d", stream_heads(c.g, c.heads_cap));
    printf("%s %-6s%-4s %-5s d=%3d hkv=%d g=%2d layout=%d bs=%3d splits=%3d min=%d lens=%s.. max|err|=%.2e "
           "lse %.2e%s %s\n",
           bad ? "FAIL" : "ok  ", kernel_name[kernel], heads, dt_name[c.dt], c.d, c.hkv, c.g, c.layout, c.bs,
           c.num_splits, c.min_tiles, lens.c_str(), worst, worst_lse, null_too ? " +null" : "", label);
    if (bad) ++failures;
    release(D);
}

static void check_merge(int dt, int ntok, int nh, int hd, bool with_lse) {
    std::vector<float> a((size_t)ntok * nh * hd), bb(a.size()), la(ntok * nh), lb(ntok * nh);
    for (auto& x : a) x = urand();
    for (auto& x : bb) x = urand();
    const float ninf = -INFINITY;
    for (int i = 0; i < ntok * nh; ++i) {
        la[i] = urand() * 5;
        lb[i] = urand() * 5;
        if (i % 7 == 1) la[i] = ninf;
        if (i % 7 == 2) lb[i] = ninf;
        if (i % 7 == 3) la[i] = lb[i] = ninf;
    }
    std::vector<unsigned char> ab, bbb;
    std::vector<float> ar, br;
    encode(dt, a, ab, ar);
    encode(dt, bb, bbb, br);
    void *da = dalloc<unsigned char>(ab.size()), *db = dalloc<unsigned char>(ab.size()),
         *dout = dalloc<unsigned char>(ab.size());
    float *dla = dalloc<float>(la.size()), *dlb = dalloc<float>(la.size()), *dlo = dalloc<float>(la.size());
    CK(cudaMemcpy(da, ab.data(), ab.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, bbb.data(), ab.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dla, la.data(), la.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlb, lb.data(), la.size() * 4, cudaMemcpyHostToDevice));
    MergeParams mp;
    memset(&mp, 0, sizeof(mp));
    mp.prefix = da;
    mp.prefix_lse = dla;
    mp.suffix = db;
    mp.suffix_lse = dlb;
    mp.out = dout;
    mp.out_lse = with_lse ? dlo : nullptr;
    mp.num_tokens = ntok;
    mp.num_heads = nh;
    mp.head_dim = hd;
    MergeKern k = dt == F32 ? merge_attn_states_f32 : dt == F16 ? merge_attn_states_f16 : merge_attn_states_bf16;
    DA_LAUNCH(k, dim3(ntok, nh), DECODE_THREADS, 0, mp);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<unsigned char> out(ab.size());
    std::vector<float> lo(la.size());
    CK(cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lo.data(), dlo, lo.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    const double tol = dt == F32 ? 1e-5 : dt == F16 ? 2e-3 : 1.6e-2;
    for (int i = 0; i < ntok * nh; ++i) {
        double m = std::max(la[i], lb[i]);
        bool empty = std::isinf(m) && m < 0;
        double wa = empty ? 0 : std::exp(la[i] - m), wb = empty ? 0 : std::exp(lb[i] - m);
        for (int d = 0; d < hd; ++d) {
            size_t j = (size_t)i * hd + d;
            double want = empty ? 0.0 : (wa * ar[j] + wb * br[j]) / (wa + wb);
            float got = decode_elem(dt, &out[j * dt_size(dt)]);
            if (!(std::fabs(got - want) <= tol * (1 + std::fabs(want)))) {
                if (bad++ < 5) printf("    merge i=%d d=%d got %g want %g\n", i, d, got, want);
            }
        }
        if (with_lse) {
            double want = empty ? -INFINITY : m + std::log(wa + wb);
            bool ok = empty ? (std::isinf(lo[i]) && lo[i] < 0) : std::fabs(lo[i] - want) <= 1e-5 * (1 + std::fabs(want));
            if (!ok && bad++ < 5) printf("    merge lse i=%d got %g want %g\n", i, lo[i], want);
        }
    }
    ++cases_run;
    printf("%s merge %s tokens=%d heads=%d head_dim=%d out_lse=%d\n", bad ? "FAIL" : "ok  ", dt_name[dt], ntok, nh,
           hd, (int)with_lse);
    if (bad) ++failures;
    for (void* p : {da, db, dout, (void*)dla, (void*)dlb, (void*)dlo}) cudaFree(p);
}

#ifndef DA_EMULATE
// Times the case on data filled with a constant pattern (the values do not
// change the work); block tables / token indices are random permutations.
static double time_case(const Case& c, int reps, double* gbps) {
    Problem P;
    P.c = c;
    P.B = (int)c.lens.size();
    P.hq = c.hkv * c.g;
    P.seq_lens = c.lens;
    long long total = 0;
    for (int l : c.lens) total += l;
    if (c.layout == 0) {
        for (int l : c.lens) P.mbps = std::max(P.mbps, (l + c.bs - 1) / c.bs);
        long long nblocks = (long long)P.B * P.mbps;
        std::vector<int> ids(nblocks);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        P.table = ids;
        P.num_slots = nblocks * c.bs;
    } else {
        P.num_slots = total;
        P.indices.resize(total);
        std::iota(P.indices.begin(), P.indices.end(), 0);
        // Shuffle pages of 16 slots (a paged allocator), keeping slots within a page in order.
        std::vector<int> pages(total / 16);
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng);
        for (long long i = 0; i < total; ++i) P.indices[i] = pages[i / 16] * 16 + i % 16;
        P.indptr.push_back(0);
        for (int l : c.lens) P.indptr.push_back(P.indptr.back() + l);
        P.num_indices = total;
    }
    DeviceProblem D;
    size_t qbytes = (size_t)P.B * P.hq * c.d * dt_size(c.dt), kvbytes = (size_t)P.num_slots * c.hkv * c.d * dt_size(c.dt);
    D.q = dalloc<unsigned char>(qbytes);
    D.out = dalloc<unsigned char>(qbytes);
    D.k = dalloc<unsigned char>(kvbytes);
    D.v = dalloc<unsigned char>(kvbytes);
    CK(cudaMemset(D.q, 0x3c, qbytes));
    CK(cudaMemset(D.k, 0x3c, kvbytes));
    CK(cudaMemset(D.v, 0x3c, kvbytes));
    D.lens = dalloc<int>(P.B);
    CK(cudaMemcpy(D.lens, P.seq_lens.data(), P.B * 4, cudaMemcpyHostToDevice));
    D.table = dalloc<int>(P.table.size());
    if (!P.table.empty()) CK(cudaMemcpy(D.table, P.table.data(), P.table.size() * 4, cudaMemcpyHostToDevice));
    D.indptr = dalloc<int>(P.indptr.size());
    if (!P.indptr.empty()) CK(cudaMemcpy(D.indptr, P.indptr.data(), P.indptr.size() * 4, cudaMemcpyHostToDevice));
    D.indices = dalloc<int>(P.indices.size());
    if (!P.indices.empty())
        CK(cudaMemcpy(D.indices, P.indices.data(), P.indices.size() * 4, cudaMemcpyHostToDevice));
    size_t rows = (size_t)P.B * P.hq * c.num_splits;
    D.pacc = dalloc<float>(rows * c.d);
    D.pml = dalloc<float>(rows * 2);
    DecodeParams p = make_params(P, D);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    for (int i = 0; i < 3; ++i) launch(P, p, s);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) launch(P, p, s);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    double us = ms * 1e3 / reps;
    double bytes = 2.0 * total * c.hkv * c.d * dt_size(c.dt);
    *gbps = bytes / (us * 1e-6) / 1e9;
    std::vector<unsigned char> out(qbytes);
    CK(cudaMemcpy(out.data(), D.out, qbytes, cudaMemcpyDeviceToHost));
    float o0 = decode_elem(c.dt, out.data());
    if (!std::isfinite(o0)) printf("    (output not finite: %g)\n", o0);
    release(D);
    cudaStreamDestroy(s);
    return us;
}

#endif

// The batch's split length as the kernels compute it (batch_tiles_per_split,
// in 32 bits), written to p.out, for lengths whose tiles no KV buffer could
// hold: sums past 2^16 tiles a thread and 2^32 tokens a batch.
__global__ void batch_split_probe(const DecodeParams p) {
    const unsigned per = batch_tiles_per_split<DECODE_THREADS>(p);
    if (threadIdx.x == 0) *static_cast<unsigned*>(p.out) = per;
}
__global__ void __launch_bounds__(DECODE_REDUCE_THREADS) batch_split_probe_reducer(const DecodeParams p) {
    const unsigned per = batch_tiles_per_split<DECODE_REDUCE_THREADS>(p);
    if (threadIdx.x == 0) *static_cast<unsigned*>(p.out) = per;
}

static void check_batch_split_lengths() {
    std::mt19937_64 lens_rng(29);
    for (int trial = 0; trial < 8; ++trial) {
        const int n = trial == 0 ? DECODE_PACK_MAX_SEQS : trial == 1 ? 1 : 1 + (int)(lens_rng() % DECODE_PACK_MAX_SEQS);
        std::vector<int> lens(n);
        for (int b = 0; b < n; ++b)
            lens[b] = trial == 0 || trial == 1 ? 0x7fffffff : (int)(lens_rng() % 0x80000000ull) >> (trial % 3) * 8;
        long long tiles = 0;
        for (int l : lens) tiles += (l + 15ll) / 16;
        const long long mean = (tiles + n - 1) / n;
        const int batch_splits = 1 + trial, min_tiles = trial == 3 ? 1 << 20 : 1;
        const long long want = host_split_rule(mean * 16, batch_splits, min_tiles).per;
        int* d_lens = dalloc<int>(n);
        unsigned* d_out = dalloc<unsigned>(1);
        CK(cudaMemcpy(d_lens, lens.data(), n * 4, cudaMemcpyHostToDevice));
        DecodeParams p;
        memset(&p, 0, sizeof(p));
        p.seq_lens = d_lens;
        p.out = d_out;
        p.num_seqs = n;
        p.layout = DECODE_LAYOUT_BLOCK_TABLE;
        p.block_size = 16;
        p.max_blocks_per_seq = 1 << 27;  // every length fits its (never read) row
        p.num_splits = 1024;
        p.batch_splits = batch_splits;
        p.min_tiles_per_split = min_tiles;
        for (int reducer = 0; reducer < 2; ++reducer) {
            if (reducer) DA_LAUNCH(batch_split_probe_reducer, dim3(1), DECODE_REDUCE_THREADS, 0, p);
            else DA_LAUNCH(batch_split_probe, dim3(1), DECODE_THREADS, 0, p);
            CK(cudaDeviceSynchronize());
            unsigned got = 0;
            CK(cudaMemcpy(&got, d_out, 4, cudaMemcpyDeviceToHost));
            const bool ok = got == (unsigned long long)want;
            ++cases_run;
            failures += !ok;
            printf("%s batch split length, %d sequences, %lld tiles, %s: %u (want %lld)\n", ok ? "ok  " : "FAIL", n,
                   tiles, reducer ? "reducer" : "decode", got, want);
        }
        cudaFree(d_lens);
        cudaFree(d_out);
    }
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && std::string(argv[1]) == "quick";
    force_wide_reduce = argc > 1 && std::string(argv[argc - 1]) == "wide";
    if (argc > 1 && std::string(argv[1]) == "mma") {
        quick = true;
        kernel_filter = 1 << MMA;
        heads_first = argc > 2 && std::string(argv[2]) == "heads";
        warp_splits = argc > 2 && std::string(argv[2]) == "warps";
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    check_batch_split_lengths();
    const int dims[] = {64, 80, 96, 112, 120, 128, 192, 256};

    // Every (type, head dim): both layouts, unsplit and split, odd and even groups.
    for (int dt = 0; dt < 3; ++dt)
        for (int d : dims) {
            int gmax = 4096 / d;
            check_case({dt, d, 2, std::min(4, gmax), 0, 16, {1, 17, 300, 0, 33}, 1, 1, {}}, "");
            check_case({dt, d, 1, gmax, 1, 16, {45, 513, 16}, 3, 1, {}}, "g max, split");
            check_case({dt, d, 3, 7, 0, 48, {77, 1, 129}, 4, 1, {}}, "g 7");
            if (d == 128 || d == 256) {
                // Sizes engines pick to line attention pages up with other
                // state: not powers of two, tiles in the middle of a block.
                check_case({dt, d, 2, 4, 0, 80, {1000, 17, 161, 0}, 3, 1, {}}, "80-token blocks", 1 << MMA);
                check_case({dt, d, 1, 8, 0, 544, {2000, 545, 1}, 2, 1, {}}, "544-token blocks", 1 << MMA);
            }
            check_case({dt, d, 2, 1, 1, 16, {255, 31}, 1, 1, {}}, "g 1");
            check_case({dt, d, 2, 2, 0, 32, {100, 7}, 2, 1, {}}, "g 2");
            check_case({dt, d, 1, 3, 1, 16, {70, 300}, 1, 1, {}}, "g 3");
        }
    // The power-of-two entry point given 48-token blocks: NaN, no tile read.
    pow2_entry = true;
    check_case({BF16, 128, 2, 4, 0, 48, {300, 1}, 2, 1, {}}, "pow2 entry, 48-token blocks", 1 << MMA);
    pow2_entry = false;
    // Splits: the planner's shapes, surplus splits, min tiles, empty sequences.
    // (The three long ones run the staged kernel only; the stream kernel gets
    // the same shapes with 2 KV heads and a shorter long sequence, as emulating
    // it costs about 5 times as much.)
    check_case({BF16, 128, 8, 4, 0, 16, {2560, 17, 0, 5000}, 16, 1, {}}, "vllm-like 16 splits", 1 << STAGED);
    check_case({BF16, 128, 8, 4, 0, 64, {2560, 17, 0, 5000}, 8, 4, {}}, "sglang-like min tiles", 1 << STAGED);
    check_case({BF16, 128, 2, 4, 0, 16, {2560, 17, 0, 5000}, 16, 1, {}}, "vllm-like 16 splits", 1 << STREAM | 1 << MMA);
    check_case({BF16, 128, 2, 4, 0, 64, {2560, 17, 0, 5000}, 8, 4, {}}, "sglang-like min tiles", 1 << STREAM | 1 << MMA);
    check_case({BF16, 128, 4, 8, 1, 16, {17}, 3, 1, {}}, "desk-check case (g=8 here)");
    check_case({BF16, 64, 1, 4, 0, 16, {17}, 3, 1, {}}, "desk-check case g=4 d=64 s=17 splits=3");
    check_case({F16, 128, 2, 6, 1, 16, {40000, 3}, 64, 1, {}}, "long, 64 splits", 1 << STAGED);
    check_case({F16, 128, 2, 6, 1, 16, {8000, 3}, 64, 1, {}}, "long, 64 splits", 1 << STREAM | 1 << MMA);
    // More active splits than the narrow reducer loads in its first round
    // (d 64: 16 split lanes x 8 rows, d 128: 8 x 8), so the wide one; 300 at
    // d 64 also more than its first round (16 x 16 rows, pairs up to 128).
    check_case({BF16, 64, 1, 4, 0, 16, {9600, 5}, 300, 1, {}}, "300 active splits", 1 << STREAM | 1 << MMA);
    check_case({BF16, 128, 1, 4, 0, 16, {6000, 5}, 300, 1, {}}, "188 active splits", 1 << STREAM | 1 << MMA);
    check_case({BF16, 128, 1, 8, 0, 16, {2048, 5}, 128, 1, {}}, "128 active splits", 1 << MMA);
    check_case({F32, 256, 1, 2, 1, 16, {1000, 40}, 80, 1, {}}, "d256, 63 active splits", 1 << STREAM);
    check_case({F32, 96, 2, 5, 0, 32, {0, 0, 0}, 5, 1, {}}, "all empty, split");
    check_case({F32, 96, 2, 5, 0, 32, {0, 0, 0}, 1, 1, {}}, "all empty, unsplit");
    check_case({BF16, 256, 2, 16, 0, 16, {1000, 333}, 1, 1, {}}, "d256 g16");
    check_case({BF16, 128, 1, 32, 1, 16, {1000, 333}, 2, 1, {}}, "d128 g32");
    // The stream kernel's shapes: groups above 8 (several CTAs per KV head,
    // the last one partly filled), odd groups, lengths around a 16-token tile,
    // both layouts, block sizes 16 and 64, 1, 3 and many splits.
    {
        struct GS {
            int hq, hkv;
        };
        const GS groups[] = {{20, 2}, {16, 1}, {32, 1}, {7, 1}, {14, 2}};  // g = 10, 16, 32, 7, 7
        const int splits[] = {1, 3, 37};
        int i = 0;
        for (int dt = 0; dt < 3; ++dt)
            for (int d : {64, 120, 128, 256})
                for (const GS& gs : groups) {
                    const int layout = i & 1, bs = (i >> 1) & 1 ? 64 : 16, ns = splits[i % 3];
                    ++i;
                    check_case({dt, d, gs.hkv, gs.hq / gs.hkv, layout, bs, {0, 1, 15, 16, 17, 300}, ns, 1, {}},
                               "stream shapes");
                }
        // Long sequences: unsplit, 3 splits and many splits (some surplus).
        for (int dt = 0; dt < 3; ++dt)
            for (int ns : {1, 3, 100}) {
                check_case({dt, 128, 1, 10, ns == 3, ns == 1 ? 64 : 16, {1200, 17, 1}, ns, 1, {}}, "stream long g10");
                check_case({dt, 120, 2, 7, ns != 3, 16, {900, 0, 16}, ns, 1, {}}, "stream long g7");
            }
        // Fewer query heads per CTA than the group (DECODE_ATTN_CUDA_HEADS_PER_CTA).
        for (int cap : {1, 2, 4}) {
            Case c{BF16, 64, 2, 7, 0, 16, {33, 15, 200}, 3, 1, {}};
            c.heads_cap = cap;
            check_case(c, "stream heads cap, g 7");
            Case c2{F16, 256, 1, 3, 1, 16, {100, 16, 1}, 1, 1, {}};
            c2.heads_cap = cap;
            check_case(c2, "stream heads cap, g 3");
        }
    }
    // Packed pairs (a ragged batch cut by a split length): as many CTAs as
    // pairs, more (the rest exit), and fewer (each CTA takes several pairs in
    // turn, the ring reused), over both layouts, empty and bad sequences, and
    // more sequences than one thread counts (DECODE_THREADS). Not head_dim
    // 256, which has no packed entry point.
    if (!warp_splits && !pow2_entry) {
        auto packed = [](Case c, int ctas, const char* label) {
            c.packed = ctas;
            check_case(c, label, 1 << MMA);
        };
        const std::vector<int> ragged = {2000, 17, 0, 300, 1, 16, 640};
        // 2000 tokens = 125 tiles in 8 splits of at least 16 tiles: 8 + 1 + 0 + 2 + 1 + 1 + 3 = 16 pairs.
        packed({BF16, 128, 2, 4, 0, 16, ragged, 8, 16, {}}, 16, "packed, one CTA per pair");
        packed({BF16, 128, 2, 4, 0, 16, ragged, 8, 16, {}}, 40, "packed, more CTAs than pairs");
        packed({BF16, 128, 2, 4, 0, 16, ragged, 8, 16, {}}, 3, "packed, 3 CTAs take turns");
        packed({F16, 128, 1, 8, 1, 16, ragged, 8, 16, {}}, 5, "packed, token indices");
        packed({BF16, 128, 2, 4, 0, 64, ragged, 8, 16, {}}, 7, "packed, 64-token blocks");
        packed({F16, 96, 4, 2, 0, 32, ragged, 8, 4, {}}, 9, "packed, d96, 4 kv heads");
        packed({BF16, 64, 1, 4, 0, 16, {3000, 5}, 300, 1, {}}, 50, "packed, 188 + 1 pairs on 50 CTAs");
        packed({BF16, 128, 2, 4, 0, 16, {100, 200, 300, 400, 50}, 4, 1, {NONE, NEG_LEN, NONE, TOO_LONG, NONE}}, 2,
               "packed guards: negative, too long");
        packed({F16, 64, 2, 3, 1, 32, {100, 200, 300, 400, 50}, 4, 1, {BAD_SLOT, NONE, BAD_SLOT, NONE, NONE}}, 6,
               "packed guards: bad slot");
        std::vector<int> many(300);
        for (int i = 0; i < 300; ++i) many[i] = i % 7 == 0 ? 200 : i % 5;
        packed({BF16, 64, 1, 2, 0, 16, many, 4, 4, {}}, 100, "packed, 300 sequences");
        // Cut by the batch: every sequence at the split length of the mean
        // (188 tiles over 7 sequences: 27; 2 splits of it: 14 tiles), into at
        // most num_splits splits (16: the 2000-token one gets 9; 4: it gets 4
        // of 32 tiles), on the `_batch` entry (num_seqs * (batch_splits + 1)
        // CTAs, one pair each); the reducer sums the batch's tiles too.
        auto batch = [&](Case c, int batch_splits, const char* label) {
            c.batch_splits = batch_splits;
            packed(c, 1, label);
        };
        batch({BF16, 128, 2, 4, 0, 16, ragged, 16, 1, {}}, 2, "batch rule, 9 + 1 + 2 + 1 + 1 + 3 pairs");
        batch({BF16, 128, 2, 4, 0, 16, ragged, 4, 1, {}}, 2, "batch rule, capped at 4 splits");
        batch({F16, 128, 1, 8, 1, 16, ragged, 16, 8, {}}, 2, "batch rule, token indices, floor of 8 tiles");
        batch({BF16, 64, 2, 4, 0, 32, {640, 640, 640, 640}, 8, 1, {}}, 4, "batch rule, equal lengths as planned");
        batch({BF16, 128, 2, 4, 0, 16, {100, 200, 3000, 400, 50}, 16, 1, {NONE, NEG_LEN, NONE, TOO_LONG, NONE}}, 1,
              "batch rule guards: rejected lengths count no tiles");
        batch({BF16, 64, 1, 2, 0, 16, many, 32, 1, {}}, 1, "batch rule, 300 sequences");
        // Most pairs the bound allows: one sequence of all the tiles, the
        // others empty (mean 32 tiles of 8 sequences, 1 split of it: the
        // long one gets 8 pairs, with 16 CTAs for 8 sequences).
        batch({BF16, 128, 1, 4, 0, 16, {4096, 0, 0, 0, 0, 0, 0, 0}, 16, 1, {}}, 1, "batch rule, the pair bound");
    }
    // Guards: NaN for the bad sequence, the others untouched.
    for (int layout = 0; layout < 2; ++layout)
        for (int ns : {1, 4}) {
            check_case({BF16, 128, 2, 4, layout, 16, {100, 200, 300, 400, 50}, ns, 1, {NONE, NEG_LEN, NONE, TOO_LONG, NONE}},
                       "guards: negative, too long");
            check_case({F16, 64, 2, 3, layout, 32, {100, 200, 300, 400, 50}, ns, 1, {BAD_SLOT, NONE, BAD_SLOT, NONE, NONE}},
                       "guards: bad slot");
            // A bad slot in a lone split (the CTA writes the NaN output and LSE, not the reducer).
            if (ns > 1)
                check_case({F16, 64, 2, 3, layout, 32, {100, 9, 300, 7, 0}, ns, 1, {NONE, BAD_SLOT, NONE, BAD_SLOT, NONE}},
                           "guards: bad slot in a lone split");
            if (layout == 1)
                check_case({F32, 80, 1, 2, 1, 16, {100, 200, 300, 400}, ns, 1, {NONE, BAD_INDPTR, BAD_INDPTR, NONE}},
                           "guards: bad indptr");
        }
    // The merge kernel once, in the runs of every kernel.
    if (kernel_filter == 7 && !force_wide_reduce)
        for (int dt = 0; dt < 3; ++dt) {
            check_merge(dt, 37, 5, 128, true);
            check_merge(dt, 3, 4, 80, false);
        }
    printf("stream kernel: %d cases, %d failed; max|err| f32 %.2e f16 %.2e bf16 %.2e\n", stream_cases,
           stream_failures, stream_worst[F32], stream_worst[F16], stream_worst[BF16]);
    printf("mma kernel: %d cases, %d failed; max|err| f16 %.2e bf16 %.2e\n", mma_cases, mma_failures, mma_worst[F16],
           mma_worst[BF16]);
    printf("out_lse: max|lse - ref| %.2e over every kernel\n", lse_worst);
    printf("%d passed, %d failed\n", cases_run - failures, failures);
    if (quick || failures) return failures ? 1 : 0;
#ifdef DA_EMULATE
    (void)quick;
    return 0;
#else

    // Timings: KV bytes / time (graph-free launches, back to back).
    struct T {
        Case c;
        const char* what;
    };
    std::vector<int> b64(64, 4096), b1 = {131072}, b256(256, 1024), b16(16, 16384);
    std::vector<T> timings = {
        {{BF16, 128, 8, 4, 0, 16, b64, 1, 1, {}}, "B=64 s=4096 llama-8B-like (g4) unsplit"},
        {{BF16, 128, 8, 8, 0, 16, b64, 1, 1, {}}, "B=64 s=4096 g8 unsplit"},
        {{BF16, 128, 8, 1, 0, 16, b64, 1, 1, {}}, "B=64 s=4096 g1 unsplit"},
        {{BF16, 128, 8, 4, 1, 1, b64, 1, 1, {}}, "B=64 s=4096 g4 token indices"},
        {{BF16, 128, 8, 4, 0, 16, b1, 64, 1, {}}, "B=1 s=131072 g4, 64 splits"},
        {{BF16, 128, 8, 4, 0, 16, b16, 4, 1, {}}, "B=16 s=16384 g4, 4 splits"},
        {{BF16, 128, 8, 4, 0, 16, b256, 1, 1, {}}, "B=256 s=1024 g4 unsplit"},
        {{F16, 64, 8, 4, 0, 16, b64, 1, 1, {}}, "f16 d64 B=64 s=4096 g4"},
        {{BF16, 256, 4, 2, 0, 16, b64, 1, 1, {}}, "bf16 d256 B=64 s=4096 g2"},
        {{F32, 128, 8, 4, 0, 16, b64, 1, 1, {}}, "f32 d128 B=64 s=4096 g4"},
    };
    for (auto& t : timings) {
        t.c.qscale = 1.0f;
        double gbps;
        double us = time_case(t.c, 20, &gbps);
        printf("time %-45s %9.1f us  %7.0f GB/s\n", t.what, us, gbps);
    }
    // Copy bandwidth yardstick (read + write).
    {
        size_t n = 2ull << 30;
        void *a = dalloc<unsigned char>(n), *b = dalloc<unsigned char>(n);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
        cudaEventRecord(e0);
        for (int i = 0; i < 5; ++i) cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("copy %.0f GB/s (read + write)\n", 2.0 * n * 5 / (ms * 1e-3) / 1e9);
        cudaFree(a);
        cudaFree(b);
    }
    return 0;
#endif
}

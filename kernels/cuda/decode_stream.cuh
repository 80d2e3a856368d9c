// decode_stream.cuh: the streaming decode kernel (the CUDA backend's default).
//
// Included by decode.cu after its portable layer, element types, sequence
// guards and split rule. Launch: grid (num_seqs, num_kv_heads * head_groups,
// num_splits), or with DecodeParams::grid_order heads first (num_kv_heads *
// head_groups, num_seqs, num_splits) (cta_work), DECODE_THREADS threads,
// DECODE_STREAM_RING_BYTES (64 KiB) of dynamic shared memory, where
// head_groups = ceil(g / HEADS) for the kernel's HEADS (query heads per
// CTA): the host picks the smallest HEADS in
// {1, 2, 4, 8} that holds the group, so for g <= 8 each K and V byte is read
// from HBM exactly once.
//
// Why this shape: decode is bound by bytes, and a CTA streams only as fast as
// the loads it has in flight. Each warp walks its own tokens of the split, a
// row of K (and of V) spread over LANES_PER_ROW lanes as 16-byte chunks, and
// keeps DECODE_STREAM_STAGES - 1 iterations of TOKENS_PER_ITER tokens in
// flight through a per-warp cp.async ring in shared memory (each lane reads
// back only what it copied, so no barrier guards the ring). Scores reduce
// across a row's lanes with xor shuffles; the online softmax is updated once
// per iteration, not once per token; the warps of a CTA merge their
// (m, l, acc) through shared memory once, at the end.
#pragma once

#ifndef DA_PORTABLE_LAYER
// 16-byte streaming load: KV is read once, so keep it out of L1.
DA_DEVICE uint4 da_ld_stream16(const void* ptr) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(ptr));
    return r;
}
DA_DEVICE int da_syncthreads_or(int predicate) { return __syncthreads_or(predicate); }
// Programmatic dependent launch (sm_90): the decode kernels let their reducer
// launch while they drain; the reducer waits for their stores before reading
// them. Both are no-ops when the reducer was launched without the attribute.
DA_DEVICE void da_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
DA_DEVICE void da_wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The same wait, with `count` (>= 0) and `address` computed before it. The
// wait orders memory, not arithmetic, and ptxas sank the reducer's split
// rule (32-bit divisions) and its row addresses below it, onto the chain
// that starts when the decode grid ends. Here they guard the wait, with a
// predicate that is always true, so they are ready before it.
DA_DEVICE void da_wait_for_producer_after(int count, const void* address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n\t.reg .pred ready;\n\t"
        "setp.ge.s32 ready, %0, 0;\n\t"
        "setp.ne.or.b64 ready, %1, 1, ready;\n\t"
        "@ready griddepcontrol.wait;\n\t}" ::"r"(count),
        "l"(address)
        : "memory");
#endif
}
// The launch's dynamic shared memory as a byte array `name`, 128-byte
// aligned. It follows the entry point's static shared memory, and the rings'
// swizzles are laid out from a 128-byte boundary (a row of the 32 banks).
// Aligned to 16 bytes, the packed and batch entry points' 24-56 static bytes
// put the tensor-core ring 32 or 64 bytes off one; at 32, 12 of the 16
// cp.async copies of a tile took two shared-memory wavefronts instead of one,
// and the same plan streamed 7-8% slower (ncu, s31; docs/PERFORMANCE.md).
// The plain entry points have no static shared memory: their code is the
// same either way.
#define DA_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

DA_DEVICE long long da_min_ll(long long a, long long b) { return a < b ? a : b; }

// Iterations each warp keeps in flight (shared-memory ring), and the dynamic
// shared memory the host gives every launch of the stream kernel.
#define DECODE_STREAM_STAGES 4
#define DECODE_STREAM_RING_BYTES 65536

__host__ __device__ constexpr int da_pow2_at_least(int x) { return x <= 1 ? 1 : 2 * da_pow2_at_least((x + 1) / 2); }

template <typename T, int HEAD_DIM, int HEADS>
struct StreamGeometry {
    static constexpr int WARPS = DECODE_THREADS / DA_WARP_SIZE;
    static constexpr int ELEMS_PER_CHUNK = Elem<T>::PER_CHUNK;                       // 16 bytes
    static constexpr int CHUNKS_PER_ROW = HEAD_DIM * Elem<T>::BYTES / 16;
    static constexpr int LANES_PER_ROW =
        da_pow2_at_least(CHUNKS_PER_ROW) < DA_WARP_SIZE ? da_pow2_at_least(CHUNKS_PER_ROW) : DA_WARP_SIZE;
    static constexpr int CHUNKS_PER_LANE = da_cdiv(CHUNKS_PER_ROW, LANES_PER_ROW);
    static constexpr int ROWS_PER_LOAD = DA_WARP_SIZE / LANES_PER_ROW;               // tokens per warp-wide load
    // Row groups loaded per iteration: up to 8 tokens per warp, fewer 16-byte
    // chunks per lane when a lane already holds 8 heads' Q and accumulators of
    // a wide row (keeps the kernel free of spills).
    static constexpr int TARGET_CHUNKS = HEADS * HEAD_DIM * Elem<T>::BYTES <= 2048 ? 8 : 4;
    // LOADS * CHUNKS_PER_LANE chunks of K and of V per lane and stage: at most 4 of each.
    static constexpr int LOADS_WANTED = (TARGET_CHUNKS / ROWS_PER_LOAD) / CHUNKS_PER_LANE;
    static constexpr int LOADS_CAP = 4 / CHUNKS_PER_LANE > 0 ? 4 / CHUNKS_PER_LANE : 1;
    static constexpr int LOADS = LOADS_WANTED < 1 ? 1 : LOADS_WANTED < LOADS_CAP ? LOADS_WANTED : LOADS_CAP;
    static constexpr int TOKENS_PER_ITER = LOADS * ROWS_PER_LOAD;
    static constexpr int LANE_CHUNKS = LOADS * CHUNKS_PER_LANE;
    // The ring: [warp][stage][K, V][LANE_CHUNKS][lane] of 16 bytes. Each lane
    // reads back only the chunks it copied itself, so a lane's own
    // cp.async.wait_group is the only synchronisation the ring needs.
    static constexpr int RING_BYTES = WARPS * DECODE_STREAM_STAGES * 2 * LANE_CHUNKS * DA_WARP_SIZE * 16;
    static_assert(RING_BYTES <= DECODE_STREAM_RING_BYTES, "the host reserves DECODE_STREAM_RING_BYTES");
    static_assert(DECODE_STREAM_STAGES * LOADS <= 32, "valid bits of all stages fit one word");
    static_assert(HEAD_DIM * Elem<T>::BYTES % 16 == 0, "rows are whole 16-byte chunks");
};

// What one CTA of the stream and mma kernels works on. Grid (num_seqs,
// num_kv_heads * head_groups, num_splits): up to HEADS query heads of one KV
// head (head_groups = ceil(g / HEADS) CTAs per KV head), one split of one
// sequence.
struct CtaWork {
    int b;          // the sequence
    int kv_head;
    int head0;      // the CTA's first query head
    int num_heads;  // query heads it serves, <= HEADS
    int split;      // its first split (of p.splits_per_cta)
    SeqInfo seq;
    SeqSplit cut;          // the sequence's split rule
    long long start, end;  // its tokens
};

// Packed pairs (the tensor-core kernel's `_packed` entry points, split plans
// with one split per CTA; the launch picks the entry point). A ragged batch
// cut by a split length gives a short sequence fewer splits than the grid's
// split dimension, and every empty (sequence, split) CTA of a plain grid still
// launches, reads its length and exits: about 0.6 us of a slot each on the
// H200, thousands of them where one long sequence sits among many short ones.
// Packed, the grid is (head CTAs, pairs, 1): blockIdx.x the head CTA, so
// the head CTAs of one pair are launched side by side and read neighbouring
// bytes of the same blocks, and blockIdx.y takes the active pairs y,
// y + gridDim.y, ... in turn. (s8's packed launches, a pair's head CTAs a
// grid apart, were up to 1.36x slower than the plain grid; the order was
// not the cause: the code was, see packed_item and decode_mma_later_items.) Every CTA numbers the pairs from
// all the lengths (thread t owns sequences t, t + DECODE_THREADS, ...; pairs
// go thread by thread, each thread's sequences in order, each sequence's
// splits in order), so the numbering is the same in every CTA, and a graph
// replayed with longer sequences than it was planned for (more pairs than
// CTAs) still covers them all.

// How a packed launch cuts a sequence of `len` tokens: by the plan's rule, or,
// BATCH (the `_batch` entry points, plans cut by the batch), at
// `batch_per_split` tiles (batch_tiles_per_split). A template parameter, not
// a test of batch_splits: the `_packed` entry points keep their code.
template <bool BATCH>
DA_DEVICE SeqSplit packed_split_rule(const DecodeParams& p, int len, unsigned batch_per_split) {
    if constexpr (BATCH) return batch_split_rule(p, len, batch_per_split);
    else return split_rule(p, len);
}

// Pairs of sequence b: its active splits (none for a bad or empty sequence),
// with its guards and cut.
template <bool BATCH>
DA_DEVICE int packed_seq(const DecodeParams& p, int b, unsigned batch_per_split, SeqInfo& info, SeqSplit& cut) {
    info = seq_info(p, b);
    cut = packed_split_rule<BATCH>(p, info.ok ? info.len : 0, batch_per_split);
    return info.ok ? (int)cut.active_splits : 0;
}

// The sequence and split of packed pair `item`, with the sequence's guards
// and cut; false past the last pair (bad and empty sequences have none: the
// reducer writes their rows). `total_out`: how many pairs there are. Every
// thread of the CTA calls it with the same item. Its loops are not
// unrolled: this code runs once per CTA, and an unrolled count (16
// sequences a thread) made the entry point's code 3.5 times the plain
// one's, fetched by every SM.
//
// This is the chain between a CTA's wait and its first block-table load,
// which the plain grid does not have (s33: 0.9-1.9 us of a short call,
// docs/PERFORMANCE.md). So each thread keeps its first sequence's guards and
// cut (its only one where num_seqs <= DECODE_THREADS), and the thread that
// owns the pair hands the CTA that sequence's guards and cut through shared
// memory: no length is loaded, and no split rule divides, twice on the way.
// The later sequences' loops count from DECODE_THREADS, not from the thread
// index (see for_each_own_seq).
template <bool BATCH>
DA_DEVICE bool packed_item(const DecodeParams& p, int item, unsigned batch_per_split, int& seq_out, int& split_out,
                           SeqInfo& info_out, SeqSplit& cut_out, int& total_out) {
    constexpr int WARPS = DECODE_THREADS / DA_WARP_SIZE;
    __shared__ int warp_pairs[WARPS];
    __shared__ int found_seq, found_split;
    __shared__ SeqInfo found_info;
    __shared__ SeqSplit found_cut;
    __syncthreads();  // the previous item's readers of shared memory are done
    const int t = threadIdx.x;
    int mine = 0, first_pairs = 0;
    SeqInfo first_info{};
    SeqSplit first_cut{};
    if (t < p.num_seqs) {
        first_pairs = packed_seq<BATCH>(p, t, batch_per_split, first_info, first_cut);
        mine = first_pairs;
#pragma unroll 1
        for (int b = DECODE_THREADS; b + t < p.num_seqs; b += DECODE_THREADS) {
            SeqInfo info;
            SeqSplit cut;
            mine += packed_seq<BATCH>(p, b + t, batch_per_split, info, cut);
        }
    }
    // Pairs before this thread's: a scan over the warp in floats (counts stay
    // below 2^24, exact), then the warps before it.
    const int lane = t % DA_WARP_SIZE, warp = t / DA_WARP_SIZE;
    float inclusive = (float)mine, group = (float)mine;
#pragma unroll
    for (int o = 1; o < DA_WARP_SIZE; o <<= 1) {
        const float sibling = da_shfl_xor(group, o);
        if (lane & o) inclusive += sibling;  // the sibling group precedes this lane's
        group += sibling;
    }
    if (lane == 0) warp_pairs[warp] = (int)group;
    __syncthreads();
    int k = item - ((int)inclusive - mine), total = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        k -= w < warp ? warp_pairs[w] : 0;
        total += warp_pairs[w];
    }
    if (k >= 0 && k < mine) {
        if (k < first_pairs) {
            found_seq = t;
            found_split = k;
            found_info = first_info;
            found_cut = first_cut;
        } else {
            // A later sequence's (only where num_seqs > DECODE_THREADS):
            // its length was read above, a cache hit.
            k -= first_pairs;
#pragma unroll 1
            for (int b = DECODE_THREADS; b + t < p.num_seqs; b += DECODE_THREADS) {
                SeqInfo info;
                SeqSplit cut;
                const int pairs = packed_seq<BATCH>(p, b + t, batch_per_split, info, cut);
                if (k < pairs) {
                    found_seq = b + t;
                    found_split = k;
                    found_info = info;
                    found_cut = cut;
                    break;
                }
                k -= pairs;
            }
        }
    }
    __syncthreads();
    total_out = total;
    if (item >= total) return false;
    seq_out = found_seq;
    split_out = found_split;
    info_out = found_info;  // ok: a bad sequence has no pairs
    cut_out = found_cut;
    return true;
}

// The CTA's work, or false for a surplus split, which exits at once (the
// unsplit CTA always has work: it writes zeros for s = 0, NaN for a bad
// sequence). Launched programmatically, the kernel before may still be
// writing Q, the lengths or the index: nothing is read before the wait.
// Heads first (DECODE_GRID_HEADS_FIRST) the CTAs of one (sequence, split)
// are consecutive: they read neighbouring bytes of the same blocks, and in
// a grid of several waves that keeps them in the same wave. PACKED: heads
// first always, and the pair is packed pair `item` (packed_item), false past
// the last; `pairs` gets how many there are. BATCH (with PACKED): the plan
// is cut by the batch, whose split length every CTA computes first.
template <int HEADS, bool PACKED = false, bool BATCH = false>
DA_DEVICE bool cta_work(const DecodeParams& p, CtaWork& w, int item = 0, int* pairs = nullptr) {
    DA_STAMP(0, 0);
    da_wait_for_producer();
    const bool heads_first = PACKED || p.grid_order == DECODE_GRID_HEADS_FIRST;
    const int head_cta = heads_first ? blockIdx.x : blockIdx.y;
    const int group = p.num_q_heads / p.num_kv_heads;
    const int head_groups = da_cdiv(group, HEADS);
    w.kv_head = head_cta / head_groups;
    w.head0 = w.kv_head * group + (head_cta % head_groups) * HEADS;
    w.num_heads = da_min(HEADS, w.kv_head * group + group - w.head0);
    const int splits_per_cta = p.splits_per_cta > 1 ? p.splits_per_cta : 1;
    unsigned batch_per_split = 0;
    if constexpr (PACKED) {
        if constexpr (BATCH) batch_per_split = batch_tiles_per_split<DECODE_THREADS>(p);
        int total = 0;
        const bool found = packed_item<BATCH>(p, item, batch_per_split, w.b, w.split, w.seq, w.cut, total);
        if (pairs) *pairs = total;
        if (!found) return false;
    } else {
        w.b = heads_first ? blockIdx.y : blockIdx.x;
        w.split = blockIdx.z * splits_per_cta;
        w.seq = seq_info(p, w.b);
    }
    const int len = w.seq.ok ? w.seq.len : 0;
    const SeqSplit cut = PACKED ? w.cut : split_rule(p, len);
    w.cut = cut;
    if (p.num_splits != 1) {
        // split >= active_splits, as a multiplication (split_rule).
        if ((unsigned long long)w.split * cut.tiles_per_split >= cut.tiles) return false;
        // A split call's dependent is our reducer, which may start now: it
        // waits for this grid's stores. An unsplit call's is the caller's next
        // kernel, which starts as these CTAs exit: triggered early, it was
        // placed around them and ran slower (`bench --cold` behind an
        // unrelated decode: 8B B=16 s=1024 49 us against 21 us warm;
        // docs/PERFORMANCE.md, version 20).
        da_launch_dependents();
    }
    DA_STAMP(0, 1);
    w.start = (long long)w.split * (long long)cut.tiles_per_split * DECODE_TILE_TOKENS;
    w.end = da_min_ll(len, w.start + (long long)splits_per_cta * cut.tiles_per_split * DECODE_TILE_TOKENS);
    return true;
}

// Whether the CTA writes its heads' output rows itself rather than partial
// rows for the reducer: in an unsplit call, and in a split call where the
// sequence has one active split and the CTA takes that split alone (not one
// split per warp). A graph planned for long sequences and replayed at short
// ones, or the short sequences of a ragged batch, then skip the round trip
// through the workspace; the reducer leaves those rows
// (`reducer_merges`). The lone split is told from the CTA's own token
// range (split 0 reaching the sequence's end), not from active_splits, so
// no split count stays live through the main loop (s25: keeping it cost the
// tensor-core kernel 19 instructions before its first copy).
DA_DEVICE bool cta_writes_output(const DecodeParams& p, const CtaWork& w) {
    return p.num_splits == 1 || (p.splits_per_cta <= 1 && w.split == 0 && w.end == w.seq.len);
}

// The reducer's side of cta_writes_output: whether it merges the partial
// rows of a sequence with `active` active splits (0: it writes zeros).
DA_DEVICE bool reducer_merges(const DecodeParams& p, unsigned long long active) {
    return p.splits_per_cta > 1 || active != 1;
}

// The end of a decode CTA: merge its warps' (m_w, l_w, acc_w) from shared
// memory (row h of warp w at w * HEADS + h) as
//   M = max m_w, L = sum l_w 2^(m_w - M), A = sum acc_w 2^(m_w - M),
// then write out = A / L and, where out_lse is not null, the row's LSE
// (M + log2 L) ln 2 (`direct`, cta_writes_output; NaN for a bad sequence,
// -inf for no token) or the split's partial row (A, M, L; a bad sequence
// poisons L with NaN).
//
// Two short steps, not one loop over the outputs: a thread per head turns
// the warps' maxima into weights (1 / L folded in when direct), then every
// thread sums float4 columns in a fixed number of rounds. At small KV a CTA
// spends as long here as in its main loop: the per-output loop this replaced
// (a max, WARPS exponentials and a division per element, one trip after
// another) took 1.3-1.5 us per CTA on the H200 (kernels/cuda/probe/timeline.cu).
template <typename T, int HEAD_DIM, int WARPS, int HEADS>
DA_DEVICE void store_cta_state(const DecodeParams& p, const float* warp_m, const float* warp_l, const float* warp_acc,
                               float* weight, int num_heads, int b, int head0, int split, bool direct,
                               int bad) {
    static_assert(HEAD_DIM % 4 == 0, "rows are whole float4");
    const int tid = threadIdx.x;
    // weight: [HEADS][WARPS] in shared memory.
    if (tid < num_heads) {
        const int h = tid;
        float big_m = da_neg_inf();
#pragma unroll
        for (int w = 0; w < WARPS; ++w) big_m = fmaxf(big_m, warp_m[w * HEADS + h]);
        float scale[WARPS];
        float big_l = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            scale[w] = big_m == da_neg_inf() ? 0.f : da_exp2(warp_m[w * HEADS + h] - big_m);
            big_l = fmaf(warp_l[w * HEADS + h], scale[w], big_l);
        }
        // L = 0 (no token) gives zeros.
        const float fold = direct ? (big_l == 0.f ? 0.f : 1.f / big_l) : 1.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) weight[h * WARPS + w] = scale[w] * fold;
        if (!direct) {
            const long long row_index = ((long long)b * p.num_q_heads + head0 + h) * p.num_splits + split;
            p.partial_ml[2 * row_index] = bad ? 0.f : big_m;
            p.partial_ml[2 * row_index + 1] = bad ? da_nan() : big_l;
        } else if (p.out_lse != nullptr) {
            // The row's LSE here, where this thread holds M and L. A second
            // block after the rows, computing them again, kept the registers
            // of sm_80 d192 h4 at 160 rather than 163 but cost the calls that
            // never ask for the LSE: an H100, 8B B=4 s=1024, 9.80 us against
            // 9.69 here (docs/PERFORMANCE.md, s41).
            p.out_lse[(long long)b * p.num_q_heads + head0 + h] = bad ? da_nan() : da_row_lse(big_m, big_l);
        }
    }
    __syncthreads();
    constexpr int VECS = HEAD_DIM / 4;  // float4 columns of a head
    constexpr int ROUNDS = da_cdiv(HEADS * VECS, DECODE_THREADS);
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
        const int i = tid + r * DECODE_THREADS;
        const int h = i / VECS;
        if (h >= num_heads) continue;
        const int d = (i % VECS) * 4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float4 acc = *reinterpret_cast<const float4*>(warp_acc + (w * HEADS + h) * HEAD_DIM + d);
            const float s = weight[h * WARPS + w];
            a.x = fmaf(acc.x, s, a.x);
            a.y = fmaf(acc.y, s, a.y);
            a.z = fmaf(acc.z, s, a.z);
            a.w = fmaf(acc.w, s, a.w);
        }
        if (bad) a = make_float4(da_nan(), da_nan(), da_nan(), da_nan());
        const long long q_head = (long long)b * p.num_q_heads + head0 + h;
        if (direct) {
            Elem<T>::store(p.out, q_head * HEAD_DIM + d, a.x);
            Elem<T>::store(p.out, q_head * HEAD_DIM + d + 1, a.y);
            Elem<T>::store(p.out, q_head * HEAD_DIM + d + 2, a.z);
            Elem<T>::store(p.out, q_head * HEAD_DIM + d + 3, a.w);
        } else {
            *reinterpret_cast<float4*>(p.partial_acc + (q_head * p.num_splits + split) * HEAD_DIM + d) = a;
        }
    }
}

template <typename T, int HEAD_DIM, int HEADS>
DA_DEVICE void decode_stream_body(const DecodeParams& p) {
    using G = StreamGeometry<T, HEAD_DIM, HEADS>;
    constexpr int EPC = G::ELEMS_PER_CHUNK;
    constexpr int CPL = G::CHUNKS_PER_LANE;
    constexpr int LPR = G::LANES_PER_ROW;
    constexpr int U = G::LOADS;
    constexpr int ELEM_BYTES = Elem<T>::BYTES;

    __shared__ float warp_m[G::WARPS][HEADS];
    __shared__ float warp_l[G::WARPS][HEADS];
    __shared__ __align__(16) float warp_acc[G::WARPS][HEADS][HEAD_DIM];
    __shared__ float warp_weight[HEADS][G::WARPS];

    CtaWork work;
    if (!cta_work<HEADS>(p, work)) return;
    const int b = work.b, kv_head = work.kv_head, head0 = work.head0, num_heads = work.num_heads, split = work.split;
    const SeqInfo seq = work.seq;
    const long long start = work.start, end = work.end;
    const int warp = threadIdx.x / DA_WARP_SIZE;
    const int lane = threadIdx.x % DA_WARP_SIZE;
    const int row = lane / LPR;
    const int col = lane % LPR;

    // Q of the CTA's heads, this lane's chunks, pre-scaled into log2 units.
    float q[HEADS][CPL][EPC];
#pragma unroll
    for (int h = 0; h < HEADS; ++h)
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
            const int chunk = col + c * LPR;
            if (h < num_heads && chunk < G::CHUNKS_PER_ROW) {
                const char* src = reinterpret_cast<const char*>(p.q) +
                                  ((long long)b * p.num_q_heads + head0 + h) * HEAD_DIM * ELEM_BYTES + chunk * 16;
                Elem<T>::unpack(da_ldg16(src), q[h][c]);
#pragma unroll
                for (int e = 0; e < EPC; ++e) q[h][c][e] *= p.scale_log2;
            } else {
#pragma unroll
                for (int e = 0; e < EPC; ++e) q[h][c][e] = 0.f;
            }
        }

    float acc[HEADS][CPL][EPC];
    float m[HEADS], l[HEADS];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        m[h] = da_neg_inf();
        l[h] = 0.f;
#pragma unroll
        for (int c = 0; c < CPL; ++c)
#pragma unroll
            for (int e = 0; e < EPC; ++e) acc[h][c][e] = 0.f;
    }

    const long long slot_bytes = (long long)p.num_kv_heads * HEAD_DIM * ELEM_BYTES;
    const char* k_base = reinterpret_cast<const char*>(p.k_cache) + (long long)kv_head * HEAD_DIM * ELEM_BYTES;
    const char* v_base = reinterpret_cast<const char*>(p.v_cache) + (long long)kv_head * HEAD_DIM * ELEM_BYTES;
    const int* index = index_row(p, b, seq);
    int bad = seq.ok ? 0 : 1;

    // Where this lane's tokens of the iteration starting at `first` live
    // (-1: past the end, or a bad slot).
    // An iteration's tokens are TOKENS_PER_ITER (a power of two <= 16) aligned
    // positions, so under a block table (kernel blocks are multiples of 16)
    // they share one block: one table entry per iteration, not one per token.
    static_assert(16 % G::TOKENS_PER_ITER == 0, "an iteration stays inside one 16-token tile");
    const bool block_table = p.layout == DECODE_LAYOUT_BLOCK_TABLE;
    // The block-table entry of an iteration is loaded a step before `locate`
    // needs it (all of the prologue's at once), as in the mma kernel.
    auto entry = [&](long long first) {
        return block_table && first < end ? load_raw_index(p, index, (int)first) : 0;
    };
    auto locate = [&](long long first, int block, long long (&offset)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long t = first + u * G::ROWS_PER_LOAD + row;
            const int raw = block_table ? block : t < end ? load_raw_index(p, index, (int)t) : 0;
            offset[u] = t < end ? resolve_offset(p, raw, (int)t, slot_bytes, &bad) : -1;
        }
    };
    DA_DYNAMIC_SHARED(stream_ring);
    uint4* ring = reinterpret_cast<uint4*>(stream_ring) + warp * DECODE_STREAM_STAGES * 2 * G::LANE_CHUNKS * DA_WARP_SIZE;
    auto ring_chunk = [&](int stage, int kv, int u, int c) {
        return ring + ((stage * 2 + kv) * G::LANE_CHUNKS + u * CPL + c) * DA_WARP_SIZE + lane;
    };
    // Starts the copies of one iteration into `stage` (zeros for dead rows) as one group.
    auto issue = [&](const long long (&offset)[U], int stage) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int chunk = col + c * LPR;
                const bool live = offset[u] >= 0 && chunk < G::CHUNKS_PER_ROW;
                const long long at = live ? offset[u] + chunk * 16 : 0;
                da_cp_async16(ring_chunk(stage, 0, u, c), k_base + at, live ? 16 : 0);
                da_cp_async16(ring_chunk(stage, 1, u, c), v_base + at, live ? 16 : 0);
            }
        da_cp_async_commit();
    };
    // One iteration's math on fetched rows; `valid` has bit u set for live rows.
    auto consume = [&](const uint4 (&k_raw)[U][CPL], const uint4 (&v_raw)[U][CPL], unsigned valid) {
        // Scores s = q . k (log2 units), summed over the row's lanes.
        float s[U][HEADS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int h = 0; h < HEADS; ++h) s[u][h] = 0.f;
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                float k[EPC];
                Elem<T>::unpack(k_raw[u][c], k);
#pragma unroll
                for (int h = 0; h < HEADS; ++h)
#pragma unroll
                    for (int e = 0; e < EPC; ++e) s[u][h] = fmaf(q[h][c][e], k[e], s[u][h]);
            }
#pragma unroll
            for (int h = 0; h < HEADS; ++h) {
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) s[u][h] += da_shfl_xor(s[u][h], o);
                if (!(valid & (1u << u))) s[u][h] = da_neg_inf();
            }
        }
        // Online softmax, once per iteration: the max over the warp's tokens.
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            float block_max = s[0][h];
#pragma unroll
            for (int u = 1; u < U; ++u) block_max = fmaxf(block_max, s[u][h]);
#pragma unroll
            for (int o = LPR; o < DA_WARP_SIZE; o <<= 1) block_max = fmaxf(block_max, da_shfl_xor(block_max, o));
            const float m_new = fmaxf(m[h], block_max);
            // The max is warp-wide, so this branch is uniform; once the running
            // max settles, most iterations skip the rescale. On the first
            // iteration m = -inf, alpha = 0 and acc, l (zeros) stay zero.
            if (m_new != m[h]) {
                const float alpha = da_exp2(m[h] - m_new);
                m[h] = m_new;
                l[h] *= alpha;
#pragma unroll
                for (int c = 0; c < CPL; ++c)
#pragma unroll
                    for (int e = 0; e < EPC; ++e) acc[h][c][e] *= alpha;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                s[u][h] = da_exp2(s[u][h] - m_new);  // p; 0 for rows past the end
                l[h] += s[u][h];
            }
        }
        // acc += p * v.
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                float v[EPC];
                Elem<T>::unpack(v_raw[u][c], v);
#pragma unroll
                for (int h = 0; h < HEADS; ++h)
#pragma unroll
                    for (int e = 0; e < EPC; ++e) acc[h][c][e] = fmaf(s[u][h], v[e], acc[h][c][e]);
            }
    };
    auto live = [](const long long (&offset)[U]) {
        unsigned bits = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) bits |= offset[u] >= 0 ? 1u << u : 0u;
        return bits;
    };

    // Pipeline over the warp's iterations (stride `step`): STAGES - 1 of them
    // are in flight in the ring while one is consumed, and the slots of the
    // next one to start are looked up a step ahead.
    constexpr unsigned ROW_BITS = (1u << U) - 1u;
    const long long step = (long long)G::WARPS * G::TOKENS_PER_ITER;
    const long long first = start + (long long)warp * G::TOKENS_PER_ITER;
    long long offset[U];
    unsigned valid_bits = 0;  // U bits per stage
    int entries[DECODE_STREAM_STAGES + 1];
#pragma unroll
    for (int stage = 0; stage <= DECODE_STREAM_STAGES; ++stage) entries[stage] = entry(first + stage * step);
#pragma unroll
    for (int stage = 0; stage < DECODE_STREAM_STAGES - 1; ++stage) {
        locate(first + stage * step, entries[stage], offset);
        issue(offset, stage);
        valid_bits |= live(offset) << (stage * U);
    }
    locate(first + (DECODE_STREAM_STAGES - 1) * step, entries[DECODE_STREAM_STAGES - 1], offset);
    int next_entry = entries[DECODE_STREAM_STAGES];  // of the iteration after the located one
    int stage = 0;
    for (long long it = first; it < end; it += step) {
        da_cp_async_wait<DECODE_STREAM_STAGES - 2>();  // this iteration's group has landed
        // Refill the slot consumed last iteration (by this same lane, whose
        // reads of it completed before the math that used them).
        const int refill = stage == 0 ? DECODE_STREAM_STAGES - 1 : stage - 1;
        issue(offset, refill);
        valid_bits = (valid_bits & ~(ROW_BITS << (refill * U))) | (live(offset) << (refill * U));
        locate(it + DECODE_STREAM_STAGES * step, next_entry, offset);
        next_entry = entry(it + (DECODE_STREAM_STAGES + 1) * step);
        uint4 k_raw[U][CPL], v_raw[U][CPL];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                k_raw[u][c] = *ring_chunk(stage, 0, u, c);
                v_raw[u][c] = *ring_chunk(stage, 1, u, c);
            }
        consume(k_raw, v_raw, (valid_bits >> (stage * U)) & ROW_BITS);
        stage = stage + 1 == DECODE_STREAM_STAGES ? 0 : stage + 1;
    }
    da_cp_async_wait<0>();

    // Sum l and acc over the rows of the warp (m is already warp-wide).
#pragma unroll
    for (int o = LPR; o < DA_WARP_SIZE; o <<= 1)
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            l[h] += da_shfl_xor(l[h], o);
#pragma unroll
            for (int c = 0; c < CPL; ++c)
#pragma unroll
                for (int e = 0; e < EPC; ++e) acc[h][c][e] += da_shfl_xor(acc[h][c][e], o);
        }
    if (row == 0) {
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            if (col == 0) {
                warp_m[warp][h] = m[h];
                warp_l[warp][h] = l[h];
            }
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int chunk = col + c * LPR;
                if (chunk < G::CHUNKS_PER_ROW)
#pragma unroll
                    for (int e = 0; e < EPC; ++e) warp_acc[warp][h][chunk * EPC + e] = acc[h][c][e];
            }
        }
    }
    bad = da_syncthreads_or(bad);

    store_cta_state<T, HEAD_DIM, G::WARPS, HEADS>(p, &warp_m[0][0], &warp_l[0][0], &warp_acc[0][0][0], &warp_weight[0][0],
                                                  num_heads, b, head0, split, cta_writes_output(p, work), bad);
}

// The split reducer: one CTA of DECODE_REDUCE_THREADS per (sequence, query
// head) merges the rows of the active splits with one division (and writes
// the row's LSE where out_lse is not null); no active split (s = 0) gives
// zeros (LSE -inf). Every warp folds the splits' (m, l) into M and
// L with shuffles, and the rows are summed by several split lanes at once
// (see the body), so a reduce over hundreds of splits costs a few rounds of
// loads, not hundreds. Launched programmatically on sm_90 (see
// da_wait_for_producer), its CTAs are resident before the decode grid ends.
//
// Two entry points per type and head dim, by how many rows one split lane
// loads in the first round (ROWS_PER_LANE): decode_stream_reduce_* 8 (64
// rows at head_dim 128, 64 registers) and decode_stream_reduce_wide_* 16
// (128 rows, 128 registers). The host takes the wide one only for plans
// with more splits than the narrow one's first round holds (lib.rs,
// `reduce_function`): on the H200 it made Llama-3-70B at TP=8, B = 1, 128
// splits 6-12% faster (s = 16384: 8.11 -> 7.18 us), but at B = 64 (512
// reducer CTAs, 8 splits) 10% slower, fewer of its CTAs fitting on an SM
// (docs/PERFORMANCE.md, version 25).
#define DECODE_REDUCE_THREADS 256
#define DECODE_REDUCE_ROWS_PER_LANE 8
#define DECODE_REDUCE_WIDE_ROWS_PER_LANE 16

// The reducer's split lanes at a head dim (its 256 threads over the float4
// columns of a row), and the rows the narrow entry point loads in its first
// round: plans with more splits take the wide one (lib.rs `reduce_function`
// mirrors this on the host; the emulator's tests and the timeline probe
// call it).
__host__ __device__ constexpr int decode_reduce_split_lanes(int head_dim) {
    return DECODE_REDUCE_THREADS / (head_dim / 4) > 0 ? DECODE_REDUCE_THREADS / (head_dim / 4) : 1;
}
__host__ __device__ constexpr int decode_reduce_narrow_rows(int head_dim) {
    return decode_reduce_split_lanes(head_dim) * DECODE_REDUCE_ROWS_PER_LANE;
}

template <typename T, int HEAD_DIM, int ROWS_PER_LANE, bool BATCH = false>
DA_DEVICE void decode_stream_reduce_body(const DecodeParams& p) {
    // Thread (split lane, column group): 4 head dims of the rows j = split
    // lane (mod SPLIT_LANES), so a reduce over hundreds of splits keeps
    // SPLIT_LANES * UNROLL rows in flight instead of walking them one by one.
    // After the wait, one round of loads: each lane's first UNROLL rows with
    // their maxima, and the (m, l) pairs of as many rows (up to 128), which every warp
    // folds by itself into M and L with shuffles; so the only barrier is the
    // one before the split lanes' sums are added. (A version with
    // block-wide max and sum spent about 1.3 us from the wait to the store
    // at 16-32 splits: kernels/cuda/probe/timeline.cu.)
    constexpr int THREADS = DECODE_REDUCE_THREADS;
    constexpr int ROW_VECS = HEAD_DIM / 4;  // float4 per partial row
    constexpr int SPLIT_LANES = decode_reduce_split_lanes(HEAD_DIM);
    constexpr int UNROLL = ROWS_PER_LANE;
    // (m, l) pairs per lane in the first round: as many rows as the split
    // lanes load, up to 4 pairs (128 rows). More (the wide reducer below
    // head_dim 128) spilled on sm_80; pairs past them take the loops below.
    constexpr int ROW_ROUND_PAIRS = SPLIT_LANES * UNROLL / DA_WARP_SIZE;
    constexpr int ML_PER_LANE = ROW_ROUND_PAIRS < 1 ? 1 : ROW_ROUND_PAIRS > 4 ? 4 : ROW_ROUND_PAIRS;
    constexpr int ML_ROUND = ML_PER_LANE * DA_WARP_SIZE;
    static_assert(HEAD_DIM % 4 == 0, "rows are whole float4");
    __shared__ __align__(16) float lane_sum[SPLIT_LANES][HEAD_DIM];
    DA_STAMP(1, 0);
    // BATCH (decode_stream_reduce_batch_*, launched for plans cut by the
    // batch only): every CTA sums the batch's tiles as the decode CTAs did,
    // first, while little else is live.
    unsigned batch_per_split = 0;
    if constexpr (BATCH) batch_per_split = batch_tiles_per_split<THREADS>(p);
    const int b = blockIdx.x;
    const int head = blockIdx.y;
    const long long q_head = (long long)b * p.num_q_heads + head;
    const SeqInfo seq = seq_info(p, b);  // an input: readable before the decode grid is done
    if (!seq.ok || p.num_splits > DECODE_MAX_SPLITS) {
        // The LSE first, indexed from b and head: after the row it made the
        // batch reducer spill (sm_80, d80), and from q_head it took the wide
        // reducer a register more (sm_90).
        if (p.out_lse != nullptr && threadIdx.x == 0) p.out_lse[(long long)b * p.num_q_heads + head] = da_nan();
        for (int d = threadIdx.x; d < HEAD_DIM; d += THREADS) Elem<T>::store(p.out, q_head * HEAD_DIM + d, da_nan());
        return;
    }
    // A sequence whose lone split's CTA wrote its output (cta_writes_output)
    // has no rows to merge: its CTAs load none and store nothing, but still
    // wait, so that the kernel after this one sees the decode grid's stores.
    // (No early return: with one, the compiler moved this CTA's setup below
    // the wait, onto the chain after the decode grid ends; s25 measured
    // every small split call 0.1 us slower.)
    const int active = BATCH ? (int)batch_split_rule(p, seq.len, batch_per_split).active_splits
                             : (int)split_rule(p, seq.len).active_splits;
    const bool merge = reducer_merges(p, active);
    const int rows = merge ? active : 0;
    const float4* acc = reinterpret_cast<const float4*>(p.partial_acc + q_head * p.num_splits * HEAD_DIM);
    const float* ml = p.partial_ml + 2 * q_head * p.num_splits;
    DA_STAMP(1, 1);
    da_wait_for_producer_after(rows, acc);  // the partial rows are not readable before
    // No early trigger (griddepcontrol.launch_dependents): the kernel after
    // this one, launched programmatically, starts as these CTAs exit. An
    // early trigger let our next decode grid launch while these CTAs (one
    // per query head: hundreds at large batch) still held the SMs, and the
    // scheduler put its CTAs where they left room, unevenly: Llama-3-70B at
    // TP=8, B=64, s=1024 ran 11% slower that way, behind 512 reducer CTAs
    // (docs/PERFORMANCE.md, version 19).
    DA_STAMP(1, 2);
    const int vec = threadIdx.x % ROW_VECS;
    const int split_lane = threadIdx.x / ROW_VECS;
    const int lane = threadIdx.x % DA_WARP_SIZE;
    const bool summing = split_lane < SPLIT_LANES;
    float4 first[UNROLL];
    float first_m[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int j = split_lane + u * SPLIT_LANES;
        const bool row = summing && j < rows;
        first[u] = row ? acc[(long long)j * ROW_VECS + vec] : make_float4(0.f, 0.f, 0.f, 0.f);
        first_m[u] = row ? ml[2 * j] : 0.f;
    }
    // M and L over all active splits, in every warp: the (m, l) pairs of the
    // first round are loaded together with the rows above, and only pairs
    // past it (more than ML_ROUND active splits) take a loop of loads.
    // (Loops over every pair, 32 splits a step, were part of what version 25
    // removed: 70B at TP=8 B = 1 s = 4096, 64 splits, 5.59 -> 5.40 us;
    // docs/PERFORMANCE.md.)
    float2 pair[ML_PER_LANE];
#pragma unroll
    for (int u = 0; u < ML_PER_LANE; ++u) {
        const int j = lane + u * DA_WARP_SIZE;
        pair[u] = j < rows ? *reinterpret_cast<const float2*>(ml + 2 * j) : make_float2(da_neg_inf(), 0.f);
    }
    float big_m = da_neg_inf();
#pragma unroll
    for (int u = 0; u < ML_PER_LANE; ++u) big_m = fmaxf(big_m, pair[u].x);
    for (int j = lane + ML_ROUND; j < rows; j += DA_WARP_SIZE) big_m = fmaxf(big_m, ml[2 * j]);
#pragma unroll
    for (int o = DA_WARP_SIZE / 2; o > 0; o >>= 1) big_m = fmaxf(big_m, da_shfl_xor(big_m, o));
    float big_l = 0.f;
#pragma unroll
    for (int u = 0; u < ML_PER_LANE; ++u)
        if (lane + u * DA_WARP_SIZE < rows) big_l = fmaf(pair[u].y, da_exp2(pair[u].x - big_m), big_l);
    for (int j = lane + ML_ROUND; j < rows; j += DA_WARP_SIZE)
        big_l = fmaf(ml[2 * j + 1], da_exp2(ml[2 * j] - big_m), big_l);
#pragma unroll
    for (int o = DA_WARP_SIZE / 2; o > 0; o >>= 1) big_l += da_shfl_xor(big_l, o);
    DA_STAMP(1, 3);
    if (summing) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = split_lane + u * SPLIT_LANES;
            const float w = j < rows ? da_exp2(first_m[u] - big_m) : 0.f;
            a.x = fmaf(first[u].x, w, a.x);
            a.y = fmaf(first[u].y, w, a.y);
            a.z = fmaf(first[u].z, w, a.z);
            a.w = fmaf(first[u].w, w, a.w);
        }
#pragma unroll 8
        for (int j = split_lane + UNROLL * SPLIT_LANES; j < rows; j += SPLIT_LANES) {
            const float4 row = acc[(long long)j * ROW_VECS + vec];
            const float w = da_exp2(ml[2 * j] - big_m);
            a.x = fmaf(row.x, w, a.x);
            a.y = fmaf(row.y, w, a.y);
            a.z = fmaf(row.z, w, a.z);
            a.w = fmaf(row.w, w, a.w);
        }
        *reinterpret_cast<float4*>(&lane_sum[split_lane][4 * vec]) = a;
    }
    // The row's LSE: -inf where no split is active, NaN where a row was
    // poisoned. Computed by every thread here, where big_m is still live
    // from the sums (kept to the end, big_m spilled in the reducers capped at
    // 64 and 80 registers: sm_90 f32 d112, sm_80 batch d80), and stored
    // after the barrier by the last thread, which has no column of the row
    // below head_dim 256, with one predicated store. Computed for thread 0
    // alone, behind a branch before the barrier, it cost calls that never
    // ask for the LSE 0.02-0.04 us (an H100, s42).
    const float lse = da_row_lse(big_m, big_l);
    __syncthreads();
    // The address in integers: out_lse may be null, and the store is then off.
    da_store_if(merge && p.out_lse != nullptr && threadIdx.x == THREADS - 1,
                reinterpret_cast<float*>(reinterpret_cast<unsigned long long>(p.out_lse) + 4ull * q_head), lse);
    if (!merge) return;
    for (int d = threadIdx.x; d < HEAD_DIM; d += THREADS) {
        float a = 0.f;
#pragma unroll
        for (int l = 0; l < SPLIT_LANES; ++l) a += lane_sum[l][d];
        // `== 0` and not `> 0`: a NaN sum (a poisoned row) must stay NaN.
        Elem<T>::store(p.out, q_head * HEAD_DIM + d, big_l == 0.f ? 0.f : a / big_l);
    }
    DA_STAMP(1, 4);
}

#define DA_STREAM_ENTRIES_HEADS(T, TNAME, D, HEADS, MIN_BLOCKS)                                                   \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS, MIN_BLOCKS)                                      \
        decode_stream_##TNAME##_d##D##_h##HEADS(const DecodeParams p) {                                           \
        decode_stream_body<T, D, HEADS>(p);                                                                       \
    }

#define DA_STREAM_ENTRIES(T, TNAME, D)                                                                            \
    DA_STREAM_ENTRIES_HEADS(T, TNAME, D, 1, 3)                                                                    \
    DA_STREAM_ENTRIES_HEADS(T, TNAME, D, 2, 3)                                                                    \
    DA_STREAM_ENTRIES_HEADS(T, TNAME, D, 4, 3)                                                                    \
    DA_STREAM_ENTRIES_HEADS(T, TNAME, D, 8, 2)                                                                    \
    extern "C" __global__ void __launch_bounds__(DECODE_REDUCE_THREADS) decode_stream_reduce_##TNAME##_d##D(     \
        const DecodeParams p) {                                                                                   \
        decode_stream_reduce_body<T, D, DECODE_REDUCE_ROWS_PER_LANE>(p);                                          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(DECODE_REDUCE_THREADS) decode_stream_reduce_wide_##TNAME##_d##D( \
        const DecodeParams p) {                                                                                   \
        decode_stream_reduce_body<T, D, DECODE_REDUCE_WIDE_ROWS_PER_LANE>(p);                                     \
    }

// The reducer of plans cut by the batch (the tensor-core kernel's packed
// launches: f16 and bf16, head dims up to 128). Three CTAs per SM, not the
// narrow reducer's four: in 64 registers its sum of the batch's tiles
// spilled at head dims 96-120 (sm_90); it takes 80.
#define DA_BATCH_REDUCE_ENTRY(T, TNAME, D)                                                                       \
    extern "C" __global__ void __launch_bounds__(DECODE_REDUCE_THREADS, 3)                                       \
        decode_stream_reduce_batch_##TNAME##_d##D(                                                               \
        const DecodeParams p) {                                                                                   \
        decode_stream_reduce_body<T, D, DECODE_REDUCE_ROWS_PER_LANE, true>(p);                                    \
    }

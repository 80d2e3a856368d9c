// decode_mma.cuh: the tensor-core decode kernel (f16 and bf16, head_dim <= 128
// and 256), the CUDA backend's default for those shapes.
//
// Included by decode.cu after its portable layer, element types, sequence
// guards and split rule. Launch: grid (num_seqs, num_kv_heads * head_groups,
// num_splits), or heads first (DecodeParams::grid_order, cta_work),
// DECODE_THREADS threads, MmaGeometry<HEAD_DIM>::SMEM_BYTES of dynamic shared
// memory (96 KiB, two CTAs per SM; 200 KiB at head_dim 256,
// one CTA per SM, sm_90 only), head_groups = ceil(g / 16): one CTA serves up
// to 16 query heads of one KV head, so for g <= 16 each K and V byte is read
// from HBM exactly once.
// The partial-state layout is the stream kernel's: decode_stream_reduce_*
// merges the splits, except a sequence's lone split, whose CTA writes the
// output itself (cta_writes_output).
//
// Why tensor cores for decode: with g query heads per KV head, the CUDA-core
// kernels spend 2g + 1 instructions per KV element (conversion, g FMAs for
// QK, g for PV) and the profiler showed them issue-bound at about half of
// HBM bandwidth. Here a warp takes one 16-token tile at a time and does
//   S[16 heads, 16 tokens] = Q[16, D] K^T[D, 16]   as 2 * D/16 mma.m16n8k16
//   O[16 heads, D]        += P[16, 16] V[16, D]     as D/8 mma.m16n8k16
// (rows past the group are zeros and cost nothing extra), about a tenth of
// the instructions per byte.
//
// Layout trick: no ldmatrix, no transposes. The contraction index of each
// mma may be permuted freely as long as both operands agree, and the output
// columns may be relabelled, so every lane reads whole 16-byte chunks:
//  * QK: lane (gid = lane / 4, tig = lane % 4) reads the K rows of tokens gid
//    and gid + 8, chunks tig + 4c; k-step kk takes chunk kk / 2, registers
//    (x, y) or (z, w) as the B fragment; Q's A fragment (heads gid, gid + 8)
//    is read with the same chunk mapping.
//  * The S accumulator fragment of the two token halves is, element for
//    element, the A fragment of P for PV (as in FlashAttention-2).
//  * PV: lane reads the V rows of tokens 2tig, 2tig + 1, 2tig + 8, 2tig + 9,
//    chunks gid + 8c; element 2r + e of chunk c is n-tile 8c + 2r + e, and
//    the B fragment pairs two tokens' values of one column with a byte
//    permute. Output column n of n-tile (c, r, e) is head dim
//    (n + 8c) * 8 + 2r + e.
// Memory side: the warp copies each tile's K and V rows whole (consecutive
// lanes take consecutive chunks of a row: full 128-byte lines, which halved
// the L2 requests of a first version whose lanes copied only what they read;
// each lane takes two chunks of a row, half a row apart, from one address)
// into a per-warp ring of shared-memory stages, rows stored with an XOR
// swizzle of their chunks so that the reads above are free of bank conflicts.
// A __syncwarp per tile publishes the landed copies and retires the reads of
// the slot refilled next.
// Head dims that are not multiples of 32 (K) or 64 (V) are padded with
// zero-filled chunks (cp.async with src-size 0 reads nothing).
#pragma once

#ifndef DA_PORTABLE_LAYER
// D += A B for one m16n8k16 tile, f32 accumulate (PTX fragment layouts).
DA_DEVICE void da_mma_bf16_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
DA_DEVICE void da_mma_f16_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
DA_DEVICE unsigned da_byte_perm(unsigned x, unsigned y, unsigned selector) { return __byte_perm(x, y, selector); }
DA_DEVICE bool da_warp_any(bool predicate) { return __any_sync(0xffffffffu, predicate); }
DA_DEVICE void da_syncwarp() { __syncwarp(); }
#endif

#define DECODE_MMA_RING_BYTES 98304         // head_dim <= 128: two CTAs per SM
#define DECODE_MMA_WIDE_RING_BYTES 196608   // head_dim 256: one CTA per SM
#define DECODE_MMA_HEADS 16                 // query heads per CTA: the mma's M
#define DECODE_MMA_MAX_HEAD_DIM 256

template <typename T>
struct MmaElem;
template <>
struct MmaElem<da_bf16> {
    DA_DEVICE static void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        da_mma_bf16_m16n8k16(d, a, b0, b1);
    }
    DA_DEVICE static unsigned pack(float lo, float hi) { return da_f32x2_to_bf16x2(lo, hi); }
};
template <>
struct MmaElem<da_f16> {
    DA_DEVICE static void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        da_mma_f16_m16n8k16(d, a, b0, b1);
    }
    DA_DEVICE static unsigned pack(float lo, float hi) { return da_f32x2_to_f16x2(lo, hi); }
};

template <int HEAD_DIM>
struct MmaGeometry {
    static constexpr int WARPS = DECODE_THREADS / DA_WARP_SIZE;
    static constexpr int ROW_CHUNKS = HEAD_DIM * 2 / 16;       // 16-byte chunks of one K or V row
    static constexpr int K_CHUNKS = da_cdiv(ROW_CHUNKS, 4);    // read per lane and K row: chunks tig + 4c
    static constexpr int K_STEPS = 2 * K_CHUNKS;               // k16 steps of QK
    static constexpr int V_CHUNKS = da_cdiv(ROW_CHUNKS, 8);    // read per lane and V row: chunks gid + 8c
    static constexpr int N_TILES = 8 * V_CHUNKS;               // n8 tiles of PV
    // Chunks per row in shared memory: what the reads cover, padded to whole
    // swizzle groups of 8 (the same for K and V at every head dim here).
    static constexpr int PITCH = 8 * V_CHUNKS;
    static_assert(4 * K_CHUNKS <= PITCH && PITCH % 8 == 0, "K and V rows share one pitch");
    // A lane copies LANE_CHUNKS chunks of a row from one global address:
    // chunk c and chunk c + PITCH / 2, two 16-byte cp.async, the second's
    // source at a constant offset (its destination is where the swizzle puts
    // it; from PITCH 16 up that is a constant offset too, the swizzles below
    // changing bits 1-2 of a chunk index only). So a tile costs each lane half
    // the address arithmetic of one chunk per copy (the profiler counted 552
    // instructions per tile and warp in version 21, a third of them locating
    // and issuing copies). Each warp-wide copy still reads whole 32-byte
    // sectors: neighbouring lanes take neighbouring chunks. (Pairs of
    // neighbouring chunks per lane left every sector half read by each of
    // two copies, and large calls 2-4% slower.)
    static constexpr int LANE_CHUNKS = 2;
    static constexpr int ROWS_PER_COPY = DA_WARP_SIZE * LANE_CHUNKS / PITCH;  // rows one warp-wide copy covers
    static constexpr int COPIES = DECODE_TILE_TOKENS / ROWS_PER_COPY;        // per lane, tile and K or V
    static constexpr int TILE_CHUNKS = 2 * DECODE_TILE_TOKENS * PITCH;  // K then V rows of one tile
    static constexpr int TILE_BYTES = TILE_CHUNKS * 16;
    // Tiles each warp keeps in the ring: STAGES - 1 in flight while one is consumed.
    // Wide heads (256): the accumulators alone take 128 registers, so Q's
    // A fragments (64 more) are read from shared memory per tile instead of
    // being kept in registers, and one CTA per SM takes a ring twice as big
    // (tiles are twice as big): the same bytes in flight per SM.
    static constexpr bool WIDE = HEAD_DIM > 128;
    static constexpr int RING_BYTES = WIDE ? DECODE_MMA_WIDE_RING_BYTES : DECODE_MMA_RING_BYTES;
    static constexpr int CTAS_PER_SM = WIDE ? 1 : 2;
    static constexpr int Q_CHUNKS = WIDE ? DECODE_MMA_HEADS * PITCH : 0;  // [head][PITCH], k-swizzled, after the ring
    static constexpr int SMEM_BYTES = RING_BYTES + Q_CHUNKS * 16;
    static constexpr int STAGES_FIT = RING_BYTES / (WARPS * TILE_BYTES);
    static constexpr int STAGES = STAGES_FIT > 6 ? 6 : STAGES_FIT;
    // The warps' (m, l, acc) go through the same shared memory at the end.
    static constexpr int MERGE_FLOATS = WARPS * DECODE_MMA_HEADS * (HEAD_DIM + 3);  // acc, m, l, weight
    static_assert(HEAD_DIM <= DECODE_MMA_MAX_HEAD_DIM && HEAD_DIM % 8 == 0, "rows are whole chunks");
    static_assert(DA_WARP_SIZE * LANE_CHUNKS % PITCH == 0 && DECODE_TILE_TOKENS % ROWS_PER_COPY == 0,
                  "copies tile the rows");
    static_assert(STAGES >= 3, "at least two tiles in flight per warp");
    static_assert(MERGE_FLOATS * 4 <= RING_BYTES, "the merge reuses the ring");
    // Swizzles (chunk index within a row; both stay inside an aligned group
    // of 8 chunks = 128 bytes = all 32 banks). K is read as rows gid, gid + 8
    // by 4 lanes each: odd rows take the other half of the group. V is read
    // as rows 2tig + {0, 1, 8, 9} by 8 lanes each: rows 2i, 2i + 1 get their
    // own pair of chunks.
    DA_DEVICE static int k_swizzle(int row, int chunk) { return chunk ^ ((row & 1) << 2); }
    DA_DEVICE static int v_swizzle(int row, int chunk) { return chunk ^ (((row >> 1) & 3) << 1); }
};

// One warp's partial row of its split (p.splits_per_cta > 1): (acc, m, l)
// of heads gid and gid + 8 straight from the mma fragments, as
// store_cta_state writes a CTA's (a bad split: m 0, l and acc NaN). n-tile
// nt = 8c + 2r' + e, column n = 2tig + e2 is head dim (n + 8c) * 8 + 2r' + e,
// so n-tiles 8c .. 8c + 7 of one (c, e2) are 8 consecutive dims: two float4.
template <int HEAD_DIM, int N_TILES>
DA_DEVICE void store_warp_state(const DecodeParams& p, const float (&m)[2], const float (&l)[2],
                                const float (&o)[N_TILES][4], bool bad, int b, int head0, int num_heads, int split,
                                int gid, int tig) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int h = gid + 8 * r;
        if (h >= num_heads) continue;
        const long long row = ((long long)b * p.num_q_heads + head0 + h) * p.num_splits + split;
        if (tig == 0) {
            p.partial_ml[2 * row] = bad ? 0.f : m[r];
            p.partial_ml[2 * row + 1] = bad ? da_nan() : l[r];
        }
        const float4 nan4 = make_float4(da_nan(), da_nan(), da_nan(), da_nan());
#pragma unroll
        for (int c = 0; c < N_TILES / 8; ++c)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int d0 = (2 * tig + e2 + 8 * c) * 8;
                if (d0 >= HEAD_DIM) continue;
                float4* dst = reinterpret_cast<float4*>(p.partial_acc + row * HEAD_DIM + d0);
                const int k = 2 * r + e2;
                dst[0] = bad ? nan4 : make_float4(o[8 * c][k], o[8 * c + 1][k], o[8 * c + 2][k], o[8 * c + 3][k]);
                dst[1] = bad ? nan4 : make_float4(o[8 * c + 4][k], o[8 * c + 5][k], o[8 * c + 6][k], o[8 * c + 7][k]);
            }
    }
}

// POW2_BLOCKS: a token's block-table position is a shift and a mask, as
// every power-of-two block size allows: a division by the run-time block
// size is about 20 dependent instructions on the path to the first KV copy.
// Other block sizes (multiples of 16 such as 48, or the odd sizes engines
// pick to line attention pages up with other state) take the division, in
// their own entry point: a version that chose between the two inside one
// function made every small call 20-40% slower (docs/perf-notes.md), and a
// separate function leaves the power-of-two one's code as it was.
template <typename T, int HEAD_DIM, bool POW2_BLOCKS>
DA_DEVICE void decode_mma_item(const DecodeParams& p, const CtaWork& work) {
    using G = MmaGeometry<HEAD_DIM>;
    using M = MmaElem<T>;
    constexpr int HEADS = DECODE_MMA_HEADS;
    constexpr int TILE = DECODE_TILE_TOKENS;
    static_assert(TILE == 16, "one tile is the mma's k16 of PV");

    const int b = work.b, kv_head = work.kv_head, head0 = work.head0, num_heads = work.num_heads, split = work.split;
    const SeqInfo seq = work.seq;
    // With a block table the block size must be one this entry point locates
    // (a power of two, or any multiple of the tile); any other is reported as
    // bad input and no tile is read (a shift would index past the table row,
    // a tile across two blocks would read another block's slots).
    const bool block_table = p.layout == DECODE_LAYOUT_BLOCK_TABLE;
    const bool blocks_ok = POW2_BLOCKS ? (p.block_size & (p.block_size - 1)) == 0
                                       : p.block_size > 0 && p.block_size % TILE == 0;
    int bad = seq.ok && (blocks_ok || !block_table) ? 0 : 1;
    const int warp = threadIdx.x / DA_WARP_SIZE;
    const int lane = threadIdx.x % DA_WARP_SIZE;
    // One split per warp (p.splits_per_cta > 1): the warp reads its own
    // split's tiles one after another and stores its own partial row, with
    // no merge through shared memory and no barrier after the loop; the
    // reducer merges four times the rows. `auto` asks for it on one-wave
    // grids where each warp has 4 or more tiles (1-4% faster on the H200;
    // slower with fewer tiles: docs/PERFORMANCE.md, version 21). Otherwise
    // the warps take every WARPS-th tile of the CTA's split and merge at the end.
    const bool warp_splits = p.splits_per_cta > 1;
    long long first_token = work.start, last_token = work.end;
    if (warp_splits) {
        const long long split_tokens = (long long)work.cut.tiles_per_split * TILE;
        // Warps past splits_per_cta (a plan with fewer splits per CTA than warps) idle.
        first_token = warp < p.splits_per_cta ? da_min_ll(work.start + warp * split_tokens, work.end) : work.end;
        last_token = da_min_ll(first_token + split_tokens, work.end);
    }
    const long long start = first_token, end = bad ? first_token : last_token;
    const int gid = lane / 4;  // the mma's groupID: rows of A and C, column of B
    const int tig = lane % 4;  // thread in group

    DA_DYNAMIC_SHARED(mma_ring);
    // Q of heads gid and gid + 8 (zeros past the group), this lane's K chunks:
    // in registers, or (wide heads) in shared memory, rows like K's.
    uint4 q_lo[G::WIDE ? 1 : G::K_CHUNKS], q_hi[G::WIDE ? 1 : G::K_CHUNKS];
    uint4* const q_smem = reinterpret_cast<uint4*>(mma_ring + G::RING_BYTES);
    auto q_chunk = [&](int head, int chunk) { return q_smem + head * G::PITCH + G::k_swizzle(head, chunk); };
    if constexpr (G::WIDE) {
        for (int i = threadIdx.x; i < G::Q_CHUNKS; i += DECODE_THREADS) {
            const int head = i / G::PITCH, chunk = i % G::PITCH;
            const char* q_row = reinterpret_cast<const char*>(p.q) +
                                ((long long)b * p.num_q_heads + head0 + head) * HEAD_DIM * 2 + chunk * 16;
            *q_chunk(head, chunk) =
                head < num_heads && chunk < G::ROW_CHUNKS ? da_ldg16(q_row) : make_uint4(0, 0, 0, 0);
        }
        // Published by the barrier before the main loop.
    } else {
#pragma unroll
        for (int c = 0; c < G::K_CHUNKS; ++c) {
            const int chunk = tig + 4 * c;
            const char* q_row = reinterpret_cast<const char*>(p.q) +
                                ((long long)b * p.num_q_heads + head0 + gid) * HEAD_DIM * 2 + chunk * 16;
            const bool in_row = chunk < G::ROW_CHUNKS;
            q_lo[c] = in_row && gid < num_heads ? da_ldg16(q_row) : make_uint4(0, 0, 0, 0);
            q_hi[c] = in_row && gid + 8 < num_heads ? da_ldg16(q_row + 8 * HEAD_DIM * 2) : make_uint4(0, 0, 0, 0);
        }
    }

    float o[G::N_TILES][4];
#pragma unroll
    for (int nt = 0; nt < G::N_TILES; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[nt][i] = 0.f;
    float m[2] = {da_neg_inf(), da_neg_inf()};  // rows gid and gid + 8, log2 units
    float l[2] = {0.f, 0.f};                    // this lane's share of the row sums

    const long long slot_bytes = (long long)p.num_kv_heads * HEAD_DIM * 2;
    const char* const k_cache = reinterpret_cast<const char*>(p.k_cache);
    const char* const v_cache = reinterpret_cast<const char*>(p.v_cache);
    const int* index = index_row(p, b, seq);
    const int block_shift = da_ffs(p.block_size) - 1;
    const int block_mask = p.block_size - 1;
    // The divisor of the other block sizes; never zero (a bad one reads no tile).
    const int block_divisor = POW2_BLOCKS || blocks_ok ? p.block_size : TILE;

    // Where this lane's copies of the tile starting at `first` come from:
    // rows copy_row + ROWS_PER_COPY * i, chunks copy_chunk and copy_chunk +
    // LANES_PER_ROW (LANE_CHUNKS). A tile lies inside one kernel block (a
    // multiple of 16 tokens), so a block table costs one entry per tile.
    constexpr int LANES_PER_ROW = G::PITCH / G::LANE_CHUNKS;
    const int copy_row = lane / LANES_PER_ROW;
    const int copy_chunk = lane % LANES_PER_ROW;
    // Bytes of each of the lane's two chunks; 0 for a zero pad chunk.
    const int first_chunk_bytes = copy_chunk < G::ROW_CHUNKS ? 16 : 0;
    const int second_chunk_bytes = copy_chunk + LANES_PER_ROW < G::ROW_CHUNKS ? 16 : 0;
    // The lane's part of a slot's address: its KV head's row, its chunk.
    const long long lane_bytes = (long long)kv_head * HEAD_DIM * 2 + copy_chunk * 16;
    struct Offsets {
        long long from[G::COPIES];  // byte offset of copy i's first chunk in K (and V); meaningful where `valid` says
        unsigned valid;             // bit i: copy i reads a token's row inside the pool
        bool live;  // some row of the tile is a token (warp-uniform); a dead tile is never consumed
    };
    // This runs once per tile on the path to every copy, so it is kept to
    // ints and one mask: per row only a 64-bit add. Each 64-bit compare or
    // select is two or three instructions, and the prologue's first copies
    // wait for one locate per stage (the timeline probe's "first copies
    // issued").
    long long row_bytes[G::COPIES];
#pragma unroll
    for (int i = 0; i < G::COPIES; ++i)
        row_bytes[i] = (long long)(copy_row + G::ROWS_PER_COPY * i) * slot_bytes + lane_bytes;
    // The block-table entry of the tile starting at `first` (block-table
    // layout; 0 for a dead tile or the token layout). Loaded a step before
    // `locate` needs it, and all of the prologue's at once: each cp.async
    // below is a compiler barrier, so a load placed after one waits for the
    // round trip before the next tile's copies can start (the timeline probe
    // showed the prologue's stages issued one L2 round trip apart).
    auto entry = [&](long long first) {
        return block_table && first < end
                   ? __ldg(index + (POW2_BLOCKS ? (int)first >> block_shift : (int)first / block_divisor))
                   : 0;
    };
    auto locate = [&](long long first, int raw) {
        Offsets at;
        at.valid = 0;
        // A dead tile (past the split's end) copies nothing, so its offsets
        // are not worked out (warp-uniform branch): the loop locates a tile
        // between its wait and its math, so a warp's last iterations, and
        // the only one of a warp with one tile, had that arithmetic on the
        // path to their math.
        at.live = first < end;
        if (!at.live) {
#pragma unroll
            for (int i = 0; i < G::COPIES; ++i) at.from[i] = 0;
            return at;
        }
        const long long left = end - first;
        const int rows_live = left >= TILE ? TILE : (int)left;
        if (block_table) {
            // The tile's rows are consecutive slots of one kernel block; rows
            // at or past `rows_ok` fall outside the pool (none for padding).
            const int in_block = POW2_BLOCKS ? (int)first & block_mask : (int)first % block_divisor;
            const long long slot0 = (long long)raw * p.block_size + in_block;
            const long long room = p.num_slots - slot0;
            const int rows_ok = raw < 0 || room <= 0 ? 0 : room >= TILE ? TILE : (int)room;
            if (rows_ok < rows_live) bad = 1;
            const int rows_valid = da_min(rows_live, rows_ok);
            const long long tile_bytes = slot0 * slot_bytes;
#pragma unroll
            for (int i = 0; i < G::COPIES; ++i) {
                at.from[i] = tile_bytes + row_bytes[i];
                at.valid |= (copy_row + G::ROWS_PER_COPY * i < rows_valid ? 1u : 0u) << i;
            }
        } else {
#pragma unroll
            for (int i = 0; i < G::COPIES; ++i) {
                const int row = copy_row + G::ROWS_PER_COPY * i;
                const int slot = row < rows_live ? load_raw_index(p, index, (int)first + row) : 0;
                const long long offset =
                    row < rows_live ? resolve_offset(p, slot, (int)first + row, slot_bytes, &bad) : -1;
                at.from[i] = offset + lane_bytes;
                at.valid |= (offset >= 0 ? 1u : 0u) << i;
            }
        }
        return at;
    };

    uint4* ring = reinterpret_cast<uint4*>(mma_ring) + warp * G::STAGES * G::TILE_CHUNKS;
    // Stage layout: K [row][PITCH] then V [row][PITCH], chunks swizzled.
    // Where a lane's reads of a stage start (bytes): the swizzles of the rows
    // and chunks it reads, once. K: rows gid + 8j, chunks tig + 4c, swizzled
    // to tig + 4 (c ^ (gid & 1)), so even c read from one base and odd c from
    // another, each + (8j PITCH + 4c) chunks. V: rows 2tig + {0, 1, 8, 9},
    // chunks gid + 8c, swizzled to (gid ^ 2tig) + 8c. What is left per read
    // is a constant, which the load instruction carries.
    const unsigned char* const ring_bytes = reinterpret_cast<const unsigned char*>(ring);
    const int k_flip = 4 * (gid & 1);
    const int k_read_even = (gid * G::PITCH + tig + k_flip) * 16;
    const int k_read_odd = (gid * G::PITCH + tig - k_flip) * 16;
    const int v_read = ((DECODE_TILE_TOKENS + 2 * tig) * G::PITCH + (gid ^ (2 * tig))) * 16;
    auto k_read = [&](int stage, int j, int c) {
        return *reinterpret_cast<const uint4*>(ring_bytes + stage * G::TILE_BYTES + (c % 2 ? k_read_odd : k_read_even) +
                                               (8 * j * G::PITCH + 4 * c) * 16);
    };
    auto v_read_at = [&](int stage, int ti, int c) {
        return *reinterpret_cast<const uint4*>(ring_bytes + stage * G::TILE_BYTES + v_read +
                                               ((ti & 1) + 8 * (ti >> 1)) * G::PITCH * 16 + c * 8 * 16);
    };
    // The copies' destinations as 32-bit shared addresses, in plain integer
    // arithmetic: the compiler keeps each lane's offsets out of the loop and
    // folds what is constant (later rows, at PITCH >= 16 the second chunk)
    // into the instruction. (A generic pointer per copy, converted inside
    // each copy's asm, was recomputed for every copy of every tile: about
    // ten instructions each, version 21.)
    const unsigned ring_shared = da_smem_addr(ring);
    auto k_dst = [&](int stage, int i, int chunk) {
        const int row = copy_row + G::ROWS_PER_COPY * i;
        return ring_shared + (unsigned)(stage * G::TILE_CHUNKS + row * G::PITCH + G::k_swizzle(row, chunk)) * 16u;
    };
    auto v_dst = [&](int stage, int i, int chunk) {
        const int row = copy_row + G::ROWS_PER_COPY * i;
        return ring_shared +
               (unsigned)(stage * G::TILE_CHUNKS + (DECODE_TILE_TOKENS + row) * G::PITCH + G::v_swizzle(row, chunk)) *
                   16u;
    };
    constexpr int SECOND = LANES_PER_ROW;  // the lane's second chunk, in chunks after its first
    // A dead tile (past the split's end: the pipeline's fill and drain when a
    // warp has fewer tiles than stages) copies nothing; its group stays, empty,
    // so that the wait counts hold.
    auto issue = [&](const Offsets& at, int stage) {
        if (at.live) {
#pragma unroll
            for (int i = 0; i < G::COPIES; ++i) {
                const bool live = (at.valid >> i) & 1u;
                const long long from = live ? at.from[i] : 0;
                const int first_bytes = live ? first_chunk_bytes : 0;
                const int second_bytes = live ? second_chunk_bytes : 0;
                da_cp_async16_shared(k_dst(stage, i, copy_chunk), k_cache + from, first_bytes);
                da_cp_async16_shared(k_dst(stage, i, copy_chunk + SECOND), k_cache + from + SECOND * 16, second_bytes);
                da_cp_async16_shared(v_dst(stage, i, copy_chunk), v_cache + from, first_bytes);
                da_cp_async16_shared(v_dst(stage, i, copy_chunk + SECOND), v_cache + from + SECOND * 16, second_bytes);
            }
        }
        da_cp_async_commit();
    };

    // One tile's math: tokens first .. first + 15 from `stage`.
    auto consume = [&](int stage, long long first) {
        // s[j]: S for heads (gid, gid + 8) x tokens 8j + 2tig + (0, 1). The
        // k-steps of a chunk's two halves go into two accumulators, added at
        // the end: four independent chains of K_CHUNKS mma instead of two of
        // 2 K_CHUNKS, as a warp waits for each mma's result before the next
        // of its chain issues. (Not at head_dim 256, whose registers are
        // full: there the second accumulator spilled.)
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float s_odd[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int c = 0; c < G::K_CHUNKS; ++c) {
            const uint4 q0 = G::WIDE ? *q_chunk(gid, tig + 4 * c) : q_lo[G::WIDE ? 0 : c];
            const uint4 q8 = G::WIDE ? *q_chunk(gid + 8, tig + 4 * c) : q_hi[G::WIDE ? 0 : c];
            const unsigned a_even[4] = {q0.x, q8.x, q0.y, q8.y};
            const unsigned a_odd[4] = {q0.z, q8.z, q0.w, q8.w};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const uint4 k = k_read(stage, j, c);
                M::mma(s[j], a_even, k.x, k.y);
                M::mma(G::WIDE ? s[j] : s_odd[j], a_odd, k.z, k.w);
            }
        }
        if constexpr (!G::WIDE) {
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) s[j][i] += s_odd[j][i];
        }
        // Log2 units, tokens past the end masked; the tile's max per row.
        float tile_max[2] = {da_neg_inf(), da_neg_inf()};
        const long long left = end - first;  // > 0
        const int rows_live = left >= TILE ? TILE : (int)left;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const bool live = 8 * j + 2 * tig + (i & 1) < rows_live;
                s[j][i] = live ? s[j][i] * p.scale_log2 : da_neg_inf();
                tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[j][i]);
            }
        float m_new[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = fmaxf(tile_max[r], da_shfl_xor(tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], da_shfl_xor(tile_max[r], 2));
            m_new[r] = fmaxf(m[r], tile_max[r]);
        }
        // Rescale only when some row's max moved (warp-uniform branch; on the
        // first tile m = -inf, alpha = 0, and o and l are still zero).
        if (da_warp_any(m_new[0] != m[0] || m_new[1] != m[1])) {
            const float alpha[2] = {da_exp2(m[0] - m_new[0]), da_exp2(m[1] - m_new[1])};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                l[r] *= alpha[r];
                m[r] = m_new[r];
            }
#pragma unroll
            for (int nt = 0; nt < G::N_TILES; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) o[nt][i] *= alpha[i >> 1];
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[j][i] = da_exp2(s[j][i] - m[i >> 1]);  // p; 0 for tokens past the end
                l[i >> 1] += s[j][i];
            }
        // P as the A fragment: k positions 0-7 are tokens 0-7 (s[0]), 8-15 tokens 8-15 (s[1]).
        const unsigned pa[4] = {M::pack(s[0][0], s[0][1]), M::pack(s[0][2], s[0][3]), M::pack(s[1][0], s[1][1]),
                                M::pack(s[1][2], s[1][3])};
#pragma unroll
        for (int c = 0; c < G::V_CHUNKS; ++c) {
            uint4 v[4];
#pragma unroll
            for (int ti = 0; ti < 4; ++ti) v[ti] = v_read_at(stage, ti, c);
            const unsigned lo_t[4][4] = {{v[0].x, v[0].y, v[0].z, v[0].w},
                                         {v[1].x, v[1].y, v[1].z, v[1].w},
                                         {v[2].x, v[2].y, v[2].z, v[2].w},
                                         {v[3].x, v[3].y, v[3].z, v[3].w}};
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    // Element 2r + e of tokens (2tig, 2tig + 1) and (2tig + 8, 2tig + 9).
                    const unsigned selector = e ? 0x7632u : 0x5410u;
                    const unsigned b0 = da_byte_perm(lo_t[0][r], lo_t[1][r], selector);
                    const unsigned b1 = da_byte_perm(lo_t[2][r], lo_t[3][r], selector);
                    M::mma(o[8 * c + 2 * r + e], pa, b0, b1);
                }
        }
    };

    // Pipeline over the warp's tiles (stride `step`), as in the stream kernel.
    const long long step = warp_splits ? TILE : (long long)G::WARPS * TILE;
    const long long first = warp_splits ? start : start + (long long)warp * TILE;
    int entries[G::STAGES + 1];
#pragma unroll
    for (int stage = 0; stage <= G::STAGES; ++stage) entries[stage] = entry(first + stage * step);
    // The prologue's stages are issued by a loop that is not unrolled, and
    // `entries` moves down a slot per stage (register moves; an indexed
    // array would live in local memory). Unrolled, each stage was its own
    // copy of `locate` and `issue` (the second stage's: 900 instructions of
    // SASS at head_dim 128), and a call whose code is not in the caches (in
    // an engine, other kernels run between two layers' attention) fetched
    // every copy on its way to the first tile: on the H200, `bench --cold`
    // 70B at TP=8 B=1 s=1024 9.6 -> 6.3 us, 8B B=1 s=4096 14.1 -> 10.9;
    // warm back-to-back calls pay 0.1-0.18 us for the loop
    // (docs/PERFORMANCE.md, version 20).
#pragma unroll 1
    for (int stage = 0; stage < G::STAGES - 1; ++stage) {
        issue(locate(first + stage * step, entries[0]), stage);
#pragma unroll
        for (int i = 0; i < G::STAGES; ++i) entries[i] = entries[i + 1];
    }
    DA_STAMP(0, 2);
    if constexpr (G::WIDE) __syncthreads();  // Q is in shared memory
    Offsets next = locate(first + (G::STAGES - 1) * step, entries[0]);
    int next_entry = entries[1];  // of the tile after `next`
    int stage = 0;
    for (long long it = first; it < end; it += step) {
        da_cp_async_wait<G::STAGES - 2>();  // this lane's copies of this tile have landed
        if (it == first) DA_STAMP(0, 3);
        // Every lane's have, and every lane is done reading the slot consumed
        // last iteration, which is refilled now.
        da_syncwarp();
        issue(next, stage == 0 ? G::STAGES - 1 : stage - 1);
        next = locate(it + G::STAGES * step, next_entry);
        next_entry = entry(it + (G::STAGES + 1) * step);
        consume(stage, it);
        stage = stage + 1 == G::STAGES ? 0 : stage + 1;
    }
    da_cp_async_wait<0>();
    DA_STAMP(0, 4);

    // Row sums over the four lanes of a row (m is already row-wide).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += da_shfl_xor(l[r], 1);
        l[r] += da_shfl_xor(l[r], 2);
    }
    if (warp_splits) {
        const int split = work.split + warp;
        // A surplus split (past the sequence's last) has no row to write.
        if (warp >= p.splits_per_cta || (unsigned long long)split * work.cut.tiles_per_split >= work.cut.tiles) return;
        store_warp_state<HEAD_DIM, G::N_TILES>(p, m, l, o, da_warp_any(bad != 0), b, head0, num_heads, split, gid, tig);
        DA_STAMP(0, 6);
        return;
    }
    bad = da_syncthreads_or(bad);  // also: every warp is done with the ring

    float* warp_acc = reinterpret_cast<float*>(mma_ring);              // [WARPS][HEADS][HEAD_DIM]
    float* warp_m = warp_acc + G::WARPS * HEADS * HEAD_DIM;            // [WARPS][HEADS]
    float* warp_l = warp_m + G::WARPS * HEADS;                         // [WARPS][HEADS]
    float* warp_weight = warp_l + G::WARPS * HEADS;                    // [HEADS][WARPS]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int h = gid + 8 * r;
        if (h >= num_heads) continue;
        if (tig == 0) {
            warp_m[warp * HEADS + h] = m[r];
            warp_l[warp * HEADS + h] = l[r];
        }
        // n-tile nt = 8c + 2r' + e, column n = 2tig + e2: head dim (n + 8c) * 8 + 2r' + e, so
        // n-tiles 8c .. 8c + 7 of one (c, e2) are 8 consecutive dims: two float4 stores.
#pragma unroll
        for (int c = 0; c < G::N_TILES / 8; ++c)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int d0 = (2 * tig + e2 + 8 * c) * 8;
                if (d0 >= HEAD_DIM) continue;
                float4* dst = reinterpret_cast<float4*>(warp_acc + (warp * HEADS + h) * HEAD_DIM + d0);
                dst[0] = make_float4(o[8 * c][2 * r + e2], o[8 * c + 1][2 * r + e2], o[8 * c + 2][2 * r + e2],
                                     o[8 * c + 3][2 * r + e2]);
                dst[1] = make_float4(o[8 * c + 4][2 * r + e2], o[8 * c + 5][2 * r + e2], o[8 * c + 6][2 * r + e2],
                                     o[8 * c + 7][2 * r + e2]);
            }
    }
    __syncthreads();
    DA_STAMP(0, 5);
    store_cta_state<T, HEAD_DIM, G::WARPS, HEADS>(p, warp_m, warp_l, warp_acc, warp_weight, num_heads, b, head0, split,
                                                  cta_writes_output(p, work), bad);
    DA_STAMP(0, 6);
}

// The packed pairs after a CTA's first (a graph replayed with more pairs than
// its launch has CTAs), one after another, the ring reused. Called, not
// inlined: with the item inside a loop in the entry point itself, the
// compiler laid out the whole kernel differently (236 registers against 221,
// a main loop a fifth longer); taking it out made packed launches 3-5%
// faster on the same plans (s27 calls 1-2).
template <typename T, int HEAD_DIM, bool POW2_BLOCKS>
DA_DEVICE_CALLED void decode_mma_later_items(const DecodeParams& p, int item) {
    for (;; item += gridDim.y) {
        CtaWork work;
        if (!cta_work<DECODE_MMA_HEADS, true>(p, work, item)) return;
        decode_mma_item<T, HEAD_DIM, POW2_BLOCKS>(p, work);
    }
}

// One CTA, one (sequence, head CTA, split) of the grid; or, PACKED, the
// packed pairs blockIdx.y, blockIdx.y + gridDim.y, ... (decode_stream.cuh,
// packed_item): the first inline, as the plain grid's CTA, the rest (if the
// lengths give more pairs than the launch has CTAs) through
// decode_mma_later_items; or, BATCH (the `_batch` entry points, plans cut
// by the batch), pair blockIdx.y alone: the host launches as many CTAs as
// the batch rule can make pairs, num_seqs * (batch_splits + 1), so there is
// no later pair, no call, and no copy of the parameters on a stack.
template <typename T, int HEAD_DIM, bool POW2_BLOCKS, bool PACKED, bool BATCH = false>
DA_DEVICE void decode_mma_body(const DecodeParams& p) {
    if constexpr (PACKED) {
        CtaWork work;
        int pairs = 0;
        if (!cta_work<DECODE_MMA_HEADS, true, BATCH>(p, work, blockIdx.y, &pairs)) return;
        decode_mma_item<T, HEAD_DIM, POW2_BLOCKS>(p, work);
        if constexpr (!BATCH) {
            const int next = blockIdx.y + gridDim.y;
            if (next < pairs) decode_mma_later_items<T, HEAD_DIM, POW2_BLOCKS>(p, next);
        }
    } else {
        CtaWork work;
        if (!cta_work<DECODE_MMA_HEADS>(p, work)) return;
        decode_mma_item<T, HEAD_DIM, POW2_BLOCKS>(p, work);
    }
}

// decode_mma_*: power-of-two block sizes and token indices;
// decode_mma_*_anyblock: a block table with any block size (a multiple of 16);
// decode_mma_*_packed (DA_MMA_PACKED_ENTRY): the first over packed pairs,
// grid (head CTAs, pairs, 1), head dims up to 128 (at 256 the loop spills);
// decode_mma_*_batch: one packed pair per CTA, for plans cut by the batch;
// other block sizes and head dims launch the plain grid.
// `_packed` takes its parameters __grid_constant__: it passes them by
// reference to decode_mma_later_items, a called function, and a kernel
// parameter whose address escapes is otherwise copied to a 152-byte stack,
// from which every loop then read fields (local loads: 5 a tile in the
// first pair's loop, 26 in the called one's; sm_90, nvcc 13.0, s33).
#define DA_MMA_ENTRY(T, TNAME, D)                                                                         \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS, MmaGeometry<D>::CTAS_PER_SM)             \
        decode_mma_##TNAME##_d##D(const DecodeParams p) {                                                    \
        decode_mma_body<T, D, true, false>(p);                                                            \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS, MmaGeometry<D>::CTAS_PER_SM)             \
        decode_mma_##TNAME##_d##D##_anyblock(const DecodeParams p) {                                         \
        decode_mma_body<T, D, false, false>(p);                                                           \
    }
#define DA_MMA_PACKED_ENTRY(T, TNAME, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS, MmaGeometry<D>::CTAS_PER_SM)             \
        decode_mma_##TNAME##_d##D##_packed(const __grid_constant__ DecodeParams p) {                         \
        decode_mma_body<T, D, true, true>(p);                                                             \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS, MmaGeometry<D>::CTAS_PER_SM)             \
        decode_mma_##TNAME##_d##D##_batch(const DecodeParams p) {                                            \
        decode_mma_body<T, D, true, true, true>(p);                                                       \
    }

// layout_probe.cu: on the large shapes where dense SDPA reads 2-3% faster
// than our paged kernel, how much of that is the KV's layout, and how much
// is the grid's fit to the machine?
//
// The copy pipeline alone (no math), as bulk_copy_probe.cu's `cp.async`
// mode and decode_mma.cuh copy: 4 warps, each taking every 4th 16-token
// tile of its CTA into its own 3-stage ring, two 16-byte chunks of a
// 256-byte row per lane, 96 KiB of ring (two CTAs per SM). Only where the
// rows of a tile live, and how tiles are dealt to CTAs, differ:
//   nhd-shuf   vLLM's pool [slot][kv_head][d], 16-token blocks shuffled
//              over the pool (our benchmarks' and the peers' KV): a
//              head's rows of one block are 256 B apart by num_kv_heads*256;
//   nhd-order  the same pool, blocks in order;
//   hnd-shuf   FlashInfer's HND pool [block][kv_head][16][d], shuffled: a
//              (block, head)'s 16 rows are 4 KiB in one piece;
//   dense      SDPA's [seq][kv_head][s][d]: a (sequence, head) is one run;
//   stream-k   nhd-shuf, but the grid is 2 CTAs per SM and the tiles of all
//              (sequence, head) pairs, laid end to end, are cut into equal
//              ranges, one per CTA (a range may cross pairs); the
//              decode grid's (sequence, head, split) leaves slots idle
//              where its CTA count is not a multiple of the SMs';
//   stream-k1  the same with one CTA per SM (two CTAs sharing an SM
//              stream at different rates, PERFORMANCE.md's uneven finish);
//   nhd-pf2/4  nhd-shuf, and with each tile's copies the warp asks L2 for
//              its tile 2 (4) steps beyond them (`cp.async.bulk.prefetch.L2`,
//              one 256-byte row a lane): more of the pool in flight, and its
//              address translation, without more shared memory;
//   nhd-local  NHD with the blocks shuffled only within each 2 MiB of the
//              pool (a GPU page of 2 MiB): random rows of DRAM as shuffled,
//              but the translations of an in-order walk.
//   nhd-t8/16  nhd-shuf, and after each tile's copies two lanes touch the
//              tile 8 (16) steps beyond (`prefetch.global.L2` of one line of
//              K and one of V): the block's address translation started
//              early for a 32nd of the L2 traffic of nhd-pf2/4.
//   nhd-sort   nhd-shuf with each split's blocks visited in address order
//              (the split's entries of the table sorted): what a kernel
//              that reorders its own blocks could win back, its sort free.
//   nhd-wsort  nhd-sort, but sorted only within windows of 64 of a split's
//              entries: the same order within a CTA's nearby tiles, without
//              every CTA of the grid sweeping the pool from its low end up;
//   nhd-ksort  nhd-shuf, the kernel sorting its split's entries itself: all
//              128 threads load them into shared memory and sort them there
//              (bitonic) before the first copy, so the sort's cost is in;
//   nhd-b16/64/256 nhd-shuf with each split's entries in coarse address
//              order: stably sorted by bucket, the pool cut into 16 (64,
//              256) equal ranges of blocks, the table's order within one;
//   nhd-kb64/256 the same order made by the kernel itself (a counting sort
//              of its entries into 64 (256) buckets in shared memory before
//              the first copy: two passes over the entries, shared atomics,
//              three barriers), its cost in; not stable: within a bucket
//              the atomics' order, which differs run to run;
//   nhd-kbs256 the same, stable: each warp takes a quarter of the entries
//              in order, 32 at a time, and ranks them among its lanes
//              (`__match_any_sync`) and its own counts, so the table's
//              order holds within a bucket (deterministic, and an
//              in-order table stays in order); four barriers.
//   nhd-kbs256o nhd-kbs256 with the ring's first stages (every warp's first
//              two tiles, the split's first 8 entries) issued in table
//              order before the sort, which orders the rest: the sort's
//              barriers and table loads while those copies are in flight.
//              (H100, s51: b256 wins what nhd-sort wins; kbs256 and
//              kbs256o lose to nhd-shuf on 7 of 8 shapes, up to 7.8% and
//              9.6%: PERFORMANCE.md, History s51.)
// The in-kernel orders are checked once per shape before timing: the first
// CTA's entries come back from the kernel and must be a permutation of its
// split's, in bucket order (sorted, for nhd-ksort), stable for nhd-kbs256 (after
// its first 8 entries in table order, for nhd-kbs256o).
//   nhd-run4/16 the pool shuffled in runs of 4 (16) consecutive blocks, in
//              order within a run: what an allocator that hands out a few
//              blocks at a time in order buys.
//   nhd-l8     as nhd-t8 with a load (`ld.global.nc` of 4 bytes) for the
//              touch, its value used a step later: a prefetch may be
//              dropped where its translation misses, a load is not.
//   nhd-hf     nhd-shuf with the grid heads first (num_kv_heads, num_seqs,
//              num_splits): the CTAs of one (sequence, split), which read
//              the same blocks (each its head's 256-byte rows of them), are
//              launched side by side, but drift apart as they stream;
//   nhd-cl     nhd-hf launched as clusters of num_kv_heads CTAs (one
//              (sequence, split) a cluster), no barrier: the placement alone;
//   nhd-lock4/1 nhd-cl, the cluster's CTAs held together by a split-phase
//              cluster barrier every 4 (1) of a warp's tiles, so that a
//              block's rows of every head (in NHD the whole block, one
//              contiguous run) are read at about the same time: whether
//              DRAM rows opened for one head serve the others, as a dense
//              or in-order walk's do. Only where num_kv_heads > 1 (s56).
//              (H100, s56: heads first 0.1-0.6% faster than nhd-shuf on the
//              8B shapes, but not in the kernel itself; held together
//              4.8-7.6% slower where every cluster is resident, and 30
//              clusters of 8 fit against a one-wave grid's 32: PERFORMANCE.md,
//              History s56.)
// The decode grids use the splits `auto` plans on the H200 for the shape.
// Timing: a CUDA graph of 8 calls cycling over copies of the pool
// (`pool_copies`), device events, median of 5 replays; %copy against the
// device-to-device copy of 1 GiB measured in the same run.
//
// Not part of the library or CI. On the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o layout kernels/cuda/probe/layout_probe.cu && ./layout [rounds [mask]]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "probe_check.h"
#include "probe_copy.h"
#include "probe_timing.h"

// Where row r of tile t of (sequence b, head h) lives, in bytes from the
// pool's K (the same offset in V):
//   entry = table[per_head ? (b * heads + h) * tiles + t : b * tiles + t]
//   entry * block_bytes + h * head_bytes + r * row_bytes
struct Where {
    const int* table;
    int per_head;
    long long block_bytes, head_bytes, row_bytes;
};
struct Args {
    const char* k;
    const char* v;
    Where where;
    int num_seqs, num_kv_heads, tiles_per_seq, num_splits;
    int stream_k;  // 1: blockIdx.x is a CTA's range of the flattened tiles
    int prefetch_steps;  // 0, or how many of the warp's tiles beyond the copies' L2 prefetches
    int touch_steps;     // 0, or how many of the warp's tiles beyond the copies a line of K and V is touched
    int touch_load;      // 1: the touch is a load, not a prefetch
    int kernel_sort;     // 1: the CTA sorts its entries of the table in shared memory first (not stream_k, per_head 0)
    int kernel_buckets;  // 0, or the CTA puts its entries in this many buckets of the pool first (counting sort)
    int bucket_shift;    // an entry's bucket is entry >> bucket_shift (< kernel_buckets)
    int kernel_stable;   // 1: the bucketing keeps the table's order within a bucket
    int overlap;         // 1 (with kernel_stable): the first OVERLAP_ENTRIES are issued in table order before the sort, which orders the rest
    int* check;          // null, or where CTA (0, 0, 0) writes its entries in the order it visits them
    unsigned* sink;
    int heads_first;     // 1: grid (num_kv_heads, num_seqs, num_splits)
    int lock_every;      // 0, or a cluster barrier (split phase) every this many of a warp's tiles
};

constexpr int SORT_MAX = 2048;  // entries a CTA sorts (nhd-ksort, nhd-kb*): 8 KiB after the ring
constexpr int MAX_BUCKETS = 256;  // nhd-kb*'s counts, after the entries (one row a warp for nhd-kbs256)
// nhd-kbs256o: the entries the ring's first stages take (every warp's first
// STAGES - 1 tiles), visited in table order.
constexpr int OVERLAP_ENTRIES = (STAGES - 1) * WARPS;

// Warp 0 turns `rows` rows of bucket counts (`counts[row * buckets +
// bucket]`, buckets a multiple of 32) into where each row's run of each
// bucket starts when the entries are laid out bucket by bucket, row by row
// within a bucket: an exclusive scan, each lane a run of buckets / 32.
__device__ void bucket_starts(int* counts, int buckets, int rows, int lane) {
    const int per_lane = buckets / 32;
    int sum = 0;
    for (int j = 0; j < per_lane; ++j)
        for (int r = 0; r < rows; ++r) sum += counts[r * buckets + lane * per_lane + j];
    int before = sum;
    for (int d = 1; d < 32; d <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, before, d);
        if (lane >= d) before += x;
    }
    before -= sum;
    for (int j = 0; j < per_lane; ++j)
        for (int r = 0; r < rows; ++r) {
            const int c = counts[r * buckets + lane * per_lane + j];
            counts[r * buckets + lane * per_lane + j] = before;
            before += c;
        }
}

__global__ void __launch_bounds__(128, 2) stream_kv(Args a) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // This CTA's tiles, as a range of the flattened (sequence, head, tile) index.
    long long begin, end;
    const long long pair_tiles = a.tiles_per_seq;
    if (a.stream_k) {
        const long long total = (long long)a.num_seqs * a.num_kv_heads * pair_tiles;
        begin = total * blockIdx.x / gridDim.x;
        end = total * (blockIdx.x + 1) / gridDim.x;
    } else {
        const long long pair = a.heads_first ? (long long)blockIdx.y * a.num_kv_heads + blockIdx.x
                                             : (long long)blockIdx.x * a.num_kv_heads + blockIdx.y;
        const int per_split = (a.tiles_per_seq + a.num_splits - 1) / a.num_splits;
        const int first = blockIdx.z * per_split;
        begin = pair * pair_tiles + first;
        end = pair * pair_tiles + min(a.tiles_per_seq, first + per_split);
    }
    unsigned char* ring = smem + warp * STAGES * TILE_BYTES;
    const unsigned ring_s = smem_addr(ring);
    const Where w = a.where;
    // kernel_sort: the CTA's entries, sorted, after the ring (padded with
    // INT_MAX to a power of two; at most SORT_MAX).
    int* sorted = reinterpret_cast<int*>(smem + RING_BYTES);
    // The CTA's entries of the table (sequence-major, not stream_k), and how many.
    const long long sort_pair = begin / pair_tiles;
    const int* const row = w.table + sort_pair / a.num_kv_heads * pair_tiles + (begin - sort_pair * pair_tiles);
    const int n = (int)(end - begin);
    int* const counts = sorted + SORT_MAX;  // nhd-kb*: [rows][buckets] after the entries
    // overlap: the first `prefix` entries (the ring's first stages, every
    // warp's) are visited in table order and issued before the sort, so the
    // sort runs while their copies are in flight; it orders the rest.
    const int prefix = a.overlap ? min(n, OVERLAP_ENTRIES) : 0;
    auto tile_base = [&](long long flat) {
        const long long pair = flat / pair_tiles;
        const int tile = (int)(flat - pair * pair_tiles);
        const int b = (int)(pair / a.num_kv_heads), h = (int)(pair - (long long)b * a.num_kv_heads);
        const long long idx = w.per_head ? flat : (long long)b * pair_tiles + tile;
        const int entry = (a.kernel_sort || a.kernel_buckets) && flat - begin >= prefix ? sorted[flat - begin]
                                                                                          : __ldg(w.table + idx);
        return (long long)entry * w.block_bytes + h * w.head_bytes;
    };
    unsigned acc = 0, pending = 0;
    auto issue = [&](long long flat, int stage) {
        if (a.prefetch_steps) {
            const long long ahead = flat + (long long)a.prefetch_steps * WARPS;
            if (ahead < end) {
                const long long base = tile_base(ahead) + (lane % TILE) * w.row_bytes;
                const char* src = (lane < TILE ? a.k : a.v) + base;
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(ROW_BYTES) : "memory");
            }
        }
        if (flat < end) {
            const long long base = tile_base(flat);
            copy_tile(ring_s + stage * TILE_BYTES, a.k, a.v, base, w.row_bytes, lane);
        }
        if (a.touch_steps && lane < 2) {
            const long long ahead = flat + (long long)a.touch_steps * WARPS;
            if (ahead < end) {
                const char* src = (lane == 0 ? a.k : a.v) + tile_base(ahead);
                if (a.touch_load) {
                    acc ^= pending;
                    pending = __ldg(reinterpret_cast<const unsigned*>(src));
                } else {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
                }
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    // The ring's first stages: before the sort where it overlaps them, else after.
    const long long first = begin + warp;
    auto fill_ring = [&] {
        for (int s = 0; s < STAGES - 1; ++s) issue(first + s * WARPS, s);
    };
    if (a.overlap) fill_ring();
    if (a.kernel_sort) {
        int size = 1;
        while (size < n) size <<= 1;
        for (int i = threadIdx.x; i < size; i += blockDim.x) sorted[i] = i < n ? __ldg(row + i) : 0x7fffffff;
        __syncthreads();
        for (int k = 2; k <= size; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = threadIdx.x; i < size; i += blockDim.x) {
                    const int partner = i ^ j;
                    if (partner > i) {
                        const int x = sorted[i], y = sorted[partner];
                        if ((x > y) == ((i & k) == 0)) {
                            sorted[i] = y;
                            sorted[partner] = x;
                        }
                    }
                }
                __syncthreads();
            }
        }
    }
    if (a.kernel_buckets && a.kernel_stable) {
        const int buckets = a.kernel_buckets, shift = a.bucket_shift;
        for (int i = threadIdx.x; i < WARPS * buckets; i += blockDim.x) counts[i] = 0;
        __syncthreads();
        const int per_warp = (n - prefix + WARPS - 1) / WARPS;
        const int lo = min(n, prefix + warp * per_warp), hi = min(n, lo + per_warp);
        int* const mine = counts + warp * buckets;
        const unsigned below = (1u << lane) - 1;
        for (int at = lo; at < hi; at += 32) {
            const bool in = at + lane < hi;
            const int bucket = in ? __ldg(row + at + lane) >> shift : -1 - lane;  // idle lanes match no one
            const unsigned peers = __match_any_sync(0xffffffffu, bucket);
            if (in && (peers & below) == 0) mine[bucket] += __popc(peers);
            __syncwarp();
        }
        __syncthreads();
        if (warp == 0) bucket_starts(counts, buckets, WARPS, lane);  // a row a warp
        __syncthreads();
        for (int at = lo; at < hi; at += 32) {
            const bool in = at + lane < hi;
            const int entry = in ? __ldg(row + at + lane) : 0;
            const int bucket = in ? entry >> shift : -1 - lane;
            const unsigned peers = __match_any_sync(0xffffffffu, bucket);
            if (in) sorted[prefix + mine[bucket] + __popc(peers & below)] = entry;
            __syncwarp();
            if (in && (peers & below) == 0) mine[bucket] += __popc(peers);
            __syncwarp();
        }
        __syncthreads();
    } else if (a.kernel_buckets) {
        for (int i = threadIdx.x; i < a.kernel_buckets; i += blockDim.x) counts[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&counts[__ldg(row + i) >> a.bucket_shift], 1);
        __syncthreads();
        if (warp == 0) bucket_starts(counts, a.kernel_buckets, 1, lane);
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const int entry = __ldg(row + i);
            sorted[atomicAdd(&counts[entry >> a.bucket_shift], 1)] = entry;
        }
        __syncthreads();
    }
    if (a.check && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && (a.kernel_sort || a.kernel_buckets))
        for (int i = threadIdx.x; i < n; i += blockDim.x) a.check[i] = i < prefix ? __ldg(row + i) : sorted[i];
    int stage = 0;
    if (!a.overlap) fill_ring();
    // lock_every: every CTA of the cluster makes the same number of passes
    // (its split's length in warp steps, equal within a cluster), so that
    // every thread meets every barrier.
    const long long passes = a.lock_every ? (n + WARPS - 1) / WARPS : (end - first + WARPS - 1) / WARPS;
    bool arrived = false;
    for (long long k = 0; k < passes; ++k) {
        const long long t = first + k * WARPS;
        if (a.lock_every && k % a.lock_every == 0 && arrived) {
            asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
            arrived = false;
        }
        if (t < end) {
            asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
            __syncwarp();
            issue(t + (STAGES - 1) * WARPS, stage == 0 ? STAGES - 1 : stage - 1);
            acc += *reinterpret_cast<const unsigned*>(ring + stage * TILE_BYTES + lane * 4);  // touch the tile
            stage = stage + 1 == STAGES ? 0 : stage + 1;
        }
        if (a.lock_every && k % a.lock_every == 0) {
            asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
            arrived = true;
        }
    }
    if (arrived) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    acc ^= pending;
    if (acc == 0x12345678u) a.sink[0] = acc;  // keeps the touch
}

struct Shape {
    const char* name;
    int num_seqs, num_kv_heads, seq_len, num_splits;
};
enum Layout { NHD_SHUF = 0, NHD_ORDER, HND_SHUF, DENSE, STREAM_K, STREAM_K1, NHD_PF2, NHD_PF4, NHD_LOCAL, NHD_T8, NHD_T16, NHD_L8, NHD_SORT, NHD_RUN4, NHD_RUN16, NHD_WSORT, NHD_KSORT, NHD_B16, NHD_B64, NHD_B256, NHD_KB64, NHD_KB256, NHD_KBS256, NHD_KBS256O, NHD_HF, NHD_CL, NHD_LOCK4, NHD_LOCK1, LAYOUTS };
static const char* layout_name[] = {"nhd-shuf", "nhd-order", "hnd-shuf", "dense", "stream-k", "stream-k1", "nhd-pf2", "nhd-pf4", "nhd-local", "nhd-t8", "nhd-t16", "nhd-l8", "nhd-sort", "nhd-run4", "nhd-run16", "nhd-wsort", "nhd-ksort", "nhd-b16", "nhd-b64", "nhd-b256", "nhd-kb64", "nhd-kb256", "nhd-kbs256", "nhd-kbs256o", "nhd-hf", "nhd-cl", "nhd-lock4", "nhd-lock1"};

int main(int argc, char** argv) {
    // ./layout [rounds [layouts]]: layouts a bit mask of the Layout enum (default all).
    const int rounds = argc > 1 ? atoi(argv[1]) : 3;
    const unsigned chosen = argc > 2 ? (unsigned)strtoul(argv[2], nullptr, 0) : ~0u;
    const Shape shapes[] = {
        {"8b B=16 s=4096", 16, 8, 4096, 1},     {"8b B=16 s=16384", 16, 8, 16384, 2},
        {"8b B=16 s=65536", 16, 8, 65536, 2},   {"8b B=4 s=65536", 4, 8, 65536, 8},
        {"8b B=4 s=16384", 4, 8, 16384, 8},     {"8b B=1 s=16384", 1, 8, 16384, 16},
        {"70b B=16 s=65536", 16, 1, 65536, 16}, {"70b B=64 s=16384", 64, 1, 16384, 4},
    };
    cudaStream_t st;
    PROBE_CHECK(cudaStreamCreate(&st));
    unsigned* sink;
    PROBE_CHECK(cudaMalloc(&sink, 16));
    int* check_d;  // the first CTA's entries, in its order (SORT_MAX at most)
    PROBE_CHECK(cudaMalloc(&check_d, SORT_MAX * sizeof(int)));
    PROBE_CHECK(cudaFuncSetAttribute(stream_kv, cudaFuncAttributeMaxDynamicSharedMemorySize, RING_BYTES + 4 * (SORT_MAX + WARPS * MAX_BUCKETS)));
    int sms = 0;
    PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double copy_tbs = copy_tbs_1gib(st);
    printf("# %s, %d SMs; copy %.3f TB/s (1 GiB, read + write); %d rounds, layouts alternated\n", prop.name, sms,
           copy_tbs, rounds);
    printf("%-18s %-10s %6s %10s %8s %7s\n", "shape", "layout", "ctas", "us", "TB/s", "%copy");
    for (const Shape& sh : shapes) {
        const long long tiles = sh.seq_len / TILE;
        const long long num_blocks = sh.num_seqs * tiles;  // per K (or V); a block is 16 tokens of every head
        const size_t side_bytes = (size_t)num_blocks * TILE * sh.num_kv_heads * ROW_BYTES;
        const size_t kv_bytes = 2 * side_bytes;
        const int copies = pool_copies(kv_bytes);
        char* pool;
        PROBE_CHECK(cudaMalloc(&pool, kv_bytes * copies));
        PROBE_CHECK(cudaMemset(pool, 1, kv_bytes * copies));
        // Tables: shuffled and in order, [seq][tile] of blocks; dense, [seq][head][tile] of 4 KiB runs.
        std::vector<int> shuffled(num_blocks), ordered(num_blocks), dense(num_blocks * sh.num_kv_heads);
        std::iota(ordered.begin(), ordered.end(), 0);
        shuffled = ordered;
        std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
        // Blocks of one 2 MiB window of the pool stay in that window.
        std::vector<int> local = ordered;
        const long long window = std::max<long long>(1, (2ll << 20) / ((long long)TILE * sh.num_kv_heads * ROW_BYTES));
        std::mt19937 local_rng(7);
        for (long long at = 0; at < num_blocks; at += window)
            std::shuffle(local.begin() + at, local.begin() + std::min<long long>(num_blocks, at + window), local_rng);
        std::iota(dense.begin(), dense.end(), 0);
        // The splits of the decode grid below: `order(first, last)` on each
        // split's entries of a copy of the shuffled table.
        const long long per_split = (tiles + sh.num_splits - 1) / sh.num_splits;
        auto each_split = [&](auto order) {
            std::vector<int> table = shuffled;
            for (long long b = 0; b < sh.num_seqs; ++b)
                for (long long first = 0; first < tiles; first += per_split)
                    order(table.begin() + b * tiles + first, table.begin() + b * tiles + std::min(tiles, first + per_split));
            return table;
        };
        // Each split's entries sorted.
        const std::vector<int> sorted = each_split([](auto first, auto last) { std::sort(first, last); });
        // Runs of 4 and 16 blocks in order, the runs shuffled.
        auto runs_of = [&](long long run) {
            std::vector<int> order((num_blocks + run - 1) / run), table(num_blocks);
            std::iota(order.begin(), order.end(), 0);
            std::shuffle(order.begin(), order.end(), std::mt19937(11));
            long long at = 0;
            for (int unit : order)
                for (long long i = unit * run; i < std::min(num_blocks, (unit + 1) * run); ++i) table[at++] = (int)i;
            return table;
        };
        const std::vector<int> run4 = runs_of(4), run16 = runs_of(16);
        // Each split's entries sorted within windows of 64.
        const std::vector<int> wsorted = each_split([](auto first, auto last) {
            for (auto at = first; at < last;) {
                const auto stop = last - at > 64 ? at + 64 : last;
                std::sort(at, stop);
                at = stop;
            }
        });
        // Each split's entries stably sorted by bucket (entry >> shift, under
        // 16, 64 or 256 buckets).
        auto shift_for = [&](int buckets) {
            int shift = 0;
            while (((num_blocks - 1) >> shift) >= buckets) ++shift;
            return shift;
        };
        auto bucketed = [&](int buckets) {
            const int shift = shift_for(buckets);
            return each_split([shift](auto first, auto last) {
                std::stable_sort(first, last, [shift](int x, int y) { return (x >> shift) < (y >> shift); });
            });
        };
        // Every table on the device; freed after the shape.
        std::vector<int*> uploaded;
        auto upload = [&](const std::vector<int>& table) {
            int* d;
            PROBE_CHECK(cudaMalloc(&d, table.size() * sizeof(int)));
            PROBE_CHECK(cudaMemcpy(d, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice));
            uploaded.push_back(d);
            return d;
        };
        int* const shuffled_d = upload(shuffled);
        int* const ordered_d = upload(ordered);
        int* const dense_d = upload(dense);
        int* const local_d = upload(local);
        int* const sorted_d = upload(sorted);
        int* const run4_d = upload(run4);
        int* const run16_d = upload(run16);
        int* const wsorted_d = upload(wsorted);
        int* const b16_d = upload(bucketed(16));
        int* const b64_d = upload(bucketed(64));
        int* const b256_d = upload(bucketed(256));
        const long long head_row = (long long)ROW_BYTES;
        const long long block_all = (long long)TILE * sh.num_kv_heads * ROW_BYTES;
        std::vector<std::vector<double>> us(LAYOUTS);
        for (int round = 0; round < rounds; ++round) {
            for (int layout = 0; layout < LAYOUTS; ++layout) {
                if (!(chosen >> layout & 1u)) continue;
                const int kernel_buckets = layout == NHD_KB64 ? 64 : layout == NHD_KB256 || layout == NHD_KBS256 || layout == NHD_KBS256O ? 256 : 0;
                const int kernel_stable = layout == NHD_KBS256 || layout == NHD_KBS256O;
                const int overlap = layout == NHD_KBS256O;
                if ((layout == NHD_KSORT || kernel_buckets) && per_split > SORT_MAX) continue;  // more entries than the CTA sorts
                Where w{};
                switch (layout) {
                    case NHD_SHUF:
                    case NHD_HF:
                    case NHD_CL:
                    case NHD_LOCK4:
                    case NHD_LOCK1:
                    case NHD_PF2:
                    case NHD_PF4:
                    case NHD_T8:
                    case NHD_T16:
                    case NHD_L8:
                    case STREAM_K:
                    case STREAM_K1: w = {shuffled_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_ORDER: w = {ordered_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_LOCAL: w = {local_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_WSORT: w = {wsorted_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_KB64:
                    case NHD_KB256:
                    case NHD_KBS256:
                    case NHD_KBS256O:
                    case NHD_KSORT: w = {shuffled_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_SORT: w = {sorted_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_B16: w = {b16_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_B64: w = {b64_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_B256: w = {b256_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_RUN4: w = {run4_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case NHD_RUN16: w = {run16_d, 0, block_all, head_row, sh.num_kv_heads * head_row}; break;
                    case HND_SHUF: w = {shuffled_d, 0, block_all, TILE * head_row, head_row}; break;
                    case DENSE: w = {dense_d, 1, TILE * head_row, 0, head_row}; break;
                }
                const int heads_first = layout == NHD_HF || layout == NHD_CL || layout == NHD_LOCK4 || layout == NHD_LOCK1;
                const int cluster = layout == NHD_CL || layout == NHD_LOCK4 || layout == NHD_LOCK1 ? sh.num_kv_heads : 0;
                const int lock_every = layout == NHD_LOCK4 ? 4 : layout == NHD_LOCK1 ? 1 : 0;
                if (heads_first && sh.num_kv_heads == 1) continue;  // nhd-shuf itself
                const int stream_k = layout == STREAM_K || layout == STREAM_K1;
                const int stream_ctas = (layout == STREAM_K ? 2 : 1) * sms;
                const dim3 grid = stream_k      ? dim3(stream_ctas)
                                  : heads_first ? dim3(sh.num_kv_heads, sh.num_seqs, sh.num_splits)
                                                : dim3(sh.num_seqs, sh.num_kv_heads, sh.num_splits);
                const int calls = 8;
                const int kernel_sort = layout == NHD_KSORT;
                const int extra = kernel_sort      ? 4 * SORT_MAX
                                  : kernel_buckets ? 4 * (SORT_MAX + WARPS * MAX_BUCKETS)
                                                   : 0;
                const int bucket_shift = kernel_buckets ? shift_for(kernel_buckets) : 0;
                // The cluster modes' launch: one configuration for the
                // occupancy query and every launch of the graph.
                cudaLaunchAttribute cluster_attr[1];
                cluster_attr[0].id = cudaLaunchAttributeClusterDimension;
                cluster_attr[0].val.clusterDim.x = cluster;
                cluster_attr[0].val.clusterDim.y = 1;
                cluster_attr[0].val.clusterDim.z = 1;
                cudaLaunchConfig_t cluster_cfg = {};
                cluster_cfg.gridDim = grid;
                cluster_cfg.blockDim = dim3(128);
                cluster_cfg.dynamicSmemBytes = RING_BYTES + extra;
                cluster_cfg.stream = st;
                cluster_cfg.attrs = cluster_attr;
                cluster_cfg.numAttrs = 1;
                if (cluster && round == 0) {
                    int clusters = 0;
                    PROBE_CHECK(cudaOccupancyMaxActiveClusters(&clusters, stream_kv, &cluster_cfg));
                    printf("# %s %s: clusters of %d CTAs, %d resident at once, %d in the grid\n", sh.name,
                           layout_name[layout], cluster, clusters, sh.num_seqs * sh.num_splits);
                }
                if (round == 0 && (kernel_sort || kernel_buckets)) {
                    // The first CTA's order, against its split's entries (sequence 0, split 0).
                    const int n = (int)std::min<long long>(tiles, per_split);
                    Args a{pool,     pool + side_bytes, w,           sh.num_seqs,  sh.num_kv_heads, (int)tiles,
                           sh.num_splits, 0,           0,            0,            0,               kernel_sort,
                           kernel_buckets, bucket_shift, kernel_stable, overlap,    check_d,         sink};
                    stream_kv<<<grid, 128, RING_BYTES + extra, st>>>(a);
                    PROBE_CHECK(cudaStreamSynchronize(st));
                    std::vector<int> got(n);
                    PROBE_CHECK(cudaMemcpy(got.data(), check_d, n * sizeof(int), cudaMemcpyDeviceToHost));
                    std::vector<int> want(shuffled.begin(), shuffled.begin() + n);
                    const int key_shift = kernel_sort ? 0 : bucket_shift;
                    auto key = [&](int x) { return x >> key_shift; };
                    // overlap: the ring's first stages in table order, the rest ordered.
                    const int prefix = overlap ? std::min(n, OVERLAP_ENTRIES) : 0;
                    std::stable_sort(want.begin() + prefix, want.end(), [&](int x, int y) { return key(x) < key(y); });
                    bool ok = std::is_permutation(got.begin(), got.end(), want.begin());
                    for (int i = 0; ok && i < n; ++i) ok = key(got[i]) == key(want[i]);
                    if (kernel_stable) ok = ok && got == want;
                    printf("# %s %s: first CTA's %d entries %s\n", sh.name, layout_name[layout], n,
                           ok ? "in the expected order" : "NOT in the expected order");
                }
                const double t = time_graph(st, calls, [&](int i) {
                    const char* k = pool + (size_t)(i % copies) * kv_bytes;
                    const int prefetch_steps = layout == NHD_PF2 ? 2 : layout == NHD_PF4 ? 4 : 0;
                    const int touch_steps = layout == NHD_T8 || layout == NHD_L8 ? 8 : layout == NHD_T16 ? 16 : 0;
                    Args a{k,        k + side_bytes, w,           sh.num_seqs, sh.num_kv_heads, (int)tiles, sh.num_splits,
                           stream_k, prefetch_steps, touch_steps, layout == NHD_L8, kernel_sort, kernel_buckets,
                           bucket_shift, kernel_stable, overlap, nullptr, sink};
                    a.heads_first = heads_first;
                    a.lock_every = lock_every;
                    if (cluster)
                        PROBE_CHECK(cudaLaunchKernelEx(&cluster_cfg, stream_kv, a));
                    else
                        stream_kv<<<grid, 128, RING_BYTES + extra, st>>>(a);
                });
                us[layout].push_back(t);
            }
        }
        for (int layout = 0; layout < LAYOUTS; ++layout) {
            std::vector<double>& v = us[layout];
            if (v.empty()) continue;
            std::sort(v.begin(), v.end());
            const double t = v[v.size() / 2];
            const int ctas = layout == STREAM_K    ? 2 * sms
                             : layout == STREAM_K1 ? sms
                                                   : sh.num_seqs * sh.num_kv_heads * sh.num_splits;
            const double tbs = kv_bytes / t / 1e6;
            printf("%-18s %-10s %6d %10.2f %8.3f %7.1f", sh.name, layout_name[layout], ctas, t, tbs,
                   100.0 * tbs / copy_tbs);
            for (double x : v) printf(" %.2f", x);
            printf("\n");
        }
        fflush(stdout);  // a call cut short keeps the shapes done
        PROBE_CHECK(cudaFree(pool));
        for (int* d : uploaded) PROBE_CHECK(cudaFree(d));
    }
    PROBE_CHECK(cudaGetLastError());
    return 0;
}

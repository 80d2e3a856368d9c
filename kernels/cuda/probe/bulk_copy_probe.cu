// bulk_copy_probe.cu: how fast can a decode kernel's copy pipeline stream a
// paged KV cache, with no math, by the way it copies?
//
// The pool is vLLM's layout ([slot][kv_head][head_dim] bf16, K and V
// apart, 16-token blocks shuffled over the pool); the grid is the decode
// kernel's (sequence, KV head, split), 4 warps, each warp taking every 4th
// 16-token tile of its split into its own 3-stage shared-memory ring, as
// decode_mma.cuh does. Only the copy differs:
//   cp.async    16-byte cp.async per lane, two chunks of a row per lane
//               (version 22's copy), cp.async.wait_group per tile;
//   bulk-row    one cp.async.bulk per 256-byte row (lanes 0-15 K, 16-31 V),
//               completing on one mbarrier per stage;
//   bulk-block  (one KV head only, where a block's 16 rows are contiguous)
//               one 4 KiB cp.async.bulk for K and one for V per tile;
//   tma-2d      one cp.async.bulk.tensor per tile for K and one for V: a
//               tensor map over the pool as [slot][kv_head * head_dim], box
//               16 slots x one head's 128 elements (no swizzle: this probe
//               times the copy, not the reads the kernel would make).
// Timing: a CUDA graph of 8 calls cycling over copies of the pool, device
// events, median of 5 replays.
//
// Not part of the library or CI. On the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o bulk kernels/cuda/probe/bulk_copy_probe.cu && ./bulk
#include <cuda.h>
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
enum Mode { CP_ASYNC = 0, BULK_ROW = 1, BULK_BLOCK = 2, TMA_2D = 3 };
constexpr int MODES = 4;
static const char* mode_name[] = {"cp.async", "bulk-row", "bulk-block", "tma-2d"};

struct Args {
    const char* k;
    const char* v;
    const int* table;  // [seq][blocks_per_seq]
    int blocks_per_seq, num_kv_heads, num_splits, seq_len;
    unsigned* sink;
};
struct Maps {
    CUtensorMap k, v;  // TMA_2D only
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void tma_2d(unsigned dst, const CUtensorMap* map, int x, int y, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int MODE>
__global__ void __launch_bounds__(128, 2) stream_kv(Args a, const __grid_constant__ Maps maps) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[WARPS][STAGES];
    const int b = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tiles = a.seq_len / TILE;
    const int per_split = (tiles + a.num_splits - 1) / a.num_splits;
    const int first_tile = split * per_split, end_tile = min(tiles, first_tile + per_split);
    unsigned char* ring = smem + warp * STAGES * TILE_BYTES;
    const unsigned ring_s = smem_addr(ring);
    const unsigned bar0 = smem_addr(&bars[warp][0]);
    if (MODE != CP_ASYNC && lane == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(bar0 + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    const long long slot_bytes = (long long)a.num_kv_heads * ROW_BYTES;
    const int* row = a.table + (long long)b * a.blocks_per_seq;
    auto issue = [&](int tile, int stage) {
        if (tile < end_tile) {
            const long long base = (long long)__ldg(row + tile) * TILE * slot_bytes + head * ROW_BYTES;
            const unsigned dst = ring_s + stage * TILE_BYTES;
            if (MODE == CP_ASYNC) {
                copy_tile(dst, a.k, a.v, base, slot_bytes, lane);
            } else if (MODE == BULK_ROW) {
                const unsigned bar = bar0 + 8 * stage;
                if (lane == 0) mbar_expect(bar, TILE_BYTES);
                __syncwarp();
                const int r = lane % 16;
                const char* src = (lane < 16 ? a.k : a.v) + base + r * slot_bytes;
                bulk(dst + (lane / 16 * TILE + r) * ROW_BYTES, src, ROW_BYTES, bar);
            } else if (MODE == BULK_BLOCK) {
                const unsigned bar = bar0 + 8 * stage;
                if (lane == 0) {
                    mbar_expect(bar, TILE_BYTES);
                    bulk(dst, a.k + base, TILE * ROW_BYTES, bar);
                    bulk(dst + TILE * ROW_BYTES, a.v + base, TILE * ROW_BYTES, bar);
                }
            } else {
                const unsigned bar = bar0 + 8 * stage;
                if (lane == 0) {
                    const int slot0 = __ldg(row + tile) * TILE, x = head * (ROW_BYTES / 2);
                    mbar_expect(bar, TILE_BYTES);
                    tma_2d(dst, &maps.k, x, slot0, bar);
                    tma_2d(dst + TILE * ROW_BYTES, &maps.v, x, slot0, bar);
                }
            }
        }
        if (MODE == CP_ASYNC) asm volatile("cp.async.commit_group;" ::: "memory");
    };
    unsigned acc = 0;
    int stage = 0, n = 0;
    const int first = first_tile + warp;
    for (int s = 0; s < STAGES - 1; ++s) issue(first + s * WARPS, s);
    for (int t = first; t < end_tile; t += WARPS, ++n) {
        if (MODE == CP_ASYNC)
            asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
        else
            mbar_wait(bar0 + 8 * stage, (n / STAGES) & 1);
        __syncwarp();
        issue(t + (STAGES - 1) * WARPS, stage == 0 ? STAGES - 1 : stage - 1);
        acc += *reinterpret_cast<const unsigned*>(ring + stage * TILE_BYTES + lane * 4);  // touch the tile
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    if (MODE == CP_ASYNC) asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (acc == 0x12345678u) a.sink[0] = acc;  // keeps the touch
}

struct Shape {
    const char* name;
    int num_seqs, num_kv_heads, seq_len, num_splits;
};

typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// [slot][kv_heads * 128] bf16; box: 16 slots x 128 elements (one head's row).
static CUtensorMap pool_map(EncodeTiled encode, const char* base, long long slots, int num_kv_heads) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)num_kv_heads * (ROW_BYTES / 2), (cuuint64_t)slots};
    const cuuint64_t strides[1] = {(cuuint64_t)num_kv_heads * ROW_BYTES};
    const cuuint32_t box[2] = {ROW_BYTES / 2, TILE};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<char*>(base), dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    return map;
}

int main() {
    const Shape shapes[] = {
        {"70b B=16 s=65536", 16, 1, 65536, 16}, {"70b B=64 s=65536", 64, 1, 65536, 4},
        {"70b B=64 s=16384", 64, 1, 16384, 4},  {"8b B=16 s=4096", 16, 8, 4096, 1},
        {"8b B=64 s=1024", 64, 8, 1024, 1},     {"8b B=16 s=16384", 16, 8, 16384, 2},
        {"8b B=4 s=16384", 4, 8, 16384, 8},     {"8b B=1 s=16384", 1, 8, 16384, 32},
    };
    cudaStream_t st;
    PROBE_CHECK(cudaStreamCreate(&st));
    unsigned* sink;
    PROBE_CHECK(cudaMalloc(&sink, 16));
    PROBE_CHECK(cudaFuncSetAttribute(stream_kv<CP_ASYNC>, cudaFuncAttributeMaxDynamicSharedMemorySize, RING_BYTES));
    PROBE_CHECK(cudaFuncSetAttribute(stream_kv<BULK_ROW>, cudaFuncAttributeMaxDynamicSharedMemorySize, RING_BYTES));
    PROBE_CHECK(cudaFuncSetAttribute(stream_kv<BULK_BLOCK>, cudaFuncAttributeMaxDynamicSharedMemorySize, RING_BYTES));
    PROBE_CHECK(cudaFuncSetAttribute(stream_kv<TMA_2D>, cudaFuncAttributeMaxDynamicSharedMemorySize, RING_BYTES));
    EncodeTiled encode = nullptr;
    cudaDriverEntryPointQueryResult found;
    PROBE_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                                 cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !encode) {
        fprintf(stderr, "no cuTensorMapEncodeTiled\n");
        return 1;
    }
    printf("%-18s %-10s %6s %10s %8s\n", "shape", "copy", "ctas", "us", "TB/s");
    for (const Shape& sh : shapes) {
        const long long blocks_per_seq = sh.seq_len / TILE;
        const long long num_blocks = sh.num_seqs * blocks_per_seq;
        const size_t side_bytes = (size_t)num_blocks * TILE * sh.num_kv_heads * ROW_BYTES;  // K (or V)
        const size_t kv_bytes = 2 * side_bytes;
        const int copies = pool_copies(kv_bytes);
        char* pool;
        PROBE_CHECK(cudaMalloc(&pool, kv_bytes * copies));
        PROBE_CHECK(cudaMemset(pool, 1, kv_bytes * copies));
        std::vector<int> table(num_blocks);
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), std::mt19937(7));
        int* table_d;
        PROBE_CHECK(cudaMalloc(&table_d, num_blocks * sizeof(int)));
        PROBE_CHECK(cudaMemcpy(table_d, table.data(), num_blocks * sizeof(int), cudaMemcpyHostToDevice));
        for (int mode = 0; mode < MODES; ++mode) {
            if (mode == BULK_BLOCK && sh.num_kv_heads != 1) continue;
            const dim3 grid(sh.num_seqs, sh.num_kv_heads, sh.num_splits);
            cudaGraph_t graph;
            PROBE_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            const int calls = 8;
            for (int i = 0; i < calls; ++i) {
                const char* k = pool + (size_t)(i % copies) * kv_bytes;
                Args a{k, k + side_bytes, table_d, (int)blocks_per_seq, sh.num_kv_heads, sh.num_splits, sh.seq_len, sink};
                Maps maps{};
                if (mode == TMA_2D) {
                    maps.k = pool_map(encode, k, num_blocks * TILE, sh.num_kv_heads);
                    maps.v = pool_map(encode, k + side_bytes, num_blocks * TILE, sh.num_kv_heads);
                }
                if (mode == CP_ASYNC) stream_kv<CP_ASYNC><<<grid, 128, RING_BYTES, st>>>(a, maps);
                if (mode == BULK_ROW) stream_kv<BULK_ROW><<<grid, 128, RING_BYTES, st>>>(a, maps);
                if (mode == BULK_BLOCK) stream_kv<BULK_BLOCK><<<grid, 128, RING_BYTES, st>>>(a, maps);
                if (mode == TMA_2D) stream_kv<TMA_2D><<<grid, 128, RING_BYTES, st>>>(a, maps);
            }
            PROBE_CHECK(cudaStreamEndCapture(st, &graph));
            cudaGraphExec_t exec;
            PROBE_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            PROBE_CHECK(cudaGraphLaunch(exec, st));
            std::vector<float> ms(5);
            for (float& m : ms) m = elapsed_ms(st, [&] { PROBE_CHECK(cudaGraphLaunch(exec, st)); });
            std::sort(ms.begin(), ms.end());
            const double us = ms[2] * 1e3 / calls;
            printf("%-18s %-10s %6d %10.2f %8.3f\n", sh.name, mode_name[mode], grid.x * grid.y * grid.z, us,
                   kv_bytes / us / 1e6);
            PROBE_CHECK(cudaGraphExecDestroy(exec));
            PROBE_CHECK(cudaGraphDestroy(graph));
        }
        PROBE_CHECK(cudaFree(pool));
        PROBE_CHECK(cudaFree(table_d));
    }
    PROBE_CHECK(cudaGetLastError());
    return 0;
}

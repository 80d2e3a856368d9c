// probe_copy.h: what the copy-pipeline probes (bulk_copy_probe.cu,
// layout_probe.cu) share with decode_mma.cuh at head_dim 128: its geometry
// (4 warps, 16-token tiles of K then V, 3-stage rings per warp, 96 KiB of
// ring: two CTAs per SM) and its copy of a tile (version 22's: 16-byte
// `cp.async`, two chunks of a 256-byte row per lane).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

constexpr int WARPS = 4, TILE = 16, ROW_BYTES = 256, STAGES = 3;
constexpr int TILE_BYTES = 2 * TILE * ROW_BYTES;  // K then V
constexpr int RING_BYTES = 98304;                 // as the mma kernel: two CTAs per SM

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// This lane's copies of one tile into the stage at shared address `dst`:
// rows lane / 8 + 4 i, chunks lane % 8 and lane % 8 + 8, of the 16 K rows
// at `k + base` and the 16 V rows at `v + base`, consecutive rows
// `row_bytes` apart. (One offset for K and V, as the probes had it inline:
// offsets into two pointers kept their register counts.)
__device__ __forceinline__ void copy_tile(unsigned dst, const char* k, const char* v, long long base,
                                          long long row_bytes, int lane) {
    const int r0 = lane / 8, c = lane % 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + 4 * i;
        const long long at = base + r * row_bytes + c * 16;
        cp_async16(dst + r * ROW_BYTES + c * 16, k + at);
        cp_async16(dst + r * ROW_BYTES + c * 16 + 128, k + at + 128);
        cp_async16(dst + (TILE + r) * ROW_BYTES + c * 16, v + at);
        cp_async16(dst + (TILE + r) * ROW_BYTES + c * 16 + 128, v + at + 128);
    }
}

// Copies of a pool of `kv_bytes` that a graph's calls cycle over, so that
// L2 holds none of a call's KV: 1 GiB in all, but at least 2 and at most 8.
static int pool_copies(size_t kv_bytes) {
    return (int)std::max<size_t>(2, std::min<size_t>(8, (1ull << 30) / kv_bytes));
}

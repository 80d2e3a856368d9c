// dynamic_split_probe.cu: what taking work from a shared counter could gain
// over the decode kernels' fixed splits, measured without the decode kernel.
//
// The question (docs/PERFORMANCE.md, "Why the remaining gap remains" and
// s17): CTAs that stream fixed shares of the KV finish unevenly, so a call
// ends with part of the machine idle. A stand-in streams a KV-sized buffer
// with the decode kernel's shape of work (4 warps a CTA, 96 KiB of shared
// memory so two CTAs share an SM, 8 KiB of 16-byte loads in flight per warp)
// and assigns it one of these ways:
//   static-warp  every warp a fixed contiguous share (a split per warp),
//   static-cta   every CTA a fixed contiguous share, its warps taking
//                every WARPS-th batch of 8 KiB of it (as the merged kernel's
//                warps take every 4th tile of a split). In s22's run this
//                mode read only a quarter of each share (its loads were
//                strided by WARPS inside a batch too): those rows, 160-197%
//                "of copy", were wrong; fixed in s23,
//   dyn          warps take chunks of `chunk` bytes from one counter; the
//                counter is zeroed either by a memset node before each call
//                (`memset`) or by the last warp to finish (`self`), and a
//                warp claims its next chunk as it starts the current one
//                (`ahead`) or only when it is done with it (`now`).
// Timing as in `decode-attn bench`: a CUDA graph of one call per buffer
// copy, cycling over >= 512 MiB, device events, replayed.
//
// Not part of the library or CI. Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o dprobe kernels/cuda/probe/dynamic_split_probe.cu && ./dprobe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "probe_check.h"
#include "probe_load.h"
#include "probe_timing.h"

constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int LOADS = 16;               // 16-byte loads in flight per lane: 8 KiB per warp
constexpr int SMEM_BYTES = 96 * 1024;   // the mma kernel's ring: two CTAs per SM
constexpr size_t MIB = 1 << 20;

enum Mode { STATIC_WARP = 0, STATIC_CTA = 1, DYN = 2 };

struct Args {
    const uint4* kv;
    size_t words;         // 16-byte words
    int mode;
    size_t chunk_words;   // DYN
    bool ahead;           // DYN: claim the next chunk before streaming this one
    bool self_reset;      // DYN: the last warp zeroes the counters (else a memset node does)
    unsigned* counter;    // [0] chunks claimed, [1] warps done
    unsigned* sink;
    unsigned long long* loaded;  // COUNT launches: [0] words read, [1] the sum of their indices
};

__device__ __forceinline__ size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// Words [begin, end) in batches of 32 * LOADS words (a load of every lane,
// LOADS deep): by one warp, every batch (stride 1), or by one of the CTA's
// warps, every stride-th batch from its own first (`lane_word` = the warp's
// first batch plus its lane).
// COUNT adds the lane's words read and the sum of their indices to
// loaded[0] and loaded[1]: an untimed launch that checks the mode reads every
// word once (a count alone misses a mode that reads some words four times
// and others never, as static-cta did in s22).
template <bool COUNT>
__device__ unsigned stream(const uint4* kv, size_t begin, size_t end, int lane_word, int stride,
                           unsigned long long* loaded) {
    unsigned x = 0;
    unsigned long long words = 0, index_sum = 0;
    for (size_t i = begin + lane_word; i < end; i += (size_t)32 * LOADS * stride) {
        uint4 v[LOADS];
#pragma unroll
        for (int u = 0; u < LOADS; ++u) {
            const size_t j = i + (size_t)u * 32;
            v[u] = j < end ? ld_stream(kv + j) : make_uint4(0, 0, 0, 0);
            if (COUNT && j < end) {
                words += 1;
                index_sum += j;
            }
        }
#pragma unroll
        for (int u = 0; u < LOADS; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (COUNT) {
        atomicAdd(&loaded[0], words);
        atomicAdd(&loaded[1], index_sum);
    }
    return x;
}

template <bool COUNT>
__global__ void __launch_bounds__(THREADS, 2) stand_in(Args a) {
    extern __shared__ __align__(16) unsigned char smem[];  // occupancy only
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned x = 0;
    if (a.mode == STATIC_WARP) {
        const size_t warps = (size_t)gridDim.x * WARPS;
        const size_t per = (a.words + warps - 1) / warps;
        const size_t w = (size_t)blockIdx.x * WARPS + warp;
        x = stream<COUNT>(a.kv, min_size(a.words, w * per), min_size(a.words, (w + 1) * per), lane, 1, a.loaded);
    } else if (a.mode == STATIC_CTA) {
        const size_t per = (a.words + gridDim.x - 1) / gridDim.x;
        const size_t begin = min_size(a.words, blockIdx.x * per), end = min_size(a.words, begin + per);
        x = stream<COUNT>(a.kv, begin, end, warp * 32 * LOADS + lane, WARPS, a.loaded);
    } else {
        const unsigned chunks = (unsigned)((a.words + a.chunk_words - 1) / a.chunk_words);
        unsigned claim = lane == 0 ? atomicAdd(&a.counter[0], 1u) : 0u;
        unsigned chunk = __shfl_sync(0xffffffffu, claim, 0);
        while (chunk < chunks) {
            if (a.ahead && lane == 0) claim = atomicAdd(&a.counter[0], 1u);
            const size_t begin = (size_t)chunk * a.chunk_words;
            x ^= stream<COUNT>(a.kv, begin, min_size(a.words, begin + a.chunk_words), lane, 1, a.loaded);
            if (!a.ahead && lane == 0) claim = atomicAdd(&a.counter[0], 1u);
            chunk = __shfl_sync(0xffffffffu, claim, 0);
        }
        if (a.self_reset && lane == 0) {
            // Every claim of this warp is behind it; the last warp of the
            // call leaves both counters zero for the next call.
            __threadfence();
            const unsigned total = gridDim.x * WARPS;
            if (atomicAdd(&a.counter[1], 1u) == total - 1) {
                a.counter[0] = 0;
                a.counter[1] = 0;
                __threadfence();
            }
        }
    }
    (void)smem;
    if (x == 0x12345678u) *a.sink = x;
}

struct Config {
    const char* name;
    int mode;
    int ctas_per_sm;
    size_t chunk_kib;
    bool ahead, self_reset;
};

int main() {
    cudaDeviceProp prop;
    PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
    PROBE_CHECK(cudaFuncSetAttribute(stand_in<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    PROBE_CHECK(cudaFuncSetAttribute(stand_in<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    cudaStream_t st;
    PROBE_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int sms = prop.multiProcessorCount;

    const double copy_tbs = copy_tbs_1gib(st);
    printf("# %s, %d SMs; copy %.2f TB/s (1 GiB, read + write)\n", prop.name, sms, copy_tbs);

    unsigned *counters, *sink;
    PROBE_CHECK(cudaMalloc(&counters, 2 * sizeof(unsigned)));
    PROBE_CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned)));
    PROBE_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    unsigned long long* loaded;
    PROBE_CHECK(cudaMalloc(&loaded, 2 * sizeof(unsigned long long)));

    const std::vector<Config> configs = {
        {"static-warp", STATIC_WARP, 2, 0, false, false},
        {"static-warp", STATIC_WARP, 1, 0, false, false},
        {"static-cta", STATIC_CTA, 2, 0, false, false},
        {"dyn-memset-ahead", DYN, 2, 64, true, false},
        {"dyn-memset-ahead", DYN, 2, 256, true, false},
        {"dyn-memset-ahead", DYN, 2, 1024, true, false},
        {"dyn-self-ahead", DYN, 2, 64, true, true},
        {"dyn-self-ahead", DYN, 2, 256, true, true},
        {"dyn-self-ahead", DYN, 2, 1024, true, true},
        {"dyn-self-now", DYN, 2, 256, false, true},
        {"dyn-self-ahead", DYN, 1, 256, true, true},
    };
    const std::vector<size_t> sizes_mib = {64, 128, 256, 512, 1024, 4096};
    printf("%8s %-18s %5s %9s %9s %7s %6s\n", "KV_MiB", "assignment", "CTAs", "chunk_KiB", "us", "TB/s", "%copy");
    for (size_t mib : sizes_mib) {
        const size_t bytes = mib * MIB;
        const size_t rotation = 512 * MIB;
        const int copies = (int)std::min<size_t>(64, std::max<size_t>(1, (rotation + bytes - 1) / bytes));
        unsigned char* pool;
        PROBE_CHECK(cudaMalloc(&pool, bytes * copies));
        PROBE_CHECK(cudaMemset(pool, 3, bytes * copies));
        for (int round = 0; round < 2; ++round) {
            for (const Config& c : configs) {
                const int grid = sms * c.ctas_per_sm;
                auto args = [&](int i) {
                    return Args{reinterpret_cast<const uint4*>(pool + (size_t)i * bytes), bytes / 16, c.mode,
                                c.chunk_kib * 1024 / 16, c.ahead, c.self_reset, counters, sink, loaded};
                };
                // Untimed: the mode reads every word of the buffer once.
                PROBE_CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned)));
                PROBE_CHECK(cudaMemset(loaded, 0, 2 * sizeof(unsigned long long)));
                stand_in<true><<<grid, THREADS, SMEM_BYTES, st>>>(args(0));
                PROBE_CHECK(cudaStreamSynchronize(st));
                unsigned long long read[2];
                PROBE_CHECK(cudaMemcpy(read, loaded, sizeof(read), cudaMemcpyDeviceToHost));
                const unsigned long long words = bytes / 16;
                if (read[0] != words || read[1] != words * (words - 1) / 2) {
                    fprintf(stderr, "%s reads %llu words (index sum %llu) of %llu (sum %llu)\n", c.name, read[0],
                            read[1], words, words * (words - 1) / 2);
                    return 1;
                }
                PROBE_CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned)));
                const double us = time_graph(st, copies, [&](int i) {
                    if (c.mode == DYN && !c.self_reset) PROBE_CHECK(cudaMemsetAsync(counters, 0, sizeof(unsigned), st));
                    stand_in<false><<<grid, THREADS, SMEM_BYTES, st>>>(args(i));
                });
                // The counters are zero after every call (self) or zeroed before it (memset).
                unsigned left[2];
                PROBE_CHECK(cudaMemcpy(left, counters, sizeof(left), cudaMemcpyDeviceToHost));
                if (c.mode == DYN && c.self_reset && (left[0] != 0 || left[1] != 0)) {
                    fprintf(stderr, "counters not reset: %u %u\n", left[0], left[1]);
                    return 1;
                }
                PROBE_CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned)));
                const double tbs = bytes / (us * 1e-6) / 1e12;
                printf("%8zu %-18s %5d %9zu %9.2f %7.2f %6.1f\n", mib, c.name, grid, c.chunk_kib, us, tbs,
                       100.0 * tbs / copy_tbs);
            }
        }
        PROBE_CHECK(cudaFree(pool));
    }
    PROBE_CHECK(cudaGetLastError());
    return 0;
}

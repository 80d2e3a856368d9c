// fixed_cost_probe.cu: what a decode call costs beyond its bytes, measured
// without the decode kernel. A stand-in kernel streams a KV-sized buffer
// split over (heads x splits) CTAs the way the decode kernels are (4 warps,
// 96 KiB of shared memory so two CTAs share an SM), optionally behind a chain
// of dependent loads (length -> table entry -> first KV byte), and ends in
// one of three ways:
//   direct   each CTA stores its row (no split reduce: the floor),
//   reducer  partial rows to global memory + a reducer kernel launched with
//            programmatic dependent launch (what the CUDA backend does now),
//   cluster  the splits of a head form one thread-block cluster and reduce
//            through distributed shared memory (sm_90), no second kernel.
// Timing as in `decode-attn bench`: a CUDA graph of one call per buffer copy,
// cycling over >= 512 MiB (at most 64 copies), device events, replayed.
//
// Not part of the library or CI (kernels/cuda/*.cu only is compiled there).
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o probe kernels/cuda/probe/fixed_cost_probe.cu && ./probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#include "probe_check.h"
#include "probe_load.h"
#include "probe_timing.h"

constexpr int THREADS = 128;
constexpr int HEAD_DIM = 128;
constexpr int UNROLL = 16;                 // 16-byte loads in flight per thread
constexpr int SMEM_BYTES = 96 * 1024;      // the mma kernel's ring: two CTAs per SM
constexpr int MAX_SPLITS = 256;
constexpr size_t MIB = 1 << 20;

enum Mode { DIRECT = 0, REDUCER = 1, CLUSTER = 2, CLUSTER_DIRECT = 3 };  // the last: launched as clusters, direct end

struct Args {
    const uint4* kv;      // this copy's buffer; its first 4 KiB holds the "length" and "table"
    size_t words;         // 16-byte words of KV
    int chain;            // dependent loads before the first KV load: 0, 1 (length) or 2 (+ table entry)
    int mode;
    float* out;           // [heads][HEAD_DIM]
    float* part;          // [heads][splits][HEAD_DIM]
    float* part_ml;       // [heads][splits][2]
};

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_producer() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Grid (splits, heads). CTA (split, head) streams its share of the buffer.
__global__ void __launch_bounds__(THREADS) stand_in(Args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* acc_s = reinterpret_cast<float*>(smem);  // [HEAD_DIM] + m, l
    __shared__ long long offset_s;
    const int split = blockIdx.x, splits = gridDim.x, head = blockIdx.y, heads = gridDim.y;
    if (threadIdx.x == 0) {
        // The chain: each load's address depends on the one before (values are 0).
        const int* meta = reinterpret_cast<const int*>(a.kv);
        long long off = 0;
        if (a.chain >= 1) off = __ldg(meta + split % 16);                 // "length"
        if (a.chain >= 2) off = __ldg(meta + 64 + (int)off + head % 64);  // "table entry"
        offset_s = off;
    }
    __syncthreads();
    if (a.mode == REDUCER) launch_dependents();
    const size_t ctas = (size_t)splits * heads;
    const size_t cta = (size_t)head * splits + split;
    const size_t per = (a.words + ctas - 1) / ctas;
    const size_t begin = cta * per + (size_t)offset_s;
    const size_t end = min(a.words, begin + per);
    unsigned x = 0;
    for (size_t i = begin + threadIdx.x; i < end; i += (size_t)THREADS * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const size_t j = i + (size_t)u * THREADS;
            v[u] = j < end ? ld_stream(a.kv + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    // One value per dimension (thread d < HEAD_DIM), m and l per CTA.
    const float value = (float)(x & 0xff) + (float)threadIdx.x;
    const float m = (float)(split % 7), l = 1.f;
    if (a.mode == DIRECT || a.mode == CLUSTER_DIRECT) {
        a.out[((size_t)head * splits + split) * HEAD_DIM + threadIdx.x] = value;
        return;
    }
    if (a.mode == REDUCER) {
        a.part[((size_t)head * splits + split) * HEAD_DIM + threadIdx.x] = value;
        if (threadIdx.x == 0) {
            a.part_ml[((size_t)head * splits + split) * 2] = m;
            a.part_ml[((size_t)head * splits + split) * 2 + 1] = l;
        }
        return;
    }
    // CLUSTER: the head's splits are one cluster; rank r reduces dims r, r + splits, ...
    acc_s[threadIdx.x] = value;
    if (threadIdx.x == 0) {
        acc_s[HEAD_DIM] = m;
        acc_s[HEAD_DIM + 1] = l;
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int rank = (int)cluster.block_rank();
    const int size = (int)cluster.num_blocks();
    // Every thread < size reads one peer's (m, l); the weights through shuffles.
    float big_m = -INFINITY;
    float peer_m = -INFINITY, peer_l = 0.f;
    if (threadIdx.x < 32) {
        if (threadIdx.x < size) {
            const float* peer = cluster.map_shared_rank(acc_s, threadIdx.x);
            peer_m = peer[HEAD_DIM];
            peer_l = peer[HEAD_DIM + 1];
        }
        big_m = peer_m;
        for (int o = 16; o > 0; o >>= 1) big_m = fmaxf(big_m, __shfl_xor_sync(0xffffffffu, big_m, o));
        const float w = threadIdx.x < size ? exp2f(peer_m - big_m) : 0.f;
        float big_l = w * peer_l;
        for (int o = 16; o > 0; o >>= 1) big_l += __shfl_xor_sync(0xffffffffu, big_l, o);
        if (threadIdx.x < size) acc_s[HEAD_DIM + 2 + threadIdx.x] = w / big_l;
    }
    __syncthreads();
    // dims d = rank + k * size, one thread per (peer, d): THREADS / size dims per pass
    for (int d = rank + size * (threadIdx.x / size); d < HEAD_DIM; d += size * (THREADS / size)) {
        const int peer = threadIdx.x % size;
        const float* src = cluster.map_shared_rank(acc_s, peer);
        float v = src[d] * acc_s[HEAD_DIM + 2 + peer];
        for (int o = 1; o < size; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (peer == 0) a.out[(size_t)head * HEAD_DIM + d] = v;
    }
    cluster.sync();  // peers may still read this CTA's shared memory
}

// One CTA per head: combine the splits' partial rows.
__global__ void __launch_bounds__(THREADS) reducer(Args a, int splits) {
    __shared__ float w_s[MAX_SPLITS];
    const int head = blockIdx.x;
    wait_for_producer();
    const float* ml = a.part_ml + (size_t)head * splits * 2;
    float big_m = -INFINITY;
    for (int s = 0; s < splits; ++s) big_m = fmaxf(big_m, ml[2 * s]);
    float big_l = 0.f;
    for (int s = threadIdx.x; s < splits; s += THREADS) {
        const float w = exp2f(ml[2 * s] - big_m);
        w_s[s] = w;
    }
    __syncthreads();
    for (int s = 0; s < splits; ++s) big_l += w_s[s] * ml[2 * s + 1];
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += w_s[s] * a.part[((size_t)head * splits + s) * HEAD_DIM + threadIdx.x];
    a.out[(size_t)head * HEAD_DIM + threadIdx.x] = v / big_l;
}

// The floor: a plain grid-stride read of the whole buffer (every CTA's
// threads take consecutive 16-byte words, 8 loads in flight per thread).
__global__ void __launch_bounds__(256) grid_stride_read(const uint4* kv, size_t words, unsigned* sink) {
    constexpr int LOADS = 8;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned x = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride * LOADS) {
        uint4 v[LOADS];
#pragma unroll
        for (int u = 0; u < LOADS; ++u) {
            const size_t j = i + u * stride;
            v[u] = j < words ? ld_stream(kv + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < LOADS; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (x == 0x12345678u) *sink = x;
}

__global__ void empty_kernel(int* sink) {
    if (sink && threadIdx.x == 1000) *sink = 1;
}

struct Config {
    int heads, splits, mode, chain;
};

static const char* mode_name(int m) {
    return m == DIRECT ? "direct" : m == REDUCER ? "reducer" : m == CLUSTER ? "cluster" : "cl-direct";
}

static void launch_call(cudaStream_t st, const Config& c, Args a, bool pdl_reducer) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(c.splits, c.heads);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = SMEM_BYTES;
    cfg.stream = st;
    cfg.numAttrs = 0;
    if (c.mode == CLUSTER || c.mode == CLUSTER_DIRECT) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = c.splits;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    PROBE_CHECK(cudaLaunchKernelEx(&cfg, stand_in, a));
    if (c.mode == REDUCER) {
        cudaLaunchConfig_t rc = {};
        cudaLaunchAttribute rattr[1];
        rc.gridDim = dim3(c.heads);
        rc.blockDim = dim3(THREADS);
        rc.stream = st;
        if (pdl_reducer) {
            rattr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            rattr[0].val.programmaticStreamSerializationAllowed = 1;
            rc.attrs = rattr;
            rc.numAttrs = 1;
        }
        PROBE_CHECK(cudaLaunchKernelEx(&rc, reducer, a, c.splits));
    }
}

int main() {
    cudaDeviceProp prop;
    PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
    PROBE_CHECK(cudaFuncSetAttribute(stand_in, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    PROBE_CHECK(cudaFuncSetAttribute(stand_in, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaStream_t st;
    PROBE_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    const double copy_tbs = copy_tbs_1gib(st);
    printf("# %s, %d SMs; copy %.2f TB/s (1 GiB, read + write)\n", prop.name, prop.multiProcessorCount, copy_tbs);

    // Empty kernels in a graph: the launch floor per node.
    {
        double plain = time_graph(st, 64, [&](int) { empty_kernel<<<1, 32, 0, st>>>(nullptr); });
        double pdl = time_graph(st, 64, [&](int) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = dim3(1);
            cfg.blockDim = dim3(32);
            cfg.stream = st;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            PROBE_CHECK(cudaLaunchKernelEx(&cfg, empty_kernel, (int*)nullptr));
        });
        printf("empty kernel per graph node: %.2f us plain, %.2f us programmatic\n", plain, pdl);
    }

    float *out, *part, *part_ml;
    PROBE_CHECK(cudaMalloc(&out, 64 * MAX_SPLITS * HEAD_DIM * sizeof(float)));
    PROBE_CHECK(cudaMalloc(&part, 64 * MAX_SPLITS * HEAD_DIM * sizeof(float)));
    PROBE_CHECK(cudaMalloc(&part_ml, 64 * MAX_SPLITS * 2 * sizeof(float)));

    const std::vector<double> sizes_mib = {0.5, 2, 4, 16, 64, 256, 1024};
    const std::vector<Config> configs = {
        {8, 32, DIRECT, 0},  {8, 32, DIRECT, 2},  {8, 32, REDUCER, 2}, {8, 16, DIRECT, 2},
        {8, 16, REDUCER, 2}, {8, 16, CLUSTER, 2}, {8, 16, CLUSTER_DIRECT, 2}, {8, 8, REDUCER, 2},  {8, 8, CLUSTER, 2},
        {1, 16, REDUCER, 2}, {1, 16, CLUSTER, 2}, {1, 128, REDUCER, 2}, {1, 128, DIRECT, 2},
    };
    printf("%8s %5s %6s %8s %5s %9s %7s %6s\n", "KV_MiB", "heads", "splits", "end", "chain", "us", "TB/s", "%copy");
    for (double mib : sizes_mib) {
        const size_t bytes = (size_t)(mib * MIB);
        const size_t rotation = 512 * MIB;
        const int copies = (int)std::min<size_t>(64, std::max<size_t>(1, (rotation + bytes - 1) / bytes));
        unsigned char* pool;
        PROBE_CHECK(cudaMalloc(&pool, bytes * copies));
        PROBE_CHECK(cudaMemset(pool, 0, bytes * copies));  // lengths and table entries 0: the chain's values
        for (int ctas_per_sm : {2, 4, 8}) {
            const int grid = prop.multiProcessorCount * ctas_per_sm;
            const double us = time_graph(st, copies, [&](int i) {
                grid_stride_read<<<grid, 256, 0, st>>>(reinterpret_cast<const uint4*>(pool + (size_t)i * bytes), bytes / 16,
                                                      reinterpret_cast<unsigned*>(out));
            });
            const double tbs = bytes / (us * 1e-6) / 1e12;
            printf("%8.1f %5s %6d %8s %5d %9.2f %7.2f %6.1f\n", mib, "-", grid, "read", 0, us, tbs, 100.0 * tbs / copy_tbs);
        }
        for (const Config& c : configs) {
            if (c.mode == CLUSTER || c.mode == CLUSTER_DIRECT) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeClusterDimension;
                attr[0].val.clusterDim.x = c.splits;
                attr[0].val.clusterDim.y = 1;
                attr[0].val.clusterDim.z = 1;
                cfg.gridDim = dim3(c.splits, c.heads);
                cfg.blockDim = dim3(THREADS);
                cfg.dynamicSmemBytes = SMEM_BYTES;
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                int clusters = 0;
                PROBE_CHECK(cudaOccupancyMaxActiveClusters(&clusters, stand_in, &cfg));
                if (mib == sizes_mib[0]) printf("# cluster of %d: %d clusters resident at once\n", c.splits, clusters);
                if (clusters == 0) continue;
            }
            const double us = time_graph(st, copies, [&](int i) {
                Args a{reinterpret_cast<const uint4*>(pool + (size_t)i * bytes), bytes / 16, c.chain, c.mode, out, part, part_ml};
                launch_call(st, c, a, true);
            });
            const double tbs = bytes / (us * 1e-6) / 1e12;
            printf("%8.1f %5d %6d %8s %5d %9.2f %7.2f %6.1f\n", mib, c.heads, c.splits, mode_name(c.mode), c.chain, us, tbs,
                   100.0 * tbs / copy_tbs);
        }
        PROBE_CHECK(cudaFree(pool));
    }
    PROBE_CHECK(cudaGetLastError());
    return 0;
}

// cuda_emu.h: runs decode.cu's kernels on the CPU, for logic checks where no
// GPU is at hand. Test-only; never part of the kernels' build.
//
// It supplies decode.cu's portable layer (DA_PORTABLE_LAYER) and the CUDA
// builtins the kernels use, so that decode.cu compiles as plain C++. A CTA
// runs as 128 cooperative fibers on one OS thread (each started with
// ucontext, switched with the compiler's setjmp builtins): __syncthreads
// and warp shuffles are barriers that switch fibers, so barrier counts and
// block-uniform control flow are checked (a barrier that not all live threads
// reach is reported as a deadlock). cp.async is deferred the PTX way: a copy
// lands only when the issuing thread's cp.async.wait_group lets it (its group
// is older than the N most recent committed groups), and its destination is
// poisoned with 0xff bytes (NaN as f32) from issue until then, so a read
// before the matching wait shows; this checks group accounting, not timing;
// inline PTX is replaced by plain C++ of the same rounding.
//
// Blocks of up to kMaxThreads = 256 threads. The wave (warp) size is
// DA_EMU_WAVE, 32 unless the includer defines it (64 emulates AMD
// wavefronts for kernels/hip; decode.cu itself assumes 32).
//
// Shared memory: __shared__ is `static` (one copy for the CTA's fibers, one
// CTA at a time); a kernel's dynamic shared memory (DA_DYNAMIC_SHARED, the
// rings of the stream and tensor-core kernels) is emu::dynamic_smem, at least the
// largest the host launches, filled with 0xff bytes (NaN as f32) before every CTA so that
// a read of a byte never written shows.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define DA_PORTABLE_LAYER 1
#ifndef DA_EMU_WAVE
#define DA_EMU_WAVE 32
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() {}
    dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
inline float2 make_float2(float a, float b) { return float2{a, b}; }

inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}

// ---- Fibers -----------------------------------------------------------------
namespace emu {
constexpr int kMaxThreads = 256;
constexpr size_t kStack = 256 * 1024;
enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };
struct Fiber {
    ucontext_t ctx;  // the fiber's first entry only
    void* resume[5];  // every later one (__builtin_setjmp)
    bool started;
    dim3 tid;
    State state;
    std::vector<char> stack;
    // cp.async: copies not yet landed, and the groups committed so far.
    struct Copy {
        void* dst;
        const void* src;
        int bytes;
        long long group;
    };
    std::vector<Copy> pending;
    long long committed = 0;
};
inline Fiber fibers[kMaxThreads];
inline int cur = 0, nthreads = 0;
inline ucontext_t sched;
inline void* sched_resume[5];
inline dim3 block_idx, grid_dim, block_dim;
inline float shfl_buf[kMaxThreads];
// The dynamic shared memory of a launch (see the top).
constexpr size_t kDynamicSharedBytes = 204800;  // the largest: decode_mma.cuh's at head_dim 256
alignas(16) inline unsigned char dynamic_smem[kDynamicSharedBytes];
inline void (*entry)(const void*) = nullptr;
inline const void* entry_arg = nullptr;

// Switches between fibers go through the compiler's __builtin_setjmp and
// __builtin_longjmp, which save no signal mask: swapcontext makes two
// system calls a switch, and a shuffle is two switches per lane. (glibc's
// _longjmp would do too, but _FORTIFY_SOURCE, on by default in some
// distributions' compilers, turns it into a check that aborts on a jump to
// another stack.) Only a fiber's first entry uses swapcontext, onto the
// stack makecontext set up.
[[noreturn, gnu::noinline]] inline void jump_to(void** buf) { __builtin_longjmp(buf, 1); }
inline void yield_as(State s) {
    fibers[cur].state = s;
    if (__builtin_setjmp(fibers[cur].resume) == 0) jump_to(sched_resume);
}
inline void trampoline() {
    entry(entry_arg);
    fibers[cur].state = DONE;
    jump_to(sched_resume);
}
inline void resume(int t) {
    cur = t;
    if (__builtin_setjmp(sched_resume) != 0) return;
    if (fibers[t].started) jump_to(fibers[t].resume);
    fibers[t].started = true;
    swapcontext(&sched, &fibers[t].ctx);
}
// Runs one CTA of n threads of fn(arg) to completion.
inline void run_block(void (*fn)(const void*), const void* arg, int n) {
    memset(dynamic_smem, 0xff, sizeof dynamic_smem);
    entry = fn;
    entry_arg = arg;
    nthreads = n;
    for (int t = 0; t < n; ++t) {
        Fiber& f = fibers[t];
        f.stack.resize(kStack);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, trampoline, 0);
        f.tid = dim3(t, 0, 0);
        f.state = RUNNABLE;
        f.started = false;
        f.pending.clear();  // copies a CTA never waited for are dropped
        f.committed = 0;
    }
    for (;;) {
        bool ran = false;
        for (int t = 0; t < n; ++t)
            if (fibers[t].state == RUNNABLE) {
                resume(t);
                ran = true;
            }
        if (ran) continue;
        int live = 0, at_block = 0;
        for (int t = 0; t < n; ++t) {
            live += fibers[t].state != DONE;
            at_block += fibers[t].state == AT_BLOCK_BARRIER;
        }
        if (live == 0) return;
        bool released = false;
        // A warp barrier completes when every live lane of the warp is at it.
        for (int w = 0; w * DA_EMU_WAVE < n; ++w) {
            int live_w = 0, at_w = 0;
            for (int t = w * DA_EMU_WAVE; t < w * DA_EMU_WAVE + DA_EMU_WAVE && t < n; ++t) {
                live_w += fibers[t].state != DONE;
                at_w += fibers[t].state == AT_WARP_BARRIER;
            }
            if (at_w > 0 && at_w == live_w) {
                for (int t = w * DA_EMU_WAVE; t < w * DA_EMU_WAVE + DA_EMU_WAVE && t < n; ++t)
                    if (fibers[t].state == AT_WARP_BARRIER) fibers[t].state = RUNNABLE;
                released = true;
            }
        }
        if (!released && at_block == live) {
            for (int t = 0; t < n; ++t)
                if (fibers[t].state == AT_BLOCK_BARRIER) fibers[t].state = RUNNABLE;
            released = true;
        }
        if (!released) {
            fprintf(stderr, "emu: deadlock in block (%u,%u,%u): %d live, %d at __syncthreads\n", block_idx.x,
                    block_idx.y, block_idx.z, live, at_block);
            exit(3);
        }
    }
}
}  // namespace emu

#define threadIdx (emu::fibers[emu::cur].tid)
#define blockIdx (emu::block_idx)
#define gridDim (emu::grid_dim)
#define blockDim (emu::block_dim)
inline void __syncthreads() { emu::yield_as(emu::AT_BLOCK_BARRIER); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    const int t = emu::cur;
    emu::shfl_buf[t] = v;
    emu::yield_as(emu::AT_WARP_BARRIER);
    const float r = emu::shfl_buf[(t & ~(DA_EMU_WAVE - 1)) | ((t & (DA_EMU_WAVE - 1)) ^ lane_mask)];
    emu::yield_as(emu::AT_WARP_BARRIER);
    return r;
}

#include "host_convert.h"

// ---- decode.cu's portable layer ---------------------------------------------
#define DA_DEVICE inline
#define DA_DEVICE_CALLED inline
#define DA_WARP_SIZE 32
#define DA_DYNAMIC_SHARED(name) unsigned char* const name = emu::dynamic_smem
inline float da_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
inline float da_exp2(float x) { return std::exp2(x); }
inline float da_log2(float x) { return std::log2(x); }
inline void da_store_if(bool pred, float* at, float v) {
    if (pred) *at = v;
}
inline float da_neg_inf() { return -INFINITY; }
inline float da_nan() { return __uint_as_float(0x7fffffffu); }
inline bool da_isnan(float x) { return x != x; }
inline int da_min(int a, int b) { return a < b ? a : b; }
inline int da_max(int a, int b) { return a > b ? a : b; }
// 16-byte copy; src_bytes 0 writes zeros and reads nothing. Lands at a wait.
inline void da_cp_async16(void* smem_dst, const void* global_src, int src_bytes) {
    emu::Fiber& f = emu::fibers[emu::cur];
    if (src_bytes < 0 || src_bytes > 16) {
        fprintf(stderr, "emu: cp.async src_bytes %d\n", src_bytes);
        exit(3);
    }
    memset(smem_dst, 0xff, 16);
    f.pending.push_back({smem_dst, global_src, src_bytes, f.committed});
}
// Shared addresses are offsets into the block's dynamic shared memory.
inline unsigned da_smem_addr(const void* ptr) {
    return (unsigned)(static_cast<const unsigned char*>(ptr) - emu::dynamic_smem);
}
inline void da_cp_async16_shared(unsigned smem_dst, const void* global_src, int src_bytes) {
    da_cp_async16(emu::dynamic_smem + smem_dst, global_src, src_bytes);
}
inline void da_cp_async_commit() { ++emu::fibers[emu::cur].committed; }
// Lands every copy of this thread's groups but the N most recent committed ones.
template <int N>
inline void da_cp_async_wait() {
    emu::Fiber& f = emu::fibers[emu::cur];
    size_t kept = 0;
    for (size_t i = 0; i < f.pending.size(); ++i) {
        const emu::Fiber::Copy c = f.pending[i];
        if (c.group < f.committed - N) {
            memset(c.dst, 0, 16);
            if (c.bytes) memcpy(c.dst, c.src, c.bytes);
        } else {
            f.pending[kept++] = c;
        }
    }
    f.pending.resize(kept);
}
inline uint4 da_ldg16(const void* ptr) { return *reinterpret_cast<const uint4*>(ptr); }
inline uint4 da_ld_stream16(const void* ptr) { return *reinterpret_cast<const uint4*>(ptr); }
inline int da_syncthreads_or(int pred) {
    static int any;  // one CTA runs at a time
    __syncthreads();
    if (threadIdx.x == 0) any = 0;
    __syncthreads();
    if (pred) any = 1;
    __syncthreads();
    const int r = any;
    __syncthreads();
    return r;
}
// Launches are serial here: programmatic dependent launch has nothing to overlap.
inline void da_launch_dependents() {}
inline void da_wait_for_producer() {}
inline void da_wait_for_producer_after(int, const void*) {}
inline int da_ffs(int x) { return __builtin_ffs(x); }
inline float da_bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
inline float da_bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
inline void da_f16x2_to_f32(unsigned w, float& lo, float& hi) {
    lo = host_f16_to_f32((unsigned short)(w & 0xffffu));
    hi = host_f16_to_f32((unsigned short)(w >> 16));
}
inline float da_f16_to_f32(unsigned short h) { return host_f16_to_f32(h); }
inline unsigned da_f32x2_to_bf16x2(float lo, float hi) {
    return (unsigned)host_f32_to_bf16(lo) | ((unsigned)host_f32_to_bf16(hi) << 16);
}
inline unsigned da_f32x2_to_f16x2(float lo, float hi) {
    return (unsigned)host_f32_to_f16(lo) | ((unsigned)host_f32_to_f16(hi) << 16);
}
inline unsigned short da_f32_to_bf16(float x) { return host_f32_to_bf16(x); }
inline unsigned short da_f32_to_f16(float x) { return host_f32_to_f16(x); }

// ---- A minimal runtime: host memory as device memory, launches on fibers -----
typedef int cudaError_t;
typedef void* cudaStream_t;
typedef void* cudaEvent_t;
constexpr int cudaSuccess = 0;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
struct cudaDeviceProp {
    char name[256];
    int multiProcessorCount;
};
inline cudaError_t cudaMalloc(void* pp, size_t n) {
    *(void**)pp = aligned_alloc(256, (n + 255) / 256 * 256);
    return 0;
}
inline cudaError_t cudaFree(void* p) {
    free(p);
    return 0;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
    memcpy(d, s, n);
    return 0;
}
inline cudaError_t cudaMemset(void* d, int v, size_t n) {
    memset(d, v, n);
    return 0;
}
inline cudaError_t cudaDeviceSynchronize() { return 0; }
inline cudaError_t cudaGetLastError() { return 0; }
inline const char* cudaGetErrorString(cudaError_t) { return "emu"; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    strcpy(p->name, "CPU emulation");
    p->multiProcessorCount = 1;
    return 0;
}

template <typename P>
inline void emu_launch(void (*kernel)(const P), dim3 grid, int threads, const P& params) {
    static void (*k)(const P) = nullptr;
    k = kernel;
    auto thunk = [](const void* a) { k(*static_cast<const P*>(a)); };
    emu::grid_dim = grid;
    emu::block_dim = dim3(threads);
    // Blocks in a shuffled order (fixed seed): a GPU promises no order.
    std::vector<dim3> blocks;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) blocks.push_back(dim3(x, y, z));
    static unsigned long long state = 0x9e3779b97f4a7c15ull;
    for (size_t i = blocks.size(); i > 1; --i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(blocks[i - 1], blocks[(size_t)(state >> 33) % i]);
    }
    for (const dim3& block : blocks) {
        emu::block_idx = block;
        emu::run_block(thunk, &params, threads);
    }
}

// timeline.cu: where the time of one decode call goes, phase by phase.
//
// Builds decode.cu with DA_TIMELINE, so that thread 0 of every CTA writes
// %globaltimer at the DA_STAMP points of the tensor-core kernel and the split
// reducer:
//   decode  0 entry, 1 split known (length read), 2 first tiles' copies
//           issued (block-table entries read), 3 first tile landed, 4 last
//           tile landed, 5 warps merged, 6 state stored
//   reduce  0 entry, 1 length read, 2 after griddepcontrol.wait, 3 weights'
//           max known (partial (m, l) read), 4 output stored
// and runs each shape as the CUDA backend and `decode-attn bench` do: a CUDA
// graph of one call per KV copy (cycling over >= 512 MiB, at most 64
// copies), the reducer launched programmatically. Prints the per-call time,
// then for the last call of the last replay each phase's earliest, median
// and latest time over the CTAs, relative to the decode grid's first entry,
// and where the previous call ended; then the tail: percentiles of the CTAs'
// last tile landing, and their mean by how many CTAs of the call ran on the
// same SM (%smid, recorded at entry), by split index and by the order in
// which the CTAs of one SM entered; and how many CTAs still stream near the
// end.
//
// TIMELINE_SHAPES="B,kv_heads,group,seq_len,splits[,splits_per_cta];..."
// replaces the built-in shapes (splits_per_cta 4: one split per warp); TIMELINE_COLD=1 puts before every call the evictor of `decode-attn
// bench --cold` (an unrelated f32 decode of 64 MiB on the stream kernel) and
// subtracts its time, measured alone, from the per-call time; TIMELINE_COPIES=n cycles over n KV copies instead; TIMELINE_ORDERED=1
// keeps the block table in order instead of shuffling the blocks over the pool.
//
// Not part of the library or CI. On the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels/cuda -o timeline kernels/cuda/probe/timeline.cu && ./timeline
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <vector>

#include "decode_params.h"

constexpr int MAX_CALLS = 64;
constexpr int MAX_CTAS = 8192;
constexpr int EVENTS = 8;
// [call][grid][cta][event]; the call is found from the K pointer. In
// constant memory: a stamp must not wait on a global load (a first version
// read these from global memory and added a round trip to every phase).
struct Timeline {
    unsigned long long* stamps;
    const char* k_base;
    const char* k_end;  // stamps only calls whose K lies in [k_base, k_end)
    double inv_pool_bytes;
    int on;
};
__constant__ Timeline da_timeline;

__device__ __forceinline__ void da_timeline_stamp(const DecodeParams& p, int grid, int event) {
    if (threadIdx.x != 0 || !da_timeline.on) return;
    const char* k = reinterpret_cast<const char*>(p.k_cache);
    if (k < da_timeline.k_base || k >= da_timeline.k_end) return;  // the evictor
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const long long call =
        (long long)((double)(reinterpret_cast<const char*>(p.k_cache) - da_timeline.k_base) * da_timeline.inv_pool_bytes + 0.5);
    const long long cta = blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
    if (call < 0 || call >= MAX_CALLS || cta >= MAX_CTAS) return;
    unsigned long long* row = da_timeline.stamps + ((call * 2 + grid) * MAX_CTAS + cta) * EVENTS;
    row[event] = t;
    if (event == 0) {  // slot 7: the SM this CTA ran on, plus one (0 = no stamp)
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        row[EVENTS - 1] = smid + 1ull;
    }
}

#define DA_TIMELINE 1
#include "decode.cu"

#include "probe_check.h"
#include "probe_timing.h"

struct Shape {
    const char* model;
    int num_seqs, num_kv_heads, group, seq_len, num_splits;
    int splits_per_cta = 1;  // DecodeParams::splits_per_cta
};

static const size_t MIB = 1 << 20;

int main() {
    const Shape default_shapes[] = {
        {"llama3-70b-tp8", 1, 1, 8, 1024, 32},   {"llama3-70b-tp8", 1, 1, 8, 1024, 16},
        {"llama3-70b-tp8", 1, 1, 8, 1024, 1},    {"llama3-8b", 1, 8, 4, 1024, 16},
        {"llama3-8b", 1, 8, 4, 16384, 32},       {"llama3-8b", 64, 8, 4, 1024, 1},
        {"llama3-70b-tp8", 4, 1, 8, 65536, 66},  {"llama3-70b-tp8", 1, 1, 8, 65536, 128},
        {"llama3-8b", 16, 8, 4, 65536, 2},       {"llama3-70b-tp8", 64, 1, 8, 65536, 4},
    };
    // TIMELINE_SHAPES="B,kv_heads,group,seq_len,splits;...": other shapes.
    std::vector<Shape> shapes(std::begin(default_shapes), std::end(default_shapes));
    if (const char* list = getenv("TIMELINE_SHAPES")) {
        shapes.clear();
        for (const char* at = list; *at;) {
            Shape sh{"custom", 0, 0, 0, 0, 0};
            const int fields = sscanf(at, "%d,%d,%d,%d,%d,%d", &sh.num_seqs, &sh.num_kv_heads, &sh.group, &sh.seq_len,
                                      &sh.num_splits, &sh.splits_per_cta);
            if (fields < 5) break;
            if (fields < 6 || sh.splits_per_cta < 1) sh.splits_per_cta = 1;
            sh.model = sh.num_kv_heads == 1 ? "llama3-70b-tp8" : "llama3-8b";
            shapes.push_back(sh);
            const char* next = strchr(at, ';');
            if (!next) break;
            at = next + 1;
        }
    }
    constexpr int D = 128;
    auto kernel = decode_mma_bf16_d128;
    // As lib.rs `reduce_function`: the wide reducer past the narrow one's first round.
    auto reducer_for = [](int num_splits) {
        return num_splits > decode_reduce_narrow_rows(D) ? decode_stream_reduce_wide_bf16_d128 : decode_stream_reduce_bf16_d128;
    };
    PROBE_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DECODE_MMA_RING_BYTES));
    unsigned long long* timeline;
    const size_t timeline_words = (size_t)MAX_CALLS * 2 * MAX_CTAS * EVENTS;
    PROBE_CHECK(cudaMalloc(&timeline, timeline_words * 8));
    Timeline tl{timeline, nullptr, nullptr, 0.0, 0};
    // The evictor of TIMELINE_COLD=1: 8 sequences x 1024 tokens x 8 KV heads of
    // f32 K and V (64 MiB), 32 query heads, unsplit, on the stream kernel.
    const bool cold = getenv("TIMELINE_COLD") && atoi(getenv("TIMELINE_COLD")) != 0;
    constexpr int EV_SEQS = 8, EV_LEN = 1024, EV_KV = 8, EV_Q = 32;
    char *ev_k = nullptr, *ev_v = nullptr;
    int *ev_table = nullptr, *ev_lens = nullptr;
    void *ev_q = nullptr, *ev_out = nullptr;
    const size_t ev_pool = (size_t)EV_SEQS * EV_LEN * EV_KV * D * 4;
    if (cold) {
        PROBE_CHECK(cudaMalloc(&ev_k, ev_pool));
        PROBE_CHECK(cudaMalloc(&ev_v, ev_pool));
        PROBE_CHECK(cudaMemset(ev_k, 0, ev_pool));
        PROBE_CHECK(cudaMemset(ev_v, 0, ev_pool));
        std::vector<int> ev_blocks(EV_SEQS * EV_LEN / 16), ev_l(EV_SEQS, EV_LEN);
        std::iota(ev_blocks.begin(), ev_blocks.end(), 0);
        PROBE_CHECK(cudaMalloc(&ev_table, ev_blocks.size() * 4));
        PROBE_CHECK(cudaMalloc(&ev_lens, EV_SEQS * 4));
        PROBE_CHECK(cudaMemcpy(ev_table, ev_blocks.data(), ev_blocks.size() * 4, cudaMemcpyHostToDevice));
        PROBE_CHECK(cudaMemcpy(ev_lens, ev_l.data(), EV_SEQS * 4, cudaMemcpyHostToDevice));
        PROBE_CHECK(cudaMalloc(&ev_q, (size_t)EV_SEQS * EV_Q * D * 4));
        PROBE_CHECK(cudaMalloc(&ev_out, (size_t)EV_SEQS * EV_Q * D * 4));
        PROBE_CHECK(cudaMemset(ev_q, 0, (size_t)EV_SEQS * EV_Q * D * 4));
        PROBE_CHECK(cudaFuncSetAttribute(decode_stream_f32_d128_h4, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                DECODE_STREAM_RING_BYTES));
    }
    // TIMELINE_COPIES=n: cycle over n KV copies instead of >= 512 MiB (1: KV stays in L2).
    const int copies_override = getenv("TIMELINE_COPIES") ? atoi(getenv("TIMELINE_COPIES")) : 0;
    cudaStream_t stream;
    PROBE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::mt19937_64 rng(7);

    for (const Shape& s : shapes) {
        const int num_q_heads = s.num_kv_heads * s.group;
        const int block = 16;
        const int blocks_per_seq = (s.seq_len + block - 1) / block;
        const long long num_blocks = (long long)s.num_seqs * blocks_per_seq;
        const long long num_slots = num_blocks * block;
        const size_t pool_bytes = (size_t)num_slots * s.num_kv_heads * D * 2;  // K or V
        const size_t kv_bytes = 2 * pool_bytes;
        int calls = (int)std::min<size_t>(MAX_CALLS, std::max<size_t>(1, (512 * MIB + kv_bytes - 1) / kv_bytes));
        if (copies_override > 0) calls = std::min(copies_override, MAX_CALLS);
        // K copies then V copies, each copy pool_bytes apart (the stamp finds the call from K).
        char *k_all, *v_all;
        PROBE_CHECK(cudaMalloc(&k_all, pool_bytes * calls));
        PROBE_CHECK(cudaMalloc(&v_all, pool_bytes * calls));
        PROBE_CHECK(cudaMemset(k_all, 0x3c, pool_bytes * calls));
        PROBE_CHECK(cudaMemset(v_all, 0x3c, pool_bytes * calls));
        tl.k_base = k_all;
        tl.k_end = k_all + pool_bytes * calls;
        tl.inv_pool_bytes = 1.0 / (double)pool_bytes;
        tl.on = 0;  // timed without stamps first
        PROBE_CHECK(cudaMemcpyToSymbol(da_timeline, &tl, sizeof(tl)));
        std::vector<int> table(num_blocks);
        std::iota(table.begin(), table.end(), 0);
        // TIMELINE_ORDERED=1: blocks in order (each sequence's KV contiguous), not scattered.
        if (!getenv("TIMELINE_ORDERED") || atoi(getenv("TIMELINE_ORDERED")) == 0)
            std::shuffle(table.begin(), table.end(), rng);
        std::vector<int> lens(s.num_seqs, s.seq_len);
        int *d_table, *d_lens;
        void *q, *out;
        float *pacc, *pml;
        PROBE_CHECK(cudaMalloc(&d_table, num_blocks * 4));
        PROBE_CHECK(cudaMalloc(&d_lens, s.num_seqs * 4));
        PROBE_CHECK(cudaMemcpy(d_table, table.data(), num_blocks * 4, cudaMemcpyHostToDevice));
        PROBE_CHECK(cudaMemcpy(d_lens, lens.data(), s.num_seqs * 4, cudaMemcpyHostToDevice));
        PROBE_CHECK(cudaMalloc(&q, (size_t)s.num_seqs * num_q_heads * D * 2));
        PROBE_CHECK(cudaMalloc(&out, (size_t)s.num_seqs * num_q_heads * D * 2));
        PROBE_CHECK(cudaMemset(q, 0x3c, (size_t)s.num_seqs * num_q_heads * D * 2));
        const size_t rows = (size_t)s.num_seqs * num_q_heads * s.num_splits;
        PROBE_CHECK(cudaMalloc(&pacc, rows * D * 4));
        PROBE_CHECK(cudaMalloc(&pml, rows * 2 * 4));

        const int head_groups = (s.group + DECODE_MMA_HEADS - 1) / DECODE_MMA_HEADS;
        const dim3 grid(s.num_seqs, s.num_kv_heads * head_groups,
                        (s.num_splits + s.splits_per_cta - 1) / s.splits_per_cta);
        const int ctas = grid.x * grid.y * grid.z;
        const int reduce_ctas = s.num_seqs * num_q_heads;
        if (ctas > MAX_CTAS || reduce_ctas > MAX_CTAS) {
            fprintf(stderr, "shape over MAX_CTAS\n");
            return 1;
        }
        auto record_evictor = [&]() {
            DecodeParams p;
            memset(&p, 0, sizeof(p));
            p.q = ev_q;
            p.k_cache = ev_k;
            p.v_cache = ev_v;
            p.out = ev_out;
            p.seq_lens = ev_lens;
            p.block_table = ev_table;
            p.num_slots = (long long)EV_SEQS * EV_LEN;
            p.num_seqs = EV_SEQS;
            p.num_q_heads = EV_Q;
            p.num_kv_heads = EV_KV;
            p.layout = DECODE_LAYOUT_BLOCK_TABLE;
            p.block_size = 16;
            p.max_blocks_per_seq = EV_LEN / 16;
            p.num_splits = 1;
            p.min_tiles_per_split = 1;
            p.scale_log2 = 0.0883883476f * 1.4426950409f;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(EV_SEQS, EV_KV, 1);
            cfg.blockDim = dim3(DECODE_THREADS);
            cfg.dynamicSmemBytes = DECODE_STREAM_RING_BYTES;
            cfg.stream = stream;
            PROBE_CHECK(cudaLaunchKernelEx(&cfg, decode_stream_f32_d128_h4, p));
        };
        auto record_call = [&](int call) {
            if (cold) record_evictor();
            DecodeParams p;
            memset(&p, 0, sizeof(p));
            p.q = q;
            p.k_cache = k_all + (size_t)call * pool_bytes;
            p.v_cache = v_all + (size_t)call * pool_bytes;
            p.out = out;
            p.seq_lens = d_lens;
            p.block_table = d_table;
            p.partial_acc = s.num_splits > 1 ? pacc : nullptr;
            p.partial_ml = s.num_splits > 1 ? pml : nullptr;
            p.num_slots = num_slots;
            p.num_seqs = s.num_seqs;
            p.num_q_heads = num_q_heads;
            p.num_kv_heads = s.num_kv_heads;
            p.layout = DECODE_LAYOUT_BLOCK_TABLE;
            p.block_size = block;
            p.max_blocks_per_seq = blocks_per_seq;
            p.num_splits = s.num_splits;
            p.min_tiles_per_split = 1;
            p.scale_log2 = 0.0883883476f * 1.4426950409f;
            p.splits_per_cta = s.num_splits > 1 ? s.splits_per_cta : 1;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = grid;
            cfg.blockDim = dim3(DECODE_THREADS);
            cfg.dynamicSmemBytes = DECODE_MMA_RING_BYTES;
            cfg.stream = stream;
            PROBE_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
            if (s.num_splits > 1) {
                cudaLaunchConfig_t rc = {};
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = 1;
                rc.gridDim = dim3(s.num_seqs, num_q_heads);
                rc.blockDim = dim3(DECODE_REDUCE_THREADS);
                rc.stream = stream;
                rc.attrs = attr;
                rc.numAttrs = 1;
                PROBE_CHECK(cudaLaunchKernelEx(&rc, reducer_for(s.num_splits), p));
            }
        };
        cudaGraph_t graph;
        cudaGraphExec_t exec = capture_calls(stream, calls, record_call, &graph);
        double us = replay_us(stream, exec, calls);
        double evictor_us = 0.0;
        if (cold) {
            evictor_us = time_graph(stream, calls, [&](int) { record_evictor(); });
            us -= evictor_us;
        }
        printf("\n%s B=%d s=%d splits=%d%s: %.2f us per call (%d calls per graph, %d decode CTAs, %d reducer CTAs), "
               "%.2f TB/s\n",
               s.model, s.num_seqs, s.seq_len, s.num_splits, s.splits_per_cta > 1 ? " (one per warp)" : "", us, calls, ctas, s.num_splits > 1 ? reduce_ctas : 0,
               kv_bytes / (us * 1e-6) / 1e12);
        if (cold) printf("  cold: behind the evictor, whose %.2f us alone are subtracted\n", evictor_us);

        // Replays with stamps on: time them too, then keep the last replay's
        // stamps (read the last call and the one before).
        tl.on = 1;
        PROBE_CHECK(cudaMemcpyToSymbol(da_timeline, &tl, sizeof(tl)));
        printf("  with stamps: %.2f us per call\n", replay_us(stream, exec, calls) - evictor_us);
        PROBE_CHECK(cudaMemset(timeline, 0, timeline_words * 8));
        PROBE_CHECK(cudaGraphLaunch(exec, stream));
        PROBE_CHECK(cudaStreamSynchronize(stream));
        std::vector<unsigned long long> stamps(timeline_words);
        PROBE_CHECK(cudaMemcpy(stamps.data(), timeline, timeline_words * 8, cudaMemcpyDeviceToHost));
        auto at = [&](int call, int g, int cta, int ev) {
            return stamps[(((size_t)call * 2 + g) * MAX_CTAS + cta) * EVENTS + ev];
        };
        const int last = calls - 1;
        unsigned long long t0 = ~0ull;
        for (int c = 0; c < ctas; ++c)
            if (at(last, 0, c, 0)) t0 = std::min(t0, at(last, 0, c, 0));
        auto summary = [&](int call, int g, int ev, int n, const char* name) {
            std::vector<double> v;
            for (int c = 0; c < n; ++c)
                if (at(call, g, c, ev)) v.push_back(((double)at(call, g, c, ev) - (double)t0) / 1000.0);
            if (v.empty()) return;
            std::sort(v.begin(), v.end());
            printf("  %-34s n=%5zu  first %7.2f  median %7.2f  last %7.2f us\n", name, v.size(), v.front(), v[v.size() / 2],
                   v.back());
        };
        if (calls > 1) {
            if (s.num_splits > 1)
                summary(last - 1, 1, 4, reduce_ctas, "previous call: reducer stored");
            else
                summary(last - 1, 0, 6, ctas, "previous call: decode stored");
        }
        const char* decode_names[] = {"decode: entry",           "decode: split known",   "decode: first copies issued",
                                      "decode: first tile landed", "decode: last tile landed", "decode: warps merged",
                                      "decode: state stored"};
        for (int ev = 0; ev < 7; ++ev) summary(last, 0, ev, ctas, decode_names[ev]);
        if (s.num_splits > 1) {
            const char* reduce_names[] = {"reduce: entry", "reduce: length read", "reduce: after wait", "reduce: (m, l) read",
                                          "reduce: output stored"};
            for (int ev = 0; ev < 5; ++ev) summary(last, 1, ev, reduce_ctas, reduce_names[ev]);
        }
        // The tail: when CTAs' last tiles landed (percentiles), and the mean
        // by how many CTAs of this call ran on the CTA's SM.
        {
            // When a CTA's last tile landed, in us from the call's first entry.
            auto landed_us = [&](int c) { return ((double)at(last, 0, c, 4) - (double)t0) / 1000.0; };
            // Per SM, its CTAs of this call as (entry stamp, CTA), those with both stamps.
            std::vector<std::vector<std::pair<unsigned long long, int>>> on_sm(1024);
            for (int c = 0; c < ctas; ++c)
                if (at(last, 0, c, 4) && at(last, 0, c, 7)) on_sm[at(last, 0, c, 7) - 1].push_back({at(last, 0, c, 0), c});
            std::vector<double> ends;
            std::vector<double> sum_by(16, 0.0);
            std::vector<int> n_by(16, 0);
            for (int c = 0; c < ctas; ++c) {
                if (!at(last, 0, c, 4) || !at(last, 0, c, 7)) continue;
                const double e = landed_us(c);
                ends.push_back(e);
                const int k = std::min(15, (int)on_sm[at(last, 0, c, 7) - 1].size());
                sum_by[k] += e;
                n_by[k]++;
            }
            std::sort(ends.begin(), ends.end());
            if (!ends.empty()) {
                printf("  last tile landed, percentiles:");
                for (double q : {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0})
                    printf(" p%g %.1f", q * 100, ends[(size_t)(q * (ends.size() - 1))]);
                printf(" us\n  by CTAs on the SM this call:");
                for (int k = 1; k < 16; ++k)
                    if (n_by[k]) printf(" %d: n=%d mean %.1f us;", k, n_by[k], sum_by[k] / n_by[k]);
                int sms = 0;
                for (const auto& v : on_sm) sms += !v.empty();
                printf(" (%d SMs used)\n", sms);
                // Is the spread systematic? The mean by the grid's split
                // index (blockIdx.z: which wave a CTA launched in), and by
                // the order in which the CTAs of one SM entered.
                const int per_z = grid.x * grid.y;
                printf("  by split index z:");
                for (int z = 0; z < (int)grid.z && z < 16; ++z) {
                    double sum = 0;
                    int n = 0;
                    for (int c = z * per_z; c < (z + 1) * per_z; ++c)
                        if (at(last, 0, c, 4)) sum += landed_us(c), ++n;
                    if (n) printf(" %d: %.1f;", z, sum / n);
                }
                std::vector<double> rank_sum(16, 0.0);
                std::vector<int> rank_n(16, 0);
                for (auto& v : on_sm) {
                    std::sort(v.begin(), v.end());
                    for (size_t r = 0; r < v.size() && r < 16; ++r) {
                        const int c = v[r].second;
                        rank_sum[r] += ((double)at(last, 0, c, 4) - (double)at(last, 0, c, 0)) / 1000.0;
                        rank_n[r]++;
                    }
                }
                printf("\n  by entry order on the SM (mean us from entry to last tile):");
                for (int r = 0; r < 16; ++r)
                    if (rank_n[r]) printf(" %d: n=%d %.1f;", r, rank_n[r], rank_sum[r] / rank_n[r]);
                // How many CTAs still stream at each point of the tail.
                printf("\n  CTAs streaming at:");
                const double end = ends.back();
                for (double back : {200.0, 100.0, 50.0, 25.0, 10.0, 5.0, 2.0}) {
                    if (back > end) continue;
                    int n = 0;
                    for (double e : ends) n += e > end - back;
                    printf(" end-%g us: %d;", back, n);
                }
                printf("\n");
            }
        }
        // The timer's granularity: the smallest nonzero gap between sorted entry stamps.
        std::vector<unsigned long long> entries;
        for (int c = 0; c < ctas; ++c)
            if (at(last, 0, c, 0)) entries.push_back(at(last, 0, c, 0));
        std::sort(entries.begin(), entries.end());
        unsigned long long grain = ~0ull;
        for (size_t i = 1; i < entries.size(); ++i)
            if (entries[i] > entries[i - 1]) grain = std::min(grain, entries[i] - entries[i - 1]);
        if (grain != ~0ull) printf("  (timer step seen: %llu ns)\n", grain);

        PROBE_CHECK(cudaGraphExecDestroy(exec));
        PROBE_CHECK(cudaGraphDestroy(graph));
        for (void* ptr : {(void*)k_all, (void*)v_all, (void*)d_table, (void*)d_lens, q, out, (void*)pacc, (void*)pml})
            PROBE_CHECK(cudaFree(ptr));
    }
    return 0;
}

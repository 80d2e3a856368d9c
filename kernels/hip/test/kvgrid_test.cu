// kvgrid_test.cu: a CPU check of kernels/hip/decode_kvgrid.hip against an f64
// reference, the kernels running as fibers (kernels/cuda/test/cuda_emu.h)
// through da_portable.h's emulation branch, with 32-lane or 64-lane waves:
//
//   g++ -std=c++17 -O1 -DDA_EMU_WAVE=32 -x c++ -I kernels/hip -I kernels/cuda kernels/hip/test/kvgrid_test.cu -o /tmp/kvgrid_emu32
//   g++ -std=c++17 -O1 -DDA_EMU_WAVE=64 -x c++ -I kernels/hip -I kernels/cuda kernels/hip/test/kvgrid_test.cu -o /tmp/kvgrid_emu64
//   g++ -std=c++17 -O1 -DDA_EMU_WAVE=64 -DKVG_NO_MFMA -x c++ -I kernels/hip -I kernels/cuda kernels/hip/test/kvgrid_test.cu -o /tmp/kvgrid_emu64g
//   /tmp/kvgrid_emu32 && /tmp/kvgrid_emu64 && /tmp/kvgrid_emu64g   # under a minute each; `quick` runs a subset
// (`cargo test` runs all three: tests/tests/emulated_kernels.rs.)
//
// At wave 64 the f16 / bf16 kernels take the MFMA path (as on gfx90a /
// gfx942), its instructions modelled by test/mfma_emu.h; at wave 32, and at
// wave 64 with -DKVG_NO_MFMA, every type runs the generic path.
//
// Launches as the host must: decode_kvgrid_<T>_d<D> on grid (num_seqs,
// num_splits, num_kv_heads) x 256 threads, then, when num_splits > 1,
// decode_kvgrid_reduce_<T>_d<D> on (num_seqs, num_q_heads) x 256. Output,
// partial_acc, partial_ml and out_lse are poisoned with NaN bytes before each
// run. Checks: relative error norm ||out - ref|| / ||ref|| over the good
// sequences (limits bf16 1e-2, f16 5e-3, f32 1e-5), every element finite; NaN
// rows (written: not the poison's bits) for bad sequences only; exact zeros
// for length 0; surplus splits write no partial row. Every other case
// passes an out_lse (the rest null, so the null path stays covered) and
// checks it against the f64 LSE, ln(sum_t exp(q . k_t / sqrt(d))):
// |lse - ref| <= 1e-3 max(1, |ref|), -inf exactly for length 0, NaN exactly
// for the NaN rows (written: not the poison's bits), and nothing written
// past [num_seqs, num_q_heads].
#define DA_EMULATE_PORTABLE 1
#include "test/cuda_emu.h"
#include "mfma_emu.h"  // kernels/hip/test: the MFMA path's instructions, wave 64 only
#include "../decode_kvgrid.hip"
#include "test/host_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>


typedef void (*Kern)(const DecodeParams);
struct Kerns {
    int dt, d;
    Kern decode, reduce;
};
#define KP(TN, DTV, D) {DTV, D, decode_kvgrid_##TN##_d##D, decode_kvgrid_reduce_##TN##_d##D}
#define KP_ALL(TN, DTV) \
    KP(TN, DTV, 64), KP(TN, DTV, 80), KP(TN, DTV, 96), KP(TN, DTV, 112), KP(TN, DTV, 120), KP(TN, DTV, 128), \
        KP(TN, DTV, 192), KP(TN, DTV, 256)
static const Kerns all_kernels[] = {KP_ALL(f32, F32), KP_ALL(f16, F16), KP_ALL(bf16, BF16)};
static Kerns find_kernels(int dt, int d) {
    for (const auto& k : all_kernels)
        if (k.dt == dt && k.d == d) return k;
    fprintf(stderr, "no kernel %d %d\n", dt, d);
    exit(2);
}

static std::mt19937_64 rng(2024);
static float urand() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }

enum Corrupt { NONE = 0, NEG_LEN, TOO_LONG, BAD_BLOCK, BAD_INDPTR };

struct Case {
    int dt, d, hkv, g, layout, bs;
    std::vector<int> lens;
    int num_splits;  // 0: partitions of 256 tokens (ceil(max_len / 256), min_tiles 16)
    int min_tiles;
    std::vector<int> corrupt;  // per sequence
};

struct Run {
    Case c;
    int B, hq;
    long long num_slots = 0, num_indices = 0;
    int mbps = 0;
    std::vector<int> table, indptr, indices, seq_lens;
    std::vector<float> q, k, v;
    std::vector<unsigned char> qb, kb, vb;
};

static Run build(const Case& c) {
    Run R;
    R.c = c;
    R.B = (int)c.lens.size();
    R.hq = c.hkv * c.g;
    R.seq_lens = c.lens;
    if (c.layout == 0) {
        int nblocks = 0;
        for (int l : c.lens) {
            const int nb = (l + c.bs - 1) / c.bs;
            R.mbps = std::max(R.mbps, nb);
            nblocks += nb;
        }
        R.mbps += 1;
        nblocks += 2;
        std::vector<int> ids(nblocks);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        R.table.assign((size_t)R.B * R.mbps, -1);
        int next = 0;
        for (int b = 0; b < R.B; ++b)
            for (int i = 0; i < (c.lens[b] + c.bs - 1) / c.bs; ++i) R.table[(size_t)b * R.mbps + i] = ids[next++];
        R.num_slots = (long long)nblocks * c.bs;
    } else {
        long long total = 0;
        for (int l : c.lens) total += l;
        R.num_slots = total + 5;
        std::vector<int> perm(R.num_slots);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        R.indptr.push_back(0);
        for (int b = 0; b < R.B; ++b) {
            for (int t = 0; t < c.lens[b]; ++t) R.indices.push_back(perm[R.indices.size()]);
            R.indptr.push_back((int)R.indices.size());
        }
        R.num_indices = (long long)R.indices.size();
    }
    for (int b = 0; b < R.B; ++b) {
        const int kind = c.corrupt.empty() ? NONE : c.corrupt[b];
        const int len = c.lens[b];
        if (kind == NEG_LEN) R.seq_lens[b] = -3;
        if (kind == TOO_LONG)
            R.seq_lens[b] = c.layout == 0 ? R.mbps * c.bs + 1 : len + (int)(R.num_indices - R.indptr[b]) + 1;
        if (kind == BAD_BLOCK && len > 0) {
            const int t = len * 2 / 3;
            if (c.layout == 0) R.table[(size_t)b * R.mbps + t / c.bs] = (b & 1) ? -1 : (int)(R.num_slots / c.bs);
            else R.indices[R.indptr[b] + t] = (b & 1) ? -1 : (int)R.num_slots;
        }
        if (kind == BAD_INDPTR && c.layout == 1) R.indptr[b] = (b & 1) ? -2 : (int)R.num_indices;
    }
    R.q.resize((size_t)R.B * R.hq * c.d);
    R.k.resize((size_t)R.num_slots * c.hkv * c.d);
    R.v.resize(R.k.size());
    for (auto& x : R.q) x = urand() * 2.f;
    for (auto& x : R.k) x = urand();
    for (auto& x : R.v) x = urand();
    encode(c.dt, R.q, R.qb, R.q);
    encode(c.dt, R.k, R.kb, R.k);
    encode(c.dt, R.v, R.vb, R.v);
    return R;
}

static bool is_bad(const Case& c, int b) {
    int kind = c.corrupt.empty() ? NONE : c.corrupt[b];
    if (kind == BAD_INDPTR && c.layout != 1) kind = NONE;
    if (kind == BAD_BLOCK && c.lens[b] == 0) kind = NONE;
    return kind != NONE;
}

// softmax(q k^T / sqrt(d)) v in f64, and (where `lse` is not null) the row's
// ln(sum_t exp(q . k_t / sqrt(d))).
static void reference(const Run& R, int b, int h, std::vector<double>& o, double* lse = nullptr) {
    const Case& c = R.c;
    auto slot_of = [&](int t) -> long long {
        return c.layout == 0 ? (long long)R.table[(size_t)b * R.mbps + t / c.bs] * c.bs + t % c.bs
                             : R.indices[R.indptr[b] + t];
    };
    reference_attention(&R.q[((size_t)b * R.hq + h) * c.d], R.k.data(), R.v.data(), c.lens[b], c.d, c.hkv, h / c.g,
                        slot_of, o, lse);
}

static int failures = 0, cases_run = 0, lse_cases = 0;
static double worst[3] = {0, 0, 0}, worst_lse[3] = {0, 0, 0};

template <typename T>
static T* dalloc(size_t n, int fill) {
    T* p = static_cast<T*>(aligned_alloc(256, (std::max<size_t>(n, 1) * sizeof(T) + 255) / 256 * 256));
    memset(p, fill, std::max<size_t>(n, 1) * sizeof(T));
    return p;
}

static void check(const Case& c0, const char* label) {
    Case c = c0;
    int max_len = 0;
    for (int l : c.lens) max_len = std::max(max_len, l);
    if (c.num_splits == 0) {  // the host's normal rule: partitions of 256 tokens
        c.num_splits = std::max(1, (max_len + 255) / 256);
        c.min_tiles = 16;
    }
    Run R = build(c);
    const int B = R.B, hq = R.hq, d = c.d, ns = c.num_splits;
    // Device buffers (host memory under emulation), outputs poisoned with NaN bytes.
    unsigned char* q = dalloc<unsigned char>(R.qb.size(), 0);
    unsigned char* k = dalloc<unsigned char>(R.kb.size(), 0);
    unsigned char* v = dalloc<unsigned char>(R.vb.size(), 0);
    unsigned char* out = dalloc<unsigned char>(R.qb.size(), 0xff);
    memcpy(q, R.qb.data(), R.qb.size());
    memcpy(k, R.kb.data(), R.kb.size());
    memcpy(v, R.vb.data(), R.vb.size());
    const size_t rows = (size_t)B * hq * ns;
    float* pacc = dalloc<float>(rows * d, 0xff);
    float* pml = dalloc<float>(rows * 2, 0xff);
    // out_lse on half the cases, in the pattern on, off, off, on (so both of
    // a pair of consecutive checks get it in turn), null on the rest;
    // LSE_GUARD floats past its end must stay poisoned.
    constexpr int LSE_GUARD = 64;
    const bool want_lse = ((cases_run + cases_run / 2) & 1) == 0;
    const size_t lse_n = (size_t)B * hq;
    float* lse = dalloc<float>(lse_n + LSE_GUARD, 0xff);
    DecodeParams p;
    memset(&p, 0, sizeof p);
    p.q = q;
    p.k_cache = k;
    p.v_cache = v;
    p.out = out;
    p.seq_lens = R.seq_lens.data();
    p.block_table = c.layout == 0 ? R.table.data() : nullptr;
    p.kv_indptr = c.layout == 1 ? R.indptr.data() : nullptr;
    p.kv_indices = c.layout == 1 ? R.indices.data() : nullptr;
    p.partial_acc = ns > 1 ? pacc : nullptr;
    p.partial_ml = ns > 1 ? pml : nullptr;
    p.out_lse = want_lse ? lse : nullptr;
    p.num_slots = R.num_slots;
    p.num_indices = R.num_indices;
    p.num_seqs = B;
    p.num_q_heads = hq;
    p.num_kv_heads = c.hkv;
    p.layout = c.layout;
    p.block_size = c.bs;
    p.max_blocks_per_seq = R.mbps;
    p.num_splits = ns;
    p.min_tiles_per_split = c.min_tiles;
    p.scale_log2 = (float)(1.0 / std::sqrt((double)d) * 1.4426950408889634);

    const Kerns kk = find_kernels(c.dt, d);
    emu_launch(kk.decode, dim3(B, ns, c.hkv), DECODE_KVGRID_THREADS, p);
    if (ns > 1) emu_launch(kk.reduce, dim3(B, hq), DECODE_KVGRID_THREADS, p);

    int bad = 0;
    if (ns > 1) {  // surplus splits write nothing: their rows keep the 0xff fill
        for (int b = 0; b < B; ++b) {
            if (is_bad(c, b)) continue;
            const long long active = host_split_rule(c.lens[b], ns, c.min_tiles).active;
            for (int h = 0; h < hq; ++h)
                for (int j = 0; j < ns; ++j) {
                    unsigned m;
                    memcpy(&m, &pml[(((size_t)b * hq + h) * ns + j) * 2], 4);
                    const bool written = m != 0xffffffffu;
                    if (written != (j < active) && bad++ < 5)
                        printf("    b=%d h=%d split %d of %lld active: written=%d\n", b, h, j, active, (int)written);
                }
        }
    }
    double err2 = 0, ref2 = 0;
    std::vector<double> ref;
    std::vector<double> ref_lse(lse_n, NAN);  // the rows' f64 LSEs, from the same pass as the outputs
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < hq; ++h) {
            const bool nan_row = is_bad(c, b);
            if (!nan_row) reference(R, b, h, ref, &ref_lse[(size_t)b * hq + h]);
            for (int i = 0; i < d; ++i) {
                const unsigned char* elem = &out[(((size_t)b * hq + h) * d + i) * dt_size(c.dt)];
                const float got = decode_elem(c.dt, elem);
                if (nan_row) {
                    // The poison is a NaN too, all bits set; the kernel's NaN
                    // (dap_nan(), 0x7fffffff converted) has its sign bit clear.
                    if (!std::isnan(got) && bad++ < 5) printf("    b=%d h=%d i=%d: want NaN, got %g\n", b, h, i, got);
                    if (std::all_of(elem, elem + dt_size(c.dt), [](unsigned char x) { return x == 0xff; }) && bad++ < 5)
                        printf("    b=%d h=%d i=%d: want NaN, left unwritten\n", b, h, i);
                    continue;
                }
                if (c.lens[b] == 0) {
                    if (got != 0.f && bad++ < 5) printf("    b=%d h=%d i=%d: want 0 (empty), got %g\n", b, h, i, got);
                    continue;
                }
                if (!std::isfinite(got)) {
                    if (bad++ < 5) printf("    b=%d h=%d i=%d: got %g want %g\n", b, h, i, got, ref[i]);
                    continue;
                }
                err2 += (got - ref[i]) * (got - ref[i]);
                ref2 += ref[i] * ref[i];
            }
        }
    double lse_err = 0;
    if (want_lse) {
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < hq; ++h) {
                const float got = lse[(size_t)b * hq + h];
                if (is_bad(c, b)) {
                    // The poison is a NaN too: a NaN the kernel wrote has other bits (dap_nan() is 0x7fffffff).
                    unsigned u;
                    memcpy(&u, &got, 4);
                    if (!std::isnan(got) && bad++ < 5) printf("    b=%d h=%d: lse want NaN, got %g\n", b, h, got);
                    if (u == 0xffffffffu && bad++ < 5) printf("    b=%d h=%d: lse want NaN, left unwritten\n", b, h);
                    continue;
                }
                if (c.lens[b] == 0) {
                    if (!(std::isinf(got) && got < 0) && bad++ < 5)
                        printf("    b=%d h=%d: lse want -inf (empty), got %g\n", b, h, got);
                    continue;
                }
                const double want = ref_lse[(size_t)b * hq + h];
                const double err = std::fabs((double)got - want) / std::max(1.0, std::fabs(want));
                if (!std::isfinite(got) || !(err <= 1e-3)) {
                    if (bad++ < 5) printf("    b=%d h=%d: lse got %.7g want %.7g\n", b, h, got, want);
                    continue;
                }
                lse_err = std::max(lse_err, err);
            }
        worst_lse[c.dt] = std::max(worst_lse[c.dt], lse_err);
        ++lse_cases;
    }
    {  // nothing written past the rows (and, with a null out_lse, nothing at all)
        unsigned u;
        for (size_t i = want_lse ? lse_n : 0; i < lse_n + LSE_GUARD; ++i) {
            memcpy(&u, &lse[i], 4);
            if (u != 0xffffffffu && bad++ < 5) printf("    lse[%zu] written (%s out_lse)\n", i, want_lse ? "past" : "null");
        }
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
    const double limit = c.dt == F32 ? 1e-5 : c.dt == F16 ? 5e-3 : 1e-2;
    if (!(rel <= limit)) ++bad;
    worst[c.dt] = std::max(worst[c.dt], rel);
    ++cases_run;
    std::string lens;
    for (size_t i = 0; i < c.lens.size() && i < 8; ++i) lens += std::to_string(c.lens[i]) + ",";
    char lse_note[32] = "lse null   ";
    if (want_lse) snprintf(lse_note, sizeof lse_note, "lse %.1e", lse_err);
    printf("%s %-4s d=%3d hkv=%d g=%2d layout=%d bs=%2d splits=%3d min=%2d lens=%s rel=%.2e %s  %s\n",
           bad ? "FAIL" : "ok  ", dt_name[c.dt], d, c.hkv, c.g, c.layout, c.bs, ns, c.min_tiles, lens.c_str(), rel,
           lse_note, label);
    fflush(stdout);
    if (bad) ++failures;
    for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)pacc, (void*)pml, (void*)lse}) free(ptr);
}

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "quick";
    printf("decode_kvgrid under emulation, wave %d, %s\n", DAP_WAVE,
           KVG_MFMA ? "f16/bf16 on the MFMA path (test/mfma_emu.h)" : "every type on the generic path");
    const int dims[] = {64, 80, 96, 112, 120, 128, 192, 256};
    // Buckets {1, 2, 4, 8, 16}: exact (1, 2, 4, 8, 16), inside one (3, 5, 6, 7, 10, 12),
    // passes of 16 (32, 20: a full pass and a partial one).
    const int groups[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 32};
    const int ngroups = (int)(sizeof groups / sizeof groups[0]);
    // Every (type, head dim): lengths around a tile and a partition, both
    // layouts and block sizes, partitions of 256 and unsplit, groups in turn.
    int i = 0;
    for (int dt = 0; dt < 3; ++dt)
        for (int d : dims) {
            const int g1 = groups[i % ngroups], g2 = groups[(i + 6) % ngroups];
            const int layout = i & 1, bs = (i >> 1) & 1 ? 32 : 16;
            ++i;
            if (quick && d != 128 && d != 80) continue;
            check({dt, d, 2, g1, layout, bs, {0, 1, 15, 16, 17, 255, 256, 257}, 0, 16, {}}, "partitions of 256");
            check({dt, d, 1, g2, 1 - layout, 48 - bs, {1000, 17, 256}, 1, 1, {}}, "unsplit");
        }
    // Every group, with long sequences, partitions of 256 and unsplit.
    for (int g : groups) {
        check({BF16, 128, 1, g, g & 1, 16, {4100, 1}, 0, 16, {}}, "groups, partitions of 256");
        if (!quick) check({F16, 64, 2, g, (g + 1) & 1, 32, {1000, 300}, 1, 1, {}}, "groups, unsplit");
    }
    // Other split rules: surplus splits, min tiles, partitions of thousands of tokens.
    check({BF16, 128, 2, 4, 0, 16, {4100, 33, 0, 700}, 7, 1, {}}, "7 splits, surplus for short ones");
    check({F16, 96, 1, 8, 1, 16, {100, 2000}, 3, 16, {}}, "3 splits, min 16 tiles");
    check({F32, 128, 1, 2, 0, 32, {4100, 257}, 2, 1, {}}, "2 splits of ~2050 tokens");
    check({BF16, 256, 1, 10, 1, 16, {4100}, 1, 1, {}}, "unsplit 4100, g 10");
    check({F32, 64, 2, 3, 1, 16, {1000, 5}, 64, 1, {}}, "64 splits, most surplus");
    check({F16, 128, 1, 16, 0, 16, {0, 0}, 4, 1, {}}, "all empty, split");
    check({F16, 128, 1, 16, 0, 16, {0, 0}, 1, 1, {}}, "all empty, unsplit");
    if (!quick) {
        check({F32, 256, 1, 32, 0, 16, {1000, 257}, 0, 16, {}}, "f32 d256 g32");
        check({F32, 120, 2, 7, 1, 16, {4100}, 0, 16, {}}, "f32 d120 g7 4100");
        check({F16, 80, 2, 3, 0, 16, {700, 0, 33}, 3, 1, {}}, "f16 d80 g3 (bucket 4), 3 splits");
        check({BF16, 96, 1, 6, 1, 32, {1000, 129}, 0, 16, {}}, "bf16 d96 g6 (bucket 8)");
        check({F32, 112, 2, 12, 0, 32, {600, 16}, 1, 1, {}}, "f32 d112 g12 (bucket 16) unsplit");
        check({BF16, 256, 1, 20, 1, 16, {300}, 2, 1, {}}, "bf16 d256 g20 (16 + 4) 2 splits");
        check({BF16, 192, 1, 5, 0, 32, {4100, 2}, 5, 1, {}}, "bf16 d192 5 splits");
    }
    // The MFMA path's corners (at wave 32 the generic path's): each 16-bit
    // type at head dims 64, 80, 120, 128, 256 with groups 1, 4, 8, 16 and
    // past 16 (passes), both layouts, lengths off the 16-token tiles, one
    // under a wavefront's first tile, empty ones, split and unsplit.
    {
        const int mdims[] = {64, 80, 120, 128, 256};
        const int mgroups[2][5] = {{1, 4, 8, 16, 17}, {16, 8, 24, 1, 4}};
        const int msplits[] = {0, 3, 1};
        int k = 0;
        for (int dt : {F16, BF16})
            for (int di = 0; di < 5; ++di, ++k) {
                const int d = mdims[di], g = mgroups[dt == BF16][di];
                if (quick && d != 128 && d != 80) continue;
                check({dt, d, 2, g, k & 1, (k >> 1) & 1 ? 16 : 32, {0, 5, 33, 250, 601, 1}, msplits[k % 3], 1, {}},
                      "mfma corners");
            }
        check({BF16, 256, 1, 20, 1, 16, {300, 77, 0, 513}, 4, 1, {BAD_BLOCK, NONE, BAD_BLOCK, BAD_BLOCK}},
              "guards: bad block, g 20 (16 + 4), 4 splits");
        check({F16, 120, 2, 16, 0, 32, {90, 401}, 1, 1, {NONE, BAD_BLOCK}}, "guards: bad block, d120 g16 unsplit");
        check({F16, 64, 1, 1, 1, 16, {0, 7, 1000}, 0, 16, {NONE, BAD_BLOCK, NONE}}, "guards: bad block, d64 g1");
    }
    // Guards: NaN for the bad sequence only.
    for (int layout = 0; layout < 2; ++layout)
        for (int ns : {1, 4, 0}) {
            check({BF16, 128, 2, 4, layout, 16, {100, 200, 300, 400, 50}, ns, 1, {NONE, NEG_LEN, NONE, TOO_LONG, NONE}},
                  "guards: negative, too long");
            check({F16, 64, 1, 5, layout, 32, {100, 700, 300, 400, 50}, ns, 1, {BAD_BLOCK, NONE, BAD_BLOCK, NONE, NONE}},
                  "guards: bad block id / slot");
            check({BF16, 128, 1, 12, layout, 16, {300, 0, 200}, ns, 1, {NONE, NEG_LEN, BAD_BLOCK}},
                  "guards: g 12 (bucket 16)");
            if (layout == 1)
                check({F32, 80, 1, 2, 1, 16, {100, 200, 300, 400}, ns, 1, {NONE, BAD_INDPTR, BAD_INDPTR, NONE}},
                      "guards: bad indptr");
        }
    printf("wave %d: %d cases, %d failed; worst relative error f32 %.2e f16 %.2e bf16 %.2e; %d cases with out_lse, "
           "worst LSE error f32 %.2e f16 %.2e bf16 %.2e\n",
           DAP_WAVE, cases_run, failures, worst[F32], worst[F16], worst[BF16], lse_cases, worst_lse[F32],
           worst_lse[F16], worst_lse[BF16]);
    return failures ? 1 : 0;
}

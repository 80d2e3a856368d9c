// merge_test.cu: a CPU check of kernels/hip/merge_states.hip against an f64
// reference, the kernels running as fibers (kernels/cuda/test/cuda_emu.h)
// through da_portable.h's emulation branch, with 32-lane or 64-lane waves:
//
//   g++ -std=c++17 -O1 -DDA_EMU_WAVE=32 -x c++ -I kernels/hip -I kernels/cuda kernels/hip/test/merge_test.cu -o /tmp/merge_emu32
//   g++ -std=c++17 -O1 -DDA_EMU_WAVE=64 -x c++ -I kernels/hip -I kernels/cuda kernels/hip/test/merge_test.cu -o /tmp/merge_emu64
//   /tmp/merge_emu32 && /tmp/merge_emu64      # seconds each
// (`cargo test` runs both: tests/tests/emulated_kernels.rs.)
//
// Add -DMERGE_STATES_GRID_X=3 to make every launch of more than three
// workgroups wrap into grid rows (blockIdx.y), as launches of more than
// 65536 workgroups do on a GPU.
//
// Launches as the host must (merge_grid below is crates/hip's merge_grid):
// merge_states_<T> on (min(wg, GRID_X), ceil(wg / GRID_X)) x 256 threads.
// Each case runs twice, with out and out_lse filled first with 0xff bytes
// (NaN in every type) and then with 0x55 bytes (finite), so an element or
// LSE left unwritten shows whatever it should have held; guard bytes after
// out and out_lse must stay untouched. Inputs: random states in [-1, 1],
// rows of finite LSEs (close together and far apart) and rows with -inf,
// NaN and +inf on either side or both. Checks, against the f64 reference of
// the semantics in merge_states.hip (which are decode.cu's and
// decode_attn_core::merge::merge_state's):
//   * empty rows (max of the LSEs -inf or NaN): out exactly +0, out_lse -inf;
//   * reference NaN / inf: the same NaN / inf;
//   * one state of weight exactly 0 beside a finite LSE: the other state,
//     bit for bit, and its LSE exactly;
//   * else |out - ref| <= u |ref| + 1e-5 s, s = (wa |a| + wb |b|) / (wa + wb),
//     u the output type's half ulp (2^-8 bf16, 2^-11 f16, 0 f32), and
//     |out_lse - ref| <= 2e-6 max(1, |ref|).
// out_lse null on some cases; tensors offset by one element on some cases
// (the element-by-element path of a row that is a multiple of 16 bytes).
#define DA_EMULATE_PORTABLE 1
#include "test/cuda_emu.h"
#include "../merge_states.hip"
#include "test/host_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

typedef void (*Kern)(const MergeParams);
static Kern kernel_for(int dt) {
    return dt == F32 ? merge_states_f32 : dt == F16 ? merge_states_f16 : merge_states_bf16;
}

// The host's launch (crates/hip/src/lib.rs, merge_grid).
static dim3 merge_grid(long long rows, int head_dim, int dt) {
    const long long epc = 16 / dt_size(dt);
    const long long chunks = head_dim > 0 ? (head_dim + epc - 1) / epc : 1;
    const long long groups = (rows * chunks + MERGE_STATES_THREADS - 1) / MERGE_STATES_THREADS;
    const long long x = std::min<long long>(groups, MERGE_STATES_GRID_X);
    return dim3((unsigned)x, (unsigned)((groups + MERGE_STATES_GRID_X - 1) / MERGE_STATES_GRID_X));
}

static std::mt19937_64 rng(5);
static float uni(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
static const float NEG_INF = -std::numeric_limits<float>::infinity();
static const float POS_INF = std::numeric_limits<float>::infinity();
static const float QNAN = std::numeric_limits<float>::quiet_NaN();

// Row r's two LSEs: mostly finite, with every special pairing in turn.
static void lse_pair(long long r, float& la, float& lb) {
    static const float specials[][2] = {
        {NEG_INF, 0.f}, {0.f, NEG_INF}, {NEG_INF, NEG_INF}, {QNAN, 0.f},    {0.f, QNAN},
        {QNAN, QNAN},   {QNAN, NEG_INF}, {NEG_INF, QNAN},   {POS_INF, 0.f}, {0.f, POS_INF},
        {POS_INF, POS_INF}, {NEG_INF, POS_INF},
    };
    const int ns = (int)(sizeof specials / sizeof specials[0]);
    const int pick = (int)(r % 3 == 2 ? (r / 3) % ns : -1);
    const float base = uni(-40.f, 40.f);
    if (pick < 0) {
        la = base;
        lb = r % 7 == 0 ? base + uni(-60.f, 60.f) : base + uni(-6.f, 6.f);  // far apart or comparable
        return;
    }
    la = specials[pick][0] == 0.f ? base : specials[pick][0];
    lb = specials[pick][1] == 0.f ? base + uni(-6.f, 6.f) : specials[pick][1];
}

struct Stats {
    int cases = 0, failures = 0;
    long long elements = 0;
    double worst_abs = 0;    // max |out - ref| over the compared elements
    double worst_ratio = 0;  // max |out - ref| / bound
    double worst_lse = 0;    // max |lse - ref| / max(1, |ref|)
};
static Stats stats[3];

static const unsigned char GUARD = 0xa5;
static const size_t GUARD_BYTES = 64;

static bool guard_intact(const unsigned char* p, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i)
        if (p[i] != GUARD) return false;
    return true;
}

// One case: num_tokens x num_heads rows of head_dim elements of type dt.
// offset: the tensors start one element past a 16-byte boundary.
static void check(int dt, int head_dim, int num_tokens, int num_heads, bool with_lse, bool offset) {
    const long long rows = (long long)num_tokens * num_heads;
    const size_t n = (size_t)rows * head_dim;
    const size_t es = dt_size(dt);
    const size_t off = offset ? es : 0;
    std::vector<float> a(n), b(n), ar, br, la(rows), lb(rows);
    for (auto& x : a) x = uni(-1.f, 1.f);
    for (auto& x : b) x = uni(-1.f, 1.f);
    for (long long r = 0; r < rows; ++r) lse_pair(r, la[r], lb[r]);
    std::vector<unsigned char> ab, bb;
    encode(dt, a, ab, ar);
    encode(dt, b, bb, br);

    // Device buffers: 256-aligned (cudaMalloc's emulation), plus the offset,
    // plus guard bytes after the data.
    auto dalloc = [](size_t bytes) {
        void* p = nullptr;
        cudaMalloc(&p, bytes + 16 + GUARD_BYTES);
        return (unsigned char*)p;
    };
    unsigned char* pa = dalloc(n * es);
    unsigned char* pb = dalloc(n * es);
    unsigned char* po = dalloc(n * es);
    unsigned char* pla = dalloc(rows * 4);
    unsigned char* plb = dalloc(rows * 4);
    unsigned char* plo = dalloc(rows * 4);
    memcpy(pa + off, ab.data(), ab.size());
    memcpy(pb + off, bb.data(), bb.size());
    memcpy(pla, la.data(), rows * 4);
    memcpy(plb, lb.data(), rows * 4);

    int bad = 0;
    double worst_abs = 0, worst_ratio = 0, worst_lse = 0;
    for (const unsigned char poison : {(unsigned char)0xff, (unsigned char)0x55}) {
        memset(po, GUARD, n * es + 16 + GUARD_BYTES);
        memset(po + off, poison, n * es);
        memset(plo, GUARD, rows * 4 + 16 + GUARD_BYTES);
        memset(plo, poison, rows * 4);
        MergeParams p;
        memset(&p, 0, sizeof p);
        p.prefix = pa + off;
        p.prefix_lse = (const float*)pla;
        p.suffix = pb + off;
        p.suffix_lse = (const float*)plb;
        p.out = po + off;
        p.out_lse = with_lse ? (float*)plo : nullptr;
        p.num_tokens = num_tokens;
        p.num_heads = num_heads;
        p.head_dim = head_dim;
        if (rows > 0) emu_launch(kernel_for(dt), merge_grid(rows, head_dim, dt), MERGE_STATES_THREADS, p);

        if (!guard_intact(po + off + n * es, 16 + GUARD_BYTES - off) && bad++ < 5)
            printf("    out: bytes past the end written\n");
        if (!guard_intact(po, off) && bad++ < 5) printf("    out: bytes before the tensor written\n");
        if (!guard_intact(plo + rows * 4, 16 + GUARD_BYTES) && bad++ < 5)
            printf("    out_lse: bytes past the end written\n");
        if (!with_lse) {
            bool untouched = true;
            for (long long i = 0; i < rows * 4; ++i) untouched &= plo[i] == poison;
            if (!untouched && bad++ < 5) printf("    out_lse is null but the poisoned buffer changed\n");
        }

        for (long long r = 0; r < rows; ++r) {
            const double dla = la[r], dlb = lb[r];
            const double m = std::fmax(dla, dlb);
            const bool empty = m == -INFINITY || std::isnan(m);
            double wa = 0, wb = 0, total = 1, ref_lse = -INFINITY;
            if (!empty) {
                wa = std::exp(dla - m);
                wb = std::exp(dlb - m);
                total = wa + wb;
                ref_lse = m + std::log(total);
            }
            if (with_lse) {
                float got;
                memcpy(&got, plo + r * 4, 4);
                bool ok;
                if (std::isnan(ref_lse)) ok = std::isnan(got);
                else if (std::isinf(ref_lse)) ok = got == ref_lse;
                else {
                    const double e = std::fabs(got - ref_lse) / std::max(1.0, std::fabs(ref_lse));
                    worst_lse = std::max(worst_lse, e);
                    ok = e <= 2e-6;
                    // One state of weight 0: the other's LSE exactly.
                    if ((wa == 0 && !std::isnan(wb)) || (wb == 0 && !std::isnan(wa)))
                        ok = ok && got == (wa == 0 ? lb[r] : la[r]);
                }
                if (!ok && bad++ < 5)
                    printf("    row %lld (la %g lb %g): lse %.9g want %.9g\n", r, la[r], lb[r], got, ref_lse);
            }
            for (int i = 0; i < head_dim; ++i) {
                const size_t e = (size_t)r * head_dim + i;
                const unsigned char* gp = po + off + e * es;
                const float got = decode_elem(dt, gp);
                bool ok;
                double want;
                if (empty) {
                    want = 0;
                    bool zero = true;
                    for (size_t k = 0; k < es; ++k) zero &= gp[k] == 0;
                    ok = zero;
                } else {
                    want = (wa * ar[e] + wb * br[e]) / total;
                    if (std::isnan(want)) ok = std::isnan(got);
                    else if (std::isinf(want)) ok = got == want;
                    else if (wa == 0 || wb == 0) {
                        // The other state, bit for bit.
                        const unsigned char* src = (wa == 0 ? bb.data() : ab.data()) + e * es;
                        ok = memcmp(gp, src, es) == 0;
                    } else {
                        const double s = (wa * std::fabs(ar[e]) + wb * std::fabs(br[e])) / total;
                        const double u = dt == BF16 ? 1.0 / 256 : dt == F16 ? 1.0 / 2048 : 0.0;
                        const double err = std::fabs(got - want);
                        const double bound = u * std::fabs(want) + 1e-5 * s + (dt == F16 ? 3e-8 : 0.0);
                        worst_abs = std::max(worst_abs, err);
                        if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
                        ok = err <= bound;
                    }
                }
                if (!ok && bad++ < 5)
                    printf("    row %lld dim %d (la %g lb %g): out %.9g want %.9g\n", r, i, la[r], lb[r], got, want);
            }
        }
    }
    Stats& s = stats[dt];
    ++s.cases;
    s.elements += (long long)n;
    s.worst_abs = std::max(s.worst_abs, worst_abs);
    s.worst_ratio = std::max(s.worst_ratio, worst_ratio);
    s.worst_lse = std::max(s.worst_lse, worst_lse);
    if (bad) ++s.failures;
    const dim3 g = merge_grid(rows, head_dim, dt);
    printf("%s %-4s d=%3d tokens=%3d heads=%2d lse=%d offset=%d grid=(%u,%u) out err %.2e (%.2f of bound) lse %.2e\n",
           bad ? "FAIL" : "ok  ", dt_name[dt], head_dim, num_tokens, num_heads, (int)with_lse, (int)offset, g.x, g.y,
           worst_abs, worst_ratio, worst_lse);
    fflush(stdout);
    for (void* ptr : {(void*)pa, (void*)pb, (void*)po, (void*)pla, (void*)plb, (void*)plo}) free(ptr);
}

int main() {
    printf("merge_states under emulation, wave %d, grid rows of %d workgroups\n", DAP_WAVE, MERGE_STATES_GRID_X);
    // The head dims the kernels are built for, and others the merge takes too
    // (any head_dim, like decode.cu's merge): 0 (LSE only), below one chunk,
    // not a multiple of a chunk.
    const int dims[] = {64, 80, 96, 112, 120, 128, 192, 256, 0, 1, 3, 4, 7, 8, 12, 100, 130, 250};
    int i = 0;
    for (int dt = 0; dt < 3; ++dt)
        for (int d : dims) {
            const int tokens = 1 + (i * 5) % 9, heads = 1 + (i * 3) % 8;
            check(dt, d, tokens, heads, true, false);
            check(dt, d, tokens + 2, heads, i % 2 == 0, true);
            check(dt, d, 12, 3, i % 3 != 0, false);  // 36 rows: every special pairing
            ++i;
        }
    // Empty launches, and several workgroups (with -DMERGE_STATES_GRID_X=3, several grid rows).
    for (int dt = 0; dt < 3; ++dt) {
        check(dt, 128, 0, 8, true, false);
        check(dt, 128, 5, 0, true, false);
        check(dt, 128, 37, 8, true, false);
        check(dt, 96, 20, 7, true, true);
        check(dt, 3, 300, 5, true, false);
        check(dt, 0, 700, 2, true, false);
    }
    int cases = 0, failures = 0;
    for (int dt = 0; dt < 3; ++dt) {
        cases += stats[dt].cases;
        failures += stats[dt].failures;
        printf("%-4s: %d cases, %lld elements, %d failed; worst out error %.2e (%.2f of its bound), worst lse "
               "error %.2e\n",
               dt_name[dt], stats[dt].cases, stats[dt].elements, stats[dt].failures, stats[dt].worst_abs,
               stats[dt].worst_ratio, stats[dt].worst_lse);
    }
    printf("wave %d: %d cases, %d failed\n", DAP_WAVE, cases, failures);
    return failures ? 1 : 0;
}

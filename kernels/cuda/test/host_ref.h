// host_ref.h: what the kernel tests (kernels/cuda/test/decode_test.cu and
// kernels/hip/test/kvgrid_test.cu) compute on the host the same way: element
// types and their encoding, the split rule of decode_params.h, and the f64
// attention reference. Test-only.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "host_convert.h"

enum DT { F32 = 0, F16 = 1, BF16 = 2 };
static const char* dt_name[] = {"f32", "f16", "bf16"};
static inline int dt_size(int dt) { return dt == F32 ? 4 : 2; }

// Encodes v as dt (round to nearest even) into bytes; rounded gets the
// values the bytes hold (rounded may be v itself).
static inline void encode(int dt, const std::vector<float>& v, std::vector<unsigned char>& bytes,
                          std::vector<float>& rounded) {
    bytes.resize(v.size() * dt_size(dt));
    rounded.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        if (dt == F32) {
            memcpy(&bytes[i * 4], &v[i], 4);
            rounded[i] = v[i];
        } else {
            const unsigned short h = dt == F16 ? host_f32_to_f16(v[i]) : host_f32_to_bf16(v[i]);
            memcpy(&bytes[i * 2], &h, 2);
            rounded[i] = dt == F16 ? host_f16_to_f32(h) : host_bf16_to_f32(h);
        }
    }
}
static inline float decode_elem(int dt, const unsigned char* p) {
    if (dt == F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    unsigned short h;
    memcpy(&h, p, 2);
    return dt == F16 ? host_f16_to_f32(h) : host_bf16_to_f32(h);
}

// The split rule of decode_params.h (decode_attn_core::plan::SplitRule).
struct HostSplit {
    long long tiles, per, active;
};
static inline HostSplit host_split_rule(long long len, long long num_splits, long long min_tiles) {
    HostSplit s;
    s.tiles = (len + 15) / 16;
    s.per = std::max(std::max(min_tiles, 1ll), (s.tiles + num_splits - 1) / num_splits);
    s.active = (s.tiles + s.per - 1) / s.per;
    return s;
}

// o = softmax(q k^T / sqrt(d)) v in f64 over tokens 0..len-1 of KV head
// kv_head, token t in slot slot_of(t) of the pools k, v [slots, num_kv_heads, d];
// and, where `lse` is not null, the row's log-sum-exp in the natural log,
// ln(sum_t exp(q . k_t / sqrt(d))) (-inf for len 0), as DecodeParams::out_lse
// holds it.
template <typename SlotOf>
static void reference_attention(const float* q, const float* k, const float* v, int len, int d, int num_kv_heads,
                                int kv_head, SlotOf slot_of, std::vector<double>& o, double* lse = nullptr) {
    o.assign(d, 0.0);
    if (lse) *lse = -INFINITY;
    if (len == 0) return;
    const double scale = 1.0 / std::sqrt((double)d);
    std::vector<double> sc(len);
    std::vector<long long> slots(len);
    double m = -1e300;
    for (int t = 0; t < len; ++t) {
        slots[t] = slot_of(t);
        const float* kr = &k[((size_t)slots[t] * num_kv_heads + kv_head) * d];
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += (double)q[i] * kr[i];
        sc[t] = dot * scale;
        m = std::max(m, sc[t]);
    }
    double l = 0;
    for (int t = 0; t < len; ++t) {
        const double w = std::exp(sc[t] - m);
        l += w;
        const float* vr = &v[((size_t)slots[t] * num_kv_heads + kv_head) * d];
        for (int i = 0; i < d; ++i) o[i] += w * vr[i];
    }
    for (int i = 0; i < d; ++i) o[i] /= l;
    if (lse) *lse = m + std::log(l);
}

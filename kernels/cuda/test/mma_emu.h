// mma_emu.h: the warp-collective pieces of decode_mma.cuh's portable layer
// for cuda_emu.h's fibers: mma.sync.m16n8k16 (bf16/f16 in, f32 accumulate)
// with the PTX fragment layouts, __byte_perm and __any_sync. Test-only.
#pragma once

namespace emu {
inline unsigned mma_a[kMaxThreads][4];
inline unsigned mma_b[kMaxThreads][2];
inline int vote_buf[kMaxThreads];
}  // namespace emu

// A (16x16, row): register j of lane (g, t) holds rows g (+8 for j odd) and
// columns 2t, 2t+1 (+8 for j >= 2). B (16x8, col): register j of lane (g, t)
// holds rows 2t, 2t+1 (+8 for j = 1) of column g. C/D (16x8): element i of
// lane (g, t) is row g (+8 for i >= 2), column 2t + (i & 1).
template <bool BF16>
inline void emu_mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int t = emu::cur;
    for (int j = 0; j < 4; ++j) emu::mma_a[t][j] = a[j];
    emu::mma_b[t][0] = b0;
    emu::mma_b[t][1] = b1;
    emu::yield_as(emu::AT_WARP_BARRIER);
    const int base = t & ~31, lane = t & 31, g = lane / 4, tig = lane % 4;
    auto half = [](unsigned w, int hi) -> float {
        const unsigned short h = hi ? (unsigned short)(w >> 16) : (unsigned short)(w & 0xffffu);
        return BF16 ? __uint_as_float((unsigned)h << 16) : host_f16_to_f32(h);
    };
    auto A = [&](int row, int k) {
        return half(emu::mma_a[base + (row & 7) * 4 + (k & 7) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k & 1);
    };
    auto B = [&](int k, int col) { return half(emu::mma_b[base + col * 4 + (k & 7) / 2][k >= 8 ? 1 : 0], k & 1); };
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * tig + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; ++k) acc = fmaf(A(row, k), B(k, col), acc);
        out[i] = acc;
    }
    emu::yield_as(emu::AT_WARP_BARRIER);
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}
inline void da_mma_bf16_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    emu_mma_m16n8k16<true>(d, a, b0, b1);
}
inline void da_mma_f16_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    emu_mma_m16n8k16<false>(d, a, b0, b1);
}
// Byte n of the result is byte (selector >> 4n) & 7 of the 8 bytes {y, x}.
inline unsigned da_byte_perm(unsigned x, unsigned y, unsigned selector) {
    const unsigned long long both = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)((both >> (8 * ((selector >> (4 * n)) & 7))) & 0xffu) << (8 * n);
    return r;
}
inline bool da_warp_any(bool predicate) {
    const int t = emu::cur;
    emu::vote_buf[t] = predicate;
    emu::yield_as(emu::AT_WARP_BARRIER);
    int any = 0;
    for (int l = 0; l < 32; ++l) any |= emu::vote_buf[(t & ~31) + l];
    emu::yield_as(emu::AT_WARP_BARRIER);
    return any != 0;
}
inline void da_syncwarp() { emu::yield_as(emu::AT_WARP_BARRIER); }

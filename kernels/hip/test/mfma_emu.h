// mfma_emu.h: the wave-64 matrix-core instructions da_portable.h exposes on
// gfx90a / gfx942 (dap_mfma_16x16x16_f16 / _bf16), for cuda_emu.h's fibers.
// Test-only; include after cuda_emu.h and before the kernel source. Defines
// DA_EMU_MFMA (which turns da_portable.h's DAP_MFMA on) only at wave 64: the
// instructions exist only for 64-lane wavefronts.
//
// The model is written from AMD's documentation of v_mfma_f32_16x16x16f16 and
// v_mfma_f32_16x16x16bf16_1k (one 16x16x16 block, f32 accumulate), not from
// the kernel: the AMD Matrix Instruction Calculator
// (github.com/ROCm/amd_matrix_instruction_calculator: --architecture cdna2
// --instruction v_mfma_f32_16x16x16f16 --register-layout), the AMD CDNA3 ISA
// guide ch. 7 "Matrix Arithmetic Instructions", and AMD's ROCm blog "Matrix Core Programming on AMD CDNA3 and CDNA4"
// (sec. 5.2, __builtin_amdgcn_mfma_f32_16x16x16f16). With lane = 0..63,
// operand element j = 0..3 of a lane being the 16-bit half (j & 1) of its
// register j / 2 (element 0 in bits 15:0 of the first register):
//   A (16 x 16, M x K):  lane holds A[lane % 16][4 (lane / 16) + j]
//   B (16 x 16, K x N):  lane holds B[4 (lane / 16) + j][lane % 16]
//   C, D (16 x 16 f32):  register r of lane holds D[4 (lane / 16) + r][lane % 16]
// D = A B + C; every product is exact in f32 (11- or 8-bit significands), the
// sums are f32 (the hardware's summation order is not documented; this sums
// in k order).
#pragma once

#if DA_EMU_WAVE == 64
#define DA_EMU_MFMA 1

typedef float dap_f32x4 __attribute__((vector_size(16)));

namespace emu {
inline unsigned mfma_regs[kMaxThreads][4];  // a0, a1, b0, b1 of every lane
}  // namespace emu

template <bool BF16>
inline dap_f32x4 emu_mfma_16x16x16(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    const int t = emu::cur;
    emu::mfma_regs[t][0] = a0;
    emu::mfma_regs[t][1] = a1;
    emu::mfma_regs[t][2] = b0;
    emu::mfma_regs[t][3] = b1;
    emu::yield_as(emu::AT_WARP_BARRIER);  // every lane of the wavefront has published its operands
    const int base = t & ~63, lane = t & 63;
    // Element j of the operand whose registers start at `reg` (0: A, 2: B) in lane l.
    auto elem = [&](int l, int reg, int j) -> float {
        const unsigned w = emu::mfma_regs[base + l][reg + j / 2];
        const unsigned short h = (j & 1) ? (unsigned short)(w >> 16) : (unsigned short)(w & 0xffffu);
        return BF16 ? host_bf16_to_f32(h) : host_f16_to_f32(h);
    };
    auto A = [&](int m, int k) { return elem(m + 16 * (k / 4), 0, k % 4); };
    auto B = [&](int k, int n) { return elem(n + 16 * (k / 4), 2, k % 4); };
    dap_f32x4 d;
    for (int r = 0; r < 4; ++r) {
        const int m = 4 * (lane / 16) + r, n = lane % 16;
        float acc = c[r];
        for (int k = 0; k < 16; ++k) acc += A(m, k) * B(k, n);
        d[r] = acc;
    }
    emu::yield_as(emu::AT_WARP_BARRIER);  // every lane has read the operands before they are reused
    return d;
}
inline dap_f32x4 dap_mfma_16x16x16_f16(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    return emu_mfma_16x16x16<false>(c, a0, a1, b0, b1);
}
inline dap_f32x4 dap_mfma_16x16x16_bf16(dap_f32x4 c, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    return emu_mfma_16x16x16<true>(c, a0, a1, b0, b1);
}
#endif

// host_convert.h: f32 <-> bf16 / f16 on the host, round to nearest even
// (the tests' encoder, and the CPU emulation's stand-in for cvt.rn).
#pragma once
#include <cmath>
#include <cstring>

inline float host_bits_to_f32(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned host_f32_to_bits(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline unsigned short host_f32_to_bf16(float f) {
    unsigned x = host_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (unsigned short)(x >> 16);
}
inline float host_bf16_to_f32(unsigned short h) { return host_bits_to_f32((unsigned)h << 16); }
inline unsigned short host_f32_to_f16(float f) {
    unsigned x = host_f32_to_bits(f);
    unsigned sign = (x >> 16) & 0x8000u;
    int exp = (int)((x >> 23) & 0xff);
    unsigned mant = x & 0x7fffffu;
    if (exp == 0xff) return (unsigned short)(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int e = exp - 127 + 15;
    if (e >= 0x1f) return (unsigned short)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (unsigned short)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        unsigned h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) ++h;
        return (unsigned short)(sign | h);
    }
    unsigned h = ((unsigned)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
    return (unsigned short)(sign | h);
}
inline float host_f16_to_f32(unsigned short h) {
    unsigned sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
    // Normal and infinite or NaN: the same bits re-biased (exact; ldexp
    // here was a quarter of the emulated tensor-core kernel's time). A NaN
    // becomes the quiet f32 NaN, as before.
    if (exp == 31) return host_bits_to_f32(sign | 0x7f800000u | (mant ? 0x400000u : 0u));
    if (exp != 0) return host_bits_to_f32(sign | (exp + 112u) << 23 | mant << 13);
    // Subnormal: an f32 normal.
    return host_bits_to_f32(host_f32_to_bits(std::ldexp((float)mant, -24)) | sign);
}


//! The hot loop in AVX-512F intrinsics (x86-64 only), selected at run time
//! by [`crate::kernel::Isa::detect`] for head dims that are a multiple of 16
//! (every supported one but 120, which goes to `avx2`). The same steps as
//! `avx2.rs` at twice the width, with 32 registers:
//!
//! * K rows decoded chunk-major, `[d / 16][TILE][16]`;
//! * per query head, 16 running dot products (one per row of the tile)
//!   reduced into one vector of the tile's 16 scores;
//! * the online softmax on that vector, rows past a partial tile's end
//!   masked out;
//! * V rows decoded row-major and accumulated 128 columns at a time in eight
//!   registers over the tile's rows.
//!
//! Every pointer read or written comes from a slice whose length is checked
//! first (see each `SAFETY` comment); the only other requirement of the
//! `unsafe` functions is that the CPU has AVX-512F (and AVX2, FMA, F16C,
//! which `Isa::detect` also checks, for the shared helpers).

use std::arch::x86_64::*;

use crate::kernel::{self, Elt, Fused, Scratch, State, TilePrefetch, Work, TILE};

/// Head dims this path takes: a positive multiple of 16.
pub(crate) fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(16)
}

/// Runs one work item (see `kernel::attend`); `work.head_dim` must satisfy [`fits`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn attend(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) {
    let d = work.head_dim;
    let g = state.m.len();
    let shapes_fit = fits(d)
        && work.q.len() == g * d
        && state.acc.len() == g * d
        && state.l.len() == g
        && scratch.k.len() == TILE * d
        && scratch.v.len() == TILE * d
        && scratch.s.len() == g * TILE;
    if !shapes_fit {
        crate::avx2::attend(kv, work, state, scratch);
        return;
    }
    let row_bytes = d * kv.size();
    let head_offset = work.kv_head * d;
    let mut slots = [0usize; TILE];
    // Prefetch steps per tile: one per K chunk of each head's scores, one per
    // four rows of each head's accumulation blocks.
    let blocks = d / 128 + (d % 128) / 64 + (d % 64) / 16;
    let steps = g * (d / 16 + TILE / 4 * blocks);
    for ahead in 0..PREFETCH_TILES {
        TilePrefetch::new(work, kv.size(), work.start + ahead * TILE, 1).finish();
    }
    let mut t0 = work.start;
    while t0 < work.end {
        let n = TILE.min(work.end - t0);
        let mut pf = TilePrefetch::new(work, kv.size(), t0 + PREFETCH_TILES * TILE, steps);
        let slots = &mut slots[..n];
        work.slots.fill(t0, slots);

        for (r, &slot) in slots.iter().enumerate() {
            let offset = (slot * work.slot_elems + head_offset) * kv.size();
            decode_row(kv, &work.k[offset..offset + row_bytes], &mut scratch.k[r * 16..], TILE * 16);
        }
        // Rows past the tile's end (a sequence's last, partial tile).
        let valid: __mmask16 = if n >= 16 { 0xffff } else { (1u16 << n) - 1 };
        for h in 0..g {
            let s = _mm512_mask_blend_ps(
                valid,
                _mm512_set1_ps(f32::NEG_INFINITY),
                scores16(&work.q[h * d..(h + 1) * d], &scratch.k, d, &mut pf),
            );
            let tile_max = _mm512_reduce_max_ps(s);
            let m_old = state.m[h];
            let m_new = m_old.max(tile_max);
            if m_new > m_old {
                let acc = &mut state.acc[h * d..(h + 1) * d];
                if m_old == f32::NEG_INFINITY {
                    state.l[h] = 0.0;
                    acc.fill(0.0);
                } else {
                    let alpha = kernel::exp2_nonpositive::<Fused>(m_old - m_new);
                    state.l[h] *= alpha;
                    scale(acc, alpha);
                }
                state.m[h] = m_new;
            }
            let p = _mm512_maskz_mov_ps(valid, exp2(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
            state.l[h] += _mm512_reduce_add_ps(p);
            let out = &mut scratch.s[h * TILE..(h + 1) * TILE];
            // SAFETY: `out` holds TILE = 16 floats.
            _mm512_storeu_ps(out.as_mut_ptr(), p);
        }

        for (&slot, vrow) in slots.iter().zip(scratch.v.chunks_exact_mut(d)) {
            let offset = (slot * work.slot_elems + head_offset) * kv.size();
            decode_row(kv, &work.v[offset..offset + row_bytes], vrow, 16);
        }
        for h in 0..g {
            let p = &scratch.s[h * TILE..h * TILE + n];
            accumulate(&mut state.acc[h * d..(h + 1) * d], p, &scratch.v[..n * d], d, &mut pf);
        }
        pf.finish();
        t0 += n;
    }
}

/// How many tiles ahead of the one being computed K and V rows are prefetched.
const PREFETCH_TILES: usize = 2;

/// Decodes one row of `src.len() / size` elements (a multiple of 16),
/// chunk `c` of 16 going to `dst[c * stride..c * stride + 16]`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn decode_row(kv: Elt, src: &[u8], dst: &mut [f32], stride: usize) {
    let chunks = src.len() / (16 * kv.size());
    if stride < 16 || dst.len() < (chunks.max(1) - 1) * stride + 16 {
        return;
    }
    let dst = dst.as_mut_ptr();
    // SAFETY (every store below): chunk `c < chunks` goes to
    // `dst[c * stride..c * stride + 16]`, inside `dst` by the check above;
    // each load reads one `chunks_exact` piece of `src`, unaligned.
    match kv {
        Elt::F32 => {
            for (c, s) in src.chunks_exact(64).enumerate() {
                _mm512_storeu_ps(dst.add(c * stride), _mm512_loadu_ps(s.as_ptr() as *const f32));
            }
        }
        Elt::Bf16 => {
            for (c, s) in src.chunks_exact(32).enumerate() {
                let x = _mm256_loadu_si256(s.as_ptr() as *const __m256i);
                let bits = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x));
                _mm512_storeu_ps(dst.add(c * stride), _mm512_castsi512_ps(bits));
            }
        }
        Elt::F16 => {
            for (c, s) in src.chunks_exact(32).enumerate() {
                let x = _mm256_loadu_si256(s.as_ptr() as *const __m256i);
                _mm512_storeu_ps(dst.add(c * stride), _mm512_cvtph_ps(x));
            }
        }
    }
}

/// The 16 dot products of `q` (`d` floats) with the 16 rows of the
/// chunk-major K tile `k` (`[d / 16][TILE][16]`), lane `r` for row `r`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn scores16(q: &[f32], k: &[f32], d: usize, pf: &mut TilePrefetch<'_>) -> __m512 {
    if q.len() < d || k.len() < d * TILE || !fits(d) {
        return _mm512_setzero_ps();
    }
    let q = q.as_ptr();
    let mut block = k.as_ptr();
    let mut a = [_mm512_setzero_ps(); 16];
    let mut c = 0;
    while c + 16 <= d {
        // SAFETY: `c + 16 <= d <= q.len()`; `block` is chunk `c / 16` and row
        // `r` of it ends at `(c / 16) * TILE * 16 + (r + 1) * 16 <= d * TILE <= k.len()`.
        let qv = _mm512_loadu_ps(q.add(c));
        for (r, a) in a.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(qv, _mm512_loadu_ps(block.add(16 * r)), *a);
        }
        pf.step();
        c += 16;
        if c < d {
            block = block.add(TILE * 16);
        }
    }
    transpose_sum(&a)
}

/// Lane `r` of the result is the sum of the 16 lanes of `a[r]`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn transpose_sum(a: &[__m512; 16]) -> __m512 {
    // Pairs of rows: [row 2i: 8 partial sums | row 2i+1: 8 partial sums].
    let mut x = [_mm512_setzero_ps(); 8];
    for (i, x) in x.iter_mut().enumerate() {
        let (p, q) = (a[2 * i], a[2 * i + 1]);
        *x = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(p, q), _mm512_shuffle_f32x4::<0b11_10_11_10>(p, q));
    }
    // Quads: [row 4j: 4 | 4j+1: 4 | 4j+2: 4 | 4j+3: 4] in the four 128-bit lanes.
    let mut y = [_mm512_setzero_ps(); 4];
    for (j, y) in y.iter_mut().enumerate() {
        let (p, q) = (x[2 * j], x[2 * j + 1]);
        *y = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(p, q), _mm512_shuffle_f32x4::<0b11_01_11_01>(p, q));
    }
    // Within each 128-bit lane `l`: [rows l, 4 + l, 8 + l, 12 + l] fully summed.
    let s01 = _mm512_add_ps(_mm512_unpacklo_ps(y[0], y[1]), _mm512_unpackhi_ps(y[0], y[1]));
    let s23 = _mm512_add_ps(_mm512_unpacklo_ps(y[2], y[3]), _mm512_unpackhi_ps(y[2], y[3]));
    let r = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(s01, s23), _mm512_shuffle_ps::<0b11_10_11_10>(s01, s23));
    // Row R sits at lane 4 * (R % 4) + R / 4.
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(idx, r)
}

/// `acc[j] += sum_i p[i] * v[i * d + j]` for the `p.len()` rows of `v`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn accumulate(acc: &mut [f32], p: &[f32], v: &[f32], d: usize, pf: &mut TilePrefetch<'_>) {
    let rows = p.len();
    if acc.len() != d || v.len() < rows * d || !fits(d) {
        return;
    }
    let mut c = 0;
    while c + 128 <= d {
        accumulate_block::<8>(acc, p, v, d, c, pf);
        c += 128;
    }
    while c + 64 <= d {
        accumulate_block::<4>(acc, p, v, d, c, pf);
        c += 64;
    }
    while c + 16 <= d {
        accumulate_block::<1>(acc, p, v, d, c, pf);
        c += 16;
    }
}

/// Columns `c .. c + 16 * N` of [`accumulate`], held in `N` registers.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_block<const N: usize>(
    acc: &mut [f32],
    p: &[f32],
    v: &[f32],
    d: usize,
    c: usize,
    pf: &mut TilePrefetch<'_>,
) {
    if c + 16 * N > d || acc.len() < d || v.len() < p.len() * d {
        return;
    }
    let (acc, v) = (acc.as_mut_ptr().add(c), v.as_ptr().add(c));
    // SAFETY (all loads and stores below): columns `c .. c + 16 * N <= d =
    // acc.len()`; row `i < p.len()` ends at `i * d + c + 16 * N <= p.len() * d <= v.len()`.
    let mut a = [_mm512_setzero_ps(); N];
    for (j, a) in a.iter_mut().enumerate() {
        *a = _mm512_loadu_ps(acc.add(16 * j));
    }
    for (i, &pi) in p.iter().enumerate() {
        let pb = _mm512_set1_ps(pi);
        let row = v.add(i * d);
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(pb, _mm512_loadu_ps(row.add(16 * j)), *a);
        }
        if i % 4 == 3 {
            pf.step();
        }
    }
    for (j, a) in a.iter().enumerate() {
        _mm512_storeu_ps(acc.add(16 * j), *a);
    }
}

/// `x *= alpha` for every element.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn scale(x: &mut [f32], alpha: f32) {
    let a = _mm512_set1_ps(alpha);
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` is 16 floats.
        _mm512_storeu_ps(c.as_mut_ptr(), _mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), a));
    }
    chunks.into_remainder().iter_mut().for_each(|x| *x *= alpha);
}

/// `kernel::exp2_nonpositive`, 16 lanes at a time (NaN stays NaN).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn exp2(x: __m512) -> __m512 {
    // max/min return their second operand when either is NaN: x.
    let x = _mm512_min_ps(_mm512_setzero_ps(), _mm512_max_ps(_mm512_set1_ps(-126.0), x));
    let magic = _mm512_set1_ps(12_582_912.0);
    let r = _mm512_add_ps(x, magic);
    let i = _mm512_sub_epi32(_mm512_castps_si512(r), _mm512_castps_si512(magic));
    let f = _mm512_sub_ps(x, _mm512_sub_ps(r, magic));
    let mut p = _mm512_set1_ps(1.535_336_2e-4);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339_887_4e-3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618_437e-3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550_332_5e-2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402_264_8e-1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931_472e-1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    let two_i = _mm512_slli_epi32::<23>(_mm512_add_epi32(i, _mm512_set1_epi32(127)));
    _mm512_mul_ps(p, _mm512_castsi512_ps(two_i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have() -> bool {
        crate::kernel::Isa::detect().name() == "avx512"
    }

    #[test]
    fn vector_exp2_matches_the_scalar_one() {
        if !have() {
            return;
        }
        for i in 0..200_000 {
            let x = -(i as f32) * 7e-4;
            // SAFETY: the features were detected above.
            let v = unsafe {
                let mut out = [0.0f32; 16];
                _mm512_storeu_ps(out.as_mut_ptr(), exp2(_mm512_set1_ps(x)));
                out[11]
            };
            assert_eq!(v, kernel::exp2_nonpositive::<Fused>(x), "x = {x}");
        }
    }

    #[test]
    fn scores_and_accumulate_match_plain_loops() {
        if !have() {
            return;
        }
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS.iter().filter(|&&d| fits(d)) {
            let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.3).sin()).collect();
            // Row-major rows, and the chunk-major tile `decode_row` makes of them.
            let rows: Vec<f32> = (0..TILE * d).map(|i| (i as f32 * 0.17).cos()).collect();
            let bytes = decode_attn_core::dtype::encode(decode_attn_core::DType::F32, &rows);
            let mut tile = vec![0.0f32; TILE * d];
            for r in 0..TILE {
                // SAFETY: the features were detected above.
                unsafe { decode_row(Elt::F32, &bytes[r * d * 4..(r + 1) * d * 4], &mut tile[r * 16..], TILE * 16) };
            }
            let mut s = [0.0f32; 16];
            // SAFETY: the features were detected above.
            unsafe { _mm512_storeu_ps(s.as_mut_ptr(), scores16(&q, &tile, d, &mut TilePrefetch::none())) };
            for (r, &s) in s.iter().enumerate() {
                let exact: f64 = (0..d).map(|j| q[j] as f64 * rows[r * d + j] as f64).sum();
                assert!((s as f64 - exact).abs() < 1e-4, "d={d} row {r}: {s} vs {exact}");
            }
            let p: Vec<f32> = (0..13).map(|i| i as f32 * 0.1).collect();
            let v: Vec<f32> = (0..13 * d).map(|i| (i as f32 * 0.05).sin()).collect();
            let mut acc = vec![0.5f32; d];
            // SAFETY: the features were detected above.
            unsafe { accumulate(&mut acc, &p, &v, d, &mut TilePrefetch::none()) };
            for (j, &a) in acc.iter().enumerate() {
                let exact: f64 = 0.5 + (0..13).map(|i| p[i] as f64 * v[i * d + j] as f64).sum::<f64>();
                assert!((a as f64 - exact).abs() < 1e-4, "d={d} column {j}: {a} vs {exact}");
            }
        }
    }
}

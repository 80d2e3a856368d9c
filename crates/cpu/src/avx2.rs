//! The hot loop in AVX2 + FMA + F16C intrinsics (x86-64 only), selected at
//! run time by [`crate::kernel::Isa::detect`]. Same arithmetic as the generic
//! loop in `kernel.rs`, which it falls back to for head dims that are not a
//! multiple of 8 (none of the supported ones).
//!
//! Per full or partial tile of 16 tokens: decode the K rows to f32; for each
//! query head, 8 rows at a time, 8 running dot products whose horizontal sums
//! land in one vector of 8 scores; online softmax on the 16 scores (invalid
//! rows of a partial tile masked to -inf, their weights to 0); decode the V
//! rows; accumulate 64 output columns at a time in eight registers over the
//! tile's rows.
//!
//! Every pointer read or written here comes from a slice whose length is
//! checked first (see each `SAFETY` comment); the only other requirement of
//! the `unsafe` functions is that the CPU has AVX2, FMA and F16C.

use std::arch::x86_64::*;

use crate::kernel::{self, Elt, Fused, Scratch, State, Work, TILE};

/// Runs one work item (see `kernel::attend`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) {
    let d = work.head_dim;
    let g = state.m.len();
    let shapes_fit = d.is_multiple_of(8)
        && d > 0
        && work.q.len() == g * d
        && state.acc.len() == g * d
        && state.l.len() == g
        && scratch.k.len() == TILE * d
        && scratch.v.len() == TILE * d
        && scratch.s.len() == g * TILE;
    if !shapes_fit {
        match kv {
            Elt::F32 => kernel::attend_generic::<kernel::F32, Fused>(work, state, scratch),
            Elt::F16 => kernel::attend_generic::<kernel::F16, Fused>(work, state, scratch),
            Elt::Bf16 => kernel::attend_generic::<kernel::Bf16, Fused>(work, state, scratch),
        }
        return;
    }
    let row_bytes = d * kv.size();
    let head_offset = work.kv_head * d;
    let mut slots = [0usize; TILE];
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for ahead in 0..PREFETCH_TILES {
        let mut ahead_slots = [0usize; TILE];
        let ahead_slots = tile_slots(work, work.start + ahead * TILE, &mut ahead_slots);
        prefetch_rows(kv, work, work.k, ahead_slots);
        prefetch_rows(kv, work, work.v, ahead_slots);
    }
    let mut pf_slots = [0usize; TILE];
    let mut t0 = work.start;
    while t0 < work.end {
        let n = TILE.min(work.end - t0);
        let next = t0 + n;
        // The rows of the tile PREFETCH_TILES ahead are asked for a share
        // per head, so that the misses spread over this tile's arithmetic.
        let pf_slots = tile_slots(work, t0 + PREFETCH_TILES * TILE, &mut pf_slots);
        let pf_share = |h: usize| &pf_slots[h * pf_slots.len() / g..(h + 1) * pf_slots.len() / g];
        let slots = &mut slots[..n];
        work.slots.fill(t0, slots);

        // K goes chunk-major, `[d / 8][TILE][8]`: the 8-float chunks of one
        // column block of all rows are adjacent, so `scores8` walks one pointer.
        for (r, &slot) in slots.iter().enumerate() {
            let offset = (slot * work.slot_elems + head_offset) * kv.size();
            decode_row(kv, &work.k[offset..offset + row_bytes], &mut scratch.k[r * 8..], TILE * 8);
        }
        // Lanes of rows past the tile's end (a sequence's last, partial tile).
        let valid_lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane));
        let valid_hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32 - 8), lane));
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        for h in 0..g {
            prefetch_rows(kv, work, work.k, pf_share(h));
            let qh = &work.q[h * d..(h + 1) * d];
            let s_lo = _mm256_blendv_ps(neg_inf, scores8(qh, &scratch.k, 0, d), valid_lo);
            let s_hi = if n > 8 { _mm256_blendv_ps(neg_inf, scores8(qh, &scratch.k, 8, d), valid_hi) } else { neg_inf };
            let tile_max = hmax(_mm256_max_ps(s_lo, s_hi));
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
            let m = _mm256_set1_ps(m_new);
            let p_lo = _mm256_and_ps(exp2(_mm256_sub_ps(s_lo, m)), valid_lo);
            let p_hi = _mm256_and_ps(exp2(_mm256_sub_ps(s_hi, m)), valid_hi);
            state.l[h] += hsum(_mm256_add_ps(p_lo, p_hi));
            let p = &mut scratch.s[h * TILE..(h + 1) * TILE];
            // SAFETY: `p` holds TILE = 16 floats: two stores of 8.
            _mm256_storeu_ps(p.as_mut_ptr(), p_lo);
            _mm256_storeu_ps(p.as_mut_ptr().add(8), p_hi);
        }

        for (&slot, vrow) in slots.iter().zip(scratch.v.chunks_exact_mut(d)) {
            let offset = (slot * work.slot_elems + head_offset) * kv.size();
            decode_row(kv, &work.v[offset..offset + row_bytes], vrow, 8);
        }
        for h in 0..g {
            prefetch_rows(kv, work, work.v, pf_share(h));
            let p = &scratch.s[h * TILE..h * TILE + n];
            accumulate(&mut state.acc[h * d..(h + 1) * d], p, &scratch.v[..n * d], d);
        }
        t0 = next;
    }
}

/// How many tiles ahead of the one being computed K and V rows are prefetched.
const PREFETCH_TILES: usize = 2;

/// The slots of the tile starting at token `t0`: empty past the range's end.
#[inline(always)]
fn tile_slots<'s>(work: &Work<'_>, t0: usize, slots: &'s mut [usize; TILE]) -> &'s [usize] {
    if t0 >= work.end {
        return &slots[..0];
    }
    let slots = &mut slots[..TILE.min(work.end - t0)];
    work.slots.fill(t0, slots);
    slots
}

/// Asks for this work item's rows of `cache` at `slots`: a block is anywhere
/// in the pool, where no hardware prefetcher looks.
#[inline(always)]
fn prefetch_rows(kv: Elt, work: &Work<'_>, cache: &[u8], slots: &[usize]) {
    let row_bytes = work.head_dim * kv.size();
    for &slot in slots {
        let offset = (slot * work.slot_elems + work.kv_head * work.head_dim) * kv.size();
        kernel::prefetch(cache, offset, row_bytes);
    }
}

/// Decodes one row of `src.len() / size` elements (a multiple of 8) from
/// `src`, chunk `c` of 8 going to `dst[c * stride..c * stride + 8]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode_row(kv: Elt, src: &[u8], dst: &mut [f32], stride: usize) {
    let chunks = src.len() / (8 * kv.size());
    if stride < 8 || dst.len() < (chunks.max(1) - 1) * stride + 8 {
        return;
    }
    let dst = dst.as_mut_ptr();
    // SAFETY (every store below): chunk `c < chunks` goes to
    // `dst[c * stride..c * stride + 8]`, inside `dst` by the check above;
    // each load reads one `chunks_exact` piece of `src`, unaligned.
    match kv {
        Elt::F32 => {
            for (c, s) in src.chunks_exact(32).enumerate() {
                _mm256_storeu_ps(dst.add(c * stride), _mm256_loadu_ps(s.as_ptr() as *const f32));
            }
        }
        Elt::Bf16 => {
            for (c, s) in src.chunks_exact(16).enumerate() {
                let x = _mm_loadu_si128(s.as_ptr() as *const __m128i);
                let bits = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x));
                _mm256_storeu_ps(dst.add(c * stride), _mm256_castsi256_ps(bits));
            }
        }
        Elt::F16 => {
            for (c, s) in src.chunks_exact(16).enumerate() {
                let x = _mm_loadu_si128(s.as_ptr() as *const __m128i);
                _mm256_storeu_ps(dst.add(c * stride), _mm256_cvtph_ps(x));
            }
        }
    }
}

/// The 8 dot products of `q` (`d` floats) with rows `row0..row0 + 8` of the
/// chunk-major K tile `k` (`[d / 8][TILE][8]`), as one vector. `d` is a
/// positive multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scores8(q: &[f32], k: &[f32], row0: usize, d: usize) -> __m256 {
    if q.len() < d || k.len() < d * TILE || row0 + 8 > TILE {
        return _mm256_setzero_ps();
    }
    let q = q.as_ptr();
    let mut block = k.as_ptr().add(row0 * 8);
    let mut a = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c + 8 <= d {
        // SAFETY: `c + 8 <= d <= q.len()`; `block` is chunk `c / 8` of row
        // `row0`, and row `row0 + r` of it ends at `(c / 8) * TILE * 8 +
        // (row0 + r + 1) * 8 <= d * TILE <= k.len()`.
        let qv = _mm256_loadu_ps(q.add(c));
        for (r, a) in a.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(block.add(8 * r)), *a);
        }
        c += 8;
        if c < d {
            block = block.add(TILE * 8);
        }
    }
    // Horizontal sums of the 8 accumulators into the 8 lanes of one vector.
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1); // rows 0-3: low halves | high halves
    let u1 = _mm256_hadd_ps(t2, t3); // rows 4-7
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(u0, u1), _mm256_permute2f128_ps::<0x31>(u0, u1))
}

/// `acc[j] += sum_i p[i] * v[i * d + j]` for the `p.len()` rows of `v`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn accumulate(acc: &mut [f32], p: &[f32], v: &[f32], d: usize) {
    let rows = p.len();
    if acc.len() != d || v.len() < rows * d {
        return;
    }
    let (acc, v) = (acc.as_mut_ptr(), v.as_ptr());
    let mut c = 0;
    // SAFETY (all loads and stores below): columns `c .. c + width` with
    // `c + width <= d = acc.len()`; rows `i < rows` with `i * d + c + width
    // <= rows * d <= v.len()`.
    while c + 64 <= d {
        let mut a = [_mm256_setzero_ps(); 8];
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(acc.add(c + 8 * j));
        }
        for (i, &pi) in p.iter().enumerate() {
            let pb = _mm256_set1_ps(pi);
            let row = v.add(i * d + c);
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pb, _mm256_loadu_ps(row.add(8 * j)), *a);
            }
        }
        for (j, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.add(c + 8 * j), *a);
        }
        c += 64;
    }
    while c + 32 <= d {
        let mut a = [_mm256_setzero_ps(); 4];
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(acc.add(c + 8 * j));
        }
        for (i, &pi) in p.iter().enumerate() {
            let pb = _mm256_set1_ps(pi);
            let row = v.add(i * d + c);
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pb, _mm256_loadu_ps(row.add(8 * j)), *a);
            }
        }
        for (j, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.add(c + 8 * j), *a);
        }
        c += 32;
    }
    while c + 8 <= d {
        let mut a = _mm256_loadu_ps(acc.add(c));
        for (i, &pi) in p.iter().enumerate() {
            a = _mm256_fmadd_ps(_mm256_set1_ps(pi), _mm256_loadu_ps(v.add(i * d + c)), a);
        }
        _mm256_storeu_ps(acc.add(c), a);
        c += 8;
    }
}

/// `x *= alpha` for every element.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale(x: &mut [f32], alpha: f32) {
    let a = _mm256_set1_ps(alpha);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` is 8 floats.
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), a));
    }
    chunks.into_remainder().iter_mut().for_each(|x| *x *= alpha);
}

/// `kernel::exp2_nonpositive`, 8 lanes at a time (NaN stays NaN).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn exp2(x: __m256) -> __m256 {
    // max/min return their second operand when either is NaN: x.
    let x = _mm256_min_ps(_mm256_setzero_ps(), _mm256_max_ps(_mm256_set1_ps(-126.0), x));
    let magic = _mm256_set1_ps(12_582_912.0);
    let r = _mm256_add_ps(x, magic);
    let i = _mm256_sub_epi32(_mm256_castps_si256(r), _mm256_castps_si256(magic));
    let f = _mm256_sub_ps(x, _mm256_sub_ps(r, magic));
    let mut p = _mm256_set1_ps(1.535_336_2e-4);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339_887_4e-3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618_437e-3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550_332_5e-2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402_264_8e-1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931_472e-1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0));
    let two_i = _mm256_slli_epi32::<23>(_mm256_add_epi32(i, _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(two_i))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hmax(x: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum(x: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
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
                let mut out = [0.0f32; 8];
                _mm256_storeu_ps(out.as_mut_ptr(), exp2(_mm256_set1_ps(x)));
                out[3]
            };
            assert_eq!(v, kernel::exp2_nonpositive::<Fused>(x), "x = {x}");
        }
    }

    #[test]
    fn scores_and_accumulate_match_plain_loops() {
        if !have() {
            return;
        }
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS {
            let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.3).sin()).collect();
            // Row-major rows, and the chunk-major tile `decode_row` makes of them.
            let rows: Vec<f32> = (0..TILE * d).map(|i| (i as f32 * 0.17).cos()).collect();
            let bytes = decode_attn_core::dtype::encode(decode_attn_core::DType::F32, &rows);
            let mut tile = vec![0.0f32; TILE * d];
            for r in 0..TILE {
                // SAFETY: the features were detected above.
                unsafe { decode_row(Elt::F32, &bytes[r * d * 4..(r + 1) * d * 4], &mut tile[r * 8..], TILE * 8) };
            }
            for row0 in [0, 8] {
                let mut s = [0.0f32; 8];
                // SAFETY: the features were detected above.
                unsafe { _mm256_storeu_ps(s.as_mut_ptr(), scores8(&q, &tile, row0, d)) };
                for (r, &s) in s.iter().enumerate() {
                    let exact: f64 = (0..d).map(|j| q[j] as f64 * rows[(row0 + r) * d + j] as f64).sum();
                    assert!((s as f64 - exact).abs() < 1e-4, "d={d} row {}: {s} vs {exact}", row0 + r);
                }
            }
            let p: Vec<f32> = (0..13).map(|i| i as f32 * 0.1).collect();
            let v: Vec<f32> = (0..13 * d).map(|i| (i as f32 * 0.05).sin()).collect();
            let mut acc = vec![0.5f32; d];
            // SAFETY: the features were detected above.
            unsafe { accumulate(&mut acc, &p, &v, d) };
            for (j, &a) in acc.iter().enumerate() {
                let exact: f64 = 0.5 + (0..13).map(|i| p[i] as f64 * v[i * d + j] as f64).sum::<f64>();
                assert!((a as f64 - exact).abs() < 1e-4, "d={d} column {j}: {a} vs {exact}");
            }
        }
    }
}

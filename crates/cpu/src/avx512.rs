//! The hot loop in AVX-512F intrinsics (x86-64 only), selected at run time
//! by [`crate::kernel::Isa::detect`] for head dims that are a multiple of 16
//! (every supported one but 120, which goes to `avx2`). The same steps as
//! `avx2.rs` at twice the width, with 32 registers:
//!
//! * K rows read straight from the cache: for a group of up to four query
//!   heads, each 16-element chunk of a row is decoded once into a register
//!   and used by every head of the group (up to 16 running dot products),
//!   then reduced into vectors of the tile's 16 scores per head;
//! * the online softmax on that vector, rows past a partial tile's end
//!   masked out;
//! * V rows read straight from the cache, each 16-element chunk decoded once
//!   into a register and accumulated into up to four heads at a time, 64
//!   columns per head held in registers over the tile's rows.
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

/// Runs one work item (see `kernel::attend`) and returns true; returns false,
/// touching nothing, where the shapes do not fit (a head dim that is not a
/// multiple of 16, lengths that disagree). The item is walked by
/// `kernel::for_each_head_tile`: tile by tile, every KV head in turn.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn attend(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) -> bool {
    let d = work.head_dim;
    let Some(g) = kernel::item_group(work, state, scratch).filter(|_| fits(d)) else {
        return false;
    };
    // Prefetch steps per tile: one per K chunk of each row group of each group
    // of heads scored, one per four rows of each column block of each group
    // of heads accumulated, for each KV head.
    let blocks = d / 64 + (d % 64) / 16;
    let score_passes: usize = kernel::head_groups(g)
        .map(|(_, heads)| match heads {
            1 => 1,
            2 => 2,
            _ => 4,
        })
        .sum();
    let steps = work.kv_heads * (score_passes * (d / 16) + g.div_ceil(4) * blocks * (TILE / 4));
    let scores = &mut scratch.s[..g * TILE];
    kernel::for_each_head_tile(kv, work, work.q, state, PREFETCH_TILES, steps, |t, pf| {
        // SAFETY: `attend`'s caller guarantees AVX-512F, AVX2, FMA and F16C.
        unsafe { tile(kv, t.q, t.m, t.l, t.acc, scores, t.k_rows, t.v_rows, d, pf) }
    });
    true
}

/// One tile of one KV head: the scores of its `g` query heads (`q`, `[g,
/// d]`) against the tile's K rows, the online-softmax update of `m`, `l` and
/// `acc` (`[g, d]`), and the V rows accumulated. `v_rows` holds the tile's
/// valid rows; `k_rows` past them repeat a valid row (masked out).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn tile(
    kv: Elt,
    q: &[f32],
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    s: &mut [f32],
    k_rows: &[&[u8]; TILE],
    v_rows: &[&[u8]],
    d: usize,
    pf: &mut TilePrefetch<'_>,
) {
    let g = m.len();
    let n = v_rows.len();
    if !kernel::tile_fits(q, m, l, acc, s, n, d) {
        return;
    }
    // Scores of up to four heads at a time: each 16-element K chunk is
    // decoded once into a register and used by every head of the group.
    for (h, heads) in kernel::head_groups(g) {
        let q = &q[h * d..(h + heads) * d];
        let out = &mut s[h * TILE..(h + heads) * TILE];
        match (kv, heads) {
            (Elt::F32, 1) => scores_heads::<F32, 1, 16>(q, k_rows, d, out, pf),
            (Elt::F32, 2) => scores_heads::<F32, 2, 8>(q, k_rows, d, out, pf),
            (Elt::F32, 3) => scores_heads::<F32, 3, 4>(q, k_rows, d, out, pf),
            (Elt::F32, _) => scores_heads::<F32, 4, 4>(q, k_rows, d, out, pf),
            (Elt::F16, 1) => scores_heads::<F16, 1, 16>(q, k_rows, d, out, pf),
            (Elt::F16, 2) => scores_heads::<F16, 2, 8>(q, k_rows, d, out, pf),
            (Elt::F16, 3) => scores_heads::<F16, 3, 4>(q, k_rows, d, out, pf),
            (Elt::F16, _) => scores_heads::<F16, 4, 4>(q, k_rows, d, out, pf),
            (Elt::Bf16, 1) => scores_heads::<BF16, 1, 16>(q, k_rows, d, out, pf),
            (Elt::Bf16, 2) => scores_heads::<BF16, 2, 8>(q, k_rows, d, out, pf),
            (Elt::Bf16, 3) => scores_heads::<BF16, 3, 4>(q, k_rows, d, out, pf),
            (Elt::Bf16, _) => scores_heads::<BF16, 4, 4>(q, k_rows, d, out, pf),
        }
    }
    online_softmax(s, m, l, acc, n, d);

    // V: each 16-element chunk is decoded once into a register and
    // accumulated into up to four heads.
    for (h, heads) in kernel::head_groups(g) {
        let acc = &mut acc[h * d..(h + heads) * d];
        let p = &s[h * TILE..(h + heads) * TILE];
        match (kv, heads) {
            (Elt::F32, 1) => accumulate_rows::<F32, 1>(acc, p, v_rows, d, pf),
            (Elt::F32, 2) => accumulate_rows::<F32, 2>(acc, p, v_rows, d, pf),
            (Elt::F32, 3) => accumulate_rows::<F32, 3>(acc, p, v_rows, d, pf),
            (Elt::F32, _) => accumulate_rows::<F32, 4>(acc, p, v_rows, d, pf),
            (Elt::F16, 1) => accumulate_rows::<F16, 1>(acc, p, v_rows, d, pf),
            (Elt::F16, 2) => accumulate_rows::<F16, 2>(acc, p, v_rows, d, pf),
            (Elt::F16, 3) => accumulate_rows::<F16, 3>(acc, p, v_rows, d, pf),
            (Elt::F16, _) => accumulate_rows::<F16, 4>(acc, p, v_rows, d, pf),
            (Elt::Bf16, 1) => accumulate_rows::<BF16, 1>(acc, p, v_rows, d, pf),
            (Elt::Bf16, 2) => accumulate_rows::<BF16, 2>(acc, p, v_rows, d, pf),
            (Elt::Bf16, 3) => accumulate_rows::<BF16, 3>(acc, p, v_rows, d, pf),
            (Elt::Bf16, _) => accumulate_rows::<BF16, 4>(acc, p, v_rows, d, pf),
        }
    }
}

/// How many tiles ahead of the one being computed K and V rows are prefetched.
const PREFETCH_TILES: usize = 2;

/// The online-softmax step of one tile for its `g = m.len()` heads: the
/// scores `s` (`[g, TILE]`, rows `n..` masked out) become the weights `p =
/// 2^(s - m_new)` (0 past the tile's rows), `m` and `l` move to the tile's
/// max and sum, and `acc` (`[g, d]`, any column order) is rescaled where the
/// max grew. Shared with `avx512_bf16.rs`.
///
/// # Safety
/// The CPU must have AVX-512F; `s.len() >= g * TILE`, `l.len() == g`,
/// `acc.len() >= g * d` and `1 <= n <= TILE` (checked: nothing happens
/// otherwise).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn online_softmax(s: &mut [f32], m: &mut [f32], l: &mut [f32], acc: &mut [f32], n: usize, d: usize) {
    let g = m.len();
    if s.len() < g * TILE || l.len() != g || acc.len() < g * d || n == 0 || n > TILE {
        return;
    }
    // Rows past the tile's end (a sequence's last, partial tile).
    let valid: __mmask16 = if n >= 16 { 0xffff } else { (1u16 << n) - 1 };
    for h in 0..g {
        let scores = &s[h * TILE..(h + 1) * TILE];
        // SAFETY: `scores` holds TILE = 16 floats.
        let sv = _mm512_mask_blend_ps(valid, _mm512_set1_ps(f32::NEG_INFINITY), _mm512_loadu_ps(scores.as_ptr()));
        let tile_max = _mm512_reduce_max_ps(sv);
        let m_old = m[h];
        let m_new = m_old.max(tile_max);
        if m_new > m_old {
            let acc = &mut acc[h * d..(h + 1) * d];
            if m_old == f32::NEG_INFINITY {
                l[h] = 0.0;
                acc.fill(0.0);
            } else {
                let alpha = kernel::exp2_nonpositive::<Fused>(m_old - m_new);
                l[h] *= alpha;
                scale(acc, alpha);
            }
            m[h] = m_new;
        }
        let p = _mm512_maskz_mov_ps(valid, exp2(_mm512_sub_ps(sv, _mm512_set1_ps(m_new))));
        l[h] += _mm512_reduce_add_ps(p);
        let out = &mut s[h * TILE..(h + 1) * TILE];
        // SAFETY: `out` holds TILE = 16 floats.
        _mm512_storeu_ps(out.as_mut_ptr(), p);
    }
}

/// Scores of the `H` heads of `q` (`[H, d]`) against the 16 rows of K in
/// `rows` (raw elements of kind `E`, at least `d` each), written to `out`
/// (`[H, TILE]`), `R` rows at a time (`H * R <= 16` running dot products).
// `a[h][r]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn scores_heads<const E: u8, const H: usize, const R: usize>(
    q: &[f32],
    rows: &[&[u8]; TILE],
    d: usize,
    out: &mut [f32],
    pf: &mut TilePrefetch<'_>,
) {
    let size = if E == F32 { 4 } else { 2 };
    if !fits(d)
        || H * R > 16
        || !TILE.is_multiple_of(R)
        || q.len() < H * d
        || out.len() < H * TILE
        || rows.iter().any(|r| r.len() < d * size)
    {
        return;
    }
    let q = q.as_ptr();
    for r0 in (0..TILE).step_by(R) {
        let mut a = [[_mm512_setzero_ps(); R]; H];
        let mut c = 0;
        while c + 16 <= d {
            // SAFETY: `c + 16 <= d`: head `h`'s chunk ends at `h * d + c + 16 <=
            // H * d <= q.len()`; row `r0 + r < TILE` holds `d` elements.
            let mut qv = [_mm512_setzero_ps(); H];
            for (h, qv) in qv.iter_mut().enumerate() {
                *qv = _mm512_loadu_ps(q.add(h * d + c));
            }
            for r in 0..R {
                let k = load16::<E>(rows[r0 + r].as_ptr().add(c * size));
                for h in 0..H {
                    a[h][r] = _mm512_fmadd_ps(qv[h], k, a[h][r]);
                }
            }
            pf.step();
            c += 16;
        }
        let mut flat = [_mm512_setzero_ps(); 16];
        for h in 0..H {
            for r in 0..R {
                flat[h * R + r] = a[h][r];
            }
        }
        let mut sums = [0.0f32; 16];
        // SAFETY: `sums` holds 16 floats.
        _mm512_storeu_ps(sums.as_mut_ptr(), transpose_sum(&flat));
        for h in 0..H {
            out[h * TILE + r0..h * TILE + r0 + R].copy_from_slice(&sums[h * R..(h + 1) * R]);
        }
    }
}

/// Lane `r` of the result is the sum of the 16 lanes of `a[r]`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn transpose_sum(a: &[__m512; 16]) -> __m512 {
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

/// Element kinds of [`load16`], as const parameters.
const F32: u8 = 0;
const F16: u8 = 1;
pub(crate) const BF16: u8 = 2;

/// 16 elements of kind `E` at `src`, as f32.
///
/// # Safety
/// `src` must be valid for reading 16 elements; the CPU must have AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn load16<const E: u8>(src: *const u8) -> __m512 {
    match E {
        F32 => _mm512_loadu_ps(src as *const f32),
        F16 => _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i)),
        _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
            src as *const __m256i,
        )))),
    }
}

/// `acc[h][j] += sum_i p[h][i] * v_i[j]` for the `H` heads of `acc`
/// (`[H, d]`) and `p` (`[H, TILE]`), over the rows `v_i` (raw elements of
/// kind `E`, at least `d` each).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn accumulate_rows<const E: u8, const H: usize>(
    acc: &mut [f32],
    p: &[f32],
    rows: &[&[u8]],
    d: usize,
    pf: &mut TilePrefetch<'_>,
) {
    let size = if E == F32 { 4 } else { 2 };
    if !fits(d)
        || acc.len() < H * d
        || p.len() < H * TILE
        || rows.len() > TILE
        || rows.iter().any(|r| r.len() < d * size)
    {
        return;
    }
    let mut c = 0;
    while c + 64 <= d {
        accumulate_rows_block::<E, H, 4>(acc, p, rows, d, c, pf);
        c += 64;
    }
    while c + 16 <= d {
        accumulate_rows_block::<E, H, 1>(acc, p, rows, d, c, pf);
        c += 16;
    }
}

/// Columns `c .. c + 16 * C` of [`accumulate_rows`], in `H * C` registers.
///
/// # Safety
/// The CPU must have AVX-512F, and the lengths must be as `accumulate_rows`
/// checks them: `acc.len() >= H * d`, `p.len() >= H * TILE`, `rows.len() <=
/// TILE`, every row at least `d` elements of kind `E`.
// `a[h][j]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_rows_block<const E: u8, const H: usize, const C: usize>(
    acc: &mut [f32],
    p: &[f32],
    rows: &[&[u8]],
    d: usize,
    c: usize,
    pf: &mut TilePrefetch<'_>,
) {
    let size = if E == F32 { 4 } else { 2 };
    // SAFETY (all loads and stores below): `accumulate_rows` checked
    // `acc.len() >= H * d`, `p.len() >= H * TILE`, `rows.len() <= TILE` and
    // every row holds `d` elements; columns `c .. c + 16 * C <= d`.
    if c + 16 * C > d {
        return;
    }
    let acc = acc.as_mut_ptr();
    let mut a = [[_mm512_setzero_ps(); C]; H];
    for (h, a) in a.iter_mut().enumerate() {
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(acc.add(h * d + c + 16 * j));
        }
    }
    for (i, row) in rows.iter().enumerate() {
        let mut pb = [_mm512_setzero_ps(); H];
        for (h, pb) in pb.iter_mut().enumerate() {
            *pb = _mm512_set1_ps(*p.get_unchecked(h * TILE + i));
        }
        let src = row.as_ptr().add(c * size);
        for j in 0..C {
            let v = load16::<E>(src.add(16 * j * size));
            for h in 0..H {
                a[h][j] = _mm512_fmadd_ps(pb[h], v, a[h][j]);
            }
        }
        if i % 4 == 3 {
            pf.step();
        }
    }
    for (h, a) in a.iter().enumerate() {
        for (j, a) in a.iter().enumerate() {
            _mm512_storeu_ps(acc.add(h * d + c + 16 * j), *a);
        }
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
pub(crate) unsafe fn exp2(x: __m512) -> __m512 {
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
            // Four heads against 16 rows given as raw bf16 bytes.
            let q: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.3).sin()).collect();
            let rows: Vec<f32> = (0..TILE * d).map(|i| (i as f32 * 0.17).cos()).collect();
            let bytes = decode_attn_core::dtype::encode(decode_attn_core::DType::Bf16, &rows);
            let rows = decode_attn_core::dtype::decode(decode_attn_core::DType::Bf16, &bytes);
            let mut k_rows: [&[u8]; TILE] = [&[]; TILE];
            for (r, row) in k_rows.iter_mut().enumerate() {
                *row = &bytes[r * d * 2..(r + 1) * d * 2];
            }
            let mut s = vec![0.0f32; 4 * TILE];
            // SAFETY: the features were detected above.
            unsafe { scores_heads::<BF16, 4, 4>(&q, &k_rows, d, &mut s, &mut TilePrefetch::none()) };
            for (k, &s) in s.iter().enumerate() {
                let (h, r) = (k / TILE, k % TILE);
                let exact: f64 = (0..d).map(|j| q[h * d + j] as f64 * rows[r * d + j] as f64).sum();
                assert!((s as f64 - exact).abs() < 1e-4, "d={d} head {h} row {r}: {s} vs {exact}");
            }
            // Three heads' weights over 13 rows, rows given as raw f32 bytes.
            let p: Vec<f32> = (0..3 * TILE).map(|i| (i % TILE) as f32 * 0.1 + (i / TILE) as f32).collect();
            let v: Vec<f32> = (0..13 * d).map(|i| (i as f32 * 0.05).sin()).collect();
            let bytes = decode_attn_core::dtype::encode(decode_attn_core::DType::F32, &v);
            let rows: Vec<&[u8]> = bytes.chunks_exact(d * 4).collect();
            let mut acc = vec![0.5f32; 3 * d];
            // SAFETY: the features were detected above.
            unsafe { accumulate_rows::<F32, 3>(&mut acc, &p, &rows, d, &mut TilePrefetch::none()) };
            for (k, &a) in acc.iter().enumerate() {
                let (h, j) = (k / d, k % d);
                let exact: f64 = 0.5 + (0..13).map(|i| p[h * TILE + i] as f64 * v[i * d + j] as f64).sum::<f64>();
                assert!((a as f64 - exact).abs() < 1e-4, "d={d} head {h} column {j}: {a} vs {exact}");
            }
        }
    }
}

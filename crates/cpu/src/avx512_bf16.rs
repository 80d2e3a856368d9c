//! The hot loop for bf16 KV on CPUs with AVX512_BF16 (AMD Zen 4 and later,
//! Intel Cooper Lake and Sapphire Rapids and later), selected at run time by
//! [`crate::kernel::Isa::detect`] for head dims that are a multiple of 32.
//! `vdpbf16ps` multiplies 32 pairs of bf16 and adds each pair's two products
//! into one of 16 f32 lanes: twice the multiply-adds of an f32 FMA per
//! instruction, on the raw bytes of the cache, with nothing to widen first.
//! Grouped-query shapes, whose query heads share each K and V element
//! (Llama-3-70B at TP=8: 8 heads, 4 multiply-adds per byte), spend most of
//! their time on the CPU in that arithmetic (docs/PERFORMANCE.md, "The CPU
//! backend"), which is where this pays. On Zen 4 `vdpbf16ps` issues one a
//! cycle, and a 70B tile runs at about 45% of that rate (s37).
//!
//! * Scores: the queries as the bf16 values they were given in (the backend
//!   hands them over scaled, and this path divides the scale back out and
//!   checks that it got them exactly: [`unscaled_bf16_queries`]; others go to
//!   `avx512.rs`), dotted with the K rows 32 elements an instruction, 4
//!   heads by 4 rows at a time, reduced as `avx512.rs` does, then scaled;
//! * the online softmax of `avx512.rs`;
//! * P·V, where the output is bf16 or f16 (`Work::weights_in_bf16`), with P
//!   rounded to bf16, as FlashAttention-2 and the CUDA tensor-core kernel
//!   do (an f32 output keeps `avx512.rs`'s f32 loop for V): the V rows of two tokens are interleaved
//!   (`vpunpck{l,h}wd`) so that each lane holds one column's two tokens,
//!   against a register holding both tokens' weights. The interleave puts a
//!   32-column chunk's columns in "dot order" (see [`dot_column`]); the
//!   item's accumulators are kept in that order and put back at its end, as
//!   `avx2.rs` does with its pair order.
//!
//! Every pointer read or written comes from a slice whose length is checked
//! first (see each `SAFETY` comment); the only other requirement of the
//! `unsafe` functions is that the CPU has AVX-512F, AVX-512BW, AVX512_BF16
//! (and AVX2, FMA and F16C, for `avx512.rs`'s helpers).

use std::arch::x86_64::*;

use crate::avx512;
use crate::kernel::{self, Elt, Scratch, State, TilePrefetch, Work, TILE};

/// Head dims this path takes: a positive multiple of 32 (whole 64-byte rows
/// of bf16 per instruction).
pub(crate) fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(32)
}

/// The queries `q` (multiplied by `scale` from bf16 values, as the backend
/// does) divided back into those bf16 values, in `out`; false, leaving `out`
/// unspecified, where any of them was not such a product (queries given as
/// f16 or f32, which go to `avx512.rs`, whose scores are f32 throughout).
/// Each is checked by multiplying it back, so the scores here are `scale`
/// times the dot products of exactly the queries the caller gave.
pub(crate) fn unscaled_bf16_queries(q: &[f32], scale: f32, out: &mut Vec<f32>) -> bool {
    if !(scale.is_finite() && scale > 0.0) {
        return false;
    }
    out.clear();
    out.extend(q.iter().map(|&x| round_to_bf16(x / scale)));
    out.iter().zip(q).all(|(&x, &scaled)| (x * scale).to_bits() == scaled.to_bits())
}

/// Packs each row of `x` (`[_, d]`, `d` even, bf16 values as f32) into its
/// first `d / 2` slots as the bf16 bits themselves, two to a 32-bit slot
/// (element `2j` in the low half of slot `j`): the layout `vdpbf16ps` reads,
/// made once per item rather than converted at every tile. The rest of each
/// row is left as it was.
fn pack_bf16_rows(x: &mut [f32], d: usize) {
    for row in x.chunks_exact_mut(d) {
        // Slot `j` is written after elements `2j` and `2j + 1 >= j` are read,
        // and no later slot reads below `2j`.
        for j in 0..d / 2 {
            let (even, odd) = (row[2 * j].to_bits() >> 16, row[2 * j + 1].to_bits() >> 16);
            row[j] = f32::from_bits(even | (odd << 16));
        }
    }
}

/// `x` rounded to the nearest bf16 value (ties to even), as an f32; NaN
/// stays NaN (a NaN query gives NaN scores here as on every path).
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    if x.is_nan() {
        x
    } else {
        f32::from_bits(rounded)
    }
}

/// How many tiles ahead of the one being computed K and V rows are prefetched.
const PREFETCH_TILES: usize = 2;

/// The natural column (within its 32-column chunk) of position `pos` in dot
/// order. `vpunpcklwd` of two rows' 32-column chunks gives, in 128-bit lane
/// `l`, the pairs of columns `8l .. 8l + 4`; `vpunpckhwd` those of `8l + 4 ..
/// 8l + 8`. So the low accumulator's lane `k` (positions 0-15) holds column
/// `8 * (k / 4) + k % 4`, and the high one's (positions 16-31) that plus 4.
const fn dot_column(pos: usize) -> usize {
    let k = pos % 16;
    8 * (k / 4) + k % 4 + 4 * (pos / 16)
}

/// Puts each 32-column chunk of each row of `x` (`[_, d]`, `d` a multiple
/// of 32) into dot order.
fn to_dot_order(x: &mut [f32], d: usize) {
    for chunk in x.chunks_exact_mut(d).flat_map(|row| row.chunks_exact_mut(32)) {
        let natural: [f32; 32] = std::array::from_fn(|i| chunk[i]);
        for (pos, x) in chunk.iter_mut().enumerate() {
            *x = natural[dot_column(pos)];
        }
    }
}

/// Undoes [`to_dot_order`].
fn from_dot_order(x: &mut [f32], d: usize) {
    for chunk in x.chunks_exact_mut(d).flat_map(|row| row.chunks_exact_mut(32)) {
        let dot: [f32; 32] = std::array::from_fn(|i| chunk[i]);
        for (pos, &x) in dot.iter().enumerate() {
            chunk[dot_column(pos)] = x;
        }
    }
}

/// Calls of `TilePrefetch::step` one tile of one KV head makes (`g` query
/// heads, head dim `d`), for each group of up to four heads: one per
/// 32-element chunk of each group of four rows scored; then, where V goes
/// through the bf16 loop (`dot_v`), one per pair of rows of each column
/// block, else as `avx512.rs`'s f32 loop steps (one per four rows of each
/// column block of 64, then of 16).
fn prefetch_steps(g: usize, d: usize, dot_v: bool) -> usize {
    let v_steps = if dot_v { (d / 64 + (d % 64) / 32) * (TILE / 2) } else { (d / 64 + (d % 64) / 16) * (TILE / 4) };
    g.div_ceil(4) * ((TILE / 4) * (d / 32) + v_steps)
}

/// Runs one work item (see `kernel::attend`) and returns true; returns false,
/// touching nothing, where it does not apply: KV other than bf16, queries
/// that are not bf16 values, a head dim that is not a multiple of 32,
/// lengths that disagree.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, AVX512_BF16, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn attend(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) -> bool {
    let d = work.head_dim;
    if kv != Elt::Bf16 || !fits(d) {
        return false;
    }
    let Some(g) = kernel::item_group(work, state, scratch) else {
        return false;
    };
    if !unscaled_bf16_queries(work.q, work.q_scale, &mut scratch.q) {
        return false;
    }
    pack_bf16_rows(&mut scratch.q, d);
    let (scale, dot_v) = (work.q_scale, work.weights_in_bf16);
    if dot_v {
        to_dot_order(&mut state.acc, d);
    }
    let scores = &mut scratch.s[..g * TILE];
    let steps = work.kv_heads * prefetch_steps(g, d, dot_v);
    kernel::for_each_head_tile(kv, work, &scratch.q, state, PREFETCH_TILES, steps, |t, pf| {
        // SAFETY: `attend`'s caller guarantees the features.
        unsafe { tile(t.q, scale, dot_v, t.m, t.l, t.acc, scores, t.k_rows, t.v_rows, d, pf) }
    });
    if dot_v {
        from_dot_order(&mut state.acc, d);
    }
    true
}

/// One tile of one KV head, as `avx512.rs`'s `tile` for bf16 KV: the scores
/// of its `g` query heads (`q`, `[g, d]`, bf16 values packed by
/// [`pack_bf16_rows`]; the scores are
/// `scale` times their dot products) against the tile's K rows, the
/// online-softmax update of `m`, `l` and `acc` (`[g, d]`), and the V rows
/// accumulated: with the weights rounded to bf16 and `acc` in dot order
/// where `dot_v`, else by `avx512.rs`'s f32 loop in natural order. `v_rows` holds the tile's valid rows; `k_rows`
/// past them repeat a valid row (masked out).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn tile(
    q: &[f32],
    scale: f32,
    dot_v: bool,
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
    for (h, heads) in kernel::head_groups(g) {
        let q = &q[h * d..(h + heads) * d];
        let out = &mut s[h * TILE..(h + heads) * TILE];
        match heads {
            1 => scores_heads::<1>(q, scale, k_rows, d, out, pf),
            2 => scores_heads::<2>(q, scale, k_rows, d, out, pf),
            3 => scores_heads::<3>(q, scale, k_rows, d, out, pf),
            _ => scores_heads::<4>(q, scale, k_rows, d, out, pf),
        }
    }
    avx512::online_softmax(s, m, l, acc, n, d);
    for (h, heads) in kernel::head_groups(g) {
        let acc = &mut acc[h * d..(h + heads) * d];
        let p = &s[h * TILE..(h + heads) * TILE];
        match (dot_v, heads) {
            (true, 1) => accumulate_rows::<1>(acc, p, v_rows, d, pf),
            (true, 2) => accumulate_rows::<2>(acc, p, v_rows, d, pf),
            (true, 3) => accumulate_rows::<3>(acc, p, v_rows, d, pf),
            (true, _) => accumulate_rows::<4>(acc, p, v_rows, d, pf),
            (false, 1) => avx512::accumulate_rows::<{ avx512::BF16 }, 1>(acc, p, v_rows, d, pf),
            (false, 2) => avx512::accumulate_rows::<{ avx512::BF16 }, 2>(acc, p, v_rows, d, pf),
            (false, 3) => avx512::accumulate_rows::<{ avx512::BF16 }, 3>(acc, p, v_rows, d, pf),
            (false, _) => avx512::accumulate_rows::<{ avx512::BF16 }, 4>(acc, p, v_rows, d, pf),
        }
    }
}

/// The largest head dim in 32-element chunks (256 / 32).
const MAX_CHUNKS: usize = 8;

/// Scores of the `H` heads of `q` (`[H, d]`, each row bf16 values packed by
/// [`pack_bf16_rows`]) against the 16 rows
/// of K in `rows` (raw bf16, at least `d` each), times `scale`, written to
/// `out` (`[H, TILE]`), four rows at a time (`4 * H <= 16` running dot
/// products).
// `a[h][r]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn scores_heads<const H: usize>(
    q: &[f32],
    scale: f32,
    rows: &[&[u8]; TILE],
    d: usize,
    out: &mut [f32],
    pf: &mut TilePrefetch<'_>,
) {
    const R: usize = 4;
    let chunks = d / 32;
    if !fits(d)
        || chunks > MAX_CHUNKS
        || H > 4
        || q.len() < H * d
        || out.len() < H * TILE
        || rows.iter().any(|r| r.len() < d * 2)
    {
        return;
    }
    // The heads' queries, packed bf16 (`pack_bf16_rows`), 32 to a register.
    let mut qb = [[_mm512_setzero_si512(); MAX_CHUNKS]; H];
    for h in 0..H {
        for c in 0..chunks {
            // SAFETY: `(c + 1) * 32 <= d`: the 64 bytes (16 slots) from slot
            // `16 * c` of head `h`'s row lie in its first `d / 2` slots, in `q`
            // (`q.len() >= H * d`).
            qb[h][c] = _mm512_loadu_si512(q.as_ptr().add(h * d + 16 * c) as *const _);
        }
    }
    for r0 in (0..TILE).step_by(R) {
        let mut a = [[_mm512_setzero_ps(); R]; H];
        for c in 0..chunks {
            for r in 0..R {
                // SAFETY: row `r0 + r < TILE` holds `d >= 32 * (c + 1)` bf16
                // elements: 64 bytes from element `32 * c`.
                let k = bits_bh(_mm512_loadu_si512(rows[r0 + r].as_ptr().add(64 * c) as *const _));
                for h in 0..H {
                    a[h][r] = _mm512_dpbf16_ps(a[h][r], bits_bh(qb[h][c]), k);
                }
            }
            pf.step();
        }
        let mut flat = [_mm512_setzero_ps(); 16];
        for h in 0..H {
            for r in 0..R {
                flat[h * R + r] = a[h][r];
            }
        }
        let mut sums = [0.0f32; 16];
        // SAFETY: `sums` holds 16 floats.
        _mm512_storeu_ps(sums.as_mut_ptr(), _mm512_mul_ps(avx512::transpose_sum(&flat), _mm512_set1_ps(scale)));
        for h in 0..H {
            out[h * TILE + r0..h * TILE + r0 + R].copy_from_slice(&sums[h * R..(h + 1) * R]);
        }
    }
}

/// `acc[h][j] += sum_i p[h][i] * v_i[j]` for the `H` heads of `acc` (`[H,
/// d]`, dot order) and `p` (`[H, TILE]`, rounded to bf16 here), over the
/// rows `v_i` (raw bf16, at least `d` each), two rows an instruction.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_rows<const H: usize>(
    acc: &mut [f32],
    p: &[f32],
    rows: &[&[u8]],
    d: usize,
    pf: &mut TilePrefetch<'_>,
) {
    if !fits(d)
        || H > 4
        || acc.len() < H * d
        || p.len() < H * TILE
        || rows.is_empty()
        || rows.len() > TILE
        || rows.iter().any(|r| r.len() < d * 2)
    {
        return;
    }
    // Each head's 16 weights as bf16, two tokens' to a 32-bit word: word `j`
    // holds tokens `2j` (low half) and `2j + 1`. Weights past the tile's
    // rows are 0 (`online_softmax`).
    let mut pairs = [[0u32; TILE / 2]; H];
    for (h, pairs) in pairs.iter_mut().enumerate() {
        // SAFETY: head `h`'s 16 weights lie in `p` (`p.len() >= H * TILE`);
        // `pairs` holds 8 words, 32 bytes.
        let weights = _mm512_cvtneps_pbh(_mm512_loadu_ps(p.as_ptr().add(h * TILE)));
        _mm256_storeu_si256(pairs.as_mut_ptr() as *mut __m256i, std::mem::transmute::<__m256bh, __m256i>(weights));
    }
    let mut c = 0;
    while c + 64 <= d {
        accumulate_rows_block::<H, 2>(acc, &pairs, rows, d, c, pf);
        c += 64;
    }
    if c + 32 <= d {
        accumulate_rows_block::<H, 1>(acc, &pairs, rows, d, c, pf);
    }
}

/// Columns `c .. c + 32 * C` of [`accumulate_rows`], in `2 * H * C`
/// registers (a low and a high half of each 32-column chunk).
///
/// # Safety
/// The CPU must have the module's features, and the lengths must be as
/// `accumulate_rows` checks them: `acc.len() >= H * d`, `1 <= rows.len() <=
/// TILE`, every row at least `d` bf16 elements.
// `a[h][j]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_rows_block<const H: usize, const C: usize>(
    acc: &mut [f32],
    pairs: &[[u32; TILE / 2]; H],
    rows: &[&[u8]],
    d: usize,
    c: usize,
    pf: &mut TilePrefetch<'_>,
) {
    // SAFETY (all loads and stores below): `accumulate_rows` checked
    // `acc.len() >= H * d`, `1 <= rows.len() <= TILE` and that every row
    // holds `d` bf16 elements; columns `c .. c + 32 * C <= d`.
    if c + 32 * C > d || rows.is_empty() {
        return;
    }
    let acc = acc.as_mut_ptr();
    let mut a = [[[_mm512_setzero_ps(); 2]; C]; H];
    for h in 0..H {
        for j in 0..C {
            for half in 0..2 {
                a[h][j][half] = _mm512_loadu_ps(acc.add(h * d + c + 32 * j + 16 * half));
            }
        }
    }
    let n = rows.len();
    for pair in 0..n.div_ceil(2) {
        // An odd last row pairs with itself, its second weight 0.
        let (first, second) = (rows[2 * pair], rows[(2 * pair + 1).min(n - 1)]);
        let mut weights = [_mm512_setzero_si512(); H];
        for h in 0..H {
            weights[h] = _mm512_set1_epi32(pairs[h][pair] as i32);
        }
        for j in 0..C {
            let offset = 2 * (c + 32 * j);
            let x = _mm512_loadu_si512(first.as_ptr().add(offset) as *const _);
            let y = _mm512_loadu_si512(second.as_ptr().add(offset) as *const _);
            let interleaved = [_mm512_unpacklo_epi16(x, y), _mm512_unpackhi_epi16(x, y)];
            for h in 0..H {
                for half in 0..2 {
                    a[h][j][half] = _mm512_dpbf16_ps(a[h][j][half], bits_bh(interleaved[half]), bits_bh(weights[h]));
                }
            }
        }
        pf.step();
    }
    for h in 0..H {
        for j in 0..C {
            for half in 0..2 {
                _mm512_storeu_ps(acc.add(h * d + c + 32 * j + 16 * half), a[h][j][half]);
            }
        }
    }
}

/// A register of plain bits as 32 bf16: the same 512 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn bits_bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit vector types; every bit pattern is valid in each.
    std::mem::transmute::<__m512i, __m512bh>(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have() -> bool {
        crate::kernel::Isa::detect().without_amx().name() == "avx512-bf16"
    }

    #[test]
    fn dot_order_is_a_permutation_and_round_trips() {
        let mut seen = [false; 32];
        for pos in 0..32 {
            seen[dot_column(pos)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        let d = 64;
        let original: Vec<f32> = (0..2 * d).map(|i| i as f32).collect();
        let mut x = original.clone();
        to_dot_order(&mut x, d);
        assert_ne!(x, original);
        assert_eq!(x[4], 8.0, "position 4 holds column 8");
        assert_eq!(x[16], 4.0, "position 16 holds column 4");
        from_dot_order(&mut x, d);
        assert_eq!(x, original);
    }

    #[test]
    fn only_scaled_bf16_queries_take_this_path() {
        let scale = 0.125 * std::f32::consts::LOG2_E;
        let bf16: Vec<f32> = (0..512).map(|i| round_to_bf16((i as f32 * 0.37).sin() * 3.0)).collect();
        let scaled: Vec<f32> = bf16.iter().map(|&x| x * scale).collect();
        let mut out = Vec::new();
        assert!(unscaled_bf16_queries(&scaled, scale, &mut out));
        assert_eq!(out, bf16, "the bf16 values come back exactly");
        let mut f32_query = scaled.clone();
        f32_query[7] = 0.1234567 * scale;
        assert!(!unscaled_bf16_queries(&f32_query, scale, &mut out));
        assert!(!unscaled_bf16_queries(&scaled, 0.0, &mut out));
        assert!(round_to_bf16(f32::NAN).is_nan());
        assert_eq!(round_to_bf16(f32::from_bits(0x3f80_8000)), 1.0, "a tie goes to even");
        assert_eq!(round_to_bf16(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82_0000, "a tie goes to even");
    }

    #[test]
    fn scores_and_accumulate_match_plain_loops() {
        if !have() {
            eprintln!("SKIPPED: this CPU has no AVX512_BF16");
            return;
        }
        let bf16 = round_to_bf16;
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS.iter().filter(|&&d| fits(d)) {
            // Three heads against 16 rows given as raw bf16 bytes; bf16 queries.
            let q: Vec<f32> = (0..3 * d).map(|i| bf16((i as f32 * 0.3).sin())).collect();
            let rows: Vec<f32> = (0..TILE * d).map(|i| (i as f32 * 0.17).cos()).collect();
            let bytes = decode_attn_core::dtype::encode(decode_attn_core::DType::Bf16, &rows);
            let rows = decode_attn_core::dtype::decode(decode_attn_core::DType::Bf16, &bytes);
            let mut k_rows: [&[u8]; TILE] = [&[]; TILE];
            for (r, row) in k_rows.iter_mut().enumerate() {
                *row = &bytes[r * d * 2..(r + 1) * d * 2];
            }
            let mut packed = q.clone();
            pack_bf16_rows(&mut packed, d);
            let mut s = vec![f32::NAN; 3 * TILE];
            // SAFETY: the features were detected above.
            unsafe { scores_heads::<3>(&packed, 0.5, &k_rows, d, &mut s, &mut TilePrefetch::none()) };
            for (k, &s) in s.iter().enumerate() {
                let (h, r) = (k / TILE, k % TILE);
                let exact: f64 = 0.5 * (0..d).map(|j| q[h * d + j] as f64 * rows[r * d + j] as f64).sum::<f64>();
                assert!((s as f64 - exact).abs() < 1e-4, "d={d} head {h} row {r}: {s} vs {exact}");
            }
            // Four heads' weights over 13 rows (an odd count: the last row
            // pairs with itself); weights exact in bf16, so the sums match
            // f64 to f32 rounding.
            let p: Vec<f32> = (0..4 * TILE)
                .map(|i| if i % TILE < 13 { bf16(((i % TILE) as f32 + 1.0) * 0.07) } else { 0.0 })
                .collect();
            let v: Vec<f32> = (0..13 * d).map(|i| (i as f32 * 0.05).sin()).collect();
            let bytes = decode_attn_core::dtype::encode(decode_attn_core::DType::Bf16, &v);
            let v = decode_attn_core::dtype::decode(decode_attn_core::DType::Bf16, &bytes);
            let v_rows: Vec<&[u8]> = bytes.chunks_exact(d * 2).collect();
            let mut acc: Vec<f32> = (0..4 * d).map(|i| 0.5 + i as f32 * 1e-3).collect();
            let start = acc.clone();
            to_dot_order(&mut acc, d);
            // SAFETY: the features were detected above.
            unsafe { accumulate_rows::<4>(&mut acc, &p, &v_rows, d, &mut TilePrefetch::none()) };
            from_dot_order(&mut acc, d);
            for (k, &a) in acc.iter().enumerate() {
                let (h, j) = (k / d, k % d);
                let exact: f64 =
                    start[k] as f64 + (0..13).map(|i| p[h * TILE + i] as f64 * v[i * d + j] as f64).sum::<f64>();
                assert!((a as f64 - exact).abs() < 1e-4, "d={d} head {h} column {j}: {a} vs {exact}");
            }
        }
    }
}

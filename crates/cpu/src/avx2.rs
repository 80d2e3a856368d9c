//! The hot loop in AVX2 + FMA + F16C intrinsics (x86-64 only), selected at
//! run time by [`crate::kernel::Isa::detect`] for head dims that are a
//! multiple of 8 (every supported one). The design of `avx512.rs` at half the
//! width, with 16 registers:
//!
//! * K rows read straight from the cache: for a group of up to four query
//!   heads, each 8-element chunk of a row is decoded once into a register and
//!   used by every head of the group (up to 8 running dot products), then
//!   reduced into a vector of 8 scores;
//! * the online softmax on the tile's 16 scores per head, rows past a partial
//!   tile's end masked out;
//! * V rows read straight from the cache, each 8-element chunk decoded once
//!   into a register and accumulated into up to four heads at a time, 16
//!   columns per head held in registers over the tile's rows (64 for one head);
//! * bf16 rows read in pair order (see [`load_half`]): a 16-element group as
//!   its 8 even elements, then its 8 odd ones, a load and a shift or a mask
//!   each; the item's queries and accumulators are put into that order for
//!   the item and the accumulators back out of it.
//!
//! The work item is walked by `kernel::for_each_head_tile`, as `avx512.rs`'s
//! is: tile by tile, every KV head in turn, so the item reads its slots' rows
//! of all its heads (one contiguous run per slot) rather than one head's rows
//! at a stride of a whole slot; the rows of the tile [`PREFETCH_TILES`] ahead
//! are asked for a few cache lines at a time from inside the arithmetic, so
//! that memory and compute overlap.
//!
//! Every pointer read or written comes from a slice whose length is checked
//! first (see each `SAFETY` comment); the only other requirement of the
//! `unsafe` functions is that the CPU has AVX2, FMA and F16C.

use std::arch::x86_64::*;

use crate::kernel::{self, Elt, Fused, Scratch, State, TilePrefetch, Work, TILE};

/// Head dims this path takes: a positive multiple of 8.
pub(crate) fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(8)
}

/// How many tiles ahead of the one being computed K and V rows are prefetched.
const PREFETCH_TILES: usize = 2;

/// Rows scored per pass by a group of `heads` query heads: `heads * rows`
/// running dot products, plus `heads` query chunks and one K chunk, fit the
/// 16 registers.
const fn score_rows(heads: usize) -> usize {
    match heads {
        1 => 8,
        2 => 4,
        _ => 2,
    }
}

/// Accumulator registers (8 columns each) per head of a group of `heads`
/// heads over V: `heads * regs` accumulators, plus `heads` weights and the V
/// chunks, fit the 16 registers.
const fn acc_regs(heads: usize) -> usize {
    match heads {
        1 => 8,
        2 => 4,
        _ => 2,
    }
}

/// Calls of `TilePrefetch::step` one tile of one KV head makes (`g` query
/// heads, head dim `d`): one per pass of [`scores_heads`] and one per column
/// block of [`accumulate_rows`], so that a future tile's lines spread evenly
/// over the tile. A step in every chunk's iteration instead made that
/// loop's bookkeeping longer than its arithmetic.
fn prefetch_steps(g: usize, d: usize) -> usize {
    kernel::head_groups(g).map(|(_, heads)| TILE / score_rows(heads) + column_blocks(acc_regs(heads), d)).sum()
}

/// Column blocks [`accumulate_rows`] walks with `regs` registers a head
/// (`regs` even): blocks of `8 * regs` columns, then of 16, over the whole
/// 16-column groups; then the last 8 columns where `d % 16 == 8`.
const fn column_blocks(regs: usize, d: usize) -> usize {
    let paired = d / 16 * 16;
    paired / (8 * regs) + paired % (8 * regs) / 16 + (d % 16) / 8
}

/// Runs one work item (see `kernel::attend`) and returns true; returns false,
/// touching nothing, where the shapes do not fit (a head dim that is not a
/// multiple of 8, lengths that disagree).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) -> bool {
    let d = work.head_dim;
    let Some(g) = kernel::item_group(work, state, scratch).filter(|_| fits(d)) else {
        return false;
    };
    // The loops read bf16 in pair order (see `load_half`): the queries and the
    // accumulators go into it for the item, and the accumulators back out.
    let paired = kv == Elt::Bf16;
    let queries = if paired {
        scratch.q.clear();
        scratch.q.extend_from_slice(work.q);
        to_pair_order(&mut scratch.q, d);
        to_pair_order(&mut state.acc, d);
        &scratch.q
    } else {
        work.q
    };
    let scores = &mut scratch.s[..g * TILE];
    let steps = work.kv_heads * prefetch_steps(g, d);
    kernel::for_each_head_tile(kv, work, queries, state, PREFETCH_TILES, steps, |t, pf| {
        // SAFETY: `attend`'s caller guarantees AVX2, FMA and F16C.
        unsafe { tile(kv, t.q, t.m, t.l, t.acc, scores, t.k_rows, t.v_rows, d, pf) }
    });
    if paired {
        from_pair_order(&mut state.acc, d);
    }
    true
}

/// Puts each row of `x` (`[_, d]`) into pair order: each whole 16-element
/// group as its 8 even-indexed elements, then its 8 odd-indexed ones; a last
/// 8 (`d % 16 == 8`) stays as it is.
fn to_pair_order(x: &mut [f32], d: usize) {
    for group in x.chunks_exact_mut(d).flat_map(|row| row.chunks_exact_mut(16)) {
        let natural: [f32; 16] = std::array::from_fn(|i| group[i]);
        for i in 0..8 {
            group[i] = natural[2 * i];
            group[8 + i] = natural[2 * i + 1];
        }
    }
}

/// Undoes [`to_pair_order`].
fn from_pair_order(x: &mut [f32], d: usize) {
    for group in x.chunks_exact_mut(d).flat_map(|row| row.chunks_exact_mut(16)) {
        let paired: [f32; 16] = std::array::from_fn(|i| group[i]);
        for i in 0..8 {
            group[2 * i] = paired[i];
            group[2 * i + 1] = paired[8 + i];
        }
    }
}

/// One tile of one KV head: the scores of its `g` query heads (`q`, `[g,
/// d]`) against the tile's K rows, the online-softmax update of `m`, `l` and
/// `acc` (`[g, d]`), and the V rows accumulated. `v_rows` holds the tile's
/// valid rows; `k_rows` past them repeat a valid row (masked out).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
    // Scores of up to four heads at a time: each 8-element K chunk is decoded
    // once into a register and used by every head of the group.
    for (h, heads) in kernel::head_groups(g) {
        let q = &q[h * d..(h + heads) * d];
        let out = &mut s[h * TILE..(h + heads) * TILE];
        match (kv, heads) {
            (Elt::F32, 1) => scores_heads::<F32, 1, { score_rows(1) }>(q, k_rows, d, out, pf),
            (Elt::F32, 2) => scores_heads::<F32, 2, { score_rows(2) }>(q, k_rows, d, out, pf),
            (Elt::F32, 3) => scores_heads::<F32, 3, { score_rows(3) }>(q, k_rows, d, out, pf),
            (Elt::F32, _) => scores_heads::<F32, 4, { score_rows(4) }>(q, k_rows, d, out, pf),
            (Elt::F16, 1) => scores_heads::<F16, 1, { score_rows(1) }>(q, k_rows, d, out, pf),
            (Elt::F16, 2) => scores_heads::<F16, 2, { score_rows(2) }>(q, k_rows, d, out, pf),
            (Elt::F16, 3) => scores_heads::<F16, 3, { score_rows(3) }>(q, k_rows, d, out, pf),
            (Elt::F16, _) => scores_heads::<F16, 4, { score_rows(4) }>(q, k_rows, d, out, pf),
            (Elt::Bf16, 1) => scores_heads::<BF16, 1, { score_rows(1) }>(q, k_rows, d, out, pf),
            (Elt::Bf16, 2) => scores_heads::<BF16, 2, { score_rows(2) }>(q, k_rows, d, out, pf),
            (Elt::Bf16, 3) => scores_heads::<BF16, 3, { score_rows(3) }>(q, k_rows, d, out, pf),
            (Elt::Bf16, _) => scores_heads::<BF16, 4, { score_rows(4) }>(q, k_rows, d, out, pf),
        }
    }
    // Lanes of rows past the tile's end (a sequence's last, partial tile).
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let valid_lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane));
    let valid_hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32 - 8), lane));
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    for h in 0..g {
        let scores = &mut s[h * TILE..(h + 1) * TILE];
        // SAFETY: `scores` holds TILE = 16 floats: two loads of 8.
        let s_lo = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(scores.as_ptr()), valid_lo);
        let s_hi = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(scores.as_ptr().add(8)), valid_hi);
        let tile_max = hmax(_mm256_max_ps(s_lo, s_hi));
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
        let m_new = _mm256_set1_ps(m_new);
        let p_lo = _mm256_and_ps(exp2(_mm256_sub_ps(s_lo, m_new)), valid_lo);
        let p_hi = _mm256_and_ps(exp2(_mm256_sub_ps(s_hi, m_new)), valid_hi);
        l[h] += hsum(_mm256_add_ps(p_lo, p_hi));
        // SAFETY: `scores` holds TILE = 16 floats: two stores of 8.
        _mm256_storeu_ps(scores.as_mut_ptr(), p_lo);
        _mm256_storeu_ps(scores.as_mut_ptr().add(8), p_hi);
    }

    // V: each 8-element chunk is decoded once into a register and
    // accumulated into up to four heads.
    for (h, heads) in kernel::head_groups(g) {
        let acc = &mut acc[h * d..(h + heads) * d];
        let p = &s[h * TILE..(h + heads) * TILE];
        match (kv, heads) {
            (Elt::F32, 1) => accumulate_rows::<F32, 1, { acc_regs(1) }>(acc, p, v_rows, d, pf),
            (Elt::F32, 2) => accumulate_rows::<F32, 2, { acc_regs(2) }>(acc, p, v_rows, d, pf),
            (Elt::F32, 3) => accumulate_rows::<F32, 3, { acc_regs(3) }>(acc, p, v_rows, d, pf),
            (Elt::F32, _) => accumulate_rows::<F32, 4, { acc_regs(4) }>(acc, p, v_rows, d, pf),
            (Elt::F16, 1) => accumulate_rows::<F16, 1, { acc_regs(1) }>(acc, p, v_rows, d, pf),
            (Elt::F16, 2) => accumulate_rows::<F16, 2, { acc_regs(2) }>(acc, p, v_rows, d, pf),
            (Elt::F16, 3) => accumulate_rows::<F16, 3, { acc_regs(3) }>(acc, p, v_rows, d, pf),
            (Elt::F16, _) => accumulate_rows::<F16, 4, { acc_regs(4) }>(acc, p, v_rows, d, pf),
            (Elt::Bf16, 1) => accumulate_rows::<BF16, 1, { acc_regs(1) }>(acc, p, v_rows, d, pf),
            (Elt::Bf16, 2) => accumulate_rows::<BF16, 2, { acc_regs(2) }>(acc, p, v_rows, d, pf),
            (Elt::Bf16, 3) => accumulate_rows::<BF16, 3, { acc_regs(3) }>(acc, p, v_rows, d, pf),
            (Elt::Bf16, _) => accumulate_rows::<BF16, 4, { acc_regs(4) }>(acc, p, v_rows, d, pf),
        }
    }
}

/// Scores of the `H` heads of `q` (`[H, d]`) against the 16 rows of K in
/// `rows` (raw elements of kind `E`, at least `d` each), written to `out`
/// (`[H, TILE]`), `R` rows at a time (`H * R <= 8` running dot products).
// `a[h][r]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
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
        || H * R > 8
        || !TILE.is_multiple_of(R)
        || q.len() < H * d
        || out.len() < H * TILE
        || rows.iter().any(|r| r.len() < d * size)
    {
        return;
    }
    let q = q.as_ptr();
    let high = high_halves();
    for r0 in (0..TILE).step_by(R) {
        let mut a = [[_mm256_setzero_ps(); R]; H];
        let mut c = 0;
        while c + 16 <= d {
            // SAFETY: `c + 16 <= d`: head `h`'s group ends at `h * d + c + 16
            // <= H * d <= q.len()`; row `r0 + r < TILE` holds `d` elements.
            score_chunk::<H, R>(&mut a, q.add(c), d, |r| load_half::<E, 0>(rows[r0 + r].as_ptr().add(c * size), high));
            score_chunk::<H, R>(&mut a, q.add(c + 8), d, |r| {
                load_half::<E, 1>(rows[r0 + r].as_ptr().add(c * size), high)
            });
            c += 16;
        }
        if c + 8 <= d {
            // SAFETY: as above, for the last 8 elements `c .. c + 8 <= d`.
            score_chunk::<H, R>(&mut a, q.add(c), d, |r| load8::<E>(rows[r0 + r].as_ptr().add(c * size)));
        }
        pf.step();
        let mut flat = [_mm256_setzero_ps(); 8];
        for h in 0..H {
            for r in 0..R {
                flat[h * R + r] = a[h][r];
            }
        }
        // Each head's `R` sums go straight to its scores: reading them back
        // from one 32-byte store as single floats stalls the store's
        // forwarding (timed with `transpose_sum`, s52).
        let sums = transpose_sum(&flat);
        for h in 0..H {
            // SAFETY: `out` holds `H * TILE` floats and `r0 + R <= TILE`;
            // `(h + 1) * R <= H * R <= 8` (checked above).
            store_lanes::<R>(sums, h * R, out.as_mut_ptr().add(h * TILE + r0));
        }
    }
}

/// Lanes `first .. first + R` of `sums` (its halves: lanes 0-3, 4-7) to
/// `dst`, `first` a multiple of `R`: one 64- or 128-bit store for `R` 2 or 4,
/// two for 8, and a lane at a time for any other `R`.
///
/// # Safety
/// `dst` must be valid for writing `R` floats, `first + R <= 8`; the CPU must
/// have AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn store_lanes<const R: usize>(sums: [__m128; 2], first: usize, dst: *mut f32) {
    let half = sums[first / 4 % 2];
    match R {
        // One 8-byte store of lanes 0-1 or 2-3 of the half. `dst` is only
        // as aligned as an f32, and `_mm_storel_pd`/`_mm_storeh_pd` store
        // through an `f64` place, which must be 8-aligned (Miri, s55): the
        // pair goes out unaligned, which LLVM still emits as one
        // `vmovlps`/`vmovhps`.
        2 => {
            let pairs = _mm_castps_pd(half);
            let pair = if first.is_multiple_of(4) { pairs } else { _mm_unpackhi_pd(pairs, pairs) };
            std::ptr::write_unaligned(dst.cast::<f64>(), _mm_cvtsd_f64(pair));
        }
        4 => _mm_storeu_ps(dst, half),
        8 => {
            _mm_storeu_ps(dst, sums[0]);
            _mm_storeu_ps(dst.add(4), sums[1]);
        }
        _ => {
            let mut lanes = [0.0f32; 8];
            _mm_storeu_ps(lanes.as_mut_ptr(), sums[0]);
            _mm_storeu_ps(lanes.as_mut_ptr().add(4), sums[1]);
            std::ptr::copy_nonoverlapping(lanes.as_ptr().add(first), dst, R);
        }
    }
}

/// One 8-element chunk of [`scores_heads`]: `a[h][r] += q_h * k_r` for the
/// `H` heads (head `h`'s chunk at `q + h * d`) and the `R` rows' chunks
/// `k(r)`.
///
/// # Safety
/// Every head's chunk must be readable at `q + h * d`; the CPU must have
/// AVX2, FMA and F16C.
// `a[h][r]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn score_chunk<const H: usize, const R: usize>(
    a: &mut [[__m256; R]; H],
    q: *const f32,
    d: usize,
    k: impl Fn(usize) -> __m256,
) {
    let mut qv = [_mm256_setzero_ps(); H];
    for (h, qv) in qv.iter_mut().enumerate() {
        *qv = _mm256_loadu_ps(q.add(h * d));
    }
    for r in 0..R {
        let k = k(r);
        for h in 0..H {
            a[h][r] = _mm256_fmadd_ps(qv[h], k, a[h][r]);
        }
    }
}

/// Lane `r` of the result (lanes 0-3 in the first half, 4-7 in the second)
/// is the sum of the 8 lanes of `a[r]`, always added in the same order:
/// `((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7))`. In 128-bit operations:
/// Zen 1 splits every 256-bit one in two anyway, and its `vperm2f128` and
/// `vhaddps` are slow (s52: with the stores of [`store_lanes`], a tile's
/// scores 75 ns faster than `vhaddps`-and-`vperm2f128` in a C model).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn transpose_sum(a: &[__m256; 8]) -> [__m128; 2] {
    let folded: [__m128; 8] =
        std::array::from_fn(|r| _mm_add_ps(_mm256_castps256_ps128(a[r]), _mm256_extractf128_ps::<1>(a[r])));
    [sum4(folded[0], folded[1], folded[2], folded[3]), sum4(folded[4], folded[5], folded[6], folded[7])]
}

/// Lane `r` of the result is the sum of the 4 lanes of `t_r`, added as
/// `(0 + 2) + (1 + 3)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum4(t0: __m128, t1: __m128, t2: __m128, t3: __m128) -> __m128 {
    // [t0: 0+2, t1: 0+2, t0: 1+3, t1: 1+3], and so for t2, t3.
    let s01 = _mm_add_ps(_mm_unpacklo_ps(t0, t1), _mm_unpackhi_ps(t0, t1));
    let s23 = _mm_add_ps(_mm_unpacklo_ps(t2, t3), _mm_unpackhi_ps(t2, t3));
    _mm_add_ps(_mm_movelh_ps(s01, s23), _mm_movehl_ps(s23, s01))
}

/// Element kinds of [`load8`], as const parameters.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// 8 elements of kind `E` at `src`, as f32.
///
/// # Safety
/// `src` must be valid for reading 8 elements; the CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const E: u8>(src: *const u8) -> __m256 {
    match E {
        F32 => _mm256_loadu_ps(src as *const f32),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(src as *const __m128i)),
        // bf16 is the top half of an f32.
        _ => {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(src as *const __m128i))))
        }
    }
}

/// Half `HALF` of the 16 elements of kind `E` at `src`, as f32, in pair
/// order: for bf16, the 8 even-indexed elements (`HALF` 0) or the 8
/// odd-indexed ones (`HALF` 1), each one load and one shift or `vpand` with
/// `high` (from [`high_halves`]) where [`load8`] takes a widening load and a
/// shift; for f16 and f32, elements `8 * HALF .. 8 * HALF + 8`, pair order
/// being the natural one.
///
/// # Safety
/// `src` must be valid for reading 16 elements; the CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_half<const E: u8, const HALF: usize>(src: *const u8, high: __m256i) -> __m256 {
    if E != BF16 {
        let size = if E == F32 { 4 } else { 2 };
        return load8::<E>(src.add(8 * HALF * size));
    }
    let pairs = _mm256_loadu_si256(src as *const __m256i);
    // Each 32-bit lane holds an even element (low half) and an odd one (high
    // half); bf16 is the top half of an f32.
    if HALF == 0 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs))
    } else {
        _mm256_castsi256_ps(_mm256_and_si256(pairs, high))
    }
}

/// The mask that keeps the high 16 bits of each 32-bit lane, for
/// [`load_half`], made where the loops start and hidden from the compiler:
/// with the constant in sight LLVM turns the `vpand` into a `vpblendw` with
/// zero, which Zen 1 runs much slower (s52, C models of the two loops in L1:
/// P·V 608-622 ns a tile against 546-548 with `vpand`, the scores 627-631
/// against 559-572; `docs/experiments/s52/scores_pv.c` built with -DBLEND).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn high_halves() -> __m256i {
    std::hint::black_box(_mm256_set1_epi32(0xffff_0000_u32 as i32))
}

/// `acc[h][j] += sum_i p[h][i] * v_i[j]` for the `H` heads of `acc`
/// (`[H, d]`) and `p` (`[H, TILE]`), over the rows `v_i` (raw elements of
/// kind `E`, at least `d` each), `8 * C` columns at a time.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_rows<const E: u8, const H: usize, const C: usize>(
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
    let high = high_halves();
    // Whole 16-column groups (in pair order), then the last 8 columns.
    let paired = d / 16 * 16;
    let mut c = 0;
    while c + 8 * C <= paired {
        accumulate_rows_block::<E, H, C>(acc, p, rows, d, c, high, pf);
        c += 8 * C;
    }
    while c + 16 <= paired {
        accumulate_rows_block::<E, H, 2>(acc, p, rows, d, c, high, pf);
        c += 16;
    }
    if c + 8 <= d {
        accumulate_rows_block::<E, H, 1>(acc, p, rows, d, c, high, pf);
    }
}

/// Columns `c .. c + 8 * C` of [`accumulate_rows`], in `H * C` registers:
/// whole 16-column groups in pair order (`C` even, `c` a multiple of 16), or
/// the last 8 columns (`C` 1).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and the lengths must be as
/// `accumulate_rows` checks them: `acc.len() >= H * d`, `p.len() >= H *
/// TILE`, `rows.len() <= TILE`, every row at least `d` elements of kind `E`.
// `a[h][j]` indexed by both loops reads better than nested iterators here.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_rows_block<const E: u8, const H: usize, const C: usize>(
    acc: &mut [f32],
    p: &[f32],
    rows: &[&[u8]],
    d: usize,
    c: usize,
    high: __m256i,
    pf: &mut TilePrefetch<'_>,
) {
    let size = if E == F32 { 4 } else { 2 };
    // SAFETY (all loads and stores below): `accumulate_rows` checked
    // `acc.len() >= H * d`, `p.len() >= H * TILE`, `rows.len() <= TILE` and
    // every row holds `d` elements; columns `c .. c + 8 * C <= d`.
    if c + 8 * C > d {
        return;
    }
    let acc = acc.as_mut_ptr();
    let mut a = [[_mm256_setzero_ps(); C]; H];
    for (h, a) in a.iter_mut().enumerate() {
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(acc.add(h * d + c + 8 * j));
        }
    }
    for (i, row) in rows.iter().enumerate() {
        let mut pb = [_mm256_setzero_ps(); H];
        for (h, pb) in pb.iter_mut().enumerate() {
            *pb = _mm256_set1_ps(*p.get_unchecked(h * TILE + i));
        }
        let src = row.as_ptr().add(c * size);
        for j in 0..C {
            // Register `j` holds half `j % 2` of a 16-column group; one
            // register alone is the last 8 columns, in natural order.
            let v = match (C, j % 2) {
                (1, _) => load8::<E>(src),
                (_, 0) => load_half::<E, 0>(src.add(8 * j * size), high),
                _ => load_half::<E, 1>(src.add(8 * (j - 1) * size), high),
            };
            for h in 0..H {
                a[h][j] = _mm256_fmadd_ps(pb[h], v, a[h][j]);
            }
        }
    }
    pf.step();
    for (h, a) in a.iter().enumerate() {
        for (j, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.add(h * d + c + 8 * j), *a);
        }
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
    use decode_attn_core::{dtype, DType};

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

    /// `scores_heads` and `accumulate_rows` for `H` heads against plain f64
    /// loops, rows given as raw bytes of `dtype`.
    fn check_heads<const E: u8, const H: usize, const R: usize, const C: usize>(dtype: DType, d: usize) {
        let q: Vec<f32> = (0..H * d).map(|i| (i as f32 * 0.3).sin()).collect();
        let k: Vec<f32> = (0..TILE * d).map(|i| (i as f32 * 0.17).cos()).collect();
        let bytes = dtype::encode(dtype, &k);
        let k = dtype::decode(dtype, &bytes);
        let size = bytes.len() / k.len();
        let mut k_rows: [&[u8]; TILE] = [&[]; TILE];
        for (r, row) in k_rows.iter_mut().enumerate() {
            *row = &bytes[r * d * size..(r + 1) * d * size];
        }
        // The loops take bf16 rows with the queries and accumulators in pair order.
        let pair = |x: &[f32]| {
            let mut x = x.to_vec();
            if E == BF16 {
                to_pair_order(&mut x, d);
            }
            x
        };
        let mut s = vec![f32::NAN; H * TILE];
        // SAFETY: the features were detected by the caller.
        unsafe { scores_heads::<E, H, R>(&pair(&q), &k_rows, d, &mut s, &mut TilePrefetch::none()) };
        for (i, &s) in s.iter().enumerate() {
            let (h, r) = (i / TILE, i % TILE);
            let exact: f64 = (0..d).map(|j| q[h * d + j] as f64 * k[r * d + j] as f64).sum();
            assert!((s as f64 - exact).abs() < 1e-4, "{dtype} d={d} H={H} head {h} row {r}: {s} vs {exact}");
        }
        // Weights over 13 rows (a partial tile).
        let p: Vec<f32> = (0..H * TILE).map(|i| (i % TILE) as f32 * 0.1 + (i / TILE) as f32).collect();
        let v: Vec<f32> = (0..13 * d).map(|i| (i as f32 * 0.05).sin()).collect();
        let bytes = dtype::encode(dtype, &v);
        let v = dtype::decode(dtype, &bytes);
        let rows: Vec<&[u8]> = bytes.chunks_exact(d * size).collect();
        let mut acc = pair(&(0..H * d).map(|i| 0.5 + i as f32 * 1e-3).collect::<Vec<_>>());
        // SAFETY: the features were detected by the caller.
        unsafe { accumulate_rows::<E, H, C>(&mut acc, &p, &rows, d, &mut TilePrefetch::none()) };
        if E == BF16 {
            from_pair_order(&mut acc, d);
        }
        for (i, &a) in acc.iter().enumerate() {
            let (h, j) = (i / d, i % d);
            let start = 0.5 + (h * d + j) as f32 * 1e-3;
            let exact: f64 = start as f64 + (0..13).map(|r| p[h * TILE + r] as f64 * v[r * d + j] as f64).sum::<f64>();
            assert!((a as f64 - exact).abs() < 1e-4, "{dtype} d={d} H={H} head {h} column {j}: {a} vs {exact}");
        }
    }

    #[test]
    fn scores_and_accumulate_match_plain_loops() {
        if !have() {
            return;
        }
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS {
            check_heads::<BF16, 1, { score_rows(1) }, { acc_regs(1) }>(DType::Bf16, d);
            check_heads::<BF16, 2, { score_rows(2) }, { acc_regs(2) }>(DType::Bf16, d);
            check_heads::<F16, 3, { score_rows(3) }, { acc_regs(3) }>(DType::F16, d);
            check_heads::<F32, 4, { score_rows(4) }, { acc_regs(4) }>(DType::F32, d);
            check_heads::<BF16, 4, { score_rows(4) }, { acc_regs(4) }>(DType::Bf16, d);
        }
    }

    #[test]
    fn pair_order_is_what_load_half_reads_and_undoes() {
        if !have() {
            return;
        }
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS {
            // Small integers: exact in bf16.
            let x: Vec<f32> = (0..2 * d).map(|i| (i % 97) as f32 - 7.0).collect();
            let bytes = dtype::encode(DType::Bf16, &x);
            let mut paired = x.clone();
            to_pair_order(&mut paired, d);
            for row in 0..2 {
                for c in (0..d / 16 * 16).step_by(16) {
                    let mut halves = [[0.0f32; 8]; 2];
                    let src = bytes[(row * d + c) * 2..].as_ptr();
                    // SAFETY: the features were detected above; 16 bf16 lie at `src`.
                    unsafe {
                        _mm256_storeu_ps(halves[0].as_mut_ptr(), load_half::<BF16, 0>(src, high_halves()));
                        _mm256_storeu_ps(halves[1].as_mut_ptr(), load_half::<BF16, 1>(src, high_halves()));
                    }
                    let expected = &paired[row * d + c..row * d + c + 16];
                    assert_eq!(halves.concat(), expected, "d={d} row {row} group {c}");
                }
                // A last 8 stays in natural order.
                assert_eq!(paired[row * d + d / 16 * 16..(row + 1) * d], x[row * d + d / 16 * 16..(row + 1) * d]);
            }
            from_pair_order(&mut paired, d);
            assert_eq!(paired, x, "d={d}");
        }
    }

    fn check_store_lanes<const R: usize>() {
        // SAFETY (both blocks): the features were detected by the caller;
        // `out` has room for `R` floats past any `first + R <= 8`.
        let sums = unsafe { [_mm_setr_ps(0.0, 1.0, 2.0, 3.0), _mm_setr_ps(4.0, 5.0, 6.0, 7.0)] };
        for first in (0..=8 - R).step_by(R) {
            let mut out = [f32::NAN; 10];
            unsafe { store_lanes::<R>(sums, first, out[1..].as_mut_ptr()) };
            let expected: Vec<f32> = (first..first + R).map(|lane| lane as f32).collect();
            assert_eq!(out[1..1 + R], expected[..], "R={R} first={first}");
            assert!(out[0].is_nan() && out[1 + R..].iter().all(|x| x.is_nan()), "R={R} first={first}: wrote outside");
        }
    }

    #[test]
    fn store_lanes_writes_exactly_its_lanes() {
        if !have() {
            return;
        }
        check_store_lanes::<1>();
        check_store_lanes::<2>();
        check_store_lanes::<3>();
        check_store_lanes::<4>();
        check_store_lanes::<8>();
    }

    #[test]
    fn prefetch_steps_count_the_steps_a_tile_makes() {
        // A step per pass of `score_rows` rows and per block of columns.
        // Four heads, d = 128: 8 passes of 2 rows, 8 blocks of 16 columns.
        assert_eq!(prefetch_steps(4, 128), 8 + 8);
        // Five heads: a group of four, then one (2 passes of 8 rows, two
        // 64-column blocks).
        assert_eq!(prefetch_steps(5, 128), (8 + 8) + (2 + 2));
        // d = 120, one head: one 64-column block, three 16-column ones and
        // the last 8 columns.
        assert_eq!(prefetch_steps(1, 120), 2 + 5);
    }
}

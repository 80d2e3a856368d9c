//! The hot loop: one work item `(sequence, KV heads, split)` over its token
//! range, for all `g` query heads of each of its consecutive KV heads (GQA
//! packing: each K and V row is read and decoded once, then used by every
//! head of the group). The SIMD loops (`avx2.rs`, `avx512.rs`) serve the
//! item's KV heads tile by tile, so they walk each slot's rows of all of them
//! as one contiguous run; the portable loop serves them one KV head at a
//! time, a chunk of tokens at a time.
//!
//! Tokens go 16 at a time (one tile, [`TILE_TOKENS`]): `g * 16` scores are
//! taken (the portable loop first decodes the tile's K rows into an f32
//! scratch tile; the SIMD loops decode each chunk of a row into a register),
//! the online softmax state (running max `m` in log2 units, sum `l`,
//! unnormalised `acc`) is rescaled once per tile, and the V tile is
//! accumulated with the accumulator columns held in registers across the
//! tile's 16 rows.
//!
//! This file holds the portable loop (plain loops over fixed-width chunks that
//! LLVM vectorises), the element conversions, the softmax `exp2`, and the
//! dispatch: `avx2.rs` and `avx512.rs` run the same steps in intrinsics on
//! CPUs that have them, chosen once at run time (see [`Isa`]).

use decode_attn_core::{DType, TILE_TOKENS};

pub(crate) const TILE: usize = TILE_TOKENS as usize;

/// The groups of query heads the SIMD loops serve together, as `(first
/// head, heads)`: four at a time (a K or V chunk decoded once for all of
/// them), the last group the rest of the `g`.
pub(crate) fn head_groups(g: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..g).step_by(4).map(move |h| (h, (g - h).min(4)))
}

/// Whether the slices a SIMD loop's `tile` gets agree with its `g = m.len()`
/// query heads and head dim `d`: `q` and `acc` `[g, d]`, `l` `[g]`, the
/// scores `s` `[g, TILE]`, and `1..=TILE` valid rows. The loops index with
/// unchecked SIMD loads inside these bounds, so a tile that fails this does
/// nothing.
#[inline(always)]
pub(crate) fn tile_fits(q: &[f32], m: &[f32], l: &[f32], acc: &[f32], s: &[f32], valid_rows: usize, d: usize) -> bool {
    let g = m.len();
    l.len() == g && q.len() == g * d && acc.len() == g * d && s.len() == g * TILE && (1..=TILE).contains(&valid_rows)
}

/// The element types this backend reads and writes, resolved once per call so
/// that the hot loop matches on a closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elt {
    F32,
    F16,
    Bf16,
}

impl Elt {
    pub(crate) fn of(dtype: DType) -> Option<Elt> {
        match dtype {
            DType::F32 => Some(Elt::F32),
            DType::F16 => Some(Elt::F16),
            DType::Bf16 => Some(Elt::Bf16),
            _ => None,
        }
    }

    pub(crate) const fn size(self) -> usize {
        match self {
            Elt::F32 => 4,
            Elt::F16 | Elt::Bf16 => 2,
        }
    }

    /// Decodes `dst.len()` elements from the front of `src`.
    pub(crate) fn decode(self, src: &[u8], dst: &mut [f32]) {
        match self {
            Elt::F32 => F32::decode(src, dst),
            Elt::F16 => F16::decode(src, dst),
            Elt::Bf16 => Bf16::decode(src, dst),
        }
    }

    /// Encodes `src` into the front of `dst` (round to nearest even).
    pub(crate) fn encode(self, src: &[f32], dst: &mut [u8]) {
        match self {
            Elt::F32 => {
                for (d, &s) in dst.chunks_exact_mut(4).zip(src) {
                    d.copy_from_slice(&s.to_le_bytes());
                }
            }
            Elt::F16 => {
                for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
                }
            }
            Elt::Bf16 => {
                for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::bf16::from_f32(s).to_le_bytes());
                }
            }
        }
    }
}

/// Decoding of one KV element type, inlined into the hot loop.
pub(crate) trait Elem {
    const SIZE: usize;
    fn decode(src: &[u8], dst: &mut [f32]);
}

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct Bf16;

impl Elem for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    fn decode(src: &[u8], dst: &mut [f32]) {
        for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
}

impl Elem for Bf16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn decode(src: &[u8], dst: &mut [f32]) {
        for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
            // bf16 is the top half of an f32.
            *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
        }
    }
}

impl Elem for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn decode(src: &[u8], dst: &mut [f32]) {
        for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *o = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
        }
    }
}

/// IEEE binary16 to f32, exactly, in branch-free integer and float operations
/// that vectorise: the exponent and mantissa are moved into f32 position and
/// rebiased by a multiplication with 2^112 (exact, and right for subnormals
/// too); infinities and NaNs get the all-ones exponent instead.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let shifted = em << 13;
    const TWO_POW_112: f32 = f32::from_bits(0x7780_0000);
    let magnitude =
        if em >= 0x7c00 { f32::from_bits(shifted | 0x7f80_0000) } else { f32::from_bits(shifted) * TWO_POW_112 };
    f32::from_bits(magnitude.to_bits() | sign)
}

/// How `a * b + c` is computed.
pub(crate) trait Arith {
    fn fma(a: f32, b: f32, c: f32) -> f32;
}

/// A multiply and an add: what every x86-64 and every other target has.
pub(crate) struct Separate;
/// One fused multiply-add; only used where the FMA instruction is enabled
/// (elsewhere `mul_add` is a slow library call).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Fused;

impl Arith for Separate {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

impl Arith for Fused {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// `2^x` for `x <= 0` (a score minus the running max), relative error below
/// 2e-7 (Cephes' `exp2f` polynomial). Results below 2^-126 are returned as
/// 2^-126, which is negligible against the softmax sum (at least 1). NaN
/// stays NaN. Written without calls or branches, so a loop over it vectorises.
#[inline(always)]
pub(crate) fn exp2_nonpositive<A: Arith>(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer.
    let x = x.clamp(-126.0, 0.0);
    let r = x + MAGIC;
    let i = (r.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32); // round(x), in [-126, 0]
    let f = x - (r - MAGIC); // in [-0.5, 0.5]
    let mut p = 1.535_336_2e-4f32;
    p = A::fma(p, f, 1.339_887_4e-3);
    p = A::fma(p, f, 9.618_437e-3);
    p = A::fma(p, f, 5.550_332_5e-2);
    p = A::fma(p, f, 2.402_264_8e-1);
    p = A::fma(p, f, 6.931_472e-1);
    p = A::fma(p, f, 1.0);
    p * f32::from_bits((i.wrapping_add(127) as u32) << 23)
}

/// Where one sequence's tokens are. Every id has been validated: in range and
/// non-negative for every token the sequence uses.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slots<'a> {
    /// The sequence's row of kernel block ids.
    Blocks { row: &'a [i32], block_size: usize },
    /// One slot per token.
    Tokens(&'a [i32]),
}

impl Slots<'_> {
    /// Slots of tokens `t0 .. t0 + out.len()`; `t0` is a multiple of 16, so a
    /// tile never crosses a kernel block (a multiple of 16 tokens).
    #[inline(always)]
    pub(crate) fn fill(&self, t0: usize, out: &mut [usize]) {
        if out.is_empty() {
            return;
        }
        match *self {
            Slots::Blocks { row, block_size } => {
                let base = row[t0 / block_size] as usize * block_size + t0 % block_size;
                for (i, o) in out.iter_mut().enumerate() {
                    *o = base + i;
                }
            }
            Slots::Tokens(slots) => {
                for (o, &s) in out.iter_mut().zip(&slots[t0..]) {
                    *o = s as usize;
                }
            }
        }
    }
}

/// One work item's inputs.
pub(crate) struct Work<'a> {
    pub k: &'a [u8],
    pub v: &'a [u8],
    /// Elements per slot: `num_kv_heads * head_dim`.
    pub slot_elems: usize,
    /// The first KV head of the item, and how many consecutive KV heads it
    /// serves (their rows are one contiguous run of each slot).
    pub kv_head: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub slots: Slots<'a>,
    /// Token range `[start, end)`, `start` a multiple of 16.
    pub start: usize,
    pub end: usize,
    /// `[kv_heads * g, head_dim]` queries, already multiplied by
    /// `softmax_scale * log2(e)`.
    pub q: &'a [f32],
    /// That factor, `softmax_scale * log2(e)`: the bf16 dot-product path
    /// divides it out to recover bf16 queries (`avx512_bf16.rs`).
    pub q_scale: f32,
    /// Whether the weights P may be rounded to bf16 before P·V (as on the
    /// GPU): where the output is bf16 or f16, whose own rounding is as
    /// coarse. An f32 output keeps f32 weights.
    pub weights_in_bf16: bool,
}

impl<'a> Work<'a> {
    /// The same token range for KV head `kv_head + i` alone, with its queries `q`.
    fn one_head(&self, i: usize, q: &'a [f32]) -> Work<'a> {
        Work { kv_head: self.kv_head + i, kv_heads: 1, q, ..*self }
    }
}

/// Online-softmax state of the `g` heads of one work item.
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Running max per head, log2 units.
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    /// `[g, head_dim]`, unnormalised.
    pub acc: Vec<f32>,
}

impl State {
    pub(crate) fn new(g: usize, head_dim: usize) -> State {
        State { m: vec![f32::NEG_INFINITY; g], l: vec![0.0; g], acc: vec![0.0; g * head_dim] }
    }

    pub(crate) fn reset(&mut self) {
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.acc.fill(0.0);
    }
}

/// Per-thread scratch: one decoded K tile, one V tile and the scores.
pub(crate) struct Scratch {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub s: Vec<f32>,
    /// The item's queries in the order a SIMD loop reads them (sized by it).
    pub q: Vec<f32>,
    /// The item's queries as the AMX path's tile loads read them (`amx.rs`).
    pub tiles: Vec<f32>,
}

impl Scratch {
    pub(crate) fn new(g: usize, head_dim: usize) -> Scratch {
        Scratch {
            k: vec![0.0; TILE * head_dim],
            v: vec![0.0; TILE * head_dim],
            s: vec![0.0; g * TILE],
            q: Vec::new(),
            tiles: Vec::new(),
        }
    }
}

/// Which instructions the hot loop may use. Only [`Isa::detect`] makes the
/// SIMD variants, after checking that the CPU has their features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    /// AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2(SimdToken),
    /// AVX-512F, and AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx512(SimdToken),
    /// `Avx512`'s features, and AVX-512BW and AVX512_BF16 (bf16 dot products).
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16(SimdToken),
    /// `Avx512Bf16`'s features, and AMX-TILE and AMX-BF16 with the OS's
    /// permission to use them (`amx::available`).
    #[cfg(target_arch = "x86_64")]
    Amx(SimdToken),
}

/// Proof that the features of the `Isa` variant holding it were detected;
/// not constructible outside `Isa::detect`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SimdToken(());

impl Isa {
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                if has!("avx512f") && has!("avx512bw") && has!("avx512bf16") {
                    if crate::amx::available() {
                        return Isa::Amx(SimdToken(()));
                    }
                    return Isa::Avx512Bf16(SimdToken(()));
                }
                if has!("avx512f") {
                    return Isa::Avx512(SimdToken(()));
                }
                return Isa::Avx2(SimdToken(()));
            }
        }
        Isa::Portable
    }

    /// At most AVX2 (what `CpuBackend::portable` and the tests use to reach
    /// the other paths).
    pub(crate) fn at_most_avx2(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(token) | Isa::Avx512Bf16(token) | Isa::Amx(token) => Isa::Avx2(token),
            other => other,
        }
    }

    /// Without the bf16 dot products (what `CpuBackend::without_bf16_dot`
    /// and the tests use to reach the plain AVX-512 path on a CPU that has
    /// them).
    pub(crate) fn without_bf16_dot(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16(token) | Isa::Amx(token) => Isa::Avx512(token),
            other => other,
        }
    }

    /// Without AMX tiles (what `CpuBackend::without_amx` and the tests use
    /// to reach the AVX512_BF16 path on a CPU that has both).
    pub(crate) fn without_amx(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Amx(token) => Isa::Avx512Bf16(token),
            other => other,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(_) => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16(_) => "avx512-bf16",
            #[cfg(target_arch = "x86_64")]
            Isa::Amx(_) => "amx-bf16",
        }
    }
}

/// Runs one work item, adding its tokens to `state` (`kv_heads * g` heads).
pub(crate) fn attend(isa: Isa, kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) {
    // The SIMD loops serve all the item's KV heads in one pass over its slots.
    // Each level tries its own loop, and where that loop does not take the
    // item, the level below it (the same chain `Isa`'s narrowing methods walk).
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Amx(_) => {
            // SAFETY: the token inside `Isa::Amx` proves AVX-512F,
            // AVX-512BW, AVX512_BF16, AVX2, FMA and F16C were detected and
            // that `amx::available` returned true, all `amx::attend` requires.
            if unsafe { crate::amx::attend(kv, work, state, scratch) } {
                return;
            }
            return attend(isa.without_amx(), kv, work, state, scratch);
        }
        Isa::Avx512Bf16(_) => {
            // SAFETY: the token inside `Isa::Avx512Bf16` proves AVX-512F,
            // AVX-512BW, AVX512_BF16, AVX2, FMA and F16C were detected, all
            // `avx512_bf16::attend` requires.
            if unsafe { crate::avx512_bf16::attend(kv, work, state, scratch) } {
                return;
            }
            return attend(isa.without_bf16_dot(), kv, work, state, scratch);
        }
        Isa::Avx512(_) => {
            // SAFETY: the token inside `Isa::Avx512` proves AVX-512F, AVX2,
            // FMA and F16C were detected, all `avx512::attend` requires.
            if unsafe { crate::avx512::attend(kv, work, state, scratch) } {
                return;
            }
            return attend(isa.at_most_avx2(), kv, work, state, scratch);
        }
        // SAFETY: a `SimdToken` inside `Isa::Avx2` exists only when
        // `Isa::detect` found AVX2, FMA and F16C on this CPU, which is all
        // `avx2::attend` requires.
        Isa::Avx2(_) => unsafe {
            if crate::avx2::attend(kv, work, state, scratch) {
                return;
            }
        },
        Isa::Portable => {}
    }
    if work.kv_heads == 1 {
        attend_portable(kv, work, state, scratch);
        return;
    }
    // The portable loop takes one KV head at a time, each through a state of
    // its own, a chunk of tokens at a time: every head of the item reads the
    // chunk's slots before the next chunk. One head over the whole range,
    // then the next, would read each head's rows at the slot stride, which
    // the hardware prefetchers do not follow.
    let d = work.head_dim;
    let g = state.m.len() / work.kv_heads.max(1);
    let mut one = State::new(g, d);
    let mut from = work.start;
    while from < work.end {
        let to = work.end.min(from + HEAD_CHUNK_TOKENS);
        let chunk = Work { start: from, end: to, ..*work };
        for i in 0..work.kv_heads {
            let (heads, cols) = (i * g..(i + 1) * g, i * g * d..(i + 1) * g * d);
            let (Some(q), Some(m), Some(l), Some(acc)) = (
                work.q.get(cols.clone()),
                state.m.get(heads.clone()),
                state.l.get(heads.clone()),
                state.acc.get(cols.clone()),
            ) else {
                return;
            };
            one.m.copy_from_slice(m);
            one.l.copy_from_slice(l);
            one.acc.copy_from_slice(acc);
            attend_portable(kv, &chunk.one_head(i, q), &mut one, scratch);
            state.m[heads.clone()].copy_from_slice(&one.m);
            state.l[heads].copy_from_slice(&one.l);
            state.acc[cols].copy_from_slice(&one.acc);
        }
        from = to;
    }
}

/// Tokens one KV head of a multi-head item takes on the portable loop before
/// the next head does (a multiple of the tile): 64 tokens of Llama-3-8B's 8
/// KV heads are 256 KiB of bf16 K and V, which stay in a core's L2 while the
/// heads pass.
const HEAD_CHUNK_TOKENS: usize = 4 * TILE;

/// The portable loop over an item of one KV head.
fn attend_portable(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) {
    match kv {
        Elt::F32 => attend_generic::<F32, Separate>(work, state, scratch),
        Elt::F16 => attend_generic::<F16, Separate>(work, state, scratch),
        Elt::Bf16 => attend_generic::<Bf16, Separate>(work, state, scratch),
    }
}

#[inline(always)]
pub(crate) fn attend_generic<K: Elem, A: Arith>(work: &Work<'_>, state: &mut State, scratch: &mut Scratch) {
    let d = work.head_dim;
    let g = work.q.len() / d;
    let row_bytes = d * K::SIZE;
    let head_offset = work.kv_head * d;
    let mut slots = [0usize; TILE];
    let mut next_slots = [0usize; TILE];
    let mut t0 = work.start;
    while t0 < work.end {
        let n = TILE.min(work.end - t0);
        let next = t0 + n;
        if next < work.end {
            // Ask for the next tile's K and V rows now: its block is anywhere in
            // the pool, where no hardware prefetcher looks.
            let next_slots = &mut next_slots[..TILE.min(work.end - next)];
            work.slots.fill(next, next_slots);
            for &slot in next_slots.iter() {
                let offset = (slot * work.slot_elems + head_offset) * K::SIZE;
                prefetch(work.k, offset, row_bytes);
                prefetch(work.v, offset, row_bytes);
            }
        }
        let slots = &mut slots[..n];
        work.slots.fill(t0, slots);

        for (&slot, krow) in slots.iter().zip(scratch.k.chunks_exact_mut(d)) {
            let offset = (slot * work.slot_elems + head_offset) * K::SIZE;
            K::decode(&work.k[offset..offset + row_bytes], krow);
        }
        for h in 0..g {
            let qh = &work.q[h * d..(h + 1) * d];
            let scores = &mut scratch.s[h * TILE..h * TILE + n];
            for (s, krow) in scores.iter_mut().zip(scratch.k.chunks_exact(d)) {
                *s = dot::<A>(qh, krow);
            }
            let tile_max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let m_old = state.m[h];
            let m_new = m_old.max(tile_max);
            if m_new > m_old {
                let acc = &mut state.acc[h * d..(h + 1) * d];
                if m_old == f32::NEG_INFINITY {
                    state.l[h] = 0.0;
                    acc.fill(0.0);
                } else {
                    let alpha = exp2_nonpositive::<A>(m_old - m_new);
                    state.l[h] *= alpha;
                    acc.iter_mut().for_each(|a| *a *= alpha);
                }
                state.m[h] = m_new;
            }
            for s in scores.iter_mut() {
                *s = exp2_nonpositive::<A>(*s - m_new);
            }
            state.l[h] += scores.iter().sum::<f32>();
        }

        for (&slot, vrow) in slots.iter().zip(scratch.v.chunks_exact_mut(d)) {
            let offset = (slot * work.slot_elems + head_offset) * K::SIZE;
            K::decode(&work.v[offset..offset + row_bytes], vrow);
        }
        for h in 0..g {
            let p = &scratch.s[h * TILE..h * TILE + n];
            accumulate::<A>(&mut state.acc[h * d..(h + 1) * d], p, &scratch.v, d);
        }
        t0 += n;
    }
}

/// Hints that `bytes[offset..offset + len]` will be read soon.
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8], offset: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = bytes.len().min(offset.saturating_add(len));
        let mut at = offset;
        while at < end {
            // SAFETY: `at < bytes.len()`, so the pointer stays inside `bytes`;
            // a prefetch only hints the cache and never faults or writes; SSE
            // (which `_mm_prefetch` needs) is part of the x86-64 baseline.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(at) as *const i8);
            }
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, offset, len);
}

/// The query-head group size `g` of a work item for the SIMD loops, where
/// the lengths of `work`, `state` and `scratch` agree with it.
pub(crate) fn item_group(work: &Work<'_>, state: &State, scratch: &Scratch) -> Option<usize> {
    let (heads, d) = (work.kv_heads, work.head_dim);
    let g = state.m.len().checked_div(heads)?;
    let fits = g > 0
        && state.m.len() == heads * g
        && work.q.len() == heads * g * d
        && state.acc.len() == heads * g * d
        && state.l.len() == heads * g
        && scratch.s.len() >= g * TILE;
    fits.then_some(g)
}

/// What one KV head of one tile hands a SIMD loop: its `g` query heads'
/// queries (`[g, d]`) and online-softmax state, the tile's K rows (rows past
/// a partial tile's end repeat row 0: computed, then masked out) and its
/// valid V rows, straight from the cache.
pub(crate) struct HeadTile<'t, 'a> {
    pub q: &'t [f32],
    pub m: &'t mut [f32],
    pub l: &'t mut [f32],
    pub acc: &'t mut [f32],
    pub k_rows: &'t [&'a [u8]; TILE],
    pub v_rows: &'t [&'a [u8]],
}

/// The SIMD loops' walk over a work item whose lengths [`item_group`]
/// accepted: tile by tile, every KV head in turn, so the item reads
/// its slots' rows of all its heads (one contiguous run per slot) rather than
/// one head's rows at a stride of a whole slot. `queries` are the item's
/// (`[kv_heads * g, d]`, in the order the loop reads them). The rows of the
/// tile `prefetch_tiles` ahead are handed out over the `steps` steps the loop
/// makes per tile.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn for_each_head_tile<'a>(
    kv: Elt,
    work: &Work<'a>,
    queries: &[f32],
    state: &mut State,
    prefetch_tiles: usize,
    steps: usize,
    mut head_tile: impl FnMut(HeadTile<'_, 'a>, &mut TilePrefetch<'a>),
) {
    let d = work.head_dim;
    let g = state.m.len() / work.kv_heads.max(1);
    let row_bytes = d * kv.size();
    let mut slots = [0usize; TILE];
    for ahead in 0..prefetch_tiles {
        TilePrefetch::new(work, kv.size(), work.start + ahead * TILE, 1).finish();
    }
    let mut t0 = work.start;
    while t0 < work.end {
        let n = TILE.min(work.end - t0);
        let mut pf = TilePrefetch::new(work, kv.size(), t0 + prefetch_tiles * TILE, steps);
        let slots = &mut slots[..n];
        work.slots.fill(t0, slots);
        for kh in 0..work.kv_heads {
            let head_offset = (work.kv_head + kh) * d;
            let mut k_rows: [&[u8]; TILE] = [&[]; TILE];
            let mut v_rows: [&[u8]; TILE] = [&[]; TILE];
            for (r, &slot) in slots.iter().enumerate() {
                let offset = (slot * work.slot_elems + head_offset) * kv.size();
                k_rows[r] = &work.k[offset..offset + row_bytes];
                v_rows[r] = &work.v[offset..offset + row_bytes];
            }
            for r in n..TILE {
                k_rows[r] = k_rows[0];
            }
            let tile = HeadTile {
                q: &queries[kh * g * d..(kh + 1) * g * d],
                m: &mut state.m[kh * g..(kh + 1) * g],
                l: &mut state.l[kh * g..(kh + 1) * g],
                acc: &mut state.acc[kh * g * d..(kh + 1) * g * d],
                k_rows: &k_rows,
                v_rows: &v_rows[..n],
            };
            head_tile(tile, &mut pf);
        }
        pf.finish();
        t0 += n;
    }
}

/// The cache lines of one future tile's K and V rows, handed out a few at a
/// time ([`TilePrefetch::step`]) from inside the current tile's loops, so that
/// the misses spread over its arithmetic instead of queueing up at once.
///
/// A step runs in the hot loops, so it is kept to a compare, two prefetches
/// and an add: the rows' addresses are worked out once, in
/// [`TilePrefetch::new`].
///
/// Each step fetches a line of K and the same line of V, so the two caches
/// are read as two streams at once rather than all of a tile's K and then
/// its V. s44, an Intel Xeon with AMX (2 vCPUs), `bench --backend cpu`, bf16,
/// B = 1 and 4, s = 16384 and 65536, alternated three times: 8B 82.4-93.4%
/// of copy against 57.6-77.5% with K's lines first, 70B at TP=8 64.7-97.1%
/// against 64.1-85.0% (docs/measurements/2026-12-06-s44-cpu-prefetch/); a
/// read of the same blocks with no arithmetic (docs/experiments/s44/acc3.c)
/// runs 11% faster the same way on two threads.
///
/// The hint is T1 (the outer caches), not T0: a tile is 8 KiB of bf16 K
/// and V per KV head, so an item of four of Llama-3-8B's heads reads 32 KiB
/// a tile, and the tile being computed plus two ahead at T0 are more than a
/// 32 KiB L1 (Zen 4's) holds. s36, Zen 4
/// (2 vCPUs), `bench --backend cpu`, B = 1 and 4, s = 16384 and 65536,
/// alternated three times: bf16 8B 91-112% of copy against 64-70% at T0,
/// 70B at TP=8 (8 KiB a tile) 48-67% against 44-59%; f16 8B 64-79% against
/// 54-62%, 70B 34-44% against 30-40% (docs/measurements/2026-12-05-s36-cpu-read/).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct TilePrefetch<'a> {
    /// Where each slot's run of bytes starts in K and in V. Each run lies
    /// inside `work.k` or `work.v` (checked in `new`).
    k_runs: [*const u8; TILE],
    v_runs: [*const u8; TILE],
    num_runs: usize,
    run_bytes: usize,
    /// The next slot to start, the current slot's runs, and the offset of
    /// the next line in them.
    next_run: usize,
    k_run: *const u8,
    v_run: *const u8,
    offset: usize,
    per_step: usize,
    cache: std::marker::PhantomData<&'a [u8]>,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl<'a> TilePrefetch<'a> {
    /// The tile of `work` that starts at token `t0` (nothing past the range's
    /// end), spread over about `steps` calls of [`TilePrefetch::step`].
    #[inline(always)]
    pub(crate) fn new(work: &Work<'a>, elem_size: usize, t0: usize, steps: usize) -> TilePrefetch<'a> {
        let mut slots = [0usize; TILE];
        let num_rows = if t0 < work.end { TILE.min(work.end - t0) } else { 0 };
        work.slots.fill(t0, &mut slots[..num_rows]);
        // The item's KV heads are one run of each slot.
        let run_bytes = work.kv_heads * work.head_dim * elem_size;
        let mut k_runs = [std::ptr::null(); TILE];
        let mut v_runs = [std::ptr::null(); TILE];
        let mut num_runs = 0;
        for &slot in &slots[..num_rows] {
            let offset = (slot * work.slot_elems + work.kv_head * work.head_dim) * elem_size;
            if offset + run_bytes <= work.k.len() && offset + run_bytes <= work.v.len() {
                k_runs[num_runs] = work.k.as_ptr().wrapping_add(offset);
                v_runs[num_runs] = work.v.as_ptr().wrapping_add(offset);
                num_runs += 1;
            }
        }
        let lines = num_runs * run_bytes.div_ceil(64);
        TilePrefetch {
            k_runs,
            v_runs,
            num_runs,
            run_bytes,
            next_run: 0,
            k_run: std::ptr::null(),
            v_run: std::ptr::null(),
            offset: run_bytes,
            per_step: lines.div_ceil(steps.max(1)),
            cache: std::marker::PhantomData,
        }
    }

    /// Nothing to fetch.
    #[cfg(test)]
    pub(crate) fn none() -> TilePrefetch<'static> {
        TilePrefetch {
            k_runs: [std::ptr::null(); TILE],
            v_runs: [std::ptr::null(); TILE],
            num_runs: 0,
            run_bytes: 0,
            next_run: 0,
            k_run: std::ptr::null(),
            v_run: std::ptr::null(),
            offset: 0,
            per_step: 0,
            cache: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    pub(crate) fn step(&mut self) {
        self.step_with(prefetch_line);
    }

    /// Issues whatever the steps left.
    #[inline(always)]
    pub(crate) fn finish(&mut self) {
        self.per_step = usize::MAX;
        self.step();
    }

    /// One step's lines, handed to `fetch`: a K line, then the same line of
    /// V, `per_step` times (the tests look at the addresses this way).
    #[inline(always)]
    fn step_with(&mut self, mut fetch: impl FnMut(*const u8)) {
        for _ in 0..self.per_step {
            if self.offset >= self.run_bytes {
                if self.next_run >= self.num_runs {
                    return;
                }
                self.k_run = self.k_runs[self.next_run];
                self.v_run = self.v_runs[self.next_run];
                self.offset = 0;
                self.next_run += 1;
            }
            fetch(self.k_run.wrapping_add(self.offset));
            fetch(self.v_run.wrapping_add(self.offset));
            self.offset += 64;
        }
    }
}

/// A hint to fetch the line at `line` into the outer caches (T1).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
fn prefetch_line(line: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache and never faults or writes,
    // whatever the address (`TilePrefetch` passes lines of runs `new` checked
    // anyway); SSE, which `_mm_prefetch` needs, is part of the x86-64
    // baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(line as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// `sum(a[i] * b[i])` in two 8-lane partial sums (plus a scalar tail, which
/// no supported head dim has). The lanes are never indexed dynamically, so
/// they stay in registers.
#[inline(always)]
fn dot<A: Arith>(a: &[f32], b: &[f32]) -> f32 {
    let mut lo = [0.0f32; 8];
    let mut hi = [0.0f32; 8];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            lo[i] = A::fma(x[i], y[i], lo[i]);
        }
        for i in 0..8 {
            hi[i] = A::fma(x[i + 8], y[i + 8], hi[i]);
        }
    }
    let mut ca8 = ca.remainder().chunks_exact(8);
    let mut cb8 = cb.remainder().chunks_exact(8);
    for (x, y) in (&mut ca8).zip(&mut cb8) {
        for i in 0..8 {
            lo[i] = A::fma(x[i], y[i], lo[i]);
        }
    }
    let mut tail = 0.0f32;
    for (&x, &y) in ca8.remainder().iter().zip(cb8.remainder()) {
        tail = A::fma(x, y, tail);
    }
    let mut sum = [0.0f32; 8];
    for i in 0..8 {
        sum[i] = lo[i] + hi[i];
    }
    ((sum[0] + sum[4]) + (sum[1] + sum[5])) + ((sum[2] + sum[6]) + (sum[3] + sum[7])) + tail
}

/// `acc += sum_i p[i] * v[i]` over the tile's rows `v[i] = v_tile[i*d .. (i+1)*d]`,
/// a block of accumulator columns held in registers across all rows.
#[inline(always)]
fn accumulate<A: Arith>(acc: &mut [f32], p: &[f32], v_tile: &[f32], d: usize) {
    let mut c = 0;
    while c + 32 <= d {
        accumulate_block::<A, 32>(&mut acc[c..c + 32], p, v_tile, d, c);
        c += 32;
    }
    while c + 8 <= d {
        accumulate_block::<A, 8>(&mut acc[c..c + 8], p, v_tile, d, c);
        c += 8;
    }
    for (j, a) in acc[c..].iter_mut().enumerate() {
        for (i, &pi) in p.iter().enumerate() {
            *a = A::fma(pi, v_tile[i * d + c + j], *a);
        }
    }
}

#[inline(always)]
fn accumulate_block<A: Arith, const W: usize>(acc: &mut [f32], p: &[f32], v_tile: &[f32], d: usize, c: usize) {
    let mut r = [0.0f32; W];
    r.copy_from_slice(acc);
    for (i, &pi) in p.iter().enumerate() {
        let row = &v_tile[i * d + c..i * d + c + W];
        for j in 0..W {
            r[j] = A::fma(pi, row[j], r[j]);
        }
    }
    acc.copy_from_slice(&r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_head_item_gives_each_head_what_it_alone_gives() {
        // 4 KV heads of d 128, bf16, 16-token blocks in a shuffled
        // order; 300 tokens: several 64-token chunks and a partial last tile.
        // Group 2 (the SIMD loops), 8 and 16 (the AMX tiles, where the CPU has them).
        for g in [2usize, 8, 16] {
            let (kv_heads, d, len, block) = (4usize, 128usize, 300usize, 16usize);
            let slot_elems = kv_heads * d;
            let blocks = len.div_ceil(block);
            let row: Vec<i32> = (0..blocks as i32).map(|i| (i * 7 + 3) % blocks as i32).collect();
            let pool_slots = blocks * block;
            let bytes = |seed: f32| -> Vec<u8> {
                (0..pool_slots * slot_elems)
                    .flat_map(|i| half::bf16::from_f32(((i as f32) * seed).sin()).to_le_bytes())
                    .collect()
            };
            let (k, v) = (bytes(0.731), bytes(0.277));
            // bf16 queries scaled by 0.2, as the backend scales them, so that
            // every path (the bf16 dot products too) serves the item.
            let q: Vec<f32> = (0..kv_heads * g * d)
                .map(|i| half::bf16::from_f32(((i as f32) * 0.013).cos()).to_f32() * 0.2)
                .collect();
            let work = Work {
                k: &k,
                v: &v,
                slot_elems,
                kv_head: 0,
                kv_heads,
                head_dim: d,
                slots: Slots::Blocks { row: &row, block_size: block },
                start: 0,
                end: len,
                q: &q,
                q_scale: 0.2,
                weights_in_bf16: true,
            };
            let mut isas = vec![
                Isa::Portable,
                Isa::detect().at_most_avx2(),
                Isa::detect().without_bf16_dot(),
                Isa::detect().without_amx(),
                Isa::detect(),
            ];
            isas.dedup();
            for isa in isas {
                let mut together = State::new(kv_heads * g, d);
                attend(isa, Elt::Bf16, &work, &mut together, &mut Scratch::new(g, d));
                for i in 0..kv_heads {
                    let mut alone = State::new(g, d);
                    let q_i = &q[i * g * d..(i + 1) * g * d];
                    attend(isa, Elt::Bf16, &work.one_head(i, q_i), &mut alone, &mut Scratch::new(g, d));
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    let name = isa.name();
                    assert_eq!(bits(&together.m[i * g..(i + 1) * g]), bits(&alone.m), "{name} head {i} m");
                    assert_eq!(bits(&together.l[i * g..(i + 1) * g]), bits(&alone.l), "{name} head {i} l");
                    assert_eq!(
                        bits(&together.acc[i * g * d..(i + 1) * g * d]),
                        bits(&alone.acc),
                        "{name} head {i} acc"
                    );
                    assert!(alone.l.iter().all(|&l| l > 0.0), "{name} head {i}: no tokens summed");
                }
            }
        }
    }

    #[test]
    fn a_tile_prefetch_fetches_every_line_of_k_and_v_once_in_pairs() {
        // 3 KV heads of d 64, bf16: a slot's run of the item's 2 heads is 256
        // bytes (4 lines); 16-token blocks in a shuffled order, and a tile
        // cut short by the range's end.
        let (kv_heads, d, block) = (3usize, 64usize, 16usize);
        let slot_elems = kv_heads * d;
        let row: Vec<i32> = vec![2, 0, 3, 1];
        let (k, v) = (vec![0u8; 4 * block * slot_elems * 2], vec![0u8; 4 * block * slot_elems * 2]);
        let work = Work {
            k: &k,
            v: &v,
            slot_elems,
            kv_head: 1,
            kv_heads: 2,
            head_dim: d,
            slots: Slots::Blocks { row: &row, block_size: block },
            start: 0,
            end: 40,
            q: &[],
            q_scale: 1.0,
            weights_in_bf16: true,
        };
        for (t0, rows) in [(0usize, 16usize), (16, 16), (32, 8), (48, 0)] {
            for steps in [1usize, 5, 64, 1000] {
                let mut pf = TilePrefetch::new(&work, 2, t0, steps);
                let mut fetched = Vec::new();
                for _ in 0..steps {
                    pf.step_with(|line| fetched.push(line as usize));
                }
                pf.per_step = usize::MAX;
                pf.step_with(|line| fetched.push(line as usize));
                // What the tile's rows are: each slot's run of heads 1 and 2.
                let mut slots = [0usize; TILE];
                work.slots.fill(t0, &mut slots[..rows]);
                let (k0, v0) = (k.as_ptr() as usize, v.as_ptr() as usize);
                let mut expected = Vec::new();
                for &slot in &slots[..rows] {
                    let run = (slot * slot_elems + d) * 2;
                    for line in (0..2 * d * 2).step_by(64) {
                        expected.push(k0 + run + line);
                        expected.push(v0 + run + line);
                    }
                }
                assert_eq!(fetched, expected, "tile at {t0}, {steps} steps");
            }
        }
    }

    #[test]
    fn f16_conversion_is_exact_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let ours = f16_bits_to_f32(bits);
            let theirs = half::f16::from_bits(bits).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#06x}: {ours} vs {theirs}");
            }
        }
    }

    #[test]
    fn exp2_is_accurate_on_the_softmax_range() {
        let mut worst = 0.0f64;
        for i in 0..=1_260_000 {
            let x = -(i as f32) * 1e-4;
            for value in [exp2_nonpositive::<Separate>(x), exp2_nonpositive::<Fused>(x)] {
                let exact = (x as f64).exp2();
                worst = worst.max(((value as f64) - exact).abs() / exact);
            }
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp2_nonpositive::<Separate>(0.0), 1.0);
        assert!(exp2_nonpositive::<Separate>(-1000.0) <= f32::MIN_POSITIVE);
        assert!(exp2_nonpositive::<Separate>(f32::NAN).is_nan());
    }

    #[test]
    fn dot_matches_for_every_supported_width() {
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS.iter().chain(&[3, 13, 24]) {
            let a: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..d).map(|i| (i as f32 * 0.11).cos()).collect();
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let ours = dot::<Separate>(&a, &b) as f64;
            assert!((ours - exact).abs() < 1e-4, "d={d}: {ours} vs {exact}");
        }
    }

    #[test]
    fn accumulate_matches_for_every_supported_width() {
        for &d in decode_attn_core::shape::SUPPORTED_HEAD_DIMS.iter().chain(&[3, 13, 44]) {
            let p: Vec<f32> = (0..11).map(|i| i as f32 * 0.25).collect();
            let v: Vec<f32> = (0..11 * d).map(|i| (i as f32 * 0.07).sin()).collect();
            let mut acc = vec![1.0f32; d];
            accumulate::<Separate>(&mut acc, &p, &v, d);
            for (j, &a) in acc.iter().enumerate() {
                let exact: f64 = 1.0 + (0..11).map(|i| p[i] as f64 * v[i * d + j] as f64).sum::<f64>();
                assert!((a as f64 - exact).abs() < 1e-4, "d={d} column {j}: {a} vs {exact}");
            }
        }
    }
}

//! The hot loop for bf16 KV on CPUs with AMX-BF16 (Intel Sapphire Rapids and
//! later), selected at run time by [`crate::kernel::Isa::detect`] for groups
//! of 4 to 8 query heads per KV head or an even 10 to 16, and head dims 64,
//! 96 and 128; other problems take `avx512_bf16.rs`.
//!
//! A tile multiply-add (`tdpbf16ps`) takes a 16 x 32 bf16 matrix against a
//! 32 x 16 one into 16 x 16 f32 sums: 8192 multiply-adds an instruction,
//! where `vdpbf16ps` does 32. A Llama-3-70B tile at TP=8 (8 query heads, 16
//! tokens, head dim 128: 32768 multiply-adds) is 8 of them. Per tile of one
//! KV head:
//!
//! * Scores, transposed: `S^T = K Q^T` (tokens x heads), the K rows loaded
//!   straight from the cache as the A matrix (16 rows of 32 elements at the
//!   rows' stride), the queries as B, laid out once per item in pairs of
//!   elements (`build_queries`). The 16 x 8 (or 16 x 16) result is stored,
//!   and `scale` times it is in log2 units.
//! * The online softmax per head, as `avx512.rs`'s, lane-wise on the scores
//!   as stored (a head per lane), the weights then turned to a head per
//!   register (`heads_of`).
//! * P·V with P rounded to bf16 (as `avx512_bf16.rs`, FlashAttention-2 and
//!   the CUDA tensor-core kernel do; only for bf16 and f16 outputs): the V
//!   rows are B as they lie in the cache. A tile pairs the elements of each
//!   B row (`2n`, `2n + 1`: two columns of one token), so A (the weights)
//!   holds each head twice: row `h` with the token's weight in the even
//!   element of each pair and 0 in the odd one, row `g + h` the other way
//!   round. Output row `h` is then head `h`'s even columns, row `g + h` its
//!   odd ones. Over 8 heads (16 rows) the heads go in two halves, one
//!   weights tile each. The accumulator of each KV head is kept in that
//!   layout for the whole item (`Layout::position`), loaded into four tile
//!   registers and stored back each tile, so that an item of several KV
//!   heads computes each exactly as alone.
//!
//! Rows are read in place where a tile's 16 K rows and 16 V rows lie at one
//! stride (a block-table tile); a partial tile or rows at scattered slots
//! (per-token indices) are first copied, zero-filled, to a staging tile.
//!
//! The tile registers are configured at the start of each item and released
//! at its end; [`available`] asks Linux for the process's permission to use
//! them once (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), which is why this path is
//! Linux only. Every pointer a tile load or store reaches comes from a slice
//! whose length is checked first (see each `SAFETY` comment).

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::avx512;
use crate::avx512_bf16;
use crate::kernel::{self, Elt, Fused, Scratch, State, TilePrefetch, Work, TILE};

/// The widest group of query heads per KV head: two halves of 8, each
/// twice (even and odd columns) in the 16 rows of an output tile.
const MAX_GROUP: usize = 16;
/// The largest head dim in 32-element chunks: one tile register holds each
/// chunk's output, and four are free for it.
const MAX_CHUNKS: usize = 4;
/// How many tiles ahead of the one being computed K and V rows are prefetched.
const PREFETCH_TILES: usize = 2;

/// Whether this CPU and OS let the process use AMX-BF16 tiles: CPUID says
/// AMX-TILE and AMX-BF16, the OS enables their state (XCR0 bits 17 and 18),
/// and Linux grants the permission for the tile data. Asked once.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

fn detect() -> bool {
    // Miri (the loops' checks under `cargo xtask miri`) runs neither CPUID
    // nor AMX tiles.
    if cfg!(miri) {
        return false;
    }
    // CPUID is present on every x86-64 CPU; leaf 7 reads 0s where the CPU
    // does not have it.
    let (leaf1, leaf7) = (__cpuid(1), __cpuid_count(7, 0));
    let osxsave = leaf1.ecx & (1 << 27) != 0;
    let amx = leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 22) != 0;
    if !osxsave || !amx {
        return false;
    }
    // SAFETY: XGETBV is present where CPUID reports OSXSAVE (checked above).
    let xcr0 = unsafe { _xgetbv(0) };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    request_tile_permission()
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: true where the
/// kernel granted it (Linux 5.16 and later).
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: this system call only sets a bit of the process's permitted
    // extended state (or fails with an error code); it reads and writes no
    // memory of ours. `syscall` clobbers rcx and r11, declared here.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// How a KV head's `g` query heads and head dim `d` lie in the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    g: usize,
    /// 32-element chunks of the head dim: one output tile each.
    chunks: usize,
    /// Columns of the scores tile (heads, zero past `g`): 8 or 16.
    cols: usize,
    /// Heads per weights tile (`2 * half` rows), and how many such halves.
    half: usize,
    halves: usize,
}

impl Layout {
    /// The layout of `g` heads and head dim `d`, where this path takes them:
    /// 4-8 heads (one weights tile; fewer leave the queries in pairs, 4 x
    /// `d` words, larger than the `g * d` the tile walk hands each KV head)
    /// or an even 10-16 (two equal halves: the tile shapes are set once),
    /// and a head dim of 2-4 whole chunks (the crate's smallest is 64).
    fn new(g: usize, d: usize) -> Option<Layout> {
        let chunks = d / 32;
        let dims = d.is_multiple_of(32) && (1..=MAX_CHUNKS).contains(&chunks);
        let (cols, half) = match g {
            4..=8 => (8, g),
            10..=MAX_GROUP if g.is_multiple_of(2) => (16, g / 2),
            _ => return None,
        };
        dims.then_some(Layout { g, chunks, cols, half, halves: g / half })
    }

    /// Where column `j` of head `h` lies in a KV head's accumulator in tile
    /// order: output tile (half `h / half`, chunk `j / 32`), row `h % half`
    /// (even columns) or `half + h % half` (odd), element `j % 32 / 2`.
    fn position(&self, h: usize, j: usize) -> usize {
        let (within, row) = (j % 32, h % self.half);
        let row = if within.is_multiple_of(2) { row } else { self.half + row };
        (self.tile(h / self.half, j / 32) + row) * 16 + within / 2
    }

    /// The first row (of 16 floats) of output tile (`half`, `chunk`).
    fn tile(&self, half: usize, chunk: usize) -> usize {
        (half * self.chunks + chunk) * 2 * self.half
    }
}

/// The tile registers' shapes (`ldtilecfg`'s 64-byte operand, palette 1):
/// tmm0-3 the output of chunks 0-3 and tmm4 the weights of one half of the
/// heads (`2 * half` rows of 64 bytes); tmm5 a chunk of 16 K or V rows (16 x
/// 64 bytes); tmm6 the scores `S^T` and tmm7 a chunk of the queries in pairs
/// (16 rows x `cols` heads).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(layout: Layout) -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1
        let (out_rows, score_bytes) = (2 * layout.half as u8, 4 * layout.cols as u16);
        let shapes: [(u8, u16); 8] = [
            (out_rows, 64),
            (out_rows, 64),
            (out_rows, 64),
            (out_rows, 64),
            (out_rows, 64),
            (TILE as u8, 64),
            (TILE as u8, score_bytes),
            (TILE as u8, score_bytes),
        ];
        for (i, (rows, bytes_per_row)) in shapes.into_iter().enumerate() {
            bytes[16 + 2 * i..18 + 2 * i].copy_from_slice(&bytes_per_row.to_le_bytes());
            bytes[48 + i] = rows;
        }
        TileConfig(bytes)
    }
}

/// A tile's staging memory: the scores as the tile stores them (`[TILE,
/// cols]`), the weights as tmm4 loads them (`[halves, 2 * half, 16]`
/// words), and K and V rows copied where they are not at one stride
/// (`[TILE, d]` bf16).
#[repr(C, align(64))]
struct Staging {
    scores: [f32; TILE * MAX_GROUP],
    weights: [u32; 2 * MAX_GROUP * 16],
    k: [u16; TILE * 32 * MAX_CHUNKS],
    v: [u16; TILE * 32 * MAX_CHUNKS],
}

/// Runs one work item (see `kernel::attend`) and returns true; returns false,
/// touching nothing, where it does not apply: KV other than bf16, an f32
/// output (whose weights stay f32), queries that are not bf16 values, a group
/// or head dim outside [`Layout::new`], lengths that disagree.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, AVX512_BF16, AVX2, FMA and F16C,
/// and [`available`] must have returned true.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn attend(kv: Elt, work: &Work<'_>, state: &mut State, scratch: &mut Scratch) -> bool {
    let d = work.head_dim;
    if kv != Elt::Bf16 || !work.weights_in_bf16 {
        return false;
    }
    let Some(g) = kernel::item_group(work, state, scratch) else {
        return false;
    };
    let Some(layout) = Layout::new(g, d) else {
        return false;
    };
    if !avx512_bf16::unscaled_bf16_queries(work.q, work.q_scale, &mut scratch.q) {
        return false;
    }
    let mut queries = std::mem::take(&mut scratch.tiles);
    build_queries(&scratch.q, layout, &mut queries);
    for acc in state.acc.chunks_exact_mut(g * d) {
        reorder(acc, layout, Order::ToTiles);
    }
    let scale = work.q_scale;
    let steps = work.kv_heads * 2 * layout.chunks;
    let mut staging = Staging {
        scores: [0.0; TILE * MAX_GROUP],
        weights: [0; 2 * MAX_GROUP * 16],
        k: [0; TILE * 32 * MAX_CHUNKS],
        v: [0; TILE * 32 * MAX_CHUNKS],
    };
    let config = TileConfig::new(layout);
    // SAFETY: the CPU has AMX-TILE and the process may use it (`available`);
    // `config` is a valid palette-1 configuration of 64 bytes, 64-aligned.
    asm!("ldtilecfg [{0}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
    kernel::for_each_head_tile(kv, work, &queries, state, PREFETCH_TILES, steps, |t, pf| {
        // SAFETY: `attend`'s caller guarantees the features; the tiles are
        // configured for `layout` above.
        unsafe { tile(layout, t.q, scale, t.m, t.l, t.acc, t.k_rows, t.v_rows, &mut staging, pf) }
    });
    // SAFETY: returns the tile registers to their initial state.
    asm!("tilerelease", options(nostack, nomem));
    for acc in state.acc.chunks_exact_mut(g * d) {
        reorder(acc, layout, Order::FromTiles);
    }
    scratch.tiles = queries;
    true
}

/// The item's queries (`q`, `[kv_heads, g, d]`, bf16 values as f32) as the B
/// matrices of the scores, in `out` (`[kv_heads, g * d]` words as f32 bits;
/// of each KV head's `g * d`, the first `chunks * 16 * cols <= g * d` are
/// used): for chunk `c` (elements `32c .. 32c + 32`), row `r` (elements
/// `32c + 2r` and `+ 1`), column `h` (of `cols`), the two bf16 of head `h`,
/// the even element in the low half; heads past `g` are 0.
fn build_queries(q: &[f32], layout: Layout, out: &mut Vec<f32>) {
    let (g, d, cols) = (layout.g, 32 * layout.chunks, layout.cols);
    out.clear();
    out.resize(q.len(), 0.0);
    let bf16 = |x: f32| x.to_bits() >> 16;
    for (q, out) in q.chunks_exact(g * d).zip(out.chunks_exact_mut(g * d)) {
        for c in 0..layout.chunks {
            for r in 0..TILE {
                for h in 0..g {
                    let (even, odd) = (q[h * d + 32 * c + 2 * r], q[h * d + 32 * c + 2 * r + 1]);
                    out[(c * TILE + r) * cols + h] = f32::from_bits(bf16(even) | (bf16(odd) << 16));
                }
            }
        }
    }
}

/// A KV head's accumulator at most: `MAX_GROUP` heads of `32 * MAX_CHUNKS`.
const MAX_ACC: usize = MAX_GROUP * 32 * MAX_CHUNKS;

/// Which way [`reorder`] moves an accumulator.
#[derive(Clone, Copy)]
enum Order {
    /// From natural (`[g, d]`) to tile order ([`Layout::position`]).
    ToTiles,
    /// From tile order back to natural.
    FromTiles,
}

/// Moves one KV head's accumulator (`g * d <= MAX_ACC` values) between its
/// natural order and tile order, through a stack copy (the permutation has
/// cycles, so it cannot be done in place element by element).
fn reorder(acc: &mut [f32], layout: Layout, order: Order) {
    let d = 32 * layout.chunks;
    let mut copy = [0.0f32; MAX_ACC];
    copy[..acc.len()].copy_from_slice(acc);
    for h in 0..layout.g {
        for j in 0..d {
            let (natural, tiled) = (h * d + j, layout.position(h, j));
            match order {
                Order::ToTiles => acc[tiled] = copy[natural],
                Order::FromTiles => acc[natural] = copy[tiled],
            }
        }
    }
}

/// The stride, in bytes, at which the 16 K rows and the 16 V rows of a full
/// tile lie, where both have one; `None` for a partial tile or rows at
/// scattered places.
fn common_stride(k_rows: &[&[u8]; TILE], v_rows: &[&[u8]]) -> Option<isize> {
    if v_rows.len() != TILE {
        return None;
    }
    let (k0, v0) = (k_rows[0].as_ptr() as isize, v_rows[0].as_ptr() as isize);
    let stride = (k_rows[1].as_ptr() as isize).wrapping_sub(k0);
    let at = |r: usize| stride.wrapping_mul(r as isize);
    (1..TILE)
        .all(|r| {
            k_rows[r].as_ptr() as isize == k0.wrapping_add(at(r))
                && v_rows[r].as_ptr() as isize == v0.wrapping_add(at(r))
        })
        .then_some(stride)
}

/// Copies `rows` (each at least `d` bf16) into `out` (`[TILE, d]`), rows past
/// them zero.
fn stage_rows(rows: &[&[u8]], d: usize, out: &mut [u16]) {
    for (r, out) in out.chunks_exact_mut(d).take(TILE).enumerate() {
        match rows.get(r) {
            Some(row) => {
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = u16::from_le_bytes([b[0], b[1]]);
                }
            }
            None => out.fill(0),
        }
    }
}

/// One `tdpbf16ps` into output register `tmm{c}` (0-3): weights tmm4 times
/// the V chunk in tmm5.
macro_rules! pv_chunk {
    ($acc:literal, $at:expr, $v:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd tmm", $acc, ", [{at} + {row}]"),
            "tileloadd tmm5, [{v} + {stride}]",
            concat!("tdpbf16ps tmm", $acc, ", tmm4, tmm5"),
            concat!("tilestored [{at} + {row}], tmm", $acc),
            at = in(reg) $at,
            row = in(reg) 64usize,
            v = in(reg) $v,
            stride = in(reg) $stride,
            options(nostack),
        )
    };
}

/// One tile of one KV head: the scores of its `g` query heads (`queries` as
/// `build_queries` lays out this KV head's) against the tile's K rows, times
/// `scale`; the online-softmax update of `m`, `l` and `acc` (tile order); the
/// V rows accumulated with the weights rounded to bf16. `v_rows` holds the
/// tile's valid rows; `k_rows` past them repeat a valid row.
///
/// # Safety
/// The CPU must have the features `attend` requires, with the tile registers
/// configured (`TileConfig::new(layout)`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn tile(
    layout: Layout,
    queries: &[f32],
    scale: f32,
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    k_rows: &[&[u8]; TILE],
    v_rows: &[&[u8]],
    staging: &mut Staging,
    pf: &mut TilePrefetch<'_>,
) {
    let (g, chunks, cols) = (layout.g, layout.chunks, layout.cols);
    let d = 32 * chunks;
    let n = v_rows.len();
    if m.len() != g
        || l.len() != g
        || acc.len() != g * d
        || queries.len() < chunks * TILE * cols
        || !(1..=TILE).contains(&n)
        || k_rows.iter().chain(v_rows).any(|r| r.len() < 2 * d)
    {
        return;
    }
    // The rows in place, or staged. SAFETY (the tile loads below): in place,
    // row `r` of chunk `c` is the 64 bytes from byte `64c` of `k_rows[r]` (or
    // `v_rows[r]`), which holds `2d >= 64(c + 1)` bytes; staged, of row `r`
    // of `staging.k` (`.v`), `d` elements long.
    let (k, v, stride) = match common_stride(k_rows, v_rows) {
        Some(stride) => (k_rows[0].as_ptr(), v_rows[0].as_ptr(), stride),
        None => {
            stage_rows(&k_rows[..n], d, &mut staging.k);
            stage_rows(v_rows, d, &mut staging.v);
            (staging.k.as_ptr() as *const u8, staging.v.as_ptr() as *const u8, 2 * d as isize)
        }
    };
    // S^T (16 tokens x `cols` heads) in tmm6. SAFETY: chunk `c` of the
    // queries is 16 rows of `4 cols` bytes from word `16 cols c`, inside
    // `queries` (checked above); the scores' 16 rows of `4 cols <= 64` bytes
    // are `staging.scores`.
    asm!("tilezero tmm6", options(nostack, nomem));
    for c in 0..chunks {
        asm!(
            "tileloadd tmm5, [{k} + {stride}]",
            "tileloadd tmm7, [{q} + {qrow}]",
            "tdpbf16ps tmm6, tmm5, tmm7",
            k = in(reg) k.add(64 * c),
            stride = in(reg) stride,
            q = in(reg) queries.as_ptr().add(c * TILE * cols),
            qrow = in(reg) 4 * cols,
            options(nostack, readonly),
        );
        pf.step();
    }
    asm!(
        "tilestored [{s} + {row}], tmm6",
        s = in(reg) staging.scores.as_mut_ptr(),
        row = in(reg) 4 * cols,
        options(nostack),
    );
    softmax_weights(layout, &staging.scores, scale, m, l, acc, n, &mut staging.weights);
    // P·V, a half of the heads at a time (the V chunks come from L1 the
    // second time). SAFETY: tmm4's `2 half` rows of 64 bytes are the half's
    // in `staging.weights` (`2g <= 32` rows of 16 words); output tile
    // (`half`, `c`) is `2 half` rows of 16 floats from row `layout.tile(half,
    // c)` of `acc` (`acc.len() == g * d`).
    let acc = acc.as_mut_ptr();
    for half in 0..layout.halves {
        asm!(
            "tileloadd tmm4, [{w} + {row}]",
            w = in(reg) staging.weights.as_ptr().add(half * 2 * layout.half * 16),
            row = in(reg) 64usize,
            options(nostack, readonly),
        );
        let at = |c: usize| acc.add(layout.tile(half, c) * 16);
        // The prefetch steps: two per chunk of each KV head's tile, as
        // `attend` counts them, in the first half only.
        let mut step = || {
            if half == 0 {
                pf.step();
            }
        };
        pv_chunk!("0", at(0), v, stride);
        step();
        if chunks > 1 {
            pv_chunk!("1", at(1), v.add(64), stride);
            step();
        }
        if chunks > 2 {
            pv_chunk!("2", at(2), v.add(128), stride);
            step();
        }
        if chunks > 3 {
            pv_chunk!("3", at(3), v.add(192), stride);
            step();
        }
    }
}

/// The online-softmax step of one tile, as `avx512::online_softmax`, from
/// the scores as the tile stored them (`scores`, `[TILE, cols]`, times
/// `scale`; rows `n..` masked out) for the `g` heads: `m` and `l` move to the
/// tile's max and sum, `acc` (tile order) is rescaled where the max grew, and
/// the weights `2^(s - m)` go to `weights` rounded to bf16, as tmm4 reads
/// them (half `k`'s `2 half` rows from row `2 half k`: head `h`'s row `h %
/// half` in the even half of each word, row `half + h % half` in the odd).
///
/// The scores stay as stored, a token's heads a register (two tokens' eight
/// at `cols` 8), so the max and the sum over the tile's tokens are
/// lane-wise (head by head) across registers; only the weights are turned
/// around, to a head's 16 tokens a register, by [`heads_of`]. (Gathering
/// each head's scores first and reducing across lanes took 150 of a 70B
/// tile's 370 ns in L1.)
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn softmax_weights(
    layout: Layout,
    scores: &[f32; TILE * MAX_GROUP],
    scale: f32,
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    n: usize,
    weights: &mut [u32; 2 * MAX_GROUP * 16],
) {
    let (g, half, pairs) = (layout.g, layout.half, layout.cols == 8);
    if m.len() != g || l.len() != g || acc.len() != g * 32 * layout.chunks || n == 0 || n > TILE {
        return;
    }
    // Register `i`: token `i`, or at `cols` 8 tokens 2i (lanes 0-7) and
    // 2i + 1 (lanes 8-15); head `h` at lane `h` (of each half).
    let regs = TILE * layout.cols / 16;
    let valid = |i: usize| -> __mmask16 {
        match pairs {
            true => (if 2 * i < n { 0x00ff } else { 0 }) | (if 2 * i + 1 < n { 0xff00 } else { 0 }),
            false if i < n => 0xffff,
            false => 0,
        }
    };
    let mut x = [_mm512_setzero_ps(); TILE];
    for (i, x) in x.iter_mut().enumerate().take(regs) {
        // SAFETY: floats 16i .. 16i + 16 of `scores` (TILE * MAX_GROUP).
        let raw = _mm512_loadu_ps(scores.as_ptr().add(16 * i));
        *x = _mm512_mask_blend_ps(
            valid(i),
            _mm512_set1_ps(f32::NEG_INFINITY),
            _mm512_mul_ps(raw, _mm512_set1_ps(scale)),
        );
    }
    // Lane-wise over the registers; at `cols` 8 the two halves too (the
    // other half of a register; at `cols` 16 the register itself).
    let other_half = |v: __m512| if pairs { _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v) } else { v };
    let mut tile_max = x[0];
    for &x in &x[1..regs] {
        tile_max = _mm512_max_ps(tile_max, x);
    }
    let mut head_max = [0.0f32; 16];
    // SAFETY: `head_max` holds 16 floats.
    _mm512_storeu_ps(head_max.as_mut_ptr(), _mm512_max_ps(tile_max, other_half(tile_max)));
    // The running max of head `h` in lane `h` (and `8 + h` at `cols` 8; 0
    // past `g`, whose scores are 0 and whose weights are not used).
    let mut running = [0.0f32; 16];
    for h in 0..g {
        let m_old = m[h];
        let m_new = m_old.max(head_max[h]);
        if m_new > m_old {
            let alpha = if m_old == f32::NEG_INFINITY {
                l[h] = 0.0;
                0.0
            } else {
                let alpha = kernel::exp2_nonpositive::<Fused>(m_old - m_new);
                l[h] *= alpha;
                alpha
            };
            for c in 0..layout.chunks {
                for row in [h % half, half + h % half] {
                    let at = acc.as_mut_ptr().add((layout.tile(h / half, c) + row) * 16);
                    // SAFETY: a row of output tile (h / half, c), inside the
                    // `g * d` floats of `acc` ([`Layout::position`]).
                    _mm512_storeu_ps(at, _mm512_mul_ps(_mm512_loadu_ps(at), _mm512_set1_ps(alpha)));
                }
            }
            m[h] = m_new;
        }
        running[h] = m[h];
        if pairs {
            running[8 + h] = m[h];
        }
    }
    // SAFETY: `running` holds 16 floats.
    let running = _mm512_loadu_ps(running.as_ptr());
    let mut sum = _mm512_setzero_ps();
    for (i, x) in x.iter_mut().enumerate().take(regs) {
        *x = _mm512_maskz_mov_ps(valid(i), avx512::exp2(_mm512_sub_ps(*x, running)));
        sum = _mm512_add_ps(sum, *x);
    }
    let mut head_sum = [0.0f32; 16];
    // SAFETY: `head_sum` holds 16 floats.
    let sum = if pairs { _mm512_add_ps(sum, other_half(sum)) } else { sum };
    _mm512_storeu_ps(head_sum.as_mut_ptr(), sum);
    let heads = if pairs {
        let pairs: [__m512; TILE / 2] = std::array::from_fn(|i| x[i]);
        let heads = heads_of(&pairs, &PAIRS_TO_HEADS);
        std::array::from_fn(|h| if h < TILE / 2 { heads[h] } else { _mm512_setzero_ps() })
    } else {
        heads_of(&x, &TOKENS_TO_HEADS)
    };
    for h in 0..g {
        l[h] += head_sum[h];
        let rounded = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(heads[h]));
        let even = _mm512_cvtepu16_epi32(rounded);
        let first = (h / half) * 2 * half + h % half;
        // SAFETY: rows `first` and `first + half` of 16 words lie in the
        // `2g <= 32` rows of `weights`.
        _mm512_storeu_si512(weights.as_mut_ptr().add(first * 16) as *mut _, even);
        _mm512_storeu_si512(weights.as_mut_ptr().add((first + half) * 16) as *mut _, _mm512_slli_epi32::<16>(even));
    }
}

/// `vpermt2ps` indices of [`heads_of`], `ROUNDS` rounds: for round `r`, the
/// outputs with register bit `r` clear and set. Round `r` trades register bit
/// `r` (a token bit) for lane bit `r` (head bit `r`): the low output takes the
/// lanes with that bit clear from both inputs, the high one those with it
/// set, and the bit of a lane's new place says which input it came from.
/// With a token a register (16 registers, 4 rounds) register `h` then holds
/// head `h` with token `t` in lane `t`. With token pairs (8 registers,
/// tokens `2i` and `2i + 1` in lanes 0-7 and 8-15; 3 rounds) token `t` would
/// land in lane `8(t % 2) + t / 2`, so the last round's indices are taken in
/// that order.
const fn turn_indices<const ROUNDS: usize>(pairs: bool) -> [[[i32; 16]; 2]; ROUNDS] {
    let mut idx = [[[0i32; 16]; 2]; ROUNDS];
    let mut r = 0;
    while r < ROUNDS {
        let bit = 1 << r;
        let mut j = 0;
        while j < 16 {
            let (low, high) = if j & bit == 0 { (j, j | bit) } else { ((j & !bit) | 16, j | 16) };
            idx[r][0][j] = low as i32;
            idx[r][1][j] = high as i32;
            j += 1;
        }
        r += 1;
    }
    if pairs {
        let last = idx[ROUNDS - 1];
        let mut t = 0;
        while t < 16 {
            let from = 8 * (t % 2) + t / 2;
            idx[ROUNDS - 1][0][t] = last[0][from];
            idx[ROUNDS - 1][1][t] = last[1][from];
            t += 1;
        }
    }
    idx
}
const PAIRS_TO_HEADS: [[[i32; 16]; 2]; 3] = turn_indices::<3>(true);
const TOKENS_TO_HEADS: [[[i32; 16]; 2]; 4] = turn_indices::<4>(false);

/// The tile's weights turned from tokens (a token, or two, a register, head
/// `h` at lane `h` of each) to heads (result `h`: head `h`'s 16 tokens in
/// order), in rounds of two-register permutes ([`turn_indices`]).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn heads_of<const REGS: usize, const ROUNDS: usize>(
    x: &[__m512; REGS],
    rounds: &[[[i32; 16]; 2]; ROUNDS],
) -> [__m512; REGS] {
    let mut regs = *x;
    for (r, idx) in rounds.iter().enumerate() {
        let bit = 1 << r;
        // SAFETY: each index array holds 16 i32.
        let (low, high) =
            (_mm512_loadu_si512(idx[0].as_ptr() as *const _), _mm512_loadu_si512(idx[1].as_ptr() as *const _));
        let mut next = regs;
        for a in (0..REGS).filter(|a| a & bit == 0) {
            next[a] = _mm512_permutex2var_ps(regs[a], low, regs[a | bit]);
            next[a | bit] = _mm512_permutex2var_ps(regs[a], high, regs[a | bit]);
        }
        regs = next;
    }
    regs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_order_is_a_permutation_and_round_trips() {
        for (g, d) in [(4, 64), (8, 128), (5, 96), (10, 64), (16, 128)] {
            let layout = Layout::new(g, d).unwrap();
            let mut seen = vec![false; g * d];
            for h in 0..g {
                for j in 0..d {
                    seen[layout.position(h, j)] = true;
                }
            }
            assert!(seen.iter().all(|&s| s), "g={g} d={d}");
            let original: Vec<f32> = (0..g * d).map(|i| i as f32).collect();
            let mut x = original.clone();
            reorder(&mut x, layout, Order::ToTiles);
            let half = layout.half;
            assert_eq!(x[1], 2.0, "g={g}: row 0 (head 0's even columns) holds column 2 second");
            assert_eq!(x[half * 16], 1.0, "g={g}: row `half` starts with head 0's column 1");
            reorder(&mut x, layout, Order::FromTiles);
            assert_eq!(x, original);
        }
        for (g, d) in [(3, 128), (9, 128), (11, 64), (17, 64), (8, 192), (8, 80)] {
            assert_eq!(Layout::new(g, d), None, "g={g} d={d}");
        }
    }

    #[test]
    fn weights_turn_from_tokens_to_heads() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("SKIPPED: this CPU has no AVX-512F");
            return;
        }
        // Element (t, h) labelled 100t + h, as the scores tile stores it:
        // 8 heads a row (two rows a register) or 16 (one).
        for cols in [8, 16] {
            let labels: Vec<f32> = (0..TILE * cols).map(|i| (100 * (i / cols) + i % cols) as f32).collect();
            // SAFETY: AVX-512F was detected; every load reads 16 of the labels.
            let heads: Vec<__m512> = unsafe {
                if cols == 8 {
                    let x: [__m512; TILE / 2] = std::array::from_fn(|i| _mm512_loadu_ps(labels.as_ptr().add(16 * i)));
                    heads_of(&x, &PAIRS_TO_HEADS).to_vec()
                } else {
                    let x: [__m512; TILE] = std::array::from_fn(|i| _mm512_loadu_ps(labels.as_ptr().add(16 * i)));
                    heads_of(&x, &TOKENS_TO_HEADS).to_vec()
                }
            };
            for (h, head) in heads.iter().enumerate() {
                let mut lanes = [0.0f32; 16];
                // SAFETY: `lanes` holds 16 floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *head) };
                let expected: Vec<f32> = (0..TILE).map(|t| (100 * t + h) as f32).collect();
                assert_eq!(lanes.to_vec(), expected, "cols {cols} head {h}");
            }
        }
    }

    #[test]
    fn a_common_stride_is_found_only_where_every_row_has_it() {
        let bytes = vec![0u8; 64 * 1024];
        let rows = |stride: usize| -> [&[u8]; TILE] { std::array::from_fn(|r| &bytes[r * stride..r * stride + 256]) };
        let (k, v) = (rows(512), rows(512));
        assert_eq!(common_stride(&k, &v), Some(512));
        let mut scattered = k;
        scattered[9] = &bytes[40_000..40_256];
        assert_eq!(common_stride(&scattered, &v), None);
        assert_eq!(common_stride(&k, &v[..15]), None, "a partial tile is staged");
        assert_eq!(common_stride(&k, &rows(1024)), None, "V at another stride");
    }
}

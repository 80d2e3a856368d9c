//! Small calls through every branch of the SIMD loops' pointer arithmetic:
//! each head-group size the loops dispatch on (1 to 4 query heads a pass,
//! and 5 and 8 as two passes), a head dim with an 8-element tail, partial
//! tiles, each element size, both index layouts, splits, the LSE. Natively
//! they take milliseconds; they are sized for Miri, which runs them in about
//! 3 minutes on 2 cores (`cargo xtask miri`; its first build of the
//! dependencies takes about 9 more) and fails on an out-of-bounds,
//! misaligned or aliased access in the `unsafe` code (s55: it found
//! `_mm_storel_pd` storing through an `f64` place, which must be 8-aligned,
//! into f32 scores).
//!
//! Under Miri the loops are AVX2's and the portable one's (its prefetches),
//! with bf16 and f32 KV: Miri runs neither AVX-512's permutes and bf16 dot
//! products nor F16C's conversions, so the AVX-512 loops, AMX and f16 KV
//! are checked natively only (`decode.rs`).

mod common;

use common::*;
use decode_attn_core::synth::{relative_error, HostBatch};
use decode_attn_core::{DType, DecodeAttention, KvLayout, Policy};
use decode_attn_cpu::reference::decode_reference_with_lse;
use decode_attn_cpu::CpuBackend;

/// Decodes one small batch on `backend` with poisoned output, workspace and
/// LSE, and checks both against the f64 reference.
#[allow(clippy::too_many_arguments)]
fn check(
    backend: &CpuBackend,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    layout: KvLayout,
    lens: &[u32],
    policy: Policy,
) {
    let batch = HostBatch::random(&problem(q_heads, kv_heads, head_dim, uniform(dtype), layout, lens), 55);
    let plan = backend.plan(&batch.problem, policy).unwrap();
    let mut buffers = Buffers::new(&batch, &plan).with_lse(&plan);
    buffers.decode(backend, &plan, None).unwrap();
    let (reference, reference_lse) = decode_reference_with_lse(&batch, batch.problem.shape.default_scale());
    let what = format!("{} {} {policy}", backend.instruction_set(), batch.problem);
    let err = relative_error(&buffers.out_f32(&plan), &reference);
    assert!(err <= tolerance(batch.problem.dtypes), "{what}: relative error {err:e}");
    for (got, want) in buffers.lse_f32().iter().zip(&reference_lse) {
        let close = (*got as f64 - want).abs() <= 1e-3 * want.abs().max(1.0);
        assert!(close || (got.is_infinite() && want.is_infinite()), "{what}: lse {got} against {want}");
    }
}

/// The best loop this CPU (or Miri's target features) has, on the calling
/// thread: a one-thread backend starts no rayon pool, so Miri checks these
/// calls under Stacked Borrows, which rayon's crossbeam-epoch would break.
fn simd() -> CpuBackend {
    CpuBackend::with_threads(1).unwrap()
}

/// 1, 2, 3 and 4 query heads a pass, and 5 and 8 (4 + 1, 4 + 4); a tile
/// and a partial one (20 tokens).
#[test]
fn every_head_group_size() {
    let backend = simd();
    for group in [1, 2, 3, 4, 5, 8] {
        check(&backend, group, 1, 64, DType::Bf16, KvLayout::block_table(16), &[20], Policy::Fixed { splits: 1 });
    }
}

/// Head dims whose last 8 elements are not a whole 16 (120), and a 16
/// past a multiple of 64 (80), for bf16 and for the 4-byte f32.
#[test]
fn head_dims_with_tails_and_four_byte_elements() {
    let backend = simd();
    for (dtype, head_dim) in [(DType::Bf16, 120), (DType::F32, 80), (DType::F32, 120)] {
        check(&backend, 4, 1, head_dim, dtype, KvLayout::block_table(16), &[20], Policy::Fixed { splits: 1 });
    }
}

/// Per-token indices and allocator blocks larger than the kernel's, two KV
/// heads an item, an empty sequence, and two splits a sequence (the
/// workspace and the merge).
#[test]
fn layouts_and_splits() {
    let backend = simd();
    let lens = [0, 20, 3];
    let allocator_blocks = KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 32 };
    for layout in [KvLayout::token_indices(4), allocator_blocks] {
        check(&backend, 4, 2, 64, DType::Bf16, layout, &lens, Policy::Fixed { splits: 2 });
    }
}

/// The portable loop, whose only `unsafe` is its prefetches.
#[test]
fn portable_loop() {
    let backend = simd().portable();
    check(&backend, 4, 1, 64, DType::Bf16, KvLayout::block_table(16), &[20], Policy::Fixed { splits: 2 });
}

//! Bad contents and sizes: each gives its own error, naming the value, and
//! leaves the output and the workspace byte-identical; a property test
//! writes garbage into the indices at random.

mod common;

use common::*;
use decode_attn_core::synth::{i32_bytes, relative_error, HostBatch, SplitMix64};
use decode_attn_core::{DType, DecodeArgs, DecodeAttention, Error, KvIndexBuffers, KvLayout, MergeArgs, Plan, Policy};
use decode_attn_cpu::reference::decode_reference_with_lse;
use decode_attn_cpu::{CpuBackend, CpuBuffer};
use proptest::prelude::*;

fn backend() -> CpuBackend {
    CpuBackend::with_threads(2).unwrap()
}

fn setup(layout: KvLayout, policy: Policy) -> (CpuBackend, HostBatch, Plan, Buffers) {
    let backend = backend();
    let batch = HostBatch::random(&problem(8, 2, 64, uniform(DType::Bf16), layout, &[40, 100, 0, 17]), 5);
    let plan = backend.plan(&batch.problem, policy).unwrap();
    let buffers = Buffers::new(&batch, &plan);
    (backend, batch, plan, buffers)
}

/// Runs the call, expects `expected`, and checks that nothing was written.
fn expect_error(backend: &CpuBackend, plan: &Plan, buffers: &mut Buffers, expected: Error, mentions: &[&str]) {
    let out_before = buffers.out.clone();
    let ws_before = buffers.workspace.clone();
    let err = buffers.decode(backend, plan, None).unwrap_err();
    assert_eq!(err, expected);
    let text = err.to_string();
    for m in mentions {
        assert!(text.contains(m), "{text:?} does not mention {m}");
    }
    assert!(buffers.out == out_before, "out was written on {err}");
    assert!(buffers.workspace == ws_before, "workspace was written on {err}");
}

fn set_i32(buffer: &mut CpuBuffer, index: usize, value: i32) {
    buffer.as_bytes_mut()[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn the_valid_call_succeeds() {
    for layout in LAYOUTS {
        let (backend, _, plan, mut buffers) = setup(layout, Policy::Fixed { splits: 4 });
        buffers.decode(&backend, &plan, None).unwrap();
    }
}

#[test]
fn block_id_out_of_range() {
    let (backend, batch, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 4 });
    let num_blocks = batch.num_slots / 16;
    let stride = buffers.max_blocks_per_seq;
    set_i32(&mut buffers.index_a, stride + 2, num_blocks as i32);
    let expected = Error::BlockIdOutOfRange { seq: 1, index: 2, block: num_blocks as i64, num_blocks };
    expect_error(&backend, &plan, &mut buffers, expected, &[&num_blocks.to_string()]);

    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 1 });
    set_i32(&mut buffers.index_a, 0, -7);
    let expected = Error::BlockIdOutOfRange { seq: 0, index: 0, block: -7, num_blocks };
    expect_error(&backend, &plan, &mut buffers, expected, &["-7"]);
}

#[test]
fn unused_block_entries_are_not_checked() {
    // Padding past a sequence's last block may hold anything.
    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 2 });
    let stride = buffers.max_blocks_per_seq;
    set_i32(&mut buffers.index_a, 2 * stride, i32::MAX); // sequence 2 has length 0
    set_i32(&mut buffers.index_a, 3 * stride + 2, -5); // sequence 3 uses 2 blocks
    buffers.decode(&backend, &plan, None).unwrap();
}

#[test]
fn sequence_too_long_for_its_row() {
    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Auto);
    let capacity = buffers.max_blocks_per_seq * 16;
    set_i32(&mut buffers.lens, 3, capacity as i32 + 1);
    let expected = Error::SeqTooLong { seq: 3, seq_len: capacity + 1, capacity };
    expect_error(&backend, &plan, &mut buffers, expected, &[&(capacity + 1).to_string()]);
}

#[test]
fn negative_sequence_length() {
    for layout in [LAYOUTS[0], LAYOUTS[2]] {
        let (backend, _, plan, mut buffers) = setup(layout, Policy::Auto);
        set_i32(&mut buffers.lens, 1, -3);
        expect_error(&backend, &plan, &mut buffers, Error::NegativeSeqLen { seq: 1, seq_len: -3 }, &["-3"]);
    }
}

#[test]
fn bad_indptr() {
    let (backend, _, plan, mut buffers) = setup(KvLayout::token_indices(1), Policy::Fixed { splits: 3 });
    let indptr = i32s(buffers.index_a.as_bytes());
    let num_indices = buffers.index_b.as_bytes().len() / 4;
    // Not monotone: sequence 1 ends before it starts.
    set_i32(&mut buffers.index_a, 2, indptr[1] - 1);
    let expected = Error::InvalidIndptr { seq: 1, start: indptr[1] as i64, end: indptr[1] as i64 - 1, num_indices };
    expect_error(&backend, &plan, &mut buffers, expected, &[&(indptr[1] - 1).to_string()]);

    // Past the end of kv_indices.
    let (backend, _, plan, mut buffers) = setup(KvLayout::token_indices(4), Policy::Fixed { splits: 3 });
    let indptr = i32s(buffers.index_a.as_bytes());
    let num_indices = buffers.index_b.as_bytes().len() / 4;
    set_i32(&mut buffers.index_a, 4, num_indices as i32 + 9);
    let expected = Error::InvalidIndptr { seq: 3, start: indptr[3] as i64, end: num_indices as i64 + 9, num_indices };
    expect_error(&backend, &plan, &mut buffers, expected, &[&(num_indices + 9).to_string()]);

    // Negative start.
    let (backend, _, plan, mut buffers) = setup(KvLayout::token_indices(1), Policy::Auto);
    set_i32(&mut buffers.index_a, 0, -1);
    let expected = Error::InvalidIndptr { seq: 0, start: -1, end: 40, num_indices };
    expect_error(&backend, &plan, &mut buffers, expected, &["-1"]);
}

#[test]
fn indptr_and_seq_lens_disagree() {
    let (backend, _, plan, mut buffers) = setup(KvLayout::token_indices(1), Policy::Fixed { splits: 2 });
    set_i32(&mut buffers.lens, 1, 99);
    let expected = Error::IndptrLengthMismatch { seq: 1, indexed: 100, seq_len: 99 };
    expect_error(&backend, &plan, &mut buffers, expected, &["100", "99"]);
}

#[test]
fn slot_out_of_range() {
    let (backend, batch, plan, mut buffers) = setup(KvLayout::token_indices(4), Policy::Fixed { splits: 2 });
    let num_slots = batch.num_slots;
    // Token 5 of sequence 1 (sequence 0 has 40 tokens).
    set_i32(&mut buffers.index_b, 45, num_slots as i32);
    let expected = Error::SlotOutOfRange { seq: 1, position: 5, slot: num_slots as i64, num_slots };
    expect_error(&backend, &plan, &mut buffers, expected, &[&num_slots.to_string()]);

    let (backend, batch, plan, mut buffers) = setup(KvLayout::token_indices(1), Policy::Auto);
    set_i32(&mut buffers.index_b, 3, -2);
    let expected = Error::SlotOutOfRange { seq: 0, position: 3, slot: -2, num_slots: batch.num_slots };
    expect_error(&backend, &plan, &mut buffers, expected, &["-2"]);
}

#[test]
fn workspace_too_small() {
    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 4 });
    let needed = plan.workspace_bytes as usize;
    assert!(needed > 0);
    buffers.workspace = CpuBuffer::from_bytes(vec![POISON; needed - 1]);
    let expected = Error::WorkspaceTooSmall { needed, actual: needed - 1 };
    expect_error(&backend, &plan, &mut buffers, expected, &[&needed.to_string()]);
}

#[test]
fn a_doctored_plan_cannot_shrink_the_workspace() {
    let (backend, _, mut plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 4 });
    let needed = plan.workspace_bytes as usize;
    plan.workspace_bytes = 0;
    buffers.workspace = CpuBuffer::default();
    expect_error(&backend, &plan, &mut buffers, Error::WorkspaceTooSmall { needed, actual: 0 }, &[]);
}

#[test]
fn wrong_buffer_sizes() {
    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Auto);
    let q_bytes = plan.problem.q_bytes();
    buffers.q.0.push(0);
    let expected = Error::BufferSize { name: "q", expected: q_bytes, actual: q_bytes + 1 };
    expect_error(&backend, &plan, &mut buffers, expected, &[&q_bytes.to_string()]);

    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Auto);
    let out_bytes = plan.problem.out_bytes();
    buffers.out = CpuBuffer::from_bytes(vec![POISON; out_bytes - 2]);
    let expected = Error::BufferSize { name: "out", expected: out_bytes, actual: out_bytes - 2 };
    expect_error(&backend, &plan, &mut buffers, expected, &[&out_bytes.to_string()]);

    let (backend, _, plan, mut buffers) = setup(KvLayout::token_indices(1), Policy::Auto);
    buffers.lens.0.truncate(8);
    let expected = Error::BufferSize { name: "seq_lens", expected: 16, actual: 8 };
    expect_error(&backend, &plan, &mut buffers, expected, &["16", "8"]);

    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Auto);
    let v = buffers.v.0.len();
    buffers.v.0.truncate(v - 2);
    let expected = Error::BufferSize { name: "v_cache", expected: v, actual: v - 2 };
    expect_error(&backend, &plan, &mut buffers, expected, &[]);
}

#[test]
fn layout_mismatch_and_bad_scale() {
    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Auto);
    let out_before = buffers.out.clone();
    let err = backend
        .decode(
            &plan,
            DecodeArgs {
                q: &buffers.q,
                k_cache: &buffers.k,
                v_cache: &buffers.v,
                seq_lens: &buffers.lens,
                kv_index: KvIndexBuffers::TokenIndices { indptr: &buffers.lens, indices: &buffers.lens },
                workspace: &mut buffers.workspace,
                out: &mut buffers.out,
                lse: None,
                softmax_scale: None,
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::PlanMismatch { .. }), "{err}");
    assert!(buffers.out == out_before);

    let err = buffers.decode(&backend, &plan, Some(f32::NAN)).unwrap_err();
    assert!(matches!(err, Error::InvalidScale(_)), "{err}");
    let err = buffers.decode(&backend, &plan, Some(-1.0)).unwrap_err();
    assert_eq!(err, Error::InvalidScale(-1.0));
    // Finite, but its base-2 form (times log2 e = 1.44) is not: refused rather
    // than run to a NaN output.
    for scale in [f32::MAX, 2.4e38, f32::INFINITY, 0.0] {
        let err = buffers.decode(&backend, &plan, Some(scale)).unwrap_err();
        assert_eq!(err, Error::InvalidScale(scale));
        assert!(err.to_string().contains(&scale.to_string()), "{err}");
    }
    assert!(buffers.out == out_before);
    // The largest scale whose base-2 form is finite is taken.
    let largest = f32::MAX / std::f32::consts::LOG2_E;
    let largest = if (largest * std::f32::consts::LOG2_E).is_finite() { largest } else { largest.next_down() };
    buffers.decode(&backend, &plan, Some(largest)).unwrap();
}

#[test]
fn upload_download_and_alloc() {
    let backend = backend();
    let mut buffer = backend.alloc(8).unwrap();
    assert_eq!(buffer.as_bytes(), &[0; 8]);
    let err = backend.upload(&mut buffer, &[1; 7]).unwrap_err();
    assert!(matches!(err, Error::BufferSize { expected: 8, actual: 7, .. }), "{err}");
    backend.upload(&mut buffer, &i32_bytes(&[3, -4])).unwrap();
    let mut host = [0u8; 8];
    backend.download(&buffer, &mut host).unwrap();
    assert_eq!(i32s(&host), [3, -4]);
    let mut short = [0u8; 9];
    let err = backend.download(&buffer, &mut short).unwrap_err();
    assert!(matches!(err, Error::BufferSize { expected: 8, actual: 9, .. }), "{err}");
    assert!(backend.alloc(usize::MAX).is_err());
    // Large enough for the huge-page advice: still zeroed, still the asked size.
    let big = backend.alloc((6 << 20) + 123).unwrap();
    assert_eq!(big.as_bytes().len(), (6 << 20) + 123);
    assert!(big.as_bytes().iter().all(|&b| b == 0));
    backend.synchronize().unwrap();
}

#[test]
fn an_lse_buffer_of_the_wrong_size_is_refused_before_anything_is_written() {
    for policy in [Policy::Fixed { splits: 1 }, Policy::Fixed { splits: 4 }] {
        let (backend, batch, plan, mut buffers) = setup(KvLayout::block_table(16), policy);
        let rows = batch.problem.num_seqs() * batch.problem.shape.num_q_heads;
        buffers.lse = Some(CpuBuffer::from_bytes(vec![0xAB; rows * 4 - 4]));
        let expected = Error::BufferSize { name: "lse", expected: rows * 4, actual: rows * 4 - 4 };
        expect_error(&backend, &plan, &mut buffers, expected, &["lse"]);
        assert!(buffers.lse_f32().iter().all(|x| x.to_bits() == 0xABAB_ABAB), "lse written");
    }
}

/// Sizes a caller (or an edited plan) gives that would wrap a byte count
/// onto a buffer of the right size: each refused with the value, nothing
/// written, never a panic or an abort (found by fuzzing in s51).
#[test]
fn sizes_past_what_fits_are_refused_not_wrapped() {
    // A block-table stride whose table size wraps to the table's length.
    let (backend, _, plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 4 });
    buffers.max_blocks_per_seq = buffers.max_blocks_per_seq.wrapping_add(1 << 62);
    let stride = buffers.max_blocks_per_seq as u64;
    let err = buffers.decode(&backend, &plan, None).unwrap_err();
    assert!(matches!(err, Error::OutOfRange { what: "max_blocks_per_seq", value, .. } if value == stride), "{err}");
    assert!(buffers.out.as_bytes().iter().all(|&b| b == POISON), "out written on {err}");

    // A plan edited to shapes, block sizes and lengths no planner accepts.
    type Edit = fn(&mut Plan);
    let edits: [(&str, Edit); 4] = [
        ("num_q_heads", |plan| plan.problem.shape.num_q_heads = 1 << 62),
        ("allocator block size", |plan| {
            plan.problem.layout = KvLayout::BlockTable { kernel_block_size: 1 << 60, allocator_block_size: 1 << 60 }
        }),
        ("length", |plan| plan.problem.seq_lens[1] = u32::MAX),
        ("min_tiles_per_split", |plan| plan.rule.min_tiles_per_split = 1 << 28),
    ];
    for (mention, edit) in edits {
        let (backend, _, mut plan, mut buffers) = setup(KvLayout::block_table(16), Policy::Fixed { splits: 4 });
        edit(&mut plan);
        let ws_before = buffers.workspace.clone();
        let err = buffers.decode(&backend, &plan, None).unwrap_err();
        assert!(
            matches!(err, Error::OutOfRange { .. } | Error::SeqLenTooLarge { .. }) && err.to_string().contains(mention),
            "{mention}: {err}"
        );
        assert!(buffers.out.as_bytes().iter().all(|&b| b == POISON), "out written on {err}");
        assert!(buffers.workspace == ws_before, "workspace written on {err}");
    }

    // A pool too large to start.
    let err = CpuBackend::with_threads(1 << 20).map(|_| ()).unwrap_err();
    assert_eq!(err, Error::OutOfRange { what: "CPU threads", value: 1 << 20, min: 1, max: 4096 });
}

/// Merge counts whose product wraps: refused, where the wrapped sizes
/// matched the (empty) buffers given and the call went on to allocate.
#[test]
fn merge_counts_past_what_fits_are_refused() {
    let backend = backend();
    for (num_tokens, num_heads, head_dim) in [(1usize << 62, 1, 4), (1 << 62, 4, 1), (1 << 32, 1 << 32, 1)] {
        let empty = CpuBuffer::default();
        let mut out = CpuBuffer::default();
        let err = backend
            .merge_attn_states(MergeArgs {
                num_tokens,
                num_heads,
                head_dim,
                dtype: DType::F32,
                prefix: &empty,
                prefix_lse: &empty,
                suffix: &empty,
                suffix_lse: &empty,
                out: &mut out,
                out_lse: None,
            })
            .unwrap_err();
        assert!(matches!(err, Error::OutOfRange { what: "num_tokens * num_heads * head_dim", .. }), "{err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Random entries of the lengths, the block table, kv_indptr or
    /// kv_indices overwritten with garbage: the call either refuses them
    /// with an index error, writing nothing (output, LSE and workspace
    /// byte-identical), or decodes what they now say, as the f64 reference
    /// reads the same entries. Never a panic.
    #[test]
    fn garbage_indices_are_refused_or_decoded_as_they_read(
        kv_heads in 1usize..=2,
        group in 1usize..=4,
        layout in any_layout(),
        lens in proptest::collection::vec(0u32..=300, 1..=4),
        policy in any_policy(),
        threads in 1usize..=3,
        with_lse in any::<bool>(),
        edits in 1usize..=3,
        seed in any::<u64>(),
    ) {
        let backend = CpuBackend::with_threads(threads).unwrap();
        let mut batch = HostBatch::random(&problem(kv_heads * group, kv_heads, 64, uniform(DType::Bf16), layout, &lens), seed);
        let plan = backend.plan(&batch.problem, policy).unwrap();
        let edits = batch.scribble(&mut SplitMix64::new(seed ^ 0x5EED), edits);
        let mut buffers = Buffers::new(&batch, &plan);
        if with_lse {
            buffers = buffers.with_lse(&plan);
        }
        let before = (buffers.out.clone(), buffers.lse.clone(), buffers.workspace.clone());
        match buffers.decode(&backend, &plan, None) {
            Err(err) => {
                prop_assert!(
                    matches!(
                        err,
                        Error::NegativeSeqLen { .. }
                            | Error::SeqTooLong { .. }
                            | Error::BlockIdOutOfRange { .. }
                            | Error::SlotOutOfRange { .. }
                            | Error::InvalidIndptr { .. }
                            | Error::IndptrLengthMismatch { .. }
                    ),
                    "{err} after {edits:?}"
                );
                prop_assert!(buffers.out == before.0, "out written on {err}");
                prop_assert!(buffers.lse == before.1, "lse written on {err}");
                prop_assert!(buffers.workspace == before.2, "workspace written on {err}");
            }
            Ok(()) => {
                let (reference, reference_lse) = decode_reference_with_lse(&batch, batch.problem.shape.default_scale());
                let err = relative_error(&buffers.out_f32(&plan), &reference);
                prop_assert!(err <= tolerance(batch.problem.dtypes), "{} {policy} after {edits:?}: {err:e}", batch.problem);
                if with_lse {
                    for (got, want) in buffers.lse_f32().iter().zip(&reference_lse) {
                        let close = (*got as f64 - want).abs() <= 1e-3 * want.abs().max(1.0);
                        prop_assert!(close || (got.is_infinite() && want.is_infinite()), "lse {got} vs {want}");
                    }
                }
            }
        }
    }
}

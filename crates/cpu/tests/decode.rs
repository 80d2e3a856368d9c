//! The fast backend against the f64 reference, and split plans against unsplit ones.

mod common;

use common::*;
use decode_attn_core::shape::SUPPORTED_HEAD_DIMS;
use decode_attn_core::synth::{relative_error, HostBatch};
use decode_attn_core::{DType, DTypes, DecodeAttention, KvLayout, Plan, Policy};
use decode_attn_cpu::reference::decode_reference;
use decode_attn_cpu::CpuBackend;

fn backend() -> CpuBackend {
    CpuBackend::with_threads(2).unwrap()
}

/// Checks `policy` on `batch` against the reference; returns the output.
fn check(backend: &CpuBackend, batch: &HostBatch, policy: Policy, what: &str) -> Vec<f32> {
    let scale = batch.problem.shape.default_scale();
    let out = run(backend, batch, policy, None).unwrap_or_else(|e| panic!("{what}: {e}"));
    let reference = decode_reference(batch, scale);
    let err = relative_error(&out, &reference);
    let tol = tolerance(batch.problem.dtypes);
    assert!(err <= tol, "{what} {policy}: relative error {err:e} > {tol:e}");
    out
}

/// Runs `plan` (made by hand, not from a policy as in `check`) on `batch`,
/// checks the output against the reference (relative error at most 1e-2)
/// and the rows of its empty sequences; returns the buffers, whose
/// workspace a test may read next.
fn check_plan(backend: &CpuBackend, batch: &HostBatch, plan: &Plan, what: &str) -> Buffers {
    let mut buffers = Buffers::new(batch, plan);
    buffers.decode(backend, plan, None).unwrap();
    let out = buffers.out_f32(plan);
    let err = relative_error(&out, &decode_reference(batch, batch.problem.shape.default_scale()));
    assert!(err <= 1e-2, "{what}: relative error {err:e}");
    assert_zero_rows(batch, &out, what);
    buffers
}

/// Every (sequence, head) row of a length-0 sequence must be exactly zero.
fn assert_zero_rows(batch: &HostBatch, out: &[f32], what: &str) {
    let row = batch.problem.shape.num_q_heads * batch.problem.shape.head_dim;
    for (seq, &len) in batch.seq_lens.iter().enumerate() {
        if len == 0 {
            assert!(out[seq * row..(seq + 1) * row].iter().all(|&x| x == 0.0), "{what}: sequence {seq} not zero");
        }
    }
}

#[test]
fn matches_reference_for_every_layout_dtype_and_group() {
    let backend = backend();
    let groups = [(8, 8), (8, 2), (28, 4), (16, 2), (16, 1)]; // g = 1, 4, 7, 8, 16
    let mut seed = 1;
    for layout in LAYOUTS {
        for dtype in DType::ALL {
            for (i, &(hq, hkv)) in groups.iter().enumerate() {
                // The long sequence in a rotating subset keeps the f64 reference quick.
                let long = if (i + seed as usize).is_multiple_of(3) { 3000 } else { 700 };
                let lens = [0, 1, 15, 16, 17, long, 33];
                let batch = HostBatch::random(&problem(hq, hkv, 128, uniform(dtype), layout, &lens), seed);
                seed += 1;
                let what = format!("{layout} {dtype} h={hq} h_kv={hkv}");
                for policy in [Policy::Fixed { splits: 1 }, Policy::Fixed { splits: 3 }] {
                    let out = check(&backend, &batch, policy, &what);
                    assert_zero_rows(&batch, &out, &what);
                }
            }
        }
    }
}

#[test]
fn matches_reference_for_every_head_dim() {
    let backend = backend();
    for (i, &d) in SUPPORTED_HEAD_DIMS.iter().enumerate() {
        for dtype in DType::ALL {
            let layout = LAYOUTS[i % LAYOUTS.len()];
            let batch =
                HostBatch::random(&problem(8, 2, d, uniform(dtype), layout, &[0, 5, 16, 40, 300]), 100 + i as u64);
            let what = format!("d={d} {dtype} {layout}");
            for policy in [Policy::Auto, Policy::Fixed { splits: 4 }] {
                let out = check(&backend, &batch, policy, &what);
                assert_zero_rows(&batch, &out, &what);
            }
        }
    }
}

#[test]
fn mixed_dtypes() {
    let backend = backend();
    let combos = [
        DTypes { q: DType::F32, kv: DType::Bf16, out: DType::F16 },
        DTypes { q: DType::Bf16, kv: DType::F16, out: DType::F32 },
        DTypes { q: DType::F16, kv: DType::F32, out: DType::Bf16 },
        DTypes { q: DType::F32, kv: DType::F16, out: DType::F32 },
    ];
    for (i, dtypes) in combos.into_iter().enumerate() {
        let batch = HostBatch::random(&problem(16, 4, 64, dtypes, LAYOUTS[i], &[3, 0, 200, 1000]), 7 + i as u64);
        let what = format!("{dtypes:?}");
        check(&backend, &batch, Policy::Auto, &what);
        check(&backend, &batch, Policy::Fixed { splits: 5 }, &what);
    }
}

#[test]
fn portable_path_matches_reference_too() {
    let backend = backend().portable();
    assert_eq!(backend.instruction_set(), "portable");
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        for &d in &[80, 120, 128] {
            let batch =
                HostBatch::random(&problem(28, 4, d, uniform(dtype), LAYOUTS[i], &[0, 1, 17, 500]), 40 + i as u64);
            let what = format!("portable {dtype} d={d}");
            check(&backend, &batch, Policy::Fixed { splits: 1 }, &what);
            check(&backend, &batch, Policy::Fixed { splits: 7 }, &what);
        }
    }
}

#[test]
fn avx2_path_matches_reference_too() {
    // On an AVX-512 machine this runs the AVX2 loop; elsewhere whatever is best.
    let backend = backend().at_most_avx2();
    assert_ne!(backend.instruction_set(), "avx512");
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        for &d in &[64, 120, 256] {
            let batch =
                HostBatch::random(&problem(16, 2, d, uniform(dtype), LAYOUTS[3 - i], &[0, 1, 17, 500]), 60 + i as u64);
            let what = format!("at most avx2 {dtype} d={d}");
            check(&backend, &batch, Policy::Fixed { splits: 1 }, &what);
            check(&backend, &batch, Policy::Fixed { splits: 9 }, &what);
        }
    }
}

#[test]
fn amx_path_matches_reference_and_the_bf16_dot_path() {
    // The AMX tiles take bf16 KV with a bf16 or f16 output, 4 to 8 query
    // heads per KV head or an even 10 to 16 (two weights tiles), head dims
    // 64, 96 and 128: groups of both kinds, each head dim,
    // every layout (token indices and partial tiles go through its staged
    // rows), against the reference and against the AVX512_BF16 loop.
    let backend = backend();
    if backend.instruction_set() != "amx-bf16" {
        eprintln!("SKIPPED: this CPU (or OS) gives no AMX-BF16 tiles ({})", backend.instruction_set());
        return;
    }
    let without = CpuBackend::with_threads(2).unwrap().without_amx();
    assert_eq!(without.instruction_set(), "avx512-bf16");
    let groups = [(8, 2), (10, 2), (28, 4), (16, 2), (8, 1), (20, 2), (24, 2), (32, 2), (16, 1)]; // g = 4, 5, 7, 8, 8, 10, 12, 16, 16
    let outs = [DType::Bf16, DType::F16];
    let mut seed = 500;
    for (i, layout) in LAYOUTS.into_iter().enumerate() {
        for (j, &(hq, hkv)) in groups.iter().enumerate() {
            let d = [64, 96, 128, 128][(i + j) % 4];
            let dtypes = DTypes { q: DType::Bf16, kv: DType::Bf16, out: outs[(i + j) % 2] };
            let lens = [0, 1, 15, 16, 17, 33, 700];
            let batch = HostBatch::random(&problem(hq, hkv, d, dtypes, layout, &lens), seed);
            seed += 1;
            let reference = decode_reference(&batch, batch.problem.shape.default_scale());
            for policy in [Policy::Fixed { splits: 1 }, Policy::Fixed { splits: 3 }] {
                let what = format!("{layout} h={hq} h_kv={hkv} d={d} {dtypes:?} {policy}");
                let amx = check(&backend, &batch, policy, &what);
                assert_zero_rows(&batch, &amx, &what);
                let bf16_dot = run(&without, &batch, policy, None).unwrap();
                let (err_amx, err_dot) = (relative_error(&amx, &reference), relative_error(&bf16_dot, &reference));
                // Both round P to bf16; the tiles sum in another order.
                assert!(err_amx <= 2.0 * err_dot + 1e-4, "{what}: AMX {err_amx:e} against the bf16 loop's {err_dot:e}");
            }
        }
    }
}

#[test]
fn explicit_softmax_scale_is_used() {
    let backend = backend();
    let batch = HostBatch::random(&problem(8, 2, 64, uniform(DType::F32), LAYOUTS[0], &[50, 300]), 3);
    for scale in [0.02f32, 0.3, 2.0] {
        let out = run(&backend, &batch, Policy::Auto, Some(scale)).unwrap();
        let err = relative_error(&out, &decode_reference(&batch, scale));
        assert!(err <= 1e-5, "scale {scale}: {err:e}");
    }
}

#[test]
fn one_thread_and_global_pool_agree_with_two() {
    let batch = HostBatch::random(&problem(32, 8, 128, uniform(DType::F32), LAYOUTS[2], &[900, 0, 31]), 11);
    let two = run(&backend(), &batch, Policy::Fixed { splits: 4 }, None).unwrap();
    let one = run(&CpuBackend::with_threads(1).unwrap(), &batch, Policy::Fixed { splits: 4 }, None).unwrap();
    let global = run(&CpuBackend::new(), &batch, Policy::Fixed { splits: 4 }, None).unwrap();
    // The same cut and the same per-item arithmetic: bit-identical whatever the threads.
    assert_eq!(one, two);
    assert_eq!(global, two);
}

#[test]
fn items_of_several_kv_heads_compute_each_head_as_alone() {
    // Split plans: one thread serves all 8 KV heads of a split in one item,
    // more threads fewer heads each; every head's arithmetic is the same.
    for (i, layout) in LAYOUTS.into_iter().enumerate() {
        for dtypes in [uniform(DType::Bf16), uniform(DType::F32)] {
            let batch = HostBatch::random(&problem(32, 8, 128, dtypes, layout, &[700]), 40 + i as u64);
            for policy in [Policy::Fixed { splits: 1 }, Policy::Fixed { splits: 3 }] {
                let outs: Vec<Vec<f32>> = [1, 3, 8]
                    .into_iter()
                    .map(|threads| run(&CpuBackend::with_threads(threads).unwrap(), &batch, policy, None).unwrap())
                    .collect();
                // The other paths serve such an item one KV head at a time.
                for (backend, what) in [
                    (CpuBackend::with_threads(1).unwrap().at_most_avx2(), "avx2"),
                    (CpuBackend::with_threads(1).unwrap().portable(), "portable"),
                ] {
                    check(&backend, &batch, policy, &format!("{layout} {what}"));
                }
                if policy == (Policy::Fixed { splits: 1 }) {
                    // One sequence on several threads: the backend cuts it into
                    // private splits, the same output within f32 rounding; a
                    // bf16 output can round that difference to one bf16 step
                    // (2^-8 relative) on an element.
                    let tolerance = if dtypes.out == DType::F32 { 1e-6 } else { 2f64.powi(-8) };
                    let one: Vec<f64> = outs[0].iter().map(|&x| x as f64).collect();
                    for (out, threads) in outs[1..].iter().zip([3, 8]) {
                        let err = relative_error(out, &one);
                        assert!(err <= tolerance, "{layout} {policy}: 1 vs {threads} threads: {err:e}");
                    }
                } else {
                    assert_eq!(outs[0], outs[1], "{layout} {policy}: 1 vs 3 threads");
                    assert_eq!(outs[0], outs[2], "{layout} {policy}: 1 vs 8 threads");
                }
            }
        }
    }
}

fn split_policies() -> Vec<Policy> {
    let mut policies: Vec<Policy> = (1..=20).map(|splits| Policy::Fixed { splits }).collect();
    policies.extend([37, 64, 200, 1024].map(|splits| Policy::Fixed { splits }));
    policies.extend([16, 64, 256].map(|tile_tokens| Policy::Deterministic { tile_tokens }));
    policies.extend([
        Policy::Vllm { batch_invariant: false },
        Policy::Vllm { batch_invariant: true },
        Policy::Sglang { max_kv_splits: 8 },
        Policy::Sglang { max_kv_splits: 32 },
        Policy::Auto,
    ]);
    policies
}

#[test]
fn split_plans_equal_the_unsplit_plan() {
    let backend = backend();
    for (i, layout) in LAYOUTS.into_iter().enumerate() {
        let lens = [0, 1, 17, 1000, 2500, 48];
        let batch = HostBatch::random(&problem(16, 2, 128, uniform(DType::F32), layout, &lens), 900 + i as u64);
        let unsplit = run(&backend, &batch, Policy::Fixed { splits: 1 }, None).unwrap();
        let unsplit64: Vec<f64> = unsplit.iter().map(|&x| x as f64).collect();
        for policy in split_policies() {
            let plan = backend.plan(&batch.problem, policy).unwrap();
            let out = run(&backend, &batch, policy, None).unwrap();
            let diff = relative_error(&out, &unsplit64);
            assert!(diff <= 1e-6, "{layout} {policy} ({} splits): {diff:e}", plan.num_splits);
            assert_zero_rows(&batch, &out, &format!("{layout} {policy}"));
        }
    }
}

#[test]
fn a_plan_made_for_other_lengths_runs_the_buffer_lengths() {
    // The plan is made for one set of lengths, the buffers hold others (as in a
    // replayed CUDA graph): the run-time lengths decide every cut.
    let backend = backend();
    let planned = problem(8, 2, 64, uniform(DType::F32), LAYOUTS[2], &[4000, 4000]);
    let plan = backend.plan(&planned, Policy::Fixed { splits: 8 }).unwrap();
    let actual = HostBatch::random(&problem(8, 2, 64, uniform(DType::F32), LAYOUTS[2], &[100, 2900]), 5);
    let mut buffers = Buffers::new(&actual, &plan);
    buffers.decode(&backend, &plan, None).unwrap();
    let out = buffers.out_f32(&plan);
    let err = relative_error(&out, &decode_reference(&actual, planned.shape.default_scale()));
    assert!(err <= 1e-5, "{err:e}");
}

#[test]
fn workspace_holds_partials_in_the_abi_layout() {
    // partial_acc [num_seqs, num_q_heads, num_splits, head_dim] (unnormalised),
    // then partial_ml [num_seqs, num_q_heads, num_splits, 2] (max in log2 units, sum).
    let backend = backend();
    let (hq, d) = (4, 64);
    let batch = HostBatch::random(&problem(hq, 2, d, uniform(DType::F32), LAYOUTS[0], &[70, 200, 0]), 77);
    let plan = backend.plan(&batch.problem, Policy::Fixed { splits: 3 }).unwrap();
    let mut buffers = Buffers::new(&batch, &plan);
    buffers.decode(&backend, &plan, None).unwrap();
    let ws: Vec<f32> = decode_attn_core::dtype::decode(DType::F32, buffers.workspace.as_bytes());
    let s = plan.num_splits as usize;
    let n = batch.seq_lens.len();
    let (acc, ml) = ws.split_at(n * hq * s * d);
    let scale = batch.problem.shape.default_scale() as f64;
    for (seq, split) in batch.seq_lens.iter().map(|&len| plan.rule.split(len as u32)).enumerate() {
        for h in 0..hq {
            for j in 0..split.active_splits {
                let (start, end) = split.token_range(j);
                let (expect, max, _) = attend_range(&batch, scale, seq, h, start as usize, end as usize);
                let row = (seq * hq + h) * s + j as usize;
                let (m, l) = (ml[2 * row], ml[2 * row + 1]);
                let m_natural = m as f64 / std::f64::consts::LOG2_E;
                assert!((m_natural - max).abs() < 1e-5, "seq {seq} head {h} split {j}: max {m_natural} vs {max}");
                for (k, &e) in expect.iter().enumerate() {
                    let got = acc[row * d + k] as f64 / l as f64;
                    assert!((got - e).abs() < 1e-5, "seq {seq} head {h} split {j} [{k}]: {got} vs {e}");
                }
            }
        }
    }
}

#[test]
fn block_table_with_larger_kernel_blocks() {
    let backend = backend();
    for layout in [KvLayout::block_table(32), KvLayout::BlockTable { kernel_block_size: 32, allocator_block_size: 128 }]
    {
        let batch = HostBatch::random(&problem(8, 2, 96, uniform(DType::Bf16), layout, &[31, 32, 33, 700]), 21);
        check(&backend, &batch, Policy::Fixed { splits: 1 }, &layout.to_string());
        check(&backend, &batch, Policy::Fixed { splits: 6 }, &layout.to_string());
    }
}

#[test]
fn empty_batches_and_all_empty_sequences() {
    let backend = backend();
    for layout in LAYOUTS {
        let batch = HostBatch::random(&problem(8, 2, 64, uniform(DType::Bf16), layout, &[]), 1);
        for policy in [Policy::Auto, Policy::Fixed { splits: 4 }] {
            assert!(run(&backend, &batch, policy, None).unwrap().is_empty());
        }
        let batch = HostBatch::random(&problem(8, 2, 64, uniform(DType::F16), layout, &[0, 0, 0]), 2);
        for policy in [Policy::Auto, Policy::Fixed { splits: 4 }, Policy::Sglang { max_kv_splits: 8 }] {
            let out = run(&backend, &batch, policy, None).unwrap();
            assert!(out.iter().all(|&x| x == 0.0), "{layout} {policy}");
        }
    }
}

#[test]
fn calls_on_either_side_of_the_inline_size_match_the_reference() {
    // A call reading at most 128 KiB of K and V runs on the calling thread,
    // a larger one on the pool (`INLINE_KV_BYTES`). Llama-3-70B at TP=8 in
    // bf16 reads 512 bytes a token: 256 tokens run inline, 257 on the pool,
    // where a single sequence is also cut into the backend's private splits.
    let backend = backend();
    for lens in [vec![256], vec![257], vec![100, 156], vec![100, 157]] {
        let batch = HostBatch::random(&problem(8, 1, 128, uniform(DType::Bf16), KvLayout::block_table(16), &lens), 7);
        for policy in [Policy::Auto, Policy::Fixed { splits: 3 }] {
            check(&backend, &batch, policy, &format!("lens {lens:?}"));
        }
    }
}

/// The split rule's short count (sequences below a threshold cut into fewer
/// splits than the grid has, which `auto` sets for the shorter replays of a
/// plan of equal lengths), here on a batch with lengths on both sides of the
/// threshold, both layouts.
#[test]
fn short_split_counts_match_the_reference() {
    use decode_attn_core::SplitRule;
    let backend = backend();
    for layout in LAYOUTS {
        let lens = [4096, 2048, 2047, 300, 0, 17];
        let batch = HostBatch::random(&problem(32, 8, 128, uniform(DType::Bf16), layout, &lens), 71);
        let mut plan = backend.plan(&batch.problem, Policy::Fixed { splits: 16 }).unwrap();
        plan.rule = SplitRule { short_splits: 3, short_below_tiles: 128, ..plan.rule };
        check_plan(&backend, &batch, &plan, &format!("{layout}"));
    }
}

/// A plan cut by the batch (what `auto` gives a GPU plan of equal lengths
/// where the device offers it, here the CLI's GPU figures with
/// `cuts_by_batch`): run at ragged lengths, every
/// sequence is cut at the split length of the batch's mean, which the CPU
/// backend derives from the lengths it is given as the kernels do; the
/// partial rows it writes are those of `SplitRule::for_batch`.
#[test]
fn a_batch_rule_cuts_by_the_lengths_it_is_given() {
    use decode_attn_core::DeviceProps;
    let backend = backend();
    // Block tables: a replay at shorter lengths keeps the planned rows.
    for layout in LAYOUTS.into_iter().filter(|layout| matches!(layout, KvLayout::BlockTable { .. })) {
        let planned = problem(32, 8, 128, uniform(DType::Bf16), layout, &[2048; 16]);
        let gpu = DeviceProps { cuts_by_batch: true, ..DeviceProps::gpu_like_for(132, &planned) };
        let plan = decode_attn_core::plan(&planned, Policy::Auto, &gpu).unwrap();
        assert!(plan.rule.is_batch(), "{plan}");
        let lens = [2048, 16, 17, 0, 33, 100, 16, 5, 16, 16, 16, 16, 16, 16, 16, 16];
        let batch = HostBatch::random(&planned, 72).at_lengths(&lens);
        let buffers = check_plan(&backend, &batch, &plan, &format!("{layout}"));
        // 151 tiles over 16 sequences: a mean of 10, so the 2048-token
        // sequence (128 tiles) is cut into 13 splits of 10 tiles, where the
        // per-sequence rule planned every sequence whole.
        assert_eq!(plan.per_seq[0].active_splits, 1, "{plan}");
        let cut = plan.rule.for_batch(&lens).split(2048);
        assert_eq!((cut.tiles_per_split, cut.active_splits), (10, 13), "{plan}");
        let ws: Vec<f32> = decode_attn_core::dtype::decode(DType::F32, buffers.workspace.as_bytes());
        let rows = 16 * 32 * plan.num_splits as usize;
        let ml = &ws[rows * 128..];
        for split in 0..plan.num_splits as usize {
            let l = ml[2 * split + 1];
            assert_eq!(l > 0.0, split < 13, "{layout}: sequence 0, head 0, split {split}: l = {l}");
        }
    }
}

/// The LSEs a decode writes are what its merge reads: a sequence decoded
/// whole equals its first tokens and the rest decoded apart and merged by
/// `merge_attn_states` (context-parallel decode, cascade attention), output
/// and LSE, and the LSEs match the f64 reference's, split or not.
#[test]
fn decoded_lses_merge_two_halves_into_the_whole() {
    use decode_attn_core::synth::HostIndex;
    use decode_attn_core::MergeArgs;
    use decode_attn_cpu::reference::decode_reference_with_lse;
    use decode_attn_cpu::CpuBuffer;

    let backend = backend();
    let dtypes = uniform(DType::F32);
    let lens = [700u32, 77, 0, 16, 1];
    let whole = HostBatch::random(&problem(8, 2, 64, dtypes, KvLayout::token_indices(1), &lens), 11);
    let cut = [300usize, 77, 0, 5, 0]; // tokens of each sequence in the first part
    let HostIndex::TokenIndices { indptr, indices } = &whole.index else { unreachable!("a token-index batch") };
    let part = |first: bool| {
        let mut batch = whole.clone();
        let (mut part_indptr, mut part_indices, mut part_lens) = (vec![0i32], Vec::new(), Vec::new());
        for (seq, &len) in lens.iter().enumerate() {
            let start = indptr[seq] as usize;
            let range = if first { start..start + cut[seq] } else { start + cut[seq]..start + len as usize };
            part_lens.push(range.len() as u32);
            part_indices.extend_from_slice(&indices[range]);
            part_indptr.push(part_indices.len() as i32);
        }
        batch.problem.seq_lens = part_lens.clone();
        batch.seq_lens = part_lens.iter().map(|&l| l as i32).collect();
        batch.index = HostIndex::TokenIndices { indptr: part_indptr, indices: part_indices };
        batch
    };
    for policy in [Policy::Fixed { splits: 1 }, Policy::Fixed { splits: 4 }, Policy::Auto] {
        let run = |batch: &HostBatch| {
            let plan = backend.plan(&batch.problem, policy).unwrap();
            let mut buffers = Buffers::new(batch, &plan).with_lse(&plan);
            buffers.decode(&backend, &plan, None).unwrap();
            let (out, lse) = (buffers.out_f32(&plan), buffers.lse_f32());
            let (_, reference) = decode_reference_with_lse(batch, batch.problem.shape.default_scale());
            for (row, (&got, &want)) in lse.iter().zip(&reference).enumerate() {
                let ok = if want.is_finite() { (got as f64 - want).abs() <= 1e-4 } else { got as f64 == want };
                assert!(ok, "{policy} row {row}: lse {got} against the reference's {want}");
            }
            (buffers.out, buffers.lse.unwrap(), out)
        };
        let (_, whole_lse, whole_out) = run(&whole);
        let (first_out, first_lse, _) = run(&part(true));
        let (second_out, second_lse, _) = run(&part(false));
        let rows = lens.len() * 8;
        let mut merged = CpuBuffer::from_bytes(vec![POISON; rows * 64 * 4]);
        let mut merged_lse = CpuBuffer::from_bytes(vec![POISON; rows * 4]);
        backend
            .merge_attn_states(MergeArgs {
                num_tokens: lens.len(),
                num_heads: 8,
                head_dim: 64,
                dtype: DType::F32,
                prefix: &first_out,
                prefix_lse: &first_lse,
                suffix: &second_out,
                suffix_lse: &second_lse,
                out: &mut merged,
                out_lse: Some(&mut merged_lse),
            })
            .unwrap();
        let merged_out = decode_attn_core::dtype::decode(DType::F32, merged.as_bytes());
        let whole_f64: Vec<f64> = whole_out.iter().map(|&x| x as f64).collect();
        let err = relative_error(&merged_out, &whole_f64);
        assert!(err <= 1e-5, "{policy}: merged halves against the whole: relative error {err:e}");
        let (a, b) = (
            decode_attn_core::dtype::decode(DType::F32, merged_lse.as_bytes()),
            decode_attn_core::dtype::decode(DType::F32, whole_lse.as_bytes()),
        );
        for (row, (&x, &y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x == y || (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "{policy} row {row}: merged lse {x}, whole {y}"
            );
        }
    }
}

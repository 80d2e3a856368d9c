//! Device properties, support, timing, the state merge, and a property test
//! of random problems against the reference.

mod common;

use common::*;
use decode_attn_core::shape::SUPPORTED_HEAD_DIMS;
use decode_attn_core::synth::{relative_error, HostBatch, SplitMix64};
use decode_attn_core::{dtype, AttentionShape, DType, DTypes, DecodeAttention, Error, KvLayout, MergeArgs};
use decode_attn_cpu::reference::decode_reference;
use decode_attn_cpu::{CpuBackend, CpuBuffer};
use proptest::prelude::*;

#[test]
fn device_props_describe_the_pool() {
    let backend = CpuBackend::with_threads(3).unwrap();
    let props = backend.device_props();
    assert_eq!(props.num_sms, 3);
    assert_eq!(props.ctas_per_sm, 1);
    assert_eq!(props.name, "CPU (3 threads)");
    assert!(props.mem_bandwidth_gbps > 0.0 && props.launch_overhead_us > 0.0);
    assert_eq!(backend.name(), "cpu");
    assert_eq!(CpuBackend::with_threads(0).unwrap().threads(), 1);
    assert!(CpuBackend::new().threads() >= 1);
}

#[test]
fn supports_every_dtype_combination_and_head_dim() {
    let backend = CpuBackend::new();
    for q in DType::ALL {
        for kv in DType::ALL {
            for out in DType::ALL {
                for &d in SUPPORTED_HEAD_DIMS {
                    let p = problem(8, 2, d, DTypes { q, kv, out }, KvLayout::block_table(16), &[5]);
                    backend.supports(&p).unwrap();
                }
            }
        }
    }
    let mut p = problem(8, 2, 64, uniform(DType::F32), KvLayout::block_table(16), &[5]);
    p.shape = AttentionShape { num_q_heads: 8, num_kv_heads: 2, head_dim: 100 };
    assert!(matches!(backend.supports(&p), Err(Error::UnsupportedHeadDim { head_dim: 100, .. })));
}

#[test]
fn timing_hooks_measure_something() {
    let backend = CpuBackend::with_threads(2).unwrap();
    let mut calls = 0;
    let us = backend
        .time_us(
            &mut || {
                calls += 1;
                std::hint::black_box((0..10_000u64).sum::<u64>());
                Ok(())
            },
            2,
            5,
        )
        .unwrap();
    assert_eq!(calls, 7);
    assert!(us >= 0.0 && us.is_finite());
    let err = backend.time_us(&mut || Err(Error::InvalidScale(0.0)), 0, 3).unwrap_err();
    assert_eq!(err, Error::InvalidScale(0.0));
    let gbps = backend.copy_bandwidth_gbps(1 << 20).unwrap();
    assert!(gbps > 0.0 && gbps.is_finite(), "{gbps}");
    assert!(backend.copy_bandwidth_gbps(0).unwrap() > 0.0);
}

fn f32_bytes(values: &[f32]) -> CpuBuffer {
    CpuBuffer::from_bytes(dtype::encode(DType::F32, values))
}

#[test]
fn merge_attn_states_equals_attention_over_the_union() {
    // 12 rows run on the calling thread; 576 rows (at least 144 KiB of
    // states in every dtype) on the pool.
    merge_matches_the_union(4);
    merge_matches_the_union(192);
}

fn merge_matches_the_union(hq: usize) {
    let backend = CpuBackend::with_threads(2).unwrap();
    let d = 64;
    let lens = [300u32, 17, 64];
    let batch = HostBatch::random(&problem(hq, 2, d, uniform(DType::F32), KvLayout::token_indices(1), &lens), 9);
    let scale = batch.problem.shape.default_scale();
    let whole = decode_reference(&batch, scale);
    for dtype in DType::ALL {
        // Prefix = tokens [0, cut), suffix = [cut, len) of each sequence.
        let (mut prefix, mut prefix_lse, mut suffix, mut suffix_lse, mut whole_lse) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (seq, &len) in lens.iter().enumerate() {
            let cut = (len as usize * 2) / 5;
            for h in 0..hq {
                let (a, _, la) = attend_range(&batch, scale as f64, seq, h, 0, cut);
                let (b, _, lb) = attend_range(&batch, scale as f64, seq, h, cut, len as usize);
                let (_, _, lw) = attend_range(&batch, scale as f64, seq, h, 0, len as usize);
                prefix.extend(a.iter().map(|&x| x as f32));
                suffix.extend(b.iter().map(|&x| x as f32));
                prefix_lse.push(la as f32);
                suffix_lse.push(lb as f32);
                whole_lse.push(lw);
            }
        }
        let prefix = CpuBuffer::from_bytes(dtype::encode(dtype, &prefix));
        let suffix = CpuBuffer::from_bytes(dtype::encode(dtype, &suffix));
        let mut out = CpuBuffer::from_bytes(vec![POISON; prefix.0.len()]);
        let mut out_lse = CpuBuffer::from_bytes(vec![POISON; whole_lse.len() * 4]);
        backend
            .merge_attn_states(MergeArgs {
                num_tokens: lens.len(),
                num_heads: hq,
                head_dim: d,
                dtype,
                prefix: &prefix,
                prefix_lse: &f32_bytes(&prefix_lse),
                suffix: &suffix,
                suffix_lse: &f32_bytes(&suffix_lse),
                out: &mut out,
                out_lse: Some(&mut out_lse),
            })
            .unwrap();
        let merged = dtype::decode(dtype, out.as_bytes());
        let err = relative_error(&merged, &whole);
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        assert!(err <= tol, "{hq} heads, {dtype}: {err:e}");
        for (got, want) in dtype::decode(DType::F32, out_lse.as_bytes()).iter().zip(&whole_lse) {
            assert!((*got as f64 - want).abs() < 1e-4, "lse {got} vs {want}");
        }
    }
}

#[test]
fn merge_with_empty_states() {
    let backend = CpuBackend::new();
    let a = f32_bytes(&[1.0, 2.0, 5.0, 6.0]);
    let b = f32_bytes(&[3.0, 4.0, 7.0, 8.0]);
    let ninf = f32::NEG_INFINITY;
    let mut out = CpuBuffer::from_bytes(vec![POISON; 16]);
    backend
        .merge_attn_states(MergeArgs {
            num_tokens: 2,
            num_heads: 1,
            head_dim: 2,
            dtype: DType::F32,
            prefix: &a,
            prefix_lse: &f32_bytes(&[0.5, ninf]),
            suffix: &b,
            suffix_lse: &f32_bytes(&[ninf, ninf]),
            out: &mut out,
            out_lse: None,
        })
        .unwrap();
    assert_eq!(dtype::decode(DType::F32, out.as_bytes()), [1.0, 2.0, 0.0, 0.0]);

    // Sizes are checked before anything is written.
    let mut out = CpuBuffer::from_bytes(vec![POISON; 12]);
    let err = backend
        .merge_attn_states(MergeArgs {
            num_tokens: 2,
            num_heads: 1,
            head_dim: 2,
            dtype: DType::F32,
            prefix: &a,
            prefix_lse: &f32_bytes(&[0.5, ninf]),
            suffix: &b,
            suffix_lse: &f32_bytes(&[ninf, ninf]),
            out: &mut out,
            out_lse: None,
        })
        .unwrap_err();
    assert_eq!(err, Error::BufferSize { name: "out", expected: 16, actual: 12 });
    assert_eq!(out.0, vec![POISON; 12]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn random_problems_match_the_reference(
        kv_heads in 1usize..=3,
        group in prop_oneof![Just(1usize), Just(2), Just(3), Just(4), Just(7), Just(8)],
        d_index in 0..SUPPORTED_HEAD_DIMS.len(),
        (q, kv, out) in (any_dtype(), any_dtype(), any_dtype()),
        layout in any_layout(),
        lens in proptest::collection::vec(prop_oneof![0u32..=40, 0u32..=600], 1..=4),
        policy in any_policy(),
        threads in 1usize..=3,
        seed in any::<u64>(),
    ) {
        let backend = CpuBackend::with_threads(threads).unwrap();
        let dtypes = DTypes { q, kv, out };
        let batch = HostBatch::random(
            &problem(kv_heads * group, kv_heads, SUPPORTED_HEAD_DIMS[d_index], dtypes, layout, &lens),
            seed,
        );
        // A random explicit scale half of the time.
        let mut rng = SplitMix64::new(seed);
        let scale = (rng.below(2) == 0).then(|| 0.01 + rng.below(100) as f32 / 50.0);
        let out = run(&backend, &batch, policy, scale).unwrap();
        let reference = decode_reference(&batch, scale.unwrap_or(batch.problem.shape.default_scale()));
        let err = relative_error(&out, &reference);
        prop_assert!(err <= tolerance(dtypes), "{} {policy}: {err:e}", batch.problem);
    }
}

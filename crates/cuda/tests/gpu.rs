//! CUDA-only behaviour the conformance sweep does not cover: graph capture
//! and replay with new lengths, the NVRTC path, guards against bad block ids
//! in device memory, and the merge op. Every test says plainly when it skips
//! because this machine has no CUDA device.

mod common;

use common::{download_f32, host_merge, nan_bytes, upload, DeviceBatch};
use decode_attn_core::synth::{i32_bytes, relative_error, HostBatch, HostIndex};
use decode_attn_core::{
    dtype, AttentionShape, DType, DTypes, DecodeArgs, DecodeAttention, DecodeProblem, KvLayout, MergeArgs, Policy,
};
use decode_attn_cpu::reference::decode_reference;
use decode_attn_cuda::{CudaBackend, CudaOptions, KernelSource};
use serial_test::serial;

/// The default options, with kernels compiled at run time cached in one
/// folder under the system's temporary one (the cache is keyed by source,
/// options and NVRTC version). Without it every backend of the kv-head-grid
/// kernel, which CUDA always builds with NVRTC, compiled it again: about 40 s
/// each, so the tests that open several ran past a device call's time (s34).
fn test_options() -> CudaOptions {
    CudaOptions { cache_dir: Some(std::env::temp_dir().join("decode-attn-gpu-tests")), ..CudaOptions::default() }
}

fn backend(kernels: KernelSource) -> Option<CudaBackend> {
    match decode_attn_cuda::device_count() {
        Err(err) => {
            eprintln!("SKIPPED: no CUDA device on this machine ({err})");
            None
        }
        Ok(_) => {
            let mut options = CudaOptions { kernels, ..test_options() };
            if kernels == KernelSource::Nvrtc {
                // The NVRTC test is there to compile decode.cu: no cache.
                options.cache_dir = None;
            }
            Some(
                CudaBackend::with_options(0, options)
                    .unwrap_or_else(|e| panic!("a CUDA device is present but the backend failed to open: {e}")),
            )
        }
    }
}

/// Whether there is a CUDA device; says plainly that the test skips if not.
fn device_present() -> bool {
    match decode_attn_cuda::device_count() {
        Ok(_) => true,
        Err(err) => {
            eprintln!("SKIPPED: no CUDA device on this machine ({err})");
            false
        }
    }
}

use decode_attn_core::DeviceBuffer;

/// `auto`'s plan for `problem` on this backend's kernel as an H200 would make
/// it (132 multiprocessors and the bandwidth the backend derives there):
/// `auto` weighs a device's bandwidth, so a GPU with other figures may plan
/// some of these tests' shapes without the warp splits or short counts they
/// are about (s35: an H100 then planned 33 CTA splits for 4133 tokens where
/// the H200 takes 16 of 4 warps; since s37 it plans as an H200, and faster
/// GPUs, or fewer multiprocessors, still plan by their own). Any GPU runs
/// the plan; it is the kernels' correctness on it under test.
fn plan_as_on_an_h200(backend: &CudaBackend, problem: &DecodeProblem) -> decode_attn_core::Plan {
    let h200 = decode_attn_core::DeviceProps::gpu_like(132);
    let props = decode_attn_core::DeviceProps {
        num_sms: h200.num_sms,
        mem_bandwidth_gbps: h200.mem_bandwidth_gbps,
        ..backend.props_for(problem).unwrap()
    };
    decode_attn_core::plan(problem, Policy::Auto, &props).unwrap()
}

fn problem(layout: KvLayout, lens: Vec<u32>) -> DecodeProblem {
    DecodeProblem::new(AttentionShape::new(32, 8, 128).unwrap(), DTypes::uniform(DType::Bf16), layout, lens).unwrap()
}

#[test]
#[serial]
fn graph_replay_follows_new_lengths() {
    let Some(backend) = backend(KernelSource::Auto) else { return };
    // Capture with long sequences, replay with shorter and mixed ones: the grid
    // is fixed, the split counts are recomputed on the device.
    let capture_lens = vec![4000, 3000, 2500];
    let replay_lens = vec![17, 0, 2400];
    let long = problem(KvLayout::block_table(16), capture_lens);
    let plan = backend.plan(&long, Policy::Auto).unwrap();
    assert!(plan.use_split, "{plan}");
    let batch = HostBatch::random(&long, 11);
    let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
    let graph = backend.capture(&mut || backend.decode(&plan, device.args(true))).unwrap();
    graph.replay().unwrap();
    let first = download_f32(&backend, &device.out, DType::Bf16);
    let reference = decode_reference(&batch, long.shape.default_scale());
    let err = relative_error(&first, &reference);
    assert!(err < 1e-2, "first replay: relerr {err}");

    // New lengths into the same buffer; same block table (each row still holds enough blocks).
    backend
        .upload(&mut device.seq_lens, &i32_bytes(&replay_lens.iter().map(|&s| s as i32).collect::<Vec<_>>()))
        .unwrap();
    backend.upload(&mut device.out, &nan_bytes(DType::Bf16, long.out_bytes())).unwrap();
    graph.replay().unwrap();
    let second = download_f32(&backend, &device.out, DType::Bf16);
    let reference = decode_reference(&batch.at_lengths(&replay_lens), long.shape.default_scale());
    let err = relative_error(&second, &reference);
    assert!(err < 1e-2, "replay with new lengths: relerr {err}");
    let per_seq = 32 * 128;
    assert!(second[per_seq..2 * per_seq].iter().all(|&x| x == 0.0), "a length-0 sequence decodes to zeros");
}

/// The kernels launched programmatically (the reducer starts while the decode
/// grid drains and must wait for its stores; with `All` the decode kernel also
/// starts while the upload before it drains) and plainly, under graph capture,
/// over replays with new lengths.
#[test]
#[serial]
fn split_reducer_with_and_without_programmatic_launch_under_graph_replay() {
    if !device_present() {
        return;
    }
    use decode_attn_cuda::ProgrammaticLaunch;
    for programmatic_launch in [ProgrammaticLaunch::Reducer, ProgrammaticLaunch::All, ProgrammaticLaunch::Off] {
        let options = CudaOptions { programmatic_launch, ..test_options() };
        let backend = CudaBackend::with_options(0, options).unwrap();
        let capture = problem(KvLayout::block_table(16), vec![3000, 1500, 700, 1]);
        let plan = backend.plan(&capture, "fixed:8".parse().unwrap()).unwrap();
        let batch = HostBatch::random(&capture, 5);
        let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
        let graph = backend.capture(&mut || backend.decode(&plan, device.args(true))).unwrap();
        // Each row of the block table holds the captured length's blocks: replay within them.
        for lens in [vec![3000, 1500, 700, 1], vec![17, 0, 699, 1], vec![2048, 1499, 0, 0], vec![5, 6, 7, 1]] {
            let lens_i32: Vec<i32> = lens.iter().map(|&s| s as i32).collect();
            backend.upload(&mut device.seq_lens, &i32_bytes(&lens_i32)).unwrap();
            backend.upload(&mut device.out, &nan_bytes(DType::Bf16, capture.out_bytes())).unwrap();
            graph.replay().unwrap();
            let got = download_f32(&backend, &device.out, DType::Bf16);
            let reference = decode_reference(&batch.at_lengths(&lens), capture.shape.default_scale());
            let err = relative_error(&got, &reference);
            assert!(err < 1e-2, "programmatic {programmatic_launch:?}, lengths {lens:?}: relerr {err}");
        }
    }
}

/// With `ProgrammaticLaunch::All` the decode kernel may start while the kernel
/// before it drains: a second decode whose Q is the first decode's output
/// (written by the first call's reducer) must still see that output whole.
#[test]
#[serial]
fn programmatic_decode_waits_for_the_kernel_that_writes_its_q() {
    use decode_attn_cuda::ProgrammaticLaunch;
    if !device_present() {
        return;
    }
    let options = CudaOptions { programmatic_launch: ProgrammaticLaunch::All, ..test_options() };
    let backend = CudaBackend::with_options(0, options).unwrap();
    let lens = vec![2500, 700, 40];
    let p = problem(KvLayout::block_table(16), lens.clone());
    let plan = backend.plan(&p, "fixed:6".parse().unwrap()).unwrap();
    assert!(plan.use_split, "{plan}");
    let batch = HostBatch::random(&p, 21);
    let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
    let mut second_out = upload(&backend, &nan_bytes(DType::Bf16, p.out_bytes()));
    let graph = backend
        .capture(&mut || {
            backend.decode(&plan, device.args(true))?;
            // Q of the second call = the first call's output (same shape).
            let first = device.args(true);
            let args = DecodeArgs { q: &*first.out, out: &mut second_out, ..first };
            backend.decode(&plan, args)
        })
        .unwrap();
    let scale = p.shape.default_scale();
    for round in 0..3 {
        backend.upload(&mut device.out, &nan_bytes(DType::Bf16, p.out_bytes())).unwrap();
        backend.upload(&mut second_out, &nan_bytes(DType::Bf16, p.out_bytes())).unwrap();
        graph.replay().unwrap();
        let first = download_f32(&backend, &device.out, DType::Bf16);
        let second = download_f32(&backend, &second_out, DType::Bf16);
        let reference = decode_reference(&batch, scale);
        assert!(relative_error(&first, &reference) < 1e-2, "round {round}: first call");
        // The second call's reference takes the first call's bf16 output as Q.
        let mut chained = batch.clone();
        chained.q = dtype::encode(DType::Bf16, &first);
        let err = relative_error(&second, &decode_reference(&chained, scale));
        assert!(err < 1e-2, "round {round}: second call read a Q still being written (relerr {err})");
    }
}

/// The NVRTC path compiles decode.cu one element type and head dim at a
/// time, when a plan first needs them: two such parts here, the second's
/// first decode captured into a graph right after its plan (so nothing may
/// be left to compile at launch).
#[test]
#[serial]
fn nvrtc_kernels_match_the_reference() {
    let Some(backend) = backend(KernelSource::Nvrtc) else { return };
    assert!(backend.kernel_origin().starts_with("NVRTC"), "{}", backend.kernel_origin());
    for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
        let p = problem(layout, vec![1, 300, 1000]);
        let plan = backend.plan(&p, "fixed:3".parse().unwrap()).unwrap();
        let batch = HostBatch::random(&p, 5);
        let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
        let block_table = matches!(layout, KvLayout::BlockTable { .. });
        backend.decode(&plan, device.args(block_table)).unwrap();
        let out = download_f32(&backend, &device.out, DType::Bf16);
        let err = relative_error(&out, &decode_reference(&batch, p.shape.default_scale()));
        assert!(err < 1e-2, "{layout}: relerr {err}");
    }
    // Qwen2-7B's group of 7 at head_dim 64, f16: another part.
    let shape = AttentionShape::new(28, 4, 64).unwrap();
    let p = DecodeProblem::new(shape, DTypes::uniform(DType::F16), KvLayout::block_table(16), vec![700, 2]).unwrap();
    let plan = backend.plan(&p, Policy::Auto).unwrap();
    let batch = HostBatch::random(&p, 6);
    let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
    let graph = backend.capture(&mut || backend.decode(&plan, device.args(true))).unwrap();
    graph.replay().unwrap();
    let out = download_f32(&backend, &device.out, DType::F16);
    let err = relative_error(&out, &decode_reference(&batch, p.shape.default_scale()));
    assert!(err < 1e-2, "f16 head_dim 64 from a graph: relerr {err}");
}

#[test]
#[serial]
fn bad_block_ids_in_device_memory_give_nan_not_a_crash() {
    let Some(backend) = backend(KernelSource::Auto) else { return };
    for policy in ["fixed:1", "fixed:4"] {
        let p = problem(KvLayout::block_table(16), vec![100, 100]);
        let plan = backend.plan(&p, policy.parse().unwrap()).unwrap();
        let mut batch = HostBatch::random(&p, 3);
        let HostIndex::BlockTable { table, .. } = &mut batch.index else { unreachable!() };
        table[1] = 1 << 30; // sequence 0, second block: far outside the pool
        let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
        backend.decode(&plan, device.args(true)).unwrap();
        let out = download_f32(&backend, &device.out, DType::Bf16);
        let per_seq = 32 * 128;
        assert!(out[..per_seq].iter().all(|x| x.is_nan()), "{policy}: the corrupt sequence must be NaN");
        let reference = decode_reference(&batch.at_lengths(&[0, 100]), p.shape.default_scale());
        let err = relative_error(&out[per_seq..], &reference[per_seq..]);
        assert!(err < 1e-2, "{policy}: the healthy sequence must be unaffected (relerr {err})");
    }
    // The context survives: a healthy call afterwards works.
    backend.synchronize().unwrap();
}

/// Garbage written into the lengths, block tables, kv_indptr or kv_indices
/// in device memory (`HostBatch::scribble`: signs, extremes, the pool's
/// edges, neighbours, anything), on both layouts, two kernels (bf16 d 128 on
/// the tensor cores, f32 d 64 with 8 heads a KV head on the stream kernel)
/// and split or not: every sequence the garbage spoils comes out NaN, every
/// other one as the reference decodes it, and the context survives (no
/// fault; `compute-sanitizer` on this test also sees no out-of-bounds read).
#[test]
#[serial]
fn garbage_indices_in_device_memory_give_nan_rows_not_a_fault() {
    use decode_attn_core::synth::SplitMix64;
    let Some(backend) = backend(KernelSource::Auto) else { return };
    let layouts = [
        KvLayout::block_table(16),
        KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 64 },
        KvLayout::token_indices(1),
        KvLayout::token_indices(4),
    ];
    let kinds = [(32, 8, 128, DType::Bf16, 1e-2), (8, 1, 64, DType::F32, 1e-3)];
    let mut spoiled_seqs = 0;
    for case in 0..48u64 {
        let mut rng = SplitMix64::new(case);
        let layout = layouts[rng.below(layouts.len())];
        let (q_heads, kv_heads, head_dim, dtype, tolerance) = kinds[rng.below(kinds.len())];
        let lens: Vec<u32> = (0..1 + rng.below(5)).map(|_| rng.below(2000) as u32).collect();
        let shape = AttentionShape::new(q_heads, kv_heads, head_dim).unwrap();
        let planned = DecodeProblem::new(shape, DTypes::uniform(dtype), layout, lens).unwrap();
        let policy: Policy = ["auto", "fixed:1", "fixed:5"][rng.below(3)].parse().unwrap();
        let plan = backend.plan(&planned, policy).unwrap();
        let mut batch = HostBatch::random(&planned, case);
        let num_edits = 1 + rng.below(3);
        let edits = batch.scribble(&mut rng, num_edits);
        let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
        let block_table = matches!(layout, KvLayout::BlockTable { .. });
        let what = format!("case {case}: {planned} {policy} after {edits:?}");
        backend.decode(&plan, device.args(block_table)).unwrap_or_else(|e| panic!("{what}: {e}"));
        backend.synchronize().unwrap_or_else(|e| panic!("{what}: the context did not survive: {e}"));
        let out = download_f32(&backend, &device.out, dtype);
        let reference = decode_reference(&batch, shape.default_scale());
        let per_seq = q_heads * head_dim;
        for (seq, &len) in batch.seq_lens.iter().enumerate() {
            let rows = seq * per_seq..(seq + 1) * per_seq;
            // The reference reads a negative length as none; the kernels refuse it.
            if len < 0 || reference[rows.clone()].iter().any(|x| x.is_nan()) {
                spoiled_seqs += 1;
                assert!(out[rows].iter().all(|x| x.is_nan()), "{what}: sequence {seq} is spoiled but not NaN");
            } else {
                let err = relative_error(&out[rows.clone()], &reference[rows]);
                assert!(err <= tolerance, "{what}: sequence {seq} (length {len}): relerr {err:e}");
            }
        }
    }
    // The cases must reach the guards, not only edits that change nothing.
    assert!(spoiled_seqs >= 10, "only {spoiled_seqs} spoiled sequences in 48 cases");
}

#[test]
#[serial]
fn merge_attn_states_matches_the_host_merge() {
    // NVRTC builds each element type's merge as a part of its own.
    for kernels in [KernelSource::Auto, KernelSource::Nvrtc] {
        let Some(backend) = backend(kernels) else { return };
        merge_matches_the_host_merge(&backend);
    }
}

fn merge_matches_the_host_merge(backend: &CudaBackend) {
    let (tokens, heads, dim) = (5, 6, 80);
    let mut rng = decode_attn_core::synth::SplitMix64::new(9);
    let n = tokens * heads * dim;
    let prefix: Vec<f32> = (0..n).map(|_| rng.next_signed()).collect();
    let suffix: Vec<f32> = (0..n).map(|_| rng.next_signed()).collect();
    let mut prefix_lse: Vec<f32> = (0..tokens * heads).map(|_| 3.0 * rng.next_signed()).collect();
    let mut suffix_lse: Vec<f32> = (0..tokens * heads).map(|_| 3.0 * rng.next_signed()).collect();
    prefix_lse[0] = f32::NEG_INFINITY; // an empty prefix
    prefix_lse[1] = f32::NEG_INFINITY; // both empty
    suffix_lse[1] = f32::NEG_INFINITY;
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        let lse_bytes = |v: &[f32]| dtype::encode(DType::F32, v);
        let prefix_dev = upload(backend, &dtype::encode(dtype, &prefix));
        let suffix_dev = upload(backend, &dtype::encode(dtype, &suffix));
        let prefix_lse_dev = upload(backend, &lse_bytes(&prefix_lse));
        let suffix_lse_dev = upload(backend, &lse_bytes(&suffix_lse));
        let mut out = upload(backend, &nan_bytes(dtype, n * dtype.size_bytes()));
        let mut out_lse = upload(backend, &lse_bytes(&vec![f32::NAN; tokens * heads]));
        backend
            .merge_attn_states(MergeArgs {
                num_tokens: tokens,
                num_heads: heads,
                head_dim: dim,
                dtype,
                prefix: &prefix_dev,
                prefix_lse: &prefix_lse_dev,
                suffix: &suffix_dev,
                suffix_lse: &suffix_lse_dev,
                out: &mut out,
                out_lse: Some(&mut out_lse),
            })
            .unwrap();
        let got = download_f32(backend, &out, dtype);
        let got_lse = download_f32(backend, &out_lse, DType::F32);
        let (want, want_lse) = host_merge(dtype, dim, &prefix, &prefix_lse, &suffix, &suffix_lse);
        let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        let err = relative_error(&got, &want64);
        assert!(err < if dtype == DType::F32 { 1e-6 } else { 1e-2 }, "{dtype}: relerr {err}");
        assert!(got[dim..2 * dim].iter().all(|&x| x == 0.0), "{dtype}: two empty states merge to zeros");
        assert_eq!(got_lse[1], f32::NEG_INFINITY);
        for (g, w) in got_lse.iter().zip(&want_lse).skip(2) {
            assert!((g - w).abs() < 1e-4, "{dtype}: lse {g} vs {w}");
        }
    }
}

#[test]
#[serial]
fn graph_timing_reports_a_positive_time() {
    let Some(backend) = backend(KernelSource::Auto) else { return };
    let gbps = backend.copy_bandwidth_gbps(256 << 20).unwrap();
    // No speed floor: how fast is the benchmarks' business, and under
    // compute-sanitizer the copy runs at a few per cent of its speed.
    assert!(gbps.is_finite() && gbps > 0.0, "device-to-device copy timed at {gbps} GB/s");
}

#[test]
#[serial]
fn auto_plans_each_problem_with_the_figures_of_the_kernel_that_runs_it() {
    if !device_present() {
        return;
    }
    let open = |kernel| CudaBackend::with_options(0, CudaOptions { kernel, ..test_options() }).unwrap();
    let auto = open(decode_attn_cuda::DecodeKernel::Auto);
    let stream = open(decode_attn_cuda::DecodeKernel::Stream);
    let mma = open(decode_attn_cuda::DecodeKernel::Mma);
    // Head dim 192 goes to the stream kernel, 128 to the tensor-core kernel.
    let on_stream = DecodeProblem::new(
        AttentionShape::new(32, 8, 192).unwrap(),
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        vec![30000],
    )
    .unwrap();
    let on_mma = problem(KvLayout::block_table(16), vec![30000]);
    assert_eq!(auto.kernel_for(&on_stream), decode_attn_cuda::DecodeKernel::Stream);
    assert_eq!(auto.kernel_for(&on_mma), decode_attn_cuda::DecodeKernel::Mma);
    assert_eq!(auto.props_for(&on_stream).unwrap(), stream.props_for(&on_stream).unwrap());
    assert_eq!(&auto.props_for(&on_mma).unwrap(), mma.device_props());
    assert_eq!(auto.plan(&on_stream, Policy::Auto).unwrap(), stream.plan(&on_stream, Policy::Auto).unwrap());
    assert_eq!(auto.plan(&on_mma, Policy::Auto).unwrap(), mma.plan(&on_mma, Policy::Auto).unwrap());
    // The stream kernel is bound by instruction issue: its plans count on
    // filling more of each multiprocessor than the tensor-core kernel's.
    assert!(auto.props_for(&on_stream).unwrap().lone_cta_share < auto.props_for(&on_mma).unwrap().lone_cta_share);
    let shapes = [(32, 8, 128, 48), (32, 8, 128, 16), (8, 1, 128, 48), (16, 8, 192, 16), (16, 8, 256, 16)];
    for (num_q_heads, num_kv_heads, head_dim, block) in shapes {
        let p = DecodeProblem::new(
            AttentionShape::new(num_q_heads, num_kv_heads, head_dim).unwrap(),
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(block),
            vec![30000],
        )
        .unwrap();
        let props = auto.props_for(&p).unwrap();
        eprintln!(
            "h {num_q_heads}/{num_kv_heads} d {head_dim} block {block}: {} CTAs per SM, lone CTA share {}",
            props.ctas_per_sm, props.lone_cta_share
        );
    }
}

#[test]
#[serial]
fn head_dim_256_runs_on_the_tensor_core_kernel_where_it_fits_and_matches_the_reference() {
    let Some(backend) = backend(KernelSource::Auto) else { return };
    let (major, _) = backend.compute_capability().unwrap();
    let lens = vec![1, 17, 300, 1000, 4133];
    for dtype in [DType::Bf16, DType::F16] {
        // Gemma-2's heads (16/8, d = 256) and a group of 16, one full CTA of heads.
        for (num_q_heads, num_kv_heads) in [(16, 8), (32, 2)] {
            let p = DecodeProblem::new(
                AttentionShape::new(num_q_heads, num_kv_heads, 256).unwrap(),
                DTypes::uniform(dtype),
                KvLayout::block_table(16),
                lens.clone(),
            )
            .unwrap();
            // sm_90 gives a CTA the 200 KiB it needs; sm_80 does not.
            let expected =
                if major >= 9 { decode_attn_cuda::DecodeKernel::Mma } else { decode_attn_cuda::DecodeKernel::Stream };
            assert_eq!(backend.kernel_for(&p), expected, "compute capability {major}");
            let batch = HostBatch::random(&p, 11);
            let reference = decode_reference(&batch, p.shape.default_scale());
            for policy in ["fixed:1", "fixed:3", "fixed:37", "auto"] {
                let plan = backend.plan(&p, policy.parse().unwrap()).unwrap();
                // Fresh, NaN-filled output per run: an element left unwritten fails.
                let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
                backend.decode(&plan, device.args(true)).unwrap();
                let out = download_f32(&backend, &device.out, dtype);
                let err = relative_error(&out, &reference);
                eprintln!("{dtype:?} h {num_q_heads}/{num_kv_heads} d 256 {policy}: relerr {err:.2e}");
                assert!(err < 1e-2, "{dtype:?} h {num_q_heads}/{num_kv_heads} d 256 {policy}: relerr {err}");
            }
        }
    }
}

#[test]
#[serial]
fn block_sizes_that_are_not_powers_of_two_run_on_the_tensor_core_kernel_and_match_the_reference() {
    let Some(backend) = backend(KernelSource::Auto) else { return };
    // 48: a multiple of 16 between powers of two; 80 and 544: sizes engines
    // pick to line attention pages up with other state, tiles mid-block.
    for block in [48, 80, 544] {
        let p = problem(KvLayout::block_table(block), vec![1, 47, 300, 1000, 5003]);
        assert_eq!(backend.kernel_for(&p), decode_attn_cuda::DecodeKernel::Mma, "block {block}");
        let batch = HostBatch::random(&p, 13);
        let reference = decode_reference(&batch, p.shape.default_scale());
        for policy in ["fixed:1", "fixed:5", "auto"] {
            let plan = backend.plan(&p, policy.parse().unwrap()).unwrap();
            let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
            backend.decode(&plan, device.args(true)).unwrap();
            let err = relative_error(&download_f32(&backend, &device.out, DType::Bf16), &reference);
            assert!(err < 1e-2, "block {block} {policy}: relerr {err}");
        }
    }
}

/// Decodes `lens` (Llama-3-8B's shape, bf16) once per option set under
/// `policy`, with the output and the pools' unused slots poisoned first;
/// asserts each result against the f64 reference and that every option
/// set's output bytes equal the first's.
fn outputs_identical_across<O: std::fmt::Debug>(
    options: &[(O, CudaOptions)],
    layout: KvLayout,
    lens: &[u32],
    policy: &str,
) {
    let p = problem(layout, lens.to_vec());
    let mut batch = HostBatch::random(&p, 31);
    batch.poison_unused_slots();
    let reference = decode_reference(&batch, p.shape.default_scale());
    let mut outputs = Vec::new();
    for (what, options) in options {
        let backend = CudaBackend::with_options(0, options.clone()).unwrap();
        let plan = backend.plan(&p, policy.parse().unwrap()).unwrap();
        let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
        backend.upload(&mut device.out, &nan_bytes(DType::Bf16, p.out_bytes())).unwrap();
        backend.decode(&plan, device.args(layout == KvLayout::block_table(16))).unwrap();
        let mut bytes = vec![0u8; device.out.len_bytes()];
        backend.download(&device.out, &mut bytes).unwrap();
        let got = dtype::decode(DType::Bf16, &bytes);
        let err = relative_error(&got, &reference);
        assert!(err < 1e-2, "{layout}, {policy}, {what:?}: relerr {err}");
        outputs.push((what, bytes));
    }
    for (what, bytes) in &outputs[1..] {
        assert!(bytes == &outputs[0].1, "{layout}, {policy}: {what:?} differs from {:?}", outputs[0].0);
    }
}

/// The tensor-core kernel's grid orders (heads first, sequences first, and
/// `Auto`'s choice) give the same outputs bit for bit, and the reference's:
/// a grid of several waves (48 sequences x 8 KV heads x 4 splits, and
/// unsplit), both layouts, ragged lengths with empty splits, empty and
/// one-token sequences.
#[test]
#[serial]
fn grid_orders_give_identical_outputs() {
    use decode_attn_cuda::GridOrder;
    if !device_present() {
        return;
    }
    let lens: Vec<u32> = (0..48u32).map(|i| [0, 1, 17, 300, 1000, 2500][i as usize % 6] + i).collect();
    let options: Vec<_> = [GridOrder::SeqsFirst, GridOrder::HeadsFirst, GridOrder::Auto]
        .into_iter()
        .map(|grid_order| (grid_order, CudaOptions { grid_order, ..test_options() }))
        .collect();
    for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
        for policy in ["fixed:4", "fixed:1"] {
            outputs_identical_across(&options, layout, &lens, policy);
        }
    }
}

/// `auto`'s split per warp (`Plan::splits_per_cta` 4) against the reference
/// and against the same CTAs with the warps merging (`WarpSplits::Off`), on
/// lengths where the last CTA has surplus warps or a short last split, both
/// layouts; then under a graph replayed with shorter and empty sequences,
/// where most warps' splits are surplus.
#[test]
#[serial]
fn warp_splits_match_the_reference_and_the_merged_warps() {
    use decode_attn_cuda::WarpSplits;
    if !device_present() {
        return;
    }
    let open = |warp_splits| CudaBackend::with_options(0, CudaOptions { warp_splits, ..test_options() }).unwrap();
    let (per_warp, merged) = (open(WarpSplits::Auto), open(WarpSplits::Off));
    for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
        for lens in [vec![4096], vec![5000], vec![4133], vec![1000; 4]] {
            let p = problem(layout, lens.clone());
            let batch = HostBatch::random(&p, 41);
            let reference = decode_reference(&batch, p.shape.default_scale());
            let mut outputs = Vec::new();
            for (what, backend) in [("per warp", &per_warp), ("merged", &merged)] {
                let plan = plan_as_on_an_h200(backend, &p);
                let expected = if what == "per warp" { 4 } else { 1 };
                assert!(plan.use_split, "{layout} {lens:?}: {plan}");
                assert_eq!(plan.splits_per_cta, expected, "{layout} {lens:?} {what}: {plan}");
                let mut device = DeviceBatch::new(backend, &batch, plan.workspace_bytes);
                backend.decode(&plan, device.args(layout == KvLayout::block_table(16))).unwrap();
                let out = download_f32(backend, &device.out, DType::Bf16);
                let err = relative_error(&out, &reference);
                eprintln!("{layout} {lens:?} {what}: {} splits, relerr {err:.2e}", plan.num_splits);
                assert!(err < 1e-2, "{layout} {lens:?} {what}: relerr {err}");
                outputs.push(out);
            }
            let merged_f64: Vec<f64> = outputs[1].iter().map(|&x| x as f64).collect();
            let apart = relative_error(&outputs[0], &merged_f64);
            assert!(apart < 1e-2, "{layout} {lens:?}: per warp and merged differ by {apart}");
        }
    }
    // Captured for 4 x 1000 tokens (16 splits, 4 CTAs per sequence and KV
    // head), replayed for 37 (3 warps of the first CTA), 0, 1000 and 3.
    let p = problem(KvLayout::block_table(16), vec![1000; 4]);
    let plan = plan_as_on_an_h200(&per_warp, &p);
    assert_eq!(plan.splits_per_cta, 4, "{plan}");
    let batch = HostBatch::random(&p, 43);
    let mut device = DeviceBatch::new(&per_warp, &batch, plan.workspace_bytes);
    let graph = per_warp.capture(&mut || per_warp.decode(&plan, device.args(true))).unwrap();
    let replay_lens = [37u32, 0, 1000, 3];
    per_warp.upload(&mut device.seq_lens, &i32_bytes(&replay_lens.map(|s| s as i32))).unwrap();
    per_warp.upload(&mut device.out, &nan_bytes(DType::Bf16, p.out_bytes())).unwrap();
    graph.replay().unwrap();
    let got = download_f32(&per_warp, &device.out, DType::Bf16);
    let err = relative_error(&got, &decode_reference(&batch.at_lengths(&replay_lens), p.shape.default_scale()));
    assert!(err < 1e-2, "replay with 37, 0, 1000, 3 tokens: relerr {err}");
    let per_seq = 32 * 128;
    assert!(got[per_seq..2 * per_seq].iter().all(|&x| x == 0.0), "a length-0 sequence decodes to zeros");
}

/// Runs `plan` (made for `batch`'s lengths) at `lens` instead, as a replay
/// does: the new lengths uploaded, the output poisoned; checks the result
/// against the reference at those lengths.
fn run_at_lengths(backend: &CudaBackend, plan: &decode_attn_core::Plan, batch: &HostBatch, lens: &[u32], what: &str) {
    let mut device = DeviceBatch::new(backend, batch, plan.workspace_bytes);
    let as_i32: Vec<i32> = lens.iter().map(|&s| s as i32).collect();
    backend.upload(&mut device.seq_lens, &i32_bytes(&as_i32)).unwrap();
    backend.decode(plan, device.args(true)).unwrap();
    let got = download_f32(backend, &device.out, DType::Bf16);
    let err = relative_error(&got, &decode_reference(&batch.at_lengths(lens), batch.problem.shape.default_scale()));
    assert!(err < 1e-2, "{what}, lengths {lens:?}: relerr {err}");
}

/// The split rule's short count (`SplitRule::short_splits`: sequences below
/// a threshold cut into fewer splits than the grid has), which only a replay
/// at shorter lengths than planned reaches: on every kernel, with a plan of
/// equal lengths given a short count by hand, and with lengths on both sides
/// of the threshold; then on `auto`'s own rules, one with a split per warp
/// and one that `auto` gave a short count and a floor.
#[test]
#[serial]
fn short_split_counts_match_the_reference_on_every_kernel() {
    use decode_attn_core::SplitRule;
    use decode_attn_cuda::DecodeKernel;
    if !device_present() {
        return;
    }
    let long = problem(KvLayout::block_table(16), vec![4096; 3]);
    let mut batch = HostBatch::random(&long, 61);
    batch.poison_unused_slots();
    for kernel in [DecodeKernel::Auto, DecodeKernel::Stream, DecodeKernel::Staged, DecodeKernel::KvGrid] {
        let backend = CudaBackend::with_options(0, CudaOptions { kernel, ..test_options() }).unwrap();
        let mut plan = backend.plan(&long, Policy::Fixed { splits: 16 }).unwrap();
        plan.rule = SplitRule { short_splits: 3, short_below_tiles: 128, ..plan.rule };
        // 127 tiles and fewer: 3 splits; 128 and more: 16.
        run_at_lengths(&backend, &plan, &batch, &[4096, 2032, 300], &format!("{kernel:?}"));
        run_at_lengths(&backend, &plan, &batch, &[2048, 2047, 0], &format!("{kernel:?}"));
    }
    let backend = CudaBackend::new(0).unwrap();
    // A split per warp (64 splits, 4 per CTA) with a short count of 6 by hand.
    let warps = problem(KvLayout::block_table(16), vec![16384]);
    let mut plan = plan_as_on_an_h200(&backend, &warps);
    assert!(plan.splits_per_cta > 1, "{plan}");
    plan.rule = SplitRule { short_splits: 6, short_below_tiles: 512, ..plan.rule };
    let batch = HostBatch::random(&warps, 62);
    for len in [16384, 8191, 4000, 33] {
        run_at_lengths(&backend, &plan, &batch, &[len], "split per warp");
    }
    // Llama-3-70B at TP=8, B=1, planned for 65536 tokens: auto's own short count.
    let long = DecodeProblem::new(
        AttentionShape::new(8, 1, 128).unwrap(),
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        vec![65536],
    )
    .unwrap();
    let plan = plan_as_on_an_h200(&backend, &long);
    assert!(plan.rule.short_splits > 0, "{plan}");
    let batch = HostBatch::random(&long, 63);
    for len in [65536, 20000, 9000, 1000] {
        run_at_lengths(&backend, &plan, &batch, &[len], "auto, planned for 65536");
    }
}

/// A sequence with one active split in a split call, on the stream and
/// tensor-core kernels (a split per CTA): its CTAs write the output rows
/// themselves and leave the workspace alone, and the reducer leaves the
/// output alone; sequences with several splits go through the workspace as
/// before. Checked on a poisoned workspace (0xff: NaN in every partial
/// row), so a reducer merging a row nobody wrote gives NaN, and against the
/// kernels whose reducer merges every split (staged, kv-grid), whose lone
/// splits are written to the workspace.
#[test]
#[serial]
fn one_active_split_is_written_by_its_cta_not_the_reducer() {
    use decode_attn_cuda::DecodeKernel;
    if !device_present() {
        return;
    }
    let p = problem(KvLayout::block_table(16), vec![3000, 1500, 700, 100]);
    let batch = HostBatch::random(&p, 71);
    let reference = decode_reference(&batch, p.shape.default_scale());
    let (num_seqs, num_q_heads, head_dim) = (4, 32, 128);
    for kernel in [DecodeKernel::Auto, DecodeKernel::Stream, DecodeKernel::Staged, DecodeKernel::KvGrid] {
        let backend = CudaBackend::with_options(0, CudaOptions { kernel, ..test_options() }).unwrap();
        // Splits of at least 64 tiles (1024 tokens): 3, 2, 1 and 1 active.
        let mut plan = backend.plan(&p, Policy::Fixed { splits: 8 }).unwrap();
        plan.rule.min_tiles_per_split = 64;
        let active: Vec<u32> = p.seq_lens.iter().map(|&s| plan.rule.split(s).active_splits).collect();
        assert_eq!(active, [3, 2, 1, 1], "{plan}");
        assert_eq!(plan.splits_per_cta, 1, "{plan}");
        let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
        backend.upload(&mut device.workspace, &vec![0xff; plan.workspace_bytes as usize]).unwrap();
        backend.decode(&plan, device.args(true)).unwrap();
        let out = download_f32(&backend, &device.out, DType::Bf16);
        let err = relative_error(&out, &reference);
        assert!(err < 1e-2, "{kernel:?}: relerr {err}");

        let mut workspace = vec![0u8; plan.workspace_bytes as usize];
        backend.download(&device.workspace, &mut workspace).unwrap();
        let rows = num_seqs * num_q_heads * plan.num_splits as usize;
        let ml_at = rows * head_dim * 4;
        let direct = matches!(kernel, DecodeKernel::Auto | DecodeKernel::Stream);
        for (b, &active) in active.iter().enumerate() {
            for head in 0..num_q_heads {
                for split in 0..plan.num_splits as usize {
                    let row = (b * num_q_heads + head) * plan.num_splits as usize + split;
                    let m = &workspace[ml_at + 8 * row..ml_at + 8 * row + 4];
                    let written = m != [0xff; 4];
                    let expected = split < active as usize && !(direct && active == 1);
                    assert_eq!(
                        written, expected,
                        "{kernel:?}: sequence {b} ({active} active), head {head}, split {split}"
                    );
                }
            }
        }
    }
}

/// Packed launches (`Packing`): a ragged batch whose plain grid is almost
/// all empty splits launches only its active pairs, and gives the plain grid's
/// outputs bit for bit and the reference's, on both layouts; then, captured
/// in a graph, replayed with longer sequences (more pairs than the launch
/// has CTAs, so CTAs take several in turn) and with shorter and empty ones
/// (fewer pairs than CTAs).
#[test]
#[serial]
fn packed_launches_match_the_plain_grid_and_the_reference() {
    use decode_attn_cuda::Packing;
    if !device_present() {
        return;
    }
    // One long sequence among short ones, 256-token splits: 32 of them for
    // the long one, one for each short one, so 31 of every short
    // sequence's 32 (sequence, split) CTAs would be empty (27 per active one).
    let mut lens = vec![8000u32];
    lens.extend((0..95u32).map(|i| [100, 0, 1, 250, 249][i as usize % 5] + i % 7));
    let policy = "deterministic:256";
    let options: Vec<_> = [Packing::Off, Packing::Auto, Packing::Planned]
        .into_iter()
        .map(|packing| (packing, CudaOptions { packing, ..test_options() }))
        .collect();
    for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
        outputs_identical_across(&options, layout, &lens, policy);
    }

    let packed = CudaBackend::with_options(0, test_options()).unwrap();
    let plain = CudaBackend::with_options(0, CudaOptions { packing: Packing::Off, ..test_options() }).unwrap();
    let p = problem(KvLayout::block_table(16), lens.clone());
    let plan = packed.plan(&p, policy.parse().unwrap()).unwrap();
    let pairs = packed.packed_pairs_of(&plan).expect("a mostly empty grid launches packed");
    assert_eq!(u64::from(pairs), plan.active_pairs(), "{plan}");
    assert_eq!(plain.packed_pairs_of(&plain.plan(&p, policy.parse().unwrap()).unwrap()), None);
    // A batch of 64 sequences packs from 2 empty CTAs per active one, a
    // narrower batch from 8: 8 sequences of 4000 tokens (16 splits) among 56
    // of 200 (one split), and the same mix at 32, are both 4.6 per active one.
    let mix = |num_seqs: usize| -> Vec<u32> { (0..num_seqs).map(|i| if i % 8 == 0 { 4000 } else { 200 }).collect() };
    let wide = problem(KvLayout::block_table(16), mix(64));
    let wide_plan = packed.plan(&wide, policy.parse().unwrap()).unwrap();
    assert_eq!((wide_plan.active_pairs(), wide_plan.num_splits), (184, 16), "{wide_plan}");
    assert_eq!(packed.packed_pairs_of(&wide_plan), Some(184), "{wide_plan}");
    let narrow = problem(KvLayout::block_table(16), mix(32));
    assert_eq!(packed.packed_pairs_of(&packed.plan(&narrow, policy.parse().unwrap()).unwrap()), None);
    // Equal lengths leave no empty split, and a batch of fewer empty CTAs
    // than 8 per active one (here about 1) keeps the plain grid too.
    let even = problem(KvLayout::block_table(16), vec![4000; 8]);
    assert_eq!(packed.packed_pairs_of(&packed.plan(&even, policy.parse().unwrap()).unwrap()), None);
    let spread = problem(KvLayout::block_table(16), (0..32).map(|i| 250 * i + 1).collect());
    assert_eq!(packed.packed_pairs_of(&packed.plan(&spread, policy.parse().unwrap()).unwrap()), None);
    // `plan` packs any plan with an empty CTA, and only those.
    let planned = CudaBackend::with_options(0, CudaOptions { packing: Packing::Planned, ..test_options() }).unwrap();
    let spread_plan = planned.plan(&spread, policy.parse().unwrap()).unwrap();
    assert_eq!(planned.packed_pairs_of(&spread_plan).map(u64::from), Some(spread_plan.active_pairs()), "{spread_plan}");
    assert_eq!(planned.packed_pairs_of(&planned.plan(&even, policy.parse().unwrap()).unwrap()), None);
    assert_eq!(planned.props_for(&spread).unwrap().empty_cta_us, 0.0);
    assert!(packed.props_for(&spread).unwrap().empty_cta_us > 0.0);

    // The data and block table of longer sequences (every row's blocks
    // allocated), run at the ragged lengths the plan is for, then at the
    // longer ones: more pairs than the packed launch has CTAs.
    let longer: Vec<u32> = (0..lens.len() as u32).map(|i| if i == 0 { 8000 } else { 500 + 5 * i }).collect();
    let shorter: Vec<u32> = (0..lens.len() as u32).map(|i| if i % 3 == 0 { 0 } else { i }).collect();
    let more_pairs: u32 = longer.iter().map(|&s| plan.rule.split(s).active_splits).sum();
    assert!(more_pairs > 2 * pairs, "{more_pairs} pairs against {pairs} CTAs");
    let batch = HostBatch::random(&problem(KvLayout::block_table(16), longer.clone()), 47);
    let mut device = DeviceBatch::new(&packed, &batch.at_lengths(&lens), plan.workspace_bytes);
    let graph = packed.capture(&mut || packed.decode(&plan, device.args(true))).unwrap();
    for replay_lens in [lens.clone(), longer, shorter] {
        let as_i32: Vec<i32> = replay_lens.iter().map(|&s| s as i32).collect();
        packed.upload(&mut device.seq_lens, &i32_bytes(&as_i32)).unwrap();
        packed.upload(&mut device.out, &nan_bytes(DType::Bf16, p.out_bytes())).unwrap();
        graph.replay().unwrap();
        let got = download_f32(&packed, &device.out, DType::Bf16);
        let reference = decode_reference(&batch.at_lengths(&replay_lens), p.shape.default_scale());
        let err = relative_error(&got, &reference);
        assert!(err < 1e-2, "replay at {:?}..: relerr {err}", &replay_lens[..4]);
        let per_seq = 32 * 128;
        for (b, &len) in replay_lens.iter().enumerate() {
            if len == 0 {
                assert!(got[b * per_seq..(b + 1) * per_seq].iter().all(|&x| x == 0.0), "sequence {b} of length 0");
            }
        }
    }
}

/// With `BatchRule::Auto`, a plan of equal lengths under `auto` (the graph
/// an engine captures for a batch size) cuts by the batch: captured at the planned lengths, then
/// replayed with one long sequence among short ones, a spread and empty
/// sequences, every replay matches the reference, and matches bit for bit a
/// direct call with the per-sequence rule the host derives from the replay's
/// lengths (`SplitRule::for_batch`), so the kernels and the reducer summed
/// the batch's tiles as the host does. The launch has a CTA for every pair
/// the rule can make, `num_seqs * (batch_splits + 1)`; one replay nearly
/// fills them.
#[test]
#[serial]
fn batch_rule_plans_cut_each_replay_by_its_mean_length() {
    use decode_attn_cuda::BatchRule;
    if !device_present() {
        return;
    }
    let backend = CudaBackend::with_options(0, CudaOptions { batch_rule: BatchRule::Auto, ..test_options() }).unwrap();
    let planned = problem(KvLayout::block_table(16), vec![4096; 16]);
    let plan = backend.plan(&planned, Policy::Auto).unwrap();
    assert!(plan.rule.is_batch(), "{plan}");
    assert!(plan.rule.num_splits >= 2048 / 16, "{plan}");
    // The default: the per-sequence rule.
    let off = CudaBackend::new(0).unwrap();
    let per_seq = off.plan(&planned, Policy::Auto).unwrap();
    assert!(!per_seq.rule.is_batch(), "{per_seq}");
    assert_eq!(plan.per_seq, per_seq.per_seq, "the planned lengths are cut alike");
    assert_eq!(plan.rule.batch_splits, per_seq.rule.num_splits, "{plan}");
    let ctas = backend.packed_pairs_of(&plan).expect("a batch rule launches packed");
    assert_eq!(ctas, 16 * (plan.rule.batch_splits + 1), "{plan}");
    let planned_pairs = plan.active_pairs();

    let batch = HostBatch::random(&planned, 83);
    let mut device = DeviceBatch::new(&backend, &batch, plan.workspace_bytes);
    let graph = backend.capture(&mut || backend.decode(&plan, device.args(true))).unwrap();
    let one_long: Vec<u32> = (0..16).map(|i| if i == 5 { 4096 } else { 16 + i }).collect();
    let spread: Vec<u32> = (0..16).map(|i| 256 * i + 7).collect();
    let with_empty: Vec<u32> = (0..16).map(|i| if i % 4 == 0 { 0 } else { 4096 - 200 * i }).collect();
    let more_pairs: u32 = one_long.iter().map(|&s| plan.rule.for_batch(&one_long).split(s).active_splits).sum();
    assert!(
        u64::from(more_pairs) > planned_pairs && more_pairs <= ctas,
        "{more_pairs} pairs, {planned_pairs} planned, {ctas} CTAs"
    );
    for lens in [vec![4096; 16], one_long, spread, with_empty] {
        let as_i32: Vec<i32> = lens.iter().map(|&s| s as i32).collect();
        backend.upload(&mut device.seq_lens, &i32_bytes(&as_i32)).unwrap();
        backend.upload(&mut device.out, &nan_bytes(DType::Bf16, planned.out_bytes())).unwrap();
        graph.replay().unwrap();
        let replayed = download_f32(&backend, &device.out, DType::Bf16);
        let reference = decode_reference(&batch.at_lengths(&lens), planned.shape.default_scale());
        let err = relative_error(&replayed, &reference);
        assert!(err < 1e-2, "replay at {:?}..: relerr {err}", &lens[..6]);

        let mut direct = plan.clone();
        direct.rule = plan.rule.for_batch(&lens);
        direct.per_seq = lens.iter().map(|&s| direct.rule.split(s)).collect();
        backend.upload(&mut device.out, &nan_bytes(DType::Bf16, planned.out_bytes())).unwrap();
        backend.decode(&direct, device.args(true)).unwrap();
        let got = download_f32(&backend, &device.out, DType::Bf16);
        assert!(
            got.iter().zip(&replayed).all(|(a, b)| a.to_bits() == b.to_bits()),
            "replay at {:?}.. differs from the host's cut {:?}",
            &lens[..6],
            direct.rule
        );
    }
}

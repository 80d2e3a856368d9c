//! Every backend against the f64 CPU reference.
//!
//! The CPU backend always runs the full sweep (a few seconds even in a debug
//! build on two cores). CUDA and HIP run it when a device is usable and say
//! plainly that they skip when none is. GPU tests are `#[serial]`: they share
//! one device and their timings and memory must not interleave.

use std::io::Write;

use decode_attn::{Backend, DecodeAttention, KvLayout, Result};
use decode_attn_conformance::{
    cases, check_batch_invariance, check_rejects_misuse, describe, run_case, Summary, Sweep,
};
use serial_test::serial;

/// Written straight to stderr, past the test harness's capture, so that a
/// skipped GPU test is visible in a plain `cargo test` run.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn sweep_passes(backend: &Backend, sweep: Sweep) {
    let mut summary = Summary::default();
    let mut failures = Vec::new();
    for case in cases(sweep) {
        let result = run_case(backend, &case);
        summary.record(&result);
        let line = describe(&case, &result);
        if line.starts_with("FAIL") {
            failures.push(line);
        }
    }
    say(&format!("conformance {} ({sweep:?} sweep): {summary}", backend.describe()));
    assert!(failures.is_empty(), "{} of the sweep failed:\n{}", summary.failed, failures.join("\n"));
    assert!(summary.passed > 0, "nothing was compared: {summary}");
}

fn batch_invariance_holds(backend: &Backend) {
    for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
        let differing = check_batch_invariance(backend, layout).expect("the batch-invariance run failed");
        assert_eq!(differing, 0, "{layout}: deterministic:64 output of a sequence changed with its batch");
    }
}

fn misuse_is_rejected(backend: &Backend) {
    let accepted = check_rejects_misuse(backend).expect("setting up the misuse checks failed");
    assert!(accepted.is_empty(), "{} accepted: {}", backend.name(), accepted.join("; "));
}

/// Buffers of one backend kind handed to another are an error, never a panic.
fn foreign_buffers_are_rejected(gpu: &Backend) {
    let cpu = Backend::cpu();
    let mut host = cpu.alloc(16).expect("cpu alloc");
    let mut device = gpu.alloc(16).expect("gpu alloc");
    let err = gpu.upload(&mut host, &[0; 16]).expect_err("a cpu buffer was accepted by a gpu upload");
    assert!(err.to_string().contains("allocated by the cpu backend"), "{err}");
    assert!(cpu.upload(&mut device, &[0; 16]).is_err(), "a gpu buffer was accepted by a cpu upload");

    let problem = decode_attn::DecodeProblem::new(
        decode_attn::AttentionShape::new(8, 2, 128).expect("shape"),
        decode_attn::DTypes::uniform(decode_attn::DType::Bf16),
        KvLayout::block_table(16),
        vec![40],
    )
    .expect("problem");
    let plan = gpu.plan(&problem, decode_attn::Policy::Auto).expect("plan");
    let batch = decode_attn::synth::HostBatch::random(&problem, 1);
    let mut on_cpu = decode_attn::DeviceBatch::upload(&cpu, &batch, plan.workspace_bytes, 0).expect("upload");
    assert!(gpu.decode(&plan, on_cpu.args()).is_err(), "a gpu decode accepted cpu buffers");
}

/// The GPU backend `open` gives, or `None` after saying plainly why the test skips.
fn gpu_or_skip(test: &str, open: fn(usize) -> Result<Backend>) -> Option<Backend> {
    match open(0) {
        Ok(backend) => Some(backend),
        Err(err) => {
            say(&format!("{test}: SKIPPED, no usable device on this machine ({err})"));
            None
        }
    }
}

#[test]
fn cpu_matches_the_reference() {
    sweep_passes(&Backend::cpu(), Sweep::Full);
}

#[test]
fn cpu_deterministic_policy_is_batch_invariant() {
    batch_invariance_holds(&Backend::cpu());
}

#[test]
fn cpu_rejects_misuse() {
    misuse_is_rejected(&Backend::cpu());
}

#[test]
#[serial(gpu)]
fn cuda_matches_the_reference() {
    if let Some(backend) = gpu_or_skip("cuda_matches_the_reference", Backend::cuda) {
        sweep_passes(&backend, Sweep::Full);
        batch_invariance_holds(&backend);
        misuse_is_rejected(&backend);
        foreign_buffers_are_rejected(&backend);
    }
}

#[test]
#[serial(gpu)]
fn hip_matches_the_reference() {
    if let Some(backend) = gpu_or_skip("hip_matches_the_reference", Backend::hip) {
        sweep_passes(&backend, Sweep::Full);
        batch_invariance_holds(&backend);
        misuse_is_rejected(&backend);
        foreign_buffers_are_rejected(&backend);
    }
}

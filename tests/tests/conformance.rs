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
    }
}

#[test]
#[serial(gpu)]
fn hip_matches_the_reference() {
    if let Some(backend) = gpu_or_skip("hip_matches_the_reference", Backend::hip) {
        sweep_passes(&backend, Sweep::Full);
        batch_invariance_holds(&backend);
        misuse_is_rejected(&backend);
    }
}

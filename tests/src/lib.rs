//! Conformance: every backend against the f64 CPU reference.
//!
//! [`cases`] generates the sweep (layouts, element types, head dims, group
//! ratios, policies, mixed lengths including 0, 1, 15, 16 and 17) and
//! [`run_case`] runs one case on any [`DecodeAttention`] backend: it uploads
//! a random batch, fills the output and the workspace with NaN, decodes,
//! downloads and compares. `decode-attn check` and this crate's tests share
//! both, so the command-line sweep and `cargo test` check the same things.

use std::fmt;

use decode_attn::synth::{relative_error, HostBatch, HostIndex};
use decode_attn::{
    AttentionShape, DType, DTypes, DecodeAttention, DecodeProblem, DeviceBatch, Error, KernelKind, KvLayout, Policy,
    Result,
};

/// One conformance case: a problem, the policy to plan it with, and the seed of its data.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub problem: DecodeProblem,
    pub policy: Policy,
    pub seed: u64,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.problem;
        let lens = if p.seq_lens.len() <= 6 {
            format!("{:?}", p.seq_lens)
        } else {
            format!("[{} seqs, max {}]", p.seq_lens.len(), p.max_seq_len())
        };
        let d = &p.dtypes;
        let types =
            if d.q == d.kv && d.kv == d.out { d.q.to_string() } else { format!("q {}/kv {}/out {}", d.q, d.kv, d.out) };
        write!(
            f,
            "h={}/{} d={} {} {} {} s={}",
            p.shape.num_q_heads, p.shape.num_kv_heads, p.shape.head_dim, types, p.layout, self.policy, lens
        )
    }
}

/// How much of the sweep to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Every dimension covered at least once, with short sequences: seconds on a CPU in debug.
    Quick,
    /// The whole cross-section, with sequences long enough for many splits.
    Full,
}

/// The outcome of one case.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    /// `||out - reference|| / ||reference||`; infinite when any output is NaN or infinite.
    pub relerr: f64,
    /// The largest `|lse - reference|` over the rows (natural log), 0 for a
    /// batch of no rows; infinite where one is non-finite and the
    /// reference's is not, or not the same non-finite value (`-inf` for an
    /// empty sequence, NaN for a guarded one).
    pub lse_err: f64,
    /// The largest relative error accepted for the case's output type, and
    /// the largest LSE error: `lse` is `ln(l) + m`, so its absolute error is
    /// the relative error of the softmax sum `l`.
    pub tolerance: f64,
    pub kernel: KernelKind,
    pub num_splits: u32,
    /// `Some(why)` when the backend does not run this combination (nothing was compared).
    pub skipped: Option<String>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.skipped.is_none() && self.relerr <= self.tolerance && self.lse_err <= self.tolerance
    }
}

/// The largest relative error accepted for outputs of `dtypes`: a few roundings of the
/// output type (bf16 keeps 8 mantissa bits, f16 11), with f32 accumulation below them.
pub fn tolerance(dtypes: DTypes) -> f64 {
    let storage = |dtype: DType| -> f64 {
        match dtype {
            DType::F32 => 1e-5,
            DType::F16 => 2e-3,
            _ => 1e-2,
        }
    };
    // Q rounding does not matter (the reference reads the same rounded Q); the
    // output's own rounding does, and f32 accumulation adds ~1e-6.
    storage(dtypes.out).max(1e-4)
}

/// The lengths every layout and policy is run against: empty, one token, the
/// edges of a 16-token tile, and longer ones that split into several pieces.
const EDGE_LENGTHS: &[u32] = &[0, 1, 15, 16, 17, 33, 100, 257];

fn problem(heads: (usize, usize, usize), dtypes: DTypes, layout: KvLayout, lens: &[u32]) -> DecodeProblem {
    let shape = AttentionShape { num_q_heads: heads.0, num_kv_heads: heads.1, head_dim: heads.2 };
    DecodeProblem { shape, dtypes, layout, seq_lens: lens.to_vec() }
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap_or_else(|err| panic!("the sweep's own policy {text:?} does not parse: {err}"))
}

/// The conformance sweep. [`Sweep::Quick`] is a subset of [`Sweep::Full`]'s
/// dimensions with shorter sequences; both are deterministic.
pub fn cases(sweep: Sweep) -> Vec<Case> {
    let full = sweep == Sweep::Full;
    let bf16 = DTypes::uniform(DType::Bf16);
    let mut problems: Vec<(DecodeProblem, Policy)> = Vec::new();

    // 1. Layouts x policies, on mixed lengths with every tile edge.
    let layouts = [
        KvLayout::block_table(16),
        KvLayout::block_table(32),
        // Not a power of two: the CUDA tensor-core kernel's other entry point
        // (a division where powers of two take a shift and a mask).
        KvLayout::block_table(48),
        KvLayout::block_table(80),
        KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 64 },
        KvLayout::token_indices(1),
        KvLayout::token_indices(8),
    ];
    let policies: &[&str] = if full {
        &[
            "auto",
            "vllm",
            "vllm:batch-invariant",
            "sglang",
            "sglang:4",
            "fixed:1",
            "fixed:3",
            "fixed:16",
            "deterministic:32",
        ]
    } else {
        &["auto", "vllm", "sglang", "fixed:3", "deterministic:32"]
    };
    for (i, layout) in layouts.iter().enumerate() {
        for (j, name) in policies.iter().enumerate() {
            // The quick sweep runs each policy on one layout and each layout on two policies.
            if !full && j != i % policies.len() && j != (i + 2) % policies.len() {
                continue;
            }
            problems.push((problem((8, 2, 128), bf16, *layout, EDGE_LENGTHS), policy(name)));
        }
    }

    // 2. Element types x head dims, split and unsplit.
    let head_dims: &[usize] = if full { decode_attn::shape::SUPPORTED_HEAD_DIMS } else { &[64, 128, 256] };
    let mut dtype_sets: Vec<DTypes> = DType::ALL.iter().map(|&d| DTypes::uniform(d)).collect();
    // Mixed types as engines use them: bf16 cache with f32 output, f32 queries over an f16 cache.
    dtype_sets.push(DTypes { q: DType::Bf16, kv: DType::Bf16, out: DType::F32 });
    dtype_sets.push(DTypes { q: DType::F32, kv: DType::F16, out: DType::F32 });
    let lens: &[u32] = if full { &[1, 17, 300, 1000] } else { &[1, 17, 300] };
    for (i, &dtypes) in dtype_sets.iter().enumerate() {
        for (j, &head_dim) in head_dims.iter().enumerate() {
            let names: &[&str] = if full { &["auto", "fixed:4"] } else { &["fixed:4"] };
            if !full && (i + j) % 2 == 1 {
                continue;
            }
            for name in names {
                problems.push((problem((8, 2, head_dim), dtypes, KvLayout::block_table(16), lens), policy(name)));
            }
        }
    }

    // 3. Group ratios g = h / h_kv, including non-powers of two (Qwen2-7B: 28/4 = 7)
    //    and groups larger than one CUDA stream-kernel CTA holds (8 heads):
    //    g = 10, 16 and 32 take several CTAs per KV head.
    let groups: &[(usize, usize)] = if full {
        &[(4, 4), (8, 1), (16, 2), (28, 4), (32, 8), (64, 8), (12, 2), (20, 2), (16, 1), (32, 1)]
    } else {
        &[(4, 4), (8, 1), (28, 4), (20, 2)]
    };
    for &(h, h_kv) in groups {
        for name in ["auto", "fixed:5"] {
            problems.push((problem((h, h_kv, 128), bf16, KvLayout::block_table(16), &[5, 64, 129]), policy(name)));
        }
    }

    // 4. Lengths: all empty, one token, one long sequence, many splits, many sequences.
    let long = if full { 5000 } else { 1500 };
    let length_sets: Vec<(Vec<u32>, &str)> = vec![
        (vec![0], "auto"),
        (vec![0, 0, 0], "fixed:8"),
        (vec![1], "fixed:8"),
        (vec![long], "auto"),
        (vec![long], "fixed:1024"),
        (vec![long, 0, 15, 16, 17, 1], "deterministic:64"),
        (vec![long, 3, long / 2], "sglang"),
        ((0..if full { 40 } else { 12 }).map(|i| (i * 37 % 211) as u32).collect(), "vllm"),
        // Ragged: on a GPU `auto` cuts it in chunks of the long sequence (a
        // split length, not a count), so the short ones stay whole and most
        // of the grid's CTAs are empty splits.
        (std::iter::once(long).chain(std::iter::repeat_n(200, 47)).collect(), "auto"),
    ];
    for (lens, name) in length_sets {
        for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
            problems.push((problem((8, 2, 128), bf16, layout, &lens), policy(name)));
        }
    }

    problems
        .into_iter()
        .enumerate()
        .map(|(i, (problem, policy))| Case { problem, policy, seed: 0x5EED_0000 + i as u64 })
        .collect()
}

/// Runs `case` on `backend` and compares with the f64 reference.
///
/// The output and the workspace start as NaN (all bits set), so an element a
/// kernel forgets to write, or a partial row the reducer reads without a
/// producer having written it, shows up as an infinite relative error; so
/// do the pools' slots that hold no token (`poison_unused_slots`), so that a
/// slot past a sequence's end that reaches the output shows too.
pub fn run_case<B: DecodeAttention + ?Sized>(backend: &B, case: &Case) -> Result<CaseResult> {
    let plan = match backend.plan(&case.problem, case.policy) {
        Ok(plan) => plan,
        // A backend may decline a combination it documents as unsupported;
        // the sweep counts that as skipped, and fails anything else.
        Err(err @ (Error::UnsupportedDTypes { .. } | Error::Unsupported { .. })) => {
            return Ok(CaseResult {
                relerr: f64::NAN,
                lse_err: f64::NAN,
                tolerance: tolerance(case.problem.dtypes),
                kernel: KernelKind::Unsplit,
                num_splits: 0,
                skipped: Some(err.to_string()),
            })
        }
        Err(err) => return Err(err),
    };
    let mut batch = HostBatch::random(&case.problem, case.seed);
    batch.poison_unused_slots();
    // Output and LSE poisoned (0xFF bytes are NaN in every float type).
    let mut device = DeviceBatch::upload(backend, &batch, plan.workspace_bytes, 0xFF)?;
    backend.decode(&plan, device.args_with_lse())?;
    let out = device.download_out(backend, case.problem.dtypes.out)?;
    let lse = device.download_lse(backend)?;
    let (reference, reference_lse) =
        decode_attn::reference::decode_reference_with_lse(&batch, case.problem.shape.default_scale());
    if out.len() != reference.len() {
        return Err(Error::BufferSize { name: "out", expected: reference.len(), actual: out.len() });
    }
    if lse.len() != reference_lse.len() {
        return Err(Error::BufferSize { name: "lse", expected: reference_lse.len(), actual: lse.len() });
    }
    Ok(CaseResult {
        relerr: relative_error(&out, &reference),
        lse_err: lse_error(&lse, &reference_lse),
        tolerance: tolerance(case.problem.dtypes),
        kernel: plan.kernel,
        num_splits: plan.num_splits,
        skipped: None,
    })
}

/// The largest `|got - want|` of LSEs, infinite where a value is non-finite
/// and the reference's is not the same non-finite value.
pub fn lse_error(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).fold(0.0f64, |worst, (&g, &w)| {
        let g = g as f64;
        let err = if w.is_finite() {
            if g.is_finite() {
                (g - w).abs()
            } else {
                f64::INFINITY
            }
        } else if (w.is_nan() && g.is_nan()) || g == w {
            0.0
        } else {
            f64::INFINITY
        };
        worst.max(err)
    })
}

/// Runs `f` on a batch of the first `n` sequences of `batch`. The KV pools
/// are moved into that batch and back, never copied: they may be gigabytes.
pub fn with_first_sequences<T>(batch: &mut HostBatch, n: usize, f: impl FnOnce(&HostBatch) -> T) -> T {
    let n = n.min(batch.problem.num_seqs());
    let shape = batch.problem.shape;
    let q_row = shape.num_q_heads * shape.head_dim * batch.problem.dtypes.q.size_bytes();
    let index = match &batch.index {
        HostIndex::BlockTable { table, max_blocks_per_seq } => HostIndex::BlockTable {
            table: table[..n * max_blocks_per_seq].to_vec(),
            max_blocks_per_seq: *max_blocks_per_seq,
        },
        HostIndex::TokenIndices { indptr, indices } => {
            let end = indptr[n].max(0) as usize;
            HostIndex::TokenIndices { indptr: indptr[..=n].to_vec(), indices: indices[..end].to_vec() }
        }
    };
    let mut problem = batch.problem.clone();
    problem.seq_lens.truncate(n);
    let mut subset = HostBatch {
        problem,
        q: batch.q[..n * q_row].to_vec(),
        k_cache: std::mem::take(&mut batch.k_cache),
        v_cache: std::mem::take(&mut batch.v_cache),
        seq_lens: batch.seq_lens[..n].to_vec(),
        index,
        num_slots: batch.num_slots,
    };
    let result = f(&subset);
    batch.k_cache = std::mem::take(&mut subset.k_cache);
    batch.v_cache = std::mem::take(&mut subset.v_cache);
    result
}

/// The promise of `deterministic:TILE`: a sequence's output does not depend on
/// who else is in the batch. Decodes a mixed batch, then its first sequence
/// alone over the same KV pool, and returns whether that sequence's output
/// rows are bitwise the same (with the number of differing elements if not).
pub fn check_batch_invariance<B: DecodeAttention + ?Sized>(backend: &B, layout: KvLayout) -> Result<usize> {
    let policy = Policy::Deterministic { tile_tokens: 64 };
    let problem = problem((8, 2, 128), DTypes::uniform(DType::Bf16), layout, &[1000, 3, 0, 400, 17]);
    let mut batch = HostBatch::random(&problem, 0xBA7C);
    let together = decode_attn::decode_host_batch(backend, &backend.plan(&problem, policy)?, &batch)?;
    let alone = with_first_sequences(&mut batch, 1, |first| {
        let plan = backend.plan(&first.problem, policy)?;
        decode_attn::decode_host_batch(backend, &plan, first)
    })?;
    Ok(alone.iter().zip(&together).filter(|(a, b)| a.to_bits() != b.to_bits()).count())
}

/// Misuse must come back as an error, never a panic or a wild write: a short
/// output, a short workspace, a layout the plan was not made for.
/// Returns a description of each misuse the backend accepted.
pub fn check_rejects_misuse<B: DecodeAttention + ?Sized>(backend: &B) -> Result<Vec<String>> {
    let problem = problem((8, 2, 128), DTypes::uniform(DType::Bf16), KvLayout::block_table(16), &[300, 40]);
    let plan = backend.plan(&problem, Policy::Fixed { splits: 4 })?;
    let batch = HostBatch::random(&problem, 7);
    let mut accepted = Vec::new();

    let mut device = DeviceBatch::upload(backend, &batch, plan.workspace_bytes, 0)?;
    device.out = backend.alloc(problem.out_bytes() - 2)?;
    if backend.decode(&plan, device.args()).is_ok() {
        accepted.push("an output buffer 2 bytes short".to_string());
    }

    let mut device = DeviceBatch::upload(backend, &batch, plan.workspace_bytes, 0)?;
    device.workspace = backend.alloc(plan.workspace_bytes as usize / 2)?;
    if backend.decode(&plan, device.args()).is_ok() {
        accepted.push("a workspace half the plan's size".to_string());
    }

    let other = DecodeProblem { layout: KvLayout::token_indices(1), ..problem.clone() };
    let other_batch = HostBatch::random(&other, 7);
    let mut device = DeviceBatch::upload(backend, &other_batch, plan.workspace_bytes, 0)?;
    if backend.decode(&plan, device.args()).is_ok() {
        accepted.push("token indices for a plan made for a block table".to_string());
    }
    Ok(accepted)
}

/// Counts of a finished sweep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Summary {
    pub fn record(&mut self, result: &Result<CaseResult>) {
        match result {
            Ok(r) if r.skipped.is_some() => self.skipped += 1,
            Ok(r) if r.passed() => self.passed += 1,
            _ => self.failed += 1,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.skipped > 0 {
            write!(f, ", {} skipped", self.skipped)?;
        }
        Ok(())
    }
}

/// One line for a case's outcome: PASS/FAIL/SKIP, the error, the plan and the case.
pub fn describe(case: &Case, result: &Result<CaseResult>) -> String {
    match result {
        Ok(r) if r.skipped.is_some() => {
            format!("SKIP  {case}: {}", r.skipped.as_deref().unwrap_or_default())
        }
        Ok(r) => format!(
            "{}  relerr {:.1e} lse {:.1e} (tol {:.0e}) {:?}x{}  {case}",
            if r.passed() { "PASS" } else { "FAIL" },
            r.relerr,
            r.lse_err,
            r.tolerance,
            r.kernel,
            r.num_splits
        ),
        Err(err) => format!("FAIL  {case}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_valid_and_the_sweeps_cover_the_edges() {
        for sweep in [Sweep::Quick, Sweep::Full] {
            let cases = cases(sweep);
            for case in &cases {
                case.problem.validate().unwrap_or_else(|err| panic!("{case}: {err}"));
            }
            for len in [0, 1, 15, 16, 17] {
                assert!(cases.iter().any(|c| c.problem.seq_lens.contains(&len)), "{sweep:?} lacks length {len}");
            }
            for dtype in DType::ALL {
                assert!(cases.iter().any(|c| c.problem.dtypes.kv == dtype), "{sweep:?} lacks {dtype}");
            }
            for tokens in [false, true] {
                assert!(cases.iter().any(|c| matches!(c.problem.layout, KvLayout::TokenIndices { .. }) == tokens));
            }
        }
        assert!(cases(Sweep::Quick).len() < cases(Sweep::Full).len());
    }
}

//! Shared helpers of the integration tests: upload a synthetic batch, run a
//! plan with poisoned output and workspace, read the output back as f32.

#![allow(dead_code)]

use decode_attn_core::synth::{i32_bytes, HostBatch, HostIndex};
use decode_attn_core::{
    dtype, AttentionShape, DType, DTypes, DecodeArgs, DecodeAttention, DecodeProblem, KvIndexBuffers, KvLayout, Plan,
    Policy, Result,
};
use decode_attn_cpu::{CpuBackend, CpuBuffer};
use proptest::prelude::*;

/// The four layouts every correctness test covers.
pub const LAYOUTS: [KvLayout; 4] = [
    KvLayout::block_table(16),
    KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 64 },
    KvLayout::token_indices(1),
    KvLayout::token_indices(4),
];

/// Bytes that decode as NaN in f32, f16 and bf16 alike.
pub const POISON: u8 = 0xFF;

pub fn problem(
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    dtypes: DTypes,
    layout: KvLayout,
    lens: &[u32],
) -> DecodeProblem {
    DecodeProblem::new(AttentionShape::new(q_heads, kv_heads, d).unwrap(), dtypes, layout, lens.to_vec()).unwrap()
}

pub fn uniform(dtype: DType) -> DTypes {
    DTypes::uniform(dtype)
}

/// One call's buffers on the CPU "device".
pub struct Buffers {
    pub q: CpuBuffer,
    pub k: CpuBuffer,
    pub v: CpuBuffer,
    pub lens: CpuBuffer,
    /// Block table, or kv_indptr.
    pub index_a: CpuBuffer,
    /// kv_indices (token layout only).
    pub index_b: CpuBuffer,
    pub max_blocks_per_seq: usize,
    pub block_table: bool,
    pub workspace: CpuBuffer,
    pub out: CpuBuffer,
    /// Passed as the call's LSE buffer where set (`with_lse`).
    pub lse: Option<CpuBuffer>,
}

impl Buffers {
    pub fn new(batch: &HostBatch, plan: &Plan) -> Buffers {
        let (index_a, index_b, max_blocks_per_seq, block_table) = match &batch.index {
            HostIndex::BlockTable { table, max_blocks_per_seq } => {
                (i32_bytes(table), Vec::new(), *max_blocks_per_seq, true)
            }
            HostIndex::TokenIndices { indptr, indices } => (i32_bytes(indptr), i32_bytes(indices), 0, false),
        };
        Buffers {
            q: CpuBuffer::from_bytes(batch.q.clone()),
            k: CpuBuffer::from_bytes(batch.k_cache.clone()),
            v: CpuBuffer::from_bytes(batch.v_cache.clone()),
            lens: CpuBuffer::from_bytes(i32_bytes(&batch.seq_lens)),
            index_a: CpuBuffer::from_bytes(index_a),
            index_b: CpuBuffer::from_bytes(index_b),
            max_blocks_per_seq,
            block_table,
            workspace: CpuBuffer::from_bytes(vec![POISON; plan.workspace_bytes as usize]),
            out: CpuBuffer::from_bytes(vec![POISON; plan.problem.out_bytes()]),
            lse: None,
        }
    }

    /// Asks the calls for the rows' LSEs, in a poisoned buffer.
    pub fn with_lse(mut self, plan: &Plan) -> Buffers {
        let rows = plan.problem.num_seqs() * plan.problem.shape.num_q_heads;
        self.lse = Some(CpuBuffer::from_bytes(vec![POISON; rows * 4]));
        self
    }

    pub fn lse_f32(&self) -> Vec<f32> {
        self.lse.as_ref().map(|lse| dtype::decode(DType::F32, lse.as_bytes())).unwrap_or_default()
    }

    pub fn decode(&mut self, backend: &CpuBackend, plan: &Plan, scale: Option<f32>) -> Result<()> {
        let kv_index = if self.block_table {
            KvIndexBuffers::BlockTable { table: &self.index_a, max_blocks_per_seq: self.max_blocks_per_seq }
        } else {
            KvIndexBuffers::TokenIndices { indptr: &self.index_a, indices: &self.index_b }
        };
        backend.decode(
            plan,
            DecodeArgs {
                q: &self.q,
                k_cache: &self.k,
                v_cache: &self.v,
                seq_lens: &self.lens,
                kv_index,
                workspace: &mut self.workspace,
                out: &mut self.out,
                lse: self.lse.as_mut(),
                softmax_scale: scale,
            },
        )
    }

    pub fn out_f32(&self, plan: &Plan) -> Vec<f32> {
        dtype::decode(plan.problem.dtypes.out, self.out.as_bytes())
    }
}

/// Runs `policy` on `batch` with NaN-poisoned output and workspace.
pub fn run(backend: &CpuBackend, batch: &HostBatch, policy: Policy, scale: Option<f32>) -> Result<Vec<f32>> {
    let plan = backend.plan(&batch.problem, policy)?;
    let mut buffers = Buffers::new(batch, &plan);
    buffers.decode(backend, &plan, scale)?;
    Ok(buffers.out_f32(&plan))
}

/// The tolerance of an output against the f64 reference, by the least precise dtype.
pub fn tolerance(dtypes: DTypes) -> f64 {
    if [dtypes.q, dtypes.kv, dtypes.out].iter().all(|&t| t == DType::F32) {
        1e-5
    } else {
        1e-2
    }
}

/// `[i32]` from little-endian bytes.
pub fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Attention of one query head of `seq` over tokens `[start, end)` in f64:
/// the normalised output, the max score (natural units) and the LSE (natural log).
pub fn attend_range(
    batch: &HostBatch,
    scale: f64,
    seq: usize,
    head: usize,
    start: usize,
    end: usize,
) -> (Vec<f64>, f64, f64) {
    let p = &batch.problem;
    let (hq, hkv, d) = (p.shape.num_q_heads, p.shape.num_kv_heads, p.shape.head_dim);
    let kv_head = head / p.shape.group_size();
    let q = dtype::decode(p.dtypes.q, &batch.q);
    let k = dtype::decode(p.dtypes.kv, &batch.k_cache);
    let v = dtype::decode(p.dtypes.kv, &batch.v_cache);
    let q = &q[(seq * hq + head) * d..][..d];
    let rows: Vec<usize> =
        (start..end).map(|t| (batch.slot(seq, t).expect("a valid batch") * hkv + kv_head) * d).collect();
    let scores: Vec<f64> =
        rows.iter().map(|&r| scale * (0..d).map(|j| q[j] as f64 * k[r + j] as f64).sum::<f64>()).collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum();
    let mut out = vec![0.0; d];
    for (&r, &w) in rows.iter().zip(&weights) {
        for j in 0..d {
            out[j] += w * v[r + j] as f64 / sum;
        }
    }
    (out, max, max + sum.ln())
}

// Strategies of the property tests.

pub fn any_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::Bf16)]
}

pub fn any_policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Auto),
        Just(Policy::Vllm { batch_invariant: false }),
        (1u32..=16).prop_map(|max_kv_splits| Policy::Sglang { max_kv_splits }),
        (1u32..=40).prop_map(|splits| Policy::Fixed { splits }),
        (1u32..=8).prop_map(|n| Policy::Deterministic { tile_tokens: 16 * n }),
    ]
}

pub fn any_layout() -> impl Strategy<Value = KvLayout> {
    prop_oneof![
        (1usize..=4).prop_map(|k| KvLayout::block_table(16 * k)),
        (1usize..=2, 1usize..=3)
            .prop_map(|(k, r)| KvLayout::BlockTable { kernel_block_size: 16 * k, allocator_block_size: 16 * k * r }),
        (1usize..=8).prop_map(KvLayout::token_indices),
    ]
}

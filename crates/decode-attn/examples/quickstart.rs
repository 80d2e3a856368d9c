//! The README's example: plan and run one decode step on the default backend.
//!
//! cargo run --release -p decode-attn --example quickstart

use decode_attn::synth::HostBatch;
use decode_attn::{AttentionShape, Backend, DType, DTypes, DecodeAttention, DecodeProblem, KvLayout, Policy};

fn main() -> decode_attn::Result<()> {
    let backend = Backend::from_env()?; // DECODE_ATTN_BACKEND, else CUDA, HIP, then the CPU
    let shape = AttentionShape::new(32, 8, 128)?; // Llama-3-8B: 32 query heads, 8 KV heads, d 128
    let layout = KvLayout::block_table(16); // vLLM's 16-token blocks
    let problem = DecodeProblem::new(shape, DTypes::uniform(DType::Bf16), layout, vec![4096, 1000])?;
    let plan = backend.plan(&problem, Policy::Auto)?; // pure host code: grid, splits, workspace, reason
    println!("{plan}");
    let batch = HostBatch::random(&problem, 0); // or your own q, k_cache, v_cache, block table
    let out = decode_attn::decode_host_batch(&backend, &plan, &batch)?; // upload, decode, download
    println!("{} outputs", out.len());
    Ok(())
}

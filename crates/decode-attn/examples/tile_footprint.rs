//! Hand-run timing of the CPU kernel per 16-token tile by where its KV sits
//! (not a test):
//!
//! ```text
//! cargo run --release -p decode-attn --example tile_footprint [-- [--heads Q/KV] [--threads N] [--seq-len S]]
//! ```
//!
//! One sequence of S tokens (default 16384; `--heads` default 8/1, Llama-3-70B
//! at TP=8; one thread), bf16, `fixed:1`, its block table rewritten to reuse
//! its first N blocks for N = 1 .. 1024, so the same kernel reads 8 KiB to 8
//! MiB of K and V (for 8/1): in L1, L2, L3 or beyond. Printed: the best of
//! three timings, and ns per tile of one KV head per thread. s32 found a 70B
//! tile as slow in L1 as from L3 (docs/PERFORMANCE.md, "s32").
use decode_attn::synth::{HostBatch, HostIndex};
use decode_attn::{
    AttentionShape, CpuBackend, DType, DTypes, DecodeAttention, DecodeProblem, DeviceBatch, KvLayout, Policy,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut num_q_heads, mut num_kv_heads, mut threads, mut s) = (8, 1, 1, 16384u32);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--heads" => {
                let heads = args.next().ok_or("--heads Q/KV")?;
                let (q, kv) = heads.split_once('/').ok_or("--heads Q/KV")?;
                (num_q_heads, num_kv_heads) = (q.parse()?, kv.parse()?);
            }
            "--threads" => threads = args.next().ok_or("--threads N")?.parse()?,
            "--seq-len" => s = args.next().ok_or("--seq-len S")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let backend = CpuBackend::with_threads(threads)?;
    let problem = DecodeProblem::new(
        AttentionShape::new(num_q_heads, num_kv_heads, 128)?,
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        vec![s],
    )?;
    let plan = backend.plan(&problem, Policy::Fixed { splits: 1 })?;
    let mut batch = HostBatch::random(&problem, 1);
    let HostIndex::BlockTable { table, .. } = &batch.index else { unreachable!() };
    let table = table.clone();
    let block_bytes = 16 * num_kv_heads * 128 * 2 * 2;
    for distinct in [1usize, 2, 8, 32, 128, 1024] {
        if let HostIndex::BlockTable { table: reused, .. } = &mut batch.index {
            *reused = (0..table.len()).map(|i| table[i % distinct.min(table.len())]).collect();
        }
        let mut device = DeviceBatch::upload(&backend, &batch, plan.workspace_bytes, 0xFF)?;
        let mut best = f64::MAX;
        for _ in 0..3 {
            best = best.min(backend.time_us(&mut || backend.decode(&plan, device.args()), 3, 10)?);
        }
        let tiles = (s as usize).div_ceil(16) * num_kv_heads;
        println!(
            "{num_q_heads}/{num_kv_heads} s={s} threads={threads} distinct blocks {distinct:>5} ({:>6} KiB of K+V): {best:9.1} us, {:7.1} ns a tile of one KV head",
            distinct * block_bytes / 1024,
            best * 1e3 / tiles as f64 * threads as f64
        );
    }
    Ok(())
}

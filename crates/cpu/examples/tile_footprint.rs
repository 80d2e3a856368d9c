//! Hand-run timing of the CPU kernel per 16-token tile by where its KV sits
//! (not a test):
//!
//! ```text
//! cargo run --release -p decode-attn-cpu --example tile_footprint [-- [--heads Q/KV] [--threads N] [--seq-len S]]
//! ```
//!
//! One sequence of S tokens (default 16384; `--heads` default 8/1, Llama-3-70B
//! at TP=8; one thread), bf16, `fixed:1`, its block table rewritten to reuse
//! its first N blocks for N = 1 .. 1024, so the same kernel reads 8 KiB to 8
//! MiB of K and V (for 8/1): in L1, L2, L3 or beyond. Printed: the best of
//! three timings, and ns per tile of one KV head per thread. s32 found a 70B
//! tile as slow in L1 as from L3 (docs/PERFORMANCE.md, "s32").
use decode_attn_core::synth::{i32_bytes, HostBatch, HostIndex};
use decode_attn_core::{
    AttentionShape, DType, DTypes, DecodeArgs, DecodeAttention, DecodeProblem, KvIndexBuffers, KvLayout, Policy,
};
use decode_attn_cpu::{CpuBackend, CpuBuffer};

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
    let batch = HostBatch::random(&problem, 1);
    let HostIndex::BlockTable { table, max_blocks_per_seq } = &batch.index else { unreachable!() };
    let upload = |bytes: &[u8]| -> Result<CpuBuffer, decode_attn_core::Error> {
        let mut buffer = backend.alloc(bytes.len())?;
        backend.upload(&mut buffer, bytes)?;
        Ok(buffer)
    };
    let q = upload(&batch.q)?;
    let k = upload(&batch.k_cache)?;
    let v = upload(&batch.v_cache)?;
    let lens = upload(&i32_bytes(&batch.seq_lens))?;
    let block_bytes = 16 * num_kv_heads * 128 * 2 * 2;
    for distinct in [1usize, 2, 8, 32, 128, 1024] {
        let reused: Vec<i32> = (0..table.len()).map(|i| table[i % distinct.min(table.len())]).collect();
        let table_buf = upload(&i32_bytes(&reused))?;
        let plan = backend.plan(&problem, Policy::Fixed { splits: 1 })?;
        let mut workspace = backend.alloc(plan.workspace_bytes as usize)?;
        let mut out = backend.alloc(problem.out_bytes())?;
        let mut best = f64::MAX;
        for _ in 0..3 {
            let us = backend.time_us(
                &mut || {
                    backend.decode(
                        &plan,
                        DecodeArgs {
                            q: &q,
                            k_cache: &k,
                            v_cache: &v,
                            seq_lens: &lens,
                            kv_index: KvIndexBuffers::BlockTable {
                                table: &table_buf,
                                max_blocks_per_seq: *max_blocks_per_seq,
                            },
                            workspace: &mut workspace,
                            out: &mut out,
                            softmax_scale: None,
                        },
                    )
                },
                3,
                10,
            )?;
            best = best.min(us);
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

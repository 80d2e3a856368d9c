//! Hand-run bandwidth check of the CPU backend (not a test):
//!
//! ```text
//! cargo run --release -p decode-attn-cpu --example cpu_speed [-- [--threads N] [--dtype DT] [--heads Q/KV] [--without-bf16-dot] [--without-amx] [SEQ_LEN...]]
//! ```
//!
//! Decodes a llama3-8b layer (32 query heads, 8 KV heads, d 128, B = 1; `--heads
//! 8/1` makes it llama3-70b's at TP=8) in bf16, f16 and f32
//! under several policies and prints the KV streaming rate against the
//! machine's copy bandwidth (bytes read plus written, as `bench` counts it).
//! `--without-bf16-dot` runs the plain AVX-512 loop on a CPU with AVX512_BF16
//! (`CpuBackend::without_bf16_dot`), and `--without-amx` the AVX512_BF16
//! loop on a CPU with AMX tiles (`CpuBackend::without_amx`), for timing one
//! against the other.

use decode_attn_core::synth::{i32_bytes, HostBatch, HostIndex};
use decode_attn_core::{
    AttentionShape, DType, DTypes, DecodeArgs, DecodeAttention, DecodeProblem, KvIndexBuffers, KvLayout, Policy,
};
use decode_attn_cpu::{CpuBackend, CpuBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut lens: Vec<u32> = Vec::new();
    let mut threads = None;
    let mut dtypes = vec![DType::Bf16, DType::F16, DType::F32];
    let (mut num_q_heads, mut num_kv_heads) = (32, 8);
    let mut bf16_dot = true;
    let mut amx = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => threads = Some(args.next().ok_or("--threads N")?.parse()?),
            "--without-bf16-dot" => bf16_dot = false,
            "--without-amx" => amx = false,
            "--dtype" => dtypes = vec![args.next().ok_or("--dtype DT")?.parse()?],
            "--heads" => {
                let heads = args.next().ok_or("--heads Q/KV")?;
                let (q, kv) = heads.split_once('/').ok_or("--heads Q/KV")?;
                (num_q_heads, num_kv_heads) = (q.parse()?, kv.parse()?);
            }
            _ => lens.push(arg.parse()?),
        }
    }
    let lens = if lens.is_empty() { vec![16384, 65536] } else { lens };
    let backend = match threads {
        Some(n) => CpuBackend::with_threads(n)?,
        None => CpuBackend::new(),
    };
    let backend = if bf16_dot { backend } else { backend.without_bf16_dot() };
    let backend = if amx { backend } else { backend.without_amx() };
    let copy = backend.copy_bandwidth_gbps(256 << 20)?;
    println!(
        "{} [{}]: copy bandwidth {copy:.1} GB/s (256 MiB, read + write)",
        backend.device_props().name,
        backend.instruction_set()
    );
    for &dtype in &dtypes {
        for &s in &lens {
            let problem = DecodeProblem::new(
                AttentionShape::new(num_q_heads, num_kv_heads, 128)?,
                DTypes::uniform(dtype),
                KvLayout::block_table(16),
                vec![s],
            )?;
            let batch = HostBatch::random(&problem, 1);
            let HostIndex::BlockTable { table, max_blocks_per_seq } = &batch.index else { unreachable!() };
            // Through `alloc` and `upload`, as a caller of the trait would.
            let upload = |bytes: &[u8]| -> Result<CpuBuffer, decode_attn_core::Error> {
                let mut buffer = backend.alloc(bytes.len())?;
                backend.upload(&mut buffer, bytes)?;
                Ok(buffer)
            };
            let q = upload(&batch.q)?;
            let k = upload(&batch.k_cache)?;
            let v = upload(&batch.v_cache)?;
            let lens = upload(&i32_bytes(&batch.seq_lens))?;
            let table = upload(&i32_bytes(table))?;
            for policy in [Policy::Auto, Policy::Fixed { splits: 1 }, Policy::Vllm { batch_invariant: false }] {
                let plan = backend.plan(&problem, policy)?;
                let mut workspace = backend.alloc(plan.workspace_bytes as usize)?;
                let mut out = backend.alloc(problem.out_bytes())?;
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
                                    table: &table,
                                    max_blocks_per_seq: *max_blocks_per_seq,
                                },
                                workspace: &mut workspace,
                                out: &mut out,
                                lse: None,
                                softmax_scale: None,
                            },
                        )
                    },
                    5,
                    20,
                )?;
                let gbps = plan.kv_bytes as f64 / us / 1e3;
                println!(
                    "{dtype:>4} s={s:>6} {:<8} splits {:>2}: {us:>9.1} us  {gbps:>6.1} GB/s  {:>5.1}% of copy",
                    policy.to_string(),
                    plan.num_splits,
                    100.0 * gbps / copy
                );
            }
        }
    }
    Ok(())
}

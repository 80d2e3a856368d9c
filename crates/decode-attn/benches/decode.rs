//! Criterion benchmark of decode on the default backend (`DECODE_ATTN_BACKEND`
//! picks another): `cargo bench -p decode-attn`.
//!
//! Each sample is timed by the backend's own clock (`DecodeAttention::time_us`:
//! CUDA-graph replays between device events on a GPU, wall time on the CPU),
//! over enough copies of the KV pool that L2 holds none of them (>= 512 MiB on
//! a GPU, at least two copies and 8 calls per graph, as `decode-attn bench`
//! times). Before the criterion groups, one line per shape prints µs, TB/s and
//! the fraction of the device-to-device copy bandwidth measured in the same
//! run, which criterion's own report cannot show. `decode-attn bench` is the
//! full grid with the peers' CSV; this is the quick, statistically careful one.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use decode_attn::synth::HostBatch;
use decode_attn::{
    AttentionShape, Backend, Buffer, DType, DTypes, DecodeAttention, DecodeProblem, DeviceBatch, KvLayout, KvRotation,
    Policy,
};

const MIB: usize = 1 << 20;

struct Shape {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    batch: usize,
    seq_len: u32,
}

fn shapes(gpu: bool) -> Vec<Shape> {
    let shape = |name, heads, kv_heads, batch, seq_len| Shape { name, heads, kv_heads, batch, seq_len };
    if gpu {
        vec![
            shape("llama3-8b", 32, 8, 1, 16384),
            shape("llama3-8b", 32, 8, 64, 4096),
            shape("llama3-70b-tp8", 8, 1, 1, 65536),
            shape("llama3-70b-tp8", 8, 1, 16, 16384),
        ]
    } else {
        vec![shape("llama3-8b", 32, 8, 1, 16384)]
    }
}

/// A batch on the device plus extra copies of its KV pool to cycle over.
struct Loaded {
    problem: DecodeProblem,
    plan: decode_attn::Plan,
    device: DeviceBatch<Buffer>,
    pools: Vec<(Buffer, Buffer)>,
    /// Passes over every pool per timed run ([`KvRotation::passes`]).
    passes: usize,
}

impl Loaded {
    fn new(backend: &Backend, shape: &Shape, rotation: &KvRotation) -> decode_attn::Result<Loaded> {
        let problem = DecodeProblem::new(
            AttentionShape::new(shape.heads, shape.kv_heads, 128)?,
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![shape.seq_len; shape.batch],
        )?;
        let plan = backend.plan(&problem, Policy::Auto)?;
        let batch = HostBatch::random(&problem, 1);
        let device = DeviceBatch::upload(backend, &batch, plan.workspace_bytes, 0)?;
        let pools = DeviceBatch::upload_kv_copies(backend, &batch, rotation)?;
        let passes = rotation.passes(pools.len() + 1);
        Ok(Loaded { problem, plan, device, pools, passes })
    }

    /// Microseconds per decode call, `reps` replays of `passes` passes over every copy.
    fn time_us(&mut self, backend: &Backend, reps: usize) -> decode_attn::Result<f64> {
        let Loaded { plan, device, pools, passes, .. } = self;
        let calls = (pools.len() + 1) * *passes;
        let mut work = || device.decode_over_pools(backend, plan, pools, *passes);
        Ok(backend.time_us(&mut work, 2, reps)? / calls as f64)
    }

    fn bytes(&self) -> u64 {
        self.problem.kv_bytes() + (self.problem.q_bytes() + self.problem.out_bytes()) as u64
    }
}

fn decode(c: &mut Criterion) {
    let backend = match Backend::from_env() {
        Ok(backend) => backend,
        Err(err) => {
            eprintln!("decode bench: {err}");
            std::process::exit(2);
        }
    };
    let gpu = backend.name() != "cpu";
    let (rotation, copy_bytes) =
        if gpu { (KvRotation::GPU, 1024 * MIB) } else { (KvRotation::host(64 * MIB, 64), 256 * MIB) };
    let copy_gbps = backend.copy_bandwidth_gbps(copy_bytes).expect("copy bandwidth");
    println!("# {}: copy {:.2} TB/s (read + write)", backend.describe(), copy_gbps / 1e3);
    let mut group = c.benchmark_group("decode");
    group.sample_size(10).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_secs(2));
    for shape in shapes(gpu) {
        let mut loaded = Loaded::new(&backend, &shape, &rotation).expect("upload");
        let us = loaded.time_us(&backend, 20).expect("decode");
        let tbs = loaded.bytes() as f64 / us / 1e6;
        println!(
            "# {} B={} s={}: {us:.2} us, {tbs:.3} TB/s, {:.1}% of copy, {} splits",
            shape.name,
            shape.batch,
            shape.seq_len,
            100.0 * tbs * 1e3 / copy_gbps,
            loaded.plan.num_splits
        );
        group.throughput(Throughput::Bytes(loaded.bytes()));
        let id = format!("{}/B{}/s{}", shape.name, shape.batch, shape.seq_len);
        group.bench_function(id, |bencher| {
            bencher.iter_custom(|iters| {
                let us = loaded.time_us(&backend, iters as usize).expect("decode");
                Duration::from_secs_f64(us * 1e-6 * iters as f64)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);

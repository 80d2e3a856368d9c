//! `decode-attn bench`: time decode per shape, the way the peers are timed.
//!
//! Per shape: a random batch (scattered blocks), checked against the f64
//! reference, then timed with the backend's own clock (a CUDA-graph replay on
//! GPUs, wall time on the CPU) while cycling over enough distinct copies of
//! the KV pool that no cache holds them ([`KvRotation::GPU`]: >= 512 MiB per
//! timed run on a GPU, like `bench_peers.py`, at least two copies, at least 8
//! calls per graph). Bytes are counted as the peers count them (KV + Q +
//! output), against a device-to-device copy (read + write) measured in the
//! same run.
//!
//! `--cold` times each call behind an unrelated one instead of behind its
//! own previous call (below, `Evictor`): nearer what an engine sees, whose
//! other kernels run between two layers' attention.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, ValueEnum};
use decode_attn::synth::{relative_error, HostBatch, HostIndex};
use decode_attn::{
    Backend, BackendSpec, DType, DTypes, DecodeAttention, DecodeProblem, DeviceBatch, DeviceBuffer, KvLayout,
    KvRotation, Plan, Policy,
};
use decode_attn_conformance::{lse_error, tolerance, with_first_sequences};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::args::{parse_backend, parse_batch, parse_dtype, parse_layout, parse_lens, parse_policy, Lens};
use crate::models::{parse_model, Model, MODELS};
use crate::CliResult;

const MIB: usize = 1 << 20;
const GIB: u64 = 1 << 30;
/// Host caches are smaller, and host memory is shared with the reference
/// (on a GPU: [`KvRotation::GPU`]).
const CPU_ROTATION: KvRotation = KvRotation::host(256 * MIB, 8);
/// Shapes whose KV exceeds this are skipped, as `bench_peers.py` skips them.
const MAX_KV_BYTES: u64 = 8 * GIB;
/// Most host memory one shape may take (see [`Footprint`]): the largest
/// shape the peers' grid times (8 GiB of f32 KV, on the CPU) takes 25 GiB.
/// A shape that needs more, or more than the machine has available, is an
/// error before anything runs.
const MAX_HOST_BYTES: u64 = 32 * GIB;
/// Longest `--plan-seq-len`: the lengths the kernels read are `i32`.
const MAX_PLAN_SEQ_LEN: u32 = i32::MAX as u32;
/// Multiply-adds of the f64 reference per shape; beyond it only the first
/// sequences are checked (the reference is f64, single-threaded and slow).
const REFERENCE_BUDGET_MACS: u64 = 1 << 28;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Grid {
    /// llama3-8b and llama3-70b-tp8, B in 1,4, s in 1024,4096: under a minute on a small CPU.
    Small,
    /// The peers' grid: both models, B in 1,4,16,64, s in 1024,4096,16384,65536.
    Peers,
}

impl Grid {
    fn batches(self) -> Vec<usize> {
        match self {
            Grid::Small => vec![1, 4],
            Grid::Peers => vec![1, 4, 16, 64],
        }
    }
    fn seq_lens(self) -> Vec<u32> {
        match self {
            Grid::Small => vec![1024, 4096],
            Grid::Peers => vec![1024, 4096, 16384, 65536],
        }
    }
}

#[derive(Args)]
pub struct BenchArgs {
    /// auto | cpu | cuda[:N] | hip[:N] (default: $DECODE_ATTN_BACKEND, else auto)
    #[arg(long, value_parser = parse_backend)]
    backend: Option<BackendSpec>,
    /// Shapes: `small` (default) or `peers` (the grid of ../shared/peers/bench_peers.py).
    #[arg(long, value_enum, default_value_t = Grid::Small)]
    grid: Grid,
    /// Models, comma-separated (default: llama3-8b,llama3-70b-tp8).
    #[arg(long, value_delimiter = ',', value_parser = parse_model)]
    model: Vec<Model>,
    /// Batch sizes, comma-separated (default: the grid's; at most 1048576).
    #[arg(long, value_delimiter = ',', value_parser = parse_batch)]
    batch: Vec<usize>,
    /// Sequence lengths, comma-separated, one per shape (default: the grid's).
    #[arg(long, value_delimiter = ',')]
    seq_len: Vec<u32>,
    /// Ragged batches instead of the grid, comma-separated, one per shape:
    /// `LxC+LxC...` (C sequences of length L, in that order) or
    /// `spread:B:LO-HI` (B lengths evenly spaced from LO to HI). Their CSV
    /// rows give B = the number of sequences and s = the longest.
    #[arg(long, value_delimiter = ',', value_parser = parse_lens, conflicts_with_all = ["batch", "seq_len", "grid"])]
    lens: Vec<Lens>,
    /// Policies to time, comma-separated: auto, vllm, sglang[:N], fixed:N, deterministic:TILE.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = parse_policy)]
    policy: Vec<Policy>,
    /// Element type of Q, the KV cache and the output.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    dtype: DType,
    /// KV layout: block:16 (vLLM's), tokens:1 (SGLang's), block:K/A.
    #[arg(long, default_value = "block:16", value_parser = parse_layout)]
    layout: KvLayout,
    /// Also write rows to this CSV (model,B,s,peer,mode,us,tbs,pct_copy,relerr,splits,lens), as compare.py
    /// reads them; `lens` is a ragged batch's label (empty for a uniform one), so rows sharing B and s differ.
    #[arg(long)]
    csv: Option<PathBuf>,

    /// Time every call cold: right before each timed call the graph runs an
    /// unrelated decode (f32 Llama-3-8B, 8 sequences of 1024 tokens: 64 MiB
    /// of KV, another kernel), which evicts this call's code, lengths and
    /// block table from the caches as an engine's GEMMs would between two
    /// layers. That decode's own time, measured alone the same way, is
    /// subtracted. The CSV's mode reads `cold/<backend>/<policy>`.
    #[arg(long)]
    cold: bool,

    /// Plan every shape as if each sequence were this long, and run it at
    /// its own lengths: what an engine gets that captures one CUDA graph per
    /// batch size, planned for the longest sequence it serves, and replays it
    /// at every length (the kernels read the lengths at each replay). The
    /// block table's rows are as wide as this length (entries past a
    /// sequence's end point at a valid block, never read). Block tables only;
    /// shapes longer than this are refused. The CSV's mode reads
    /// `<backend>/plan<N>/<policy>`.
    #[arg(long)]
    plan_seq_len: Option<u32>,

    /// Ask every call for the rows' LSEs too (f32, what an engine merging
    /// partial attentions needs), checked against the reference's like the
    /// output and timed with the output. The CSV's mode reads
    /// `<backend>/lse/<policy>`.
    #[arg(long)]
    lse: bool,
}

/// A shape before its lengths are written out (a batch of 2^20 sequences
/// takes 4 MiB): one (model, batch, length) of the grid or one `--lens` batch.
struct ShapeSpec {
    model: Model,
    lengths: Lengths,
}

enum Lengths {
    Uniform { batch: usize, seq_len: u32 },
    Ragged(Lens),
}

impl ShapeSpec {
    /// The longest sequence.
    fn seq_len(&self) -> u32 {
        match &self.lengths {
            Lengths::Uniform { seq_len, .. } => *seq_len,
            Lengths::Ragged(lens) => lens.max(),
        }
    }

    fn shape(&self) -> Shape {
        match &self.lengths {
            Lengths::Uniform { batch, seq_len } => {
                Shape { model: self.model, lens: vec![*seq_len; *batch], ragged: None }
            }
            Lengths::Ragged(lens) => {
                let lens = lens.to_vec();
                Shape { model: self.model, ragged: Some(ragged_label(&lens)), lens }
            }
        }
    }
}

struct Shape {
    model: Model,
    /// Every sequence's length.
    lens: Vec<u32>,
    /// Ragged batches only: how `--lens` spelled them.
    ragged: Option<String>,
}

impl Shape {
    fn batch(&self) -> usize {
        self.lens.len()
    }
    /// The longest sequence (the `s` of a CSV row).
    fn seq_len(&self) -> u32 {
        self.lens.iter().copied().max().unwrap_or(0)
    }
    /// The shape as an error message names it: `llama3-8b B=64 s=4096` or `llama3-8b --lens 1x1048576`.
    fn describe(&self) -> String {
        match &self.ragged {
            None => format!("{} B={} s={}", self.model.name, self.batch(), self.seq_len()),
            Some(label) => format!("{} --lens {label}", self.model.name),
        }
    }
    fn problem(&self, dtype: DType, layout: KvLayout) -> CliResult<DecodeProblem> {
        DecodeProblem::new(self.model.shape(), DTypes::uniform(dtype), layout, self.lens.clone())
            .map_err(|err| format!("{}: {err}", self.describe()).into())
    }
}

/// One measured row.
struct Row<'a> {
    shape: &'a Shape,
    policy: Policy,
    plan: &'a Plan,
    us: f64,
    tbs: f64,
    pct_copy: f64,
    relerr: f64,
    /// With `--lse`: the largest LSE error of the checked sequences.
    lse_err: Option<f64>,
    checked: usize,
}

pub fn run(args: BenchArgs) -> CliResult<ExitCode> {
    let models = if args.model.is_empty() { MODELS[..2].to_vec() } else { args.model.clone() };
    let batches = if args.batch.is_empty() { args.grid.batches() } else { args.batch.clone() };
    let seq_lens = if args.seq_len.is_empty() { args.grid.seq_lens() } else { args.seq_len.clone() };
    if batches.contains(&0) {
        return Err("--batch sizes must be at least 1".into());
    }
    let mut shapes = Vec::new();
    for &model in &models {
        if args.lens.is_empty() {
            for &batch in &batches {
                shapes.extend(
                    seq_lens.iter().map(|&seq_len| ShapeSpec { model, lengths: Lengths::Uniform { batch, seq_len } }),
                );
            }
        } else {
            shapes.extend(args.lens.iter().map(|lens| ShapeSpec { model, lengths: Lengths::Ragged(lens.clone()) }));
        }
    }

    if let Some(plan_len) = args.plan_seq_len {
        if !matches!(args.layout, KvLayout::BlockTable { .. }) {
            return Err("--plan-seq-len needs a block-table layout (block:N)".into());
        }
        if plan_len > MAX_PLAN_SEQ_LEN {
            return Err(format!(
                "--plan-seq-len {plan_len} is longer than any sequence the kernels take ({MAX_PLAN_SEQ_LEN} tokens: \
                 lengths are i32 on the device)"
            )
            .into());
        }
        if let Some(shape) = shapes.iter().find(|shape| shape.seq_len() > plan_len) {
            return Err(format!(
                "--plan-seq-len {plan_len} is shorter than a sequence it would serve ({} tokens)",
                shape.seq_len()
            )
            .into());
        }
    }

    let backend = crate::open_backend(args.backend)?;
    let gpu = backend.name() != "cpu";
    // Every shape that will run must be valid and fit in memory: refused
    // here, before any is timed, rather than failing (or worse, killed for
    // memory) halfway through.
    let available = available_memory_bytes();
    for spec in &shapes {
        let shape = spec.shape();
        let problem = shape.problem(args.dtype, args.layout)?;
        if problem.kv_bytes() > MAX_KV_BYTES {
            continue; // skipped below
        }
        let footprint = Footprint::of(&problem, args.plan_seq_len, (!gpu).then_some(&CPU_ROTATION));
        let (limit, whose) = match available {
            Some(bytes) if bytes < MAX_HOST_BYTES => (bytes, "this machine has available"),
            _ => (MAX_HOST_BYTES, "the bench takes for one shape"),
        };
        if footprint.total > limit as u128 {
            let planned = args.plan_seq_len.map(|len| format!(" planned for {len} tokens")).unwrap_or_default();
            return Err(format!(
                "{}{planned}: {footprint}, more than the {} {whose}",
                shape.describe(),
                gib(limit as u128)
            )
            .into());
        }
    }
    let copy_bytes = if gpu { 1 << 30 } else { 256 * MIB };
    let copy_gbps = backend.copy_bandwidth_gbps(copy_bytes)?;
    outln!(
        "# {}; copy {} (read + write, {} MiB copies); dtype {}, {}",
        backend.describe(),
        bandwidth(copy_gbps),
        copy_bytes / MIB,
        args.dtype,
        args.layout
    );
    let mut csv = match &args.csv {
        Some(path) => {
            let mut file =
                BufWriter::new(File::create(path).map_err(|err| format!("cannot create {}: {err}", path.display()))?);
            writeln!(file, "{CSV_HEADER}")?;
            Some(file)
        }
        None => None,
    };

    if let Some(plan_len) = args.plan_seq_len {
        outln!("# every shape planned for sequences of {plan_len} tokens and run at its own lengths");
    }
    let mut evictor = if args.cold { Some(Evictor::new(&backend)?) } else { None };
    let mut mode_prefix = if args.cold { format!("cold/{}", backend.name()) } else { backend.name().to_string() };
    if let Some(plan_len) = args.plan_seq_len {
        mode_prefix.push_str(&format!("/plan{plan_len}"));
    }
    if args.lse {
        mode_prefix.push_str("/lse");
    }
    if args.lse {
        outln!("# every call writes the rows' LSEs too, checked like the output (lse_err: the largest difference)");
    }
    if let Some(evictor) = &evictor {
        outln!("# cold: each timed call right after {}", evictor.describe());
    }

    let progress = progress_bar((shapes.len() * args.policy.len()) as u64);
    progress.suspend(|| {
        outln!(
            "{:16} {:>4} {:>6} {:8} {:20} {:>6} {:>10} {:>7} {:>6} {:>8} {:>7}",
            "model",
            "B",
            "s",
            "backend",
            "policy",
            "splits",
            "us",
            "TB/s",
            "%copy",
            "relerr",
            "checked"
        )
    });
    let started = Instant::now();
    let mut failures = 0usize;
    let mut partly_checked = false;
    for spec in &shapes {
        let shape = &spec.shape();
        progress.set_message(format!("{} B={} s={}", shape.model.name, shape.batch(), shape.seq_len()));
        let problem = shape.problem(args.dtype, args.layout)?;
        let kv_bytes = problem.kv_bytes();
        if let Some(label) = &shape.ragged {
            progress.suspend(|| {
                outln!(
                    "# {} ragged batch {label}: {} sequences, {} tokens, {:.1} MiB of KV",
                    shape.model.name,
                    shape.batch(),
                    shape.lens.iter().map(|&s| s as u64).sum::<u64>(),
                    kv_bytes as f64 / MIB as f64
                )
            });
        }
        if kv_bytes > MAX_KV_BYTES {
            progress.suspend(|| {
                outln!(
                    "{:16} {:>4} {:>6} skipped: {:.1} GiB of KV is over the {} GiB the peers' bench also skips",
                    shape.model.name,
                    shape.batch(),
                    shape.seq_len(),
                    kv_bytes as f64 / GIB as f64,
                    MAX_KV_BYTES / GIB
                )
            });
            progress.inc(args.policy.len() as u64);
            continue;
        }
        let planned = BenchPlan { policies: &args.policy, plan_seq_len: args.plan_seq_len, with_lse: args.lse };
        let outcome = bench_shape(&backend, shape, &problem, planned, copy_gbps, evictor.as_mut(), |row| {
            partly_checked |= row.checked < row.shape.batch();
            let line = format_row(&backend, &row);
            progress.suspend(|| outln!("{line}"));
            if let Some(note) = sparse_grid_note(&backend, &row) {
                progress.suspend(|| outln!("{note}"));
            }
            if let Some(file) = csv.as_mut() {
                write_csv_row(file, &mode_prefix, &row)?;
            }
            // Written so that a NaN relative error counts as a failure too.
            let within_tolerance = row.relerr <= tolerance(problem.dtypes)
                && row.lse_err.is_none_or(|err| err <= tolerance(problem.dtypes));
            if !within_tolerance {
                failures += 1;
            }
            progress.inc(1);
            Ok(())
        });
        if let Err(err) = outcome {
            failures += 1;
            progress
                .suspend(|| outln!("{:16} {:>4} {:>6} error: {err}", shape.model.name, shape.batch(), shape.seq_len()));
        }
    }
    progress.finish_and_clear();
    if let Some(mut file) = csv {
        file.flush()?;
    }
    if partly_checked {
        outln!(
            "# checked k/B: the f64 reference is slow, so only the first k sequences of a shape were compared \
             (at most 2^28 of its multiply-adds per shape); all B were timed"
        );
    }
    outln!("# {} shapes in {:.1} s", shapes.len(), started.elapsed().as_secs_f64());
    // The copy again, so that a machine whose speed moved during the run (a
    // shared CPU) shows it: %copy above is against the figure of the start.
    let end_gbps = backend.copy_bandwidth_gbps(copy_bytes)?;
    let drift = end_gbps / copy_gbps - 1.0;
    outln!(
        "# copy at the end {} ({:+.1}% of the start's){}",
        bandwidth(end_gbps),
        100.0 * drift,
        if drift.abs() > 0.1 {
            ": the machine's speed moved during the run; compare %copy across runs with care"
        } else {
            ""
        }
    );
    if failures > 0 {
        eprintln!(
            "error: {failures} run(s) failed: an error, or a relative (or LSE) error over {:.0e}",
            tolerance(DTypes::uniform(args.dtype))
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The host memory the bench takes for one shape at the most (an estimate
/// that errs high), computed from the lengths before anything is allocated:
///
/// * the synthetic batch ([`HostBatch::random`]): K and V pools of whole
///   allocator blocks (or pages) per sequence, a quarter more spare and one
///   more, filled through an f32 copy of one pool; its block table (as wide
///   as `--plan-seq-len`, next to the table before widening) or token
///   indices, and a copy of it staged for the upload; Q;
/// * on the CPU, whose buffers are host memory: the uploaded batch, output
///   and the rotation's copies of the pools;
/// * the check: the poisoned output, its f32 download and the f64 reference
///   of the sequences checked.
struct Footprint {
    /// Allocator blocks (or pages) in the pool, spares included, and their slots.
    blocks: u128,
    block_slots: usize,
    /// K and V pools, once.
    pool: u128,
    /// The block table or token indices, once.
    index: u128,
    /// Pools on the host (the batch's own, and on the CPU the rotation's).
    pools: u128,
    total: u128,
}

impl Footprint {
    fn of(problem: &DecodeProblem, plan_len: Option<u32>, host_rotation: Option<&KvRotation>) -> Footprint {
        let lens = || problem.seq_lens.iter().map(|&len| len as u128);
        let rows = problem.num_seqs() as u128;
        let (blocks, block_slots) = HostBatch::pool_blocks(problem);
        let blocks = blocks as u128;
        let index_entries = match problem.layout {
            KvLayout::BlockTable { kernel_block_size, allocator_block_size } => {
                let (kernel, allocator) = (kernel_block_size as u128, allocator_block_size as u128);
                let stride = lens().map(|len| len.div_ceil(allocator)).max().unwrap_or(0).max(1);
                let width =
                    (stride * (allocator / kernel)).max(plan_len.map_or(0, |len| (len as u128).div_ceil(kernel)));
                rows * width
            }
            KvLayout::TokenIndices { .. } => lens().sum::<u128>() + rows + 1,
        };
        let slot_elements = (problem.shape.num_kv_heads * problem.shape.head_dim) as u128;
        let slots = blocks * block_slots as u128;
        let pool = 2 * slots * slot_elements * problem.dtypes.kv.size_bytes() as u128;
        let fill = slots * slot_elements * 4;
        let index = 4 * index_entries;
        let row_elements = rows * (problem.shape.num_q_heads * problem.shape.head_dim) as u128;
        let q = row_elements * problem.dtypes.q.size_bytes() as u128;
        let out = row_elements * problem.dtypes.out.size_bytes() as u128;
        let reference_elements = row_elements.min(REFERENCE_BUDGET_MACS as u128 / 2 + row_elements / rows.max(1));
        let check = out + 4 * row_elements + 8 * reference_elements;
        let (pools, device) = match host_rotation {
            None => (1, 0),
            Some(rotation) => {
                let copies = rotation.copies(usize::try_from(pool).unwrap_or(usize::MAX)) as u128;
                (1 + copies, index + q + out + 4 * rows * problem.shape.num_q_heads as u128)
            }
        };
        let total = pools * pool + fill + 3 * index + q + device + check;
        Footprint { blocks, block_slots, pool, index, pools, total }
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "needs about {} of host memory ({} of K and V pool in {} blocks of {} slots, spares included, \
             {} on the host; {} of block table or token indices)",
            gib(self.total),
            gib(self.pool),
            self.blocks,
            self.block_slots,
            if self.pools == 1 { "once".to_string() } else { format!("{} times", self.pools) },
            gib(self.index)
        )
    }
}

/// Bytes as GiB, one decimal.
fn gib(bytes: u128) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

/// What the host has available for a new process (Linux's `MemAvailable`),
/// where it says.
fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.trim_start_matches("MemAvailable:").trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Widens every row of `batch`'s block table to hold `plan_len` tokens: the
/// added entries repeat the row's first block (or block 0), valid ids that
/// the kernels never read while the lengths stay as they are.
fn widen_block_table(batch: &mut HostBatch, plan_len: u32) {
    let HostIndex::BlockTable { table, max_blocks_per_seq } = &mut batch.index else { return };
    let KvLayout::BlockTable { kernel_block_size, .. } = batch.problem.layout else { return };
    let width = (plan_len as usize).div_ceil(kernel_block_size).max(*max_blocks_per_seq);
    let rows = batch.seq_lens.len();
    let mut wide = Vec::with_capacity(rows * width);
    for row in 0..rows {
        let old = &table[row * *max_blocks_per_seq..(row + 1) * *max_blocks_per_seq];
        let filler = old.first().copied().unwrap_or(0);
        wide.extend_from_slice(old);
        wide.resize((row + 1) * width, filler);
    }
    *table = wide;
    *max_blocks_per_seq = width;
}

/// A bandwidth in GB/s as TB/s on a GPU's scale, as GB/s on a CPU's.
fn bandwidth(gbps: f64) -> String {
    if gbps >= 1e3 {
        format!("{:.2} TB/s", gbps / 1e3)
    } else {
        format!("{gbps:.1} GB/s")
    }
}

/// How a shape is planned: under each of `policies`, for its own lengths or
/// (`plan_seq_len`) for sequences that long.
#[derive(Clone, Copy)]
struct BenchPlan<'a> {
    policies: &'a [Policy],
    plan_seq_len: Option<u32>,
    with_lse: bool,
}

/// Generates, checks and times one shape under each policy, calling `emit` per row.
fn bench_shape(
    backend: &Backend,
    shape: &Shape,
    problem: &DecodeProblem,
    planned: BenchPlan<'_>,
    copy_gbps: f64,
    mut evictor: Option<&mut Evictor>,
    mut emit: impl FnMut(Row<'_>) -> CliResult<()>,
) -> CliResult<()> {
    let gpu = backend.name() != "cpu";
    let policies = planned.policies;
    let mut batch = HostBatch::random(problem, 0xBE7C);
    let plan_problem = match planned.plan_seq_len {
        None => problem.clone(),
        Some(plan_len) => {
            widen_block_table(&mut batch, plan_len);
            DecodeProblem::new(problem.shape, problem.dtypes, problem.layout, vec![plan_len; problem.num_seqs()])?
        }
    };
    let plans = policies.iter().map(|&policy| backend.plan(&plan_problem, policy)).collect::<Result<Vec<_>, _>>()?;
    let workspace_bytes = plans.iter().map(|p| p.workspace_bytes).max().unwrap_or(0);

    let shape_dims = problem.shape;
    // The first sequences whose reference fits the budget (at least one).
    let macs_per_token = 2 * (shape_dims.num_q_heads * shape_dims.head_dim) as u64;
    let mut macs = 0u64;
    let checked = shape
        .lens
        .iter()
        .take_while(|&&len| {
            macs += len.max(1) as u64 * macs_per_token;
            macs <= REFERENCE_BUDGET_MACS
        })
        .count()
        .max(1);
    let scale = shape_dims.default_scale();
    let (reference, reference_lse) = with_first_sequences(&mut batch, checked, |first| {
        decode_attn::reference::decode_reference_with_lse(first, scale)
    });
    let with_lse = planned.with_lse;

    // Copies of the pool to cycle over; copy 0 is the batch's own.
    let rotation = if gpu { KvRotation::GPU } else { CPU_ROTATION };
    let mut device = DeviceBatch::upload(backend, &batch, workspace_bytes, 0xFF)?;
    let extra_pools = DeviceBatch::upload_kv_copies(backend, &batch, &rotation)?;
    let copies = extra_pools.len() + 1;
    let passes = rotation.passes(copies);
    let calls = (copies * passes) as f64;
    drop(batch); // the KV pool may be gigabytes: keep only the device copies
    let poison = vec![0xFFu8; device.out.len_bytes()];
    let bytes = problem.kv_bytes() as f64 + (problem.q_bytes() + problem.out_bytes()) as f64;

    for (plan, &policy) in plans.iter().zip(policies) {
        // Check first, with the output poisoned so unwritten elements show as NaN.
        backend.upload(&mut device.out, &poison)?;
        if let Some(lse) = device.lse.as_mut().filter(|_| with_lse) {
            backend.upload(lse, &vec![0xFF; lse.len_bytes()])?;
        }
        backend.decode(plan, if with_lse { device.args_with_lse() } else { device.args() })?;
        let out = device.download_out(backend, problem.dtypes.out)?;
        let relerr = relative_error(&out[..reference.len()], &reference);
        let lse_err =
            with_lse.then(|| device.download_lse(backend)).transpose()?.map(|lse| lse_error(&lse, &reference_lse)); // zip: the checked rows only

        let target_us = if gpu { 200_000.0 } else { 400_000.0 };
        let warmup = if gpu { 5 } else { 1 };
        let time = |work: &mut dyn FnMut() -> decode_attn::Result<()>| -> CliResult<f64> {
            let estimate_us = backend.time_us(work, 1, 2)?;
            let reps = (target_us / estimate_us.max(1.0)).ceil().clamp(3.0, 1000.0) as usize;
            Ok(backend.time_us(work, warmup, reps)?)
        };
        let us = match evictor.as_deref_mut() {
            None => {
                time(&mut || device.decode_over_pools_after(backend, plan, &extra_pools, passes, with_lse, || Ok(())))?
                    / calls
            }
            Some(evictor) => {
                let both_us = time(&mut || {
                    device.decode_over_pools_after(backend, plan, &extra_pools, passes, with_lse, || {
                        evictor.decode(backend)
                    })
                })?;
                let alone_us = time(&mut || (0..copies * passes).try_for_each(|_| evictor.decode(backend)))?;
                if both_us <= alone_us {
                    return Err(format!(
                        "--cold: {calls} calls behind the evictor took {both_us:.1} us, the evictor alone \
                         {alone_us:.1} us: the call is below this clock's noise"
                    )
                    .into());
                }
                (both_us - alone_us) / calls
            }
        };
        let tbs = bytes / us / 1e6;
        emit(Row { shape, policy, plan, us, tbs, pct_copy: 100.0 * tbs * 1e3 / copy_gbps, relerr, lse_err, checked })?;
    }
    Ok(())
}

/// For a ragged batch whose split plan leaves (sequence, split) pairs empty:
/// how many are active and how many empty CTAs a plain grid would start per
/// active one, the figure a packed launch is chosen by (`cuda`'s `Packing`),
/// and on CUDA which launch ran.
fn sparse_grid_note(backend: &Backend, row: &Row<'_>) -> Option<String> {
    let pairs = row.plan.sparse_pairs().filter(|_| row.shape.ragged.is_some())?;
    Some(format!(
        "#   {}: {} of the {} x {} (sequence, split) pairs active; {:.1} empty per active one{}",
        row.policy,
        pairs.active,
        pairs.num_seqs,
        pairs.num_splits,
        pairs.empty_per_active(),
        launch_note(backend, row.plan)
    ))
}

/// Whether the CUDA backend launches `plan` packed (its active pairs only)
/// or as the plain grid: the choice `Packing::Auto` makes from the figure
/// above, printed so that a fit reads it rather than infers it from times.
#[cfg(feature = "cuda")]
fn launch_note(backend: &Backend, plan: &Plan) -> &'static str {
    match backend {
        Backend::Cuda(cuda) if cuda.packed_pairs_of(plan).is_some() => "; launched packed",
        Backend::Cuda(_) => "; launched as the plain grid",
        _ => "",
    }
}

#[cfg(not(feature = "cuda"))]
fn launch_note(_: &Backend, _: &Plan) -> &'static str {
    ""
}

fn format_row(backend: &Backend, row: &Row<'_>) -> String {
    let lse = row.lse_err.map(|err| format!(" lse_err {err:.1e}")).unwrap_or_default();
    format!(
        "{:16} {:>4} {:>6} {:8} {:20} {:>6} {:>10.2} {:>7.3} {:>6.1} {:>8.1e} {:>7}{lse}",
        row.shape.model.name,
        row.shape.batch(),
        row.shape.seq_len(),
        backend.name(),
        row.policy.to_string(),
        row.plan.num_splits,
        row.us,
        row.tbs,
        row.pct_copy,
        row.relerr,
        format!("{}/{}", row.checked, row.shape.batch())
    )
}

/// The peers' nine columns first (compare.py joins on them), then two of
/// ours that they lack: the plan's split count and a ragged batch's label.
const CSV_HEADER: &str = "model,B,s,peer,mode,us,tbs,pct_copy,relerr,splits,lens";

fn write_csv_row(file: &mut impl Write, mode_prefix: &str, row: &Row<'_>) -> CliResult<()> {
    writeln!(
        file,
        "{},{},{},decode-attn,{}/{},{:.2},{:.3},{:.1},{},{},{}",
        row.shape.model.name,
        row.shape.batch(),
        row.shape.seq_len(),
        mode_prefix,
        row.policy,
        row.us,
        row.tbs,
        row.pct_copy,
        python_exp(row.relerr),
        row.plan.num_splits,
        row.shape.ragged.as_deref().unwrap_or("")
    )?;
    file.flush()?;
    Ok(())
}

/// A ragged batch as runs of equal lengths: `32768x1+512x63`.
fn ragged_label(lens: &[u32]) -> String {
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for &len in lens {
        match runs.last_mut() {
            Some((last, count)) if *last == len => *count += 1,
            _ => runs.push((len, 1)),
        }
    }
    let terms: Vec<String> = runs.iter().map(|(len, count)| format!("{len}x{count}")).collect();
    let label = terms.join("+");
    if label.len() <= 60 {
        label
    } else {
        let (lo, hi) = (lens.iter().min().copied().unwrap_or(0), lens.iter().max().copied().unwrap_or(0));
        format!("{} lengths from {lo} to {hi}", lens.len())
    }
}

/// `x` as Python's `f"{x:.1e}"` writes it (`3.1e-03`), as the peers' CSV has it.
fn python_exp(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() { "nan".into() } else { "inf".into() };
    }
    let rust = format!("{x:.1e}"); // "3.1e-3"
    match rust.split_once('e') {
        Some((mantissa, exponent)) => {
            let exponent: i32 = exponent.parse().unwrap_or(0);
            let sign = if exponent < 0 { '-' } else { '+' };
            format!("{mantissa}e{sign}{:02}", exponent.abs())
        }
        None => rust,
    }
}

fn progress_bar(len: u64) -> ProgressBar {
    // Progress goes to stderr and only to a terminal: piped or CI output stays the table alone.
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {msg}") {
        bar.set_style(style);
    }
    bar
}

/// `--cold`'s unrelated call: an f32 decode of Llama-3-8B's shape, 8
/// sequences of 1024 tokens (64 MiB of KV, more than the H200's 60 MB L2),
/// split in two so that its last kernel is a reducer, which lets the next
/// kernel launch only as it exits. f32 runs on another kernel than f16 and
/// bf16 on the GPU backends, so its code displaces the timed kernel's.
struct Evictor {
    plan: Plan,
    device: DeviceBatch<decode_attn::Buffer>,
}

impl Evictor {
    fn new(backend: &Backend) -> CliResult<Self> {
        let problem = DecodeProblem::new(
            crate::models::MODELS[0].shape(),
            DTypes::uniform(DType::F32),
            KvLayout::block_table(16),
            vec![1024; 8],
        )?;
        let plan = backend.plan(&problem, Policy::Fixed { splits: 2 })?;
        let batch = HostBatch::random(&problem, 0xE71C);
        let device = DeviceBatch::upload(backend, &batch, plan.workspace_bytes, 0)?;
        Ok(Evictor { plan, device })
    }

    fn decode(&mut self, backend: &Backend) -> decode_attn::Result<()> {
        backend.decode(&self.plan, self.device.args())
    }

    fn describe(&self) -> String {
        let problem = &self.plan.problem;
        format!(
            "an f32 decode of {} sequences x {} tokens ({} MiB of KV, {} splits)",
            problem.num_seqs(),
            problem.max_seq_len(),
            problem.kv_bytes() / MIB as u64,
            self.plan.num_splits
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The footprint's pool and index are what [`HostBatch::random`] (and
    /// the widening) allocate, for both layouts and ragged lengths.
    #[test]
    fn the_footprint_counts_the_pool_and_index_the_batch_allocates() {
        let shape = MODELS[1].shape();
        for layout in [
            KvLayout::block_table(16),
            KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 64 },
            KvLayout::token_indices(1),
            KvLayout::token_indices(16),
        ] {
            for (lens, plan_len) in [(vec![1, 17, 0, 300], None), (vec![5; 9], None), (vec![40, 1], Some(1000))] {
                let problem = DecodeProblem::new(shape, DTypes::uniform(DType::Bf16), layout, lens.clone()).unwrap();
                let plan_len = plan_len.filter(|_| matches!(layout, KvLayout::BlockTable { .. }));
                let footprint = Footprint::of(&problem, plan_len, None);
                let mut batch = HostBatch::random(&problem, 1);
                if let Some(plan_len) = plan_len {
                    widen_block_table(&mut batch, plan_len);
                }
                let index = match &batch.index {
                    HostIndex::BlockTable { table, .. } => table.len(),
                    HostIndex::TokenIndices { indptr, indices } => indptr.len() + indices.len(),
                };
                let at = format!("{layout} {lens:?} {plan_len:?}");
                assert_eq!(footprint.pool, (batch.k_cache.len() + batch.v_cache.len()) as u128, "{at}");
                assert_eq!(footprint.index, 4 * index as u128, "{at}");
                assert_eq!(footprint.blocks * footprint.block_slots as u128, batch.num_slots as u128, "{at}");
            }
        }
    }

    /// Every shape the peers' grid does not skip fits, in every dtype, on a
    /// GPU and on the CPU; 2^20 one-token sequences do not.
    #[test]
    fn the_host_limit_takes_the_peers_grid_and_refuses_a_pool_of_short_sequences() {
        for model in &MODELS[..2] {
            for dtype in [DType::Bf16, DType::F16, DType::F32] {
                for (batch, seq_len) in Grid::Peers
                    .batches()
                    .into_iter()
                    .flat_map(|b| Grid::Peers.seq_lens().into_iter().map(move |s| (b, s)))
                {
                    let problem = DecodeProblem::new(
                        model.shape(),
                        DTypes::uniform(dtype),
                        KvLayout::block_table(16),
                        vec![seq_len; batch],
                    )
                    .unwrap();
                    if problem.kv_bytes() > MAX_KV_BYTES {
                        continue;
                    }
                    for rotation in [None, Some(&CPU_ROTATION)] {
                        let footprint = Footprint::of(&problem, None, rotation);
                        assert!(
                            footprint.total <= MAX_HOST_BYTES as u128,
                            "{} {dtype} B={batch} s={seq_len} cpu={}: {footprint}",
                            model.name,
                            rotation.is_some()
                        );
                    }
                }
            }
        }
        let ones = DecodeProblem::new(
            MODELS[0].shape(),
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![1; crate::args::MAX_BATCH],
        )
        .unwrap();
        assert!(ones.kv_bytes() <= MAX_KV_BYTES);
        let footprint = Footprint::of(&ones, None, None);
        assert_eq!((footprint.blocks, footprint.pool), (1310721, 1310721 * 16 * 2 * 2048));
        assert!(footprint.total > MAX_HOST_BYTES as u128, "{footprint}");
    }

    #[test]
    fn ragged_batches_are_labelled_by_runs() {
        assert_eq!(ragged_label(&[32768, 512, 512]), "32768x1+512x2");
        let spread: Vec<u32> = (0..64).map(|i| 128 + 100 * i).collect();
        assert_eq!(ragged_label(&spread), "64 lengths from 128 to 6428");
    }

    #[test]
    fn relerr_is_written_like_python() {
        assert_eq!(python_exp(0.0031), "3.1e-03");
        assert_eq!(python_exp(0.0), "0.0e+00");
        assert_eq!(python_exp(12.0), "1.2e+01");
        assert_eq!(python_exp(f64::INFINITY), "inf");
    }
}

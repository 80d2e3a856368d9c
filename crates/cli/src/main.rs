//! `decode-attn`: plan, benchmark and check decode attention from the shell.
//!
//! * `plan`: what the planner decides for a model and batch, with the arithmetic.
//! * `bench`: microseconds, TB/s and % of copy bandwidth per shape, checked
//!   against the reference first; `--csv` writes the peers' columns.
//! * `check`: the conformance sweep of one backend against the f64 reference.
//! * `devices`: every backend, usable or why not.

// The doc comments on clap's argument structs are the `--help` text, written
// for a shell (`cuda[:N]`), not rustdoc links; escaping the brackets would
// print the backslashes in `--help`.
#![allow(rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use decode_attn::{
    AttentionShape, Backend, BackendOptions, BackendSpec, DType, DTypes, DecodeProblem, DeviceProps, KvLayout, Policy,
};
use decode_attn_conformance::{Summary, Sweep};

use crate::args::{parse_backend, parse_batch, parse_dtype, parse_layout, parse_policy};
use crate::models::{parse_model, Model};

type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

/// `println!` for this program's output. A closed pipe (`decode-attn plan | head`)
/// ends the program quietly, as it ends other Unix tools, instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_stdout_line(format_args!($($arg)*))
    };
}

mod args;
mod bench;
mod models;

pub(crate) fn write_stdout_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout.write_fmt(line).and_then(|()| stdout.write_all(b"\n")) {
        if err.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {err}");
        }
        std::process::exit(if err.kind() == std::io::ErrorKind::BrokenPipe { 0 } else { 1 });
    }
}

#[derive(Parser)]
#[command(name = "decode-attn", version, about = "Decode attention over a paged KV cache: plan, bench, check")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show how a decode call is cut up (grid, splits, scratch) and why.
    ///
    /// Planned for an H100/H200-class GPU with the tensor-core kernel's
    /// figures, without a device. On a GPU the library plans each problem
    /// with the figures of the kernel that runs it: problems that go to the
    /// CUDA stream kernel (f32, head_dim 192) get more splits there than
    /// shown here (head_dim 256 is planned here as the GPU plans it, with
    /// one tensor-core CTA per multiprocessor).
    Plan(PlanArgs),
    /// Time decode per shape against copy bandwidth, after checking each result.
    Bench(bench::BenchArgs),
    /// Run the conformance sweep of a backend against the f64 reference.
    Check(CheckArgs),
    /// List the backends: available, or why not.
    Devices,
}

#[derive(Args)]
struct PlanArgs {
    /// A model's per-GPU attention shape (llama3-8b, llama3-70b-tp8, qwen2-7b, ...).
    #[arg(long, value_parser = parse_model, conflicts_with_all = ["heads", "kv_heads", "head_dim"])]
    model: Option<Model>,
    /// Query heads (instead of --model).
    #[arg(long, requires_all = ["kv_heads", "head_dim"])]
    heads: Option<usize>,
    /// KV heads (instead of --model).
    #[arg(long, requires = "heads")]
    kv_heads: Option<usize>,
    /// Head dim (instead of --model).
    #[arg(long, requires = "heads")]
    head_dim: Option<usize>,
    /// Sequences in the batch (default: 1, or the number of --seq-len values; at most 1048576).
    #[arg(long, value_parser = parse_batch)]
    batch: Option<usize>,
    /// One length for every sequence, or one per sequence: 4096 or 0,1,17,4096.
    #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
    seq_len: Vec<u32>,
    /// Multiprocessors of the GPU planned for (132: H100/H200 SXM).
    #[arg(long, default_value_t = 132)]
    sms: u32,
    /// Streaming bandwidth of the GPU planned for, GB/s (default: what the
    /// CUDA backend derives on an H200, 4320). As the CUDA backend does,
    /// `auto` plans with no less than that: a slower GPU (an H100 SXM, about
    /// 3020) gets the H200's plans, which were faster there; a faster one is
    /// split by its own figure.
    #[arg(long, value_parser = parse_gbps)]
    gbps: Option<f64>,
    /// auto | vllm | vllm:batch-invariant | sglang[:N] | fixed:N | deterministic:TILE
    #[arg(long, default_value = "auto", value_parser = parse_policy)]
    policy: Policy,
    /// Element type of Q, the KV cache and the output: bf16, f16 or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    dtype: DType,
    /// block:16 | block:16/64 (kernel block / allocator block) | tokens:1 (page size)
    #[arg(long, default_value = "block:16", value_parser = parse_layout)]
    layout: KvLayout,
    /// Print the plan as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CheckArgs {
    /// auto | cpu | cuda[:N] | hip[:N] (default: $DECODE_ATTN_BACKEND, else auto)
    #[arg(long, value_parser = parse_backend)]
    backend: Option<BackendSpec>,
    /// Run the quick sweep (every dimension once, short sequences) instead of the full one.
    #[arg(long)]
    quick: bool,
    /// Only cases whose description contains this text (e.g. "token-indices", "f16", "sglang").
    #[arg(long)]
    filter: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Plan(args) => plan(args),
        Command::Bench(args) => bench::run(args),
        Command::Check(args) => check(args),
        Command::Devices => devices(),
    };
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn plan(args: PlanArgs) -> CliResult<ExitCode> {
    let shape = match (args.model, args.heads, args.kv_heads, args.head_dim) {
        (Some(model), ..) => model.shape(),
        (None, Some(heads), Some(kv_heads), Some(head_dim)) => AttentionShape::new(heads, kv_heads, head_dim)?,
        _ => return Err("give --model NAME, or all of --heads, --kv-heads and --head-dim".into()),
    };
    let seq_lens = match (args.seq_len.as_slice(), args.batch) {
        ([len], batch) => vec![*len; batch.unwrap_or(1)],
        (lens, None) => lens.to_vec(),
        (lens, Some(batch)) if batch == lens.len() => lens.to_vec(),
        (lens, Some(batch)) => {
            return Err(
                format!("--batch {batch} but --seq-len lists {} lengths; give one length or B", lens.len()).into()
            )
        }
    };
    if seq_lens.is_empty() {
        return Err("--batch must be at least 1".into());
    }
    let problem = DecodeProblem::new(shape, DTypes::uniform(args.dtype), args.layout, seq_lens)?;
    let gpu = DeviceProps::gpu_like_for(args.sms, &problem);
    // As the CUDA backend plans a device that derives `gbps`.
    let device = DeviceProps {
        mem_bandwidth_gbps: decode_attn::gpu_plan_gbps(args.gbps.unwrap_or(gpu.mem_bandwidth_gbps)),
        ..gpu
    };
    let plan = decode_attn::plan(&problem, args.policy, &device)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        outln!("{plan}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--gbps`: a positive, finite number.
fn parse_gbps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(gbps) if gbps.is_finite() && gbps > 0.0 => Ok(gbps),
        _ => Err(format!("{text:?} is not a positive number of GB/s")),
    }
}

fn check(args: CheckArgs) -> CliResult<ExitCode> {
    let backend = open_backend(args.backend)?;
    let sweep = if args.quick { Sweep::Quick } else { Sweep::Full };
    outln!("checking {} against the f64 reference ({sweep:?} sweep)", backend.describe());
    let mut summary = Summary::default();
    let cases = decode_attn_conformance::cases(sweep);
    let selected: Vec<_> =
        cases.iter().filter(|case| args.filter.as_deref().is_none_or(|text| case.to_string().contains(text))).collect();
    if selected.is_empty() {
        return Err(format!("no case matches --filter {:?}", args.filter.unwrap_or_default()).into());
    }
    for case in selected {
        let result = decode_attn_conformance::run_case(&backend, case);
        summary.record(&result);
        outln!("{}", decode_attn_conformance::describe(case, &result));
    }
    if args.filter.is_none() {
        for layout in [KvLayout::block_table(16), KvLayout::token_indices(1)] {
            let name = format!("deterministic:64 is batch invariant, {layout}");
            match decode_attn_conformance::check_batch_invariance(&backend, layout) {
                Ok(0) => record_property(&mut summary, true, &name, "bitwise equal alone and in a batch"),
                Ok(n) => record_property(&mut summary, false, &name, &format!("{n} elements differ")),
                Err(err) => record_property(&mut summary, false, &name, &err.to_string()),
            }
        }
        let name = "misuse is an error, not a crash";
        match decode_attn_conformance::check_rejects_misuse(&backend) {
            Ok(accepted) if accepted.is_empty() => record_property(&mut summary, true, name, "all rejected"),
            Ok(accepted) => record_property(&mut summary, false, name, &format!("accepted {}", accepted.join("; "))),
            Err(err) => record_property(&mut summary, false, name, &err.to_string()),
        }
    }
    outln!("{summary}");
    Ok(if summary.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn record_property(summary: &mut Summary, passed: bool, name: &str, detail: &str) {
    if passed {
        summary.passed += 1;
    } else {
        summary.failed += 1;
    }
    outln!("{}  {name}: {detail}", if passed { "PASS" } else { "FAIL" });
}

fn devices() -> CliResult<ExitCode> {
    let options = BackendOptions::from_env()?;
    let reports = decode_attn::probe_with(&options);
    let width = reports.iter().map(|r| r.name.len()).max().unwrap_or(4);
    for report in &reports {
        let state = if report.available { "available" } else { "absent   " };
        outln!("{:width$}  {state}  {}", report.name, report.detail);
    }
    let (chosen, _) = Backend::auto_with_reasons(&options);
    outln!("auto picks {}", chosen.describe());
    Ok(ExitCode::SUCCESS)
}

/// Opens `spec`, else the one `DECODE_ATTN_BACKEND` names, else the first that
/// works; GPU options (kernel source, NVRTC cache) come from the environment.
/// For `auto`, says on stderr which GPU backends it passed over and why.
pub(crate) fn open_backend(spec: Option<BackendSpec>) -> CliResult<Backend> {
    let spec = match spec {
        Some(spec) => spec,
        None => BackendSpec::from_env()?,
    };
    let options = BackendOptions::from_env()?;
    if spec != BackendSpec::Auto {
        return Ok(Backend::open_with(spec, &options)?);
    }
    let (backend, passed_over) = Backend::auto_with_reasons(&options);
    for reason in passed_over {
        eprintln!("note: auto passed over {reason}");
    }
    Ok(backend)
}

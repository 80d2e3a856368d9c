//! decode-attn: FlashDecoding-class decode attention over a paged KV cache,
//! on NVIDIA (CUDA) and AMD (HIP) GPUs and on the CPU, from one binary.
//!
//! This crate is the one import users need: it re-exports the types, the
//! planner and the [`DecodeAttention`] trait of `decode-attn-core`, and adds
//! [`Backend`], which picks a device at run time.
//!
//! ```no_run
//! use decode_attn::synth::HostBatch;
//! use decode_attn::{AttentionShape, Backend, DType, DTypes, DecodeAttention, DecodeProblem, KvLayout, Policy};
//!
//! # fn main() -> decode_attn::Result<()> {
//! let backend = Backend::from_env()?; // DECODE_ATTN_BACKEND, else CUDA, then HIP, then the CPU
//! let shape = AttentionShape::new(32, 8, 128)?; // Llama-3-8B: 32 query heads, 8 KV heads
//! let problem =
//!     DecodeProblem::new(shape, DTypes::uniform(DType::Bf16), KvLayout::block_table(16), vec![4096, 1000])?;
//! let plan = backend.plan(&problem, Policy::Auto)?;
//! println!("{plan}"); // the grid, the split counts and why
//! let batch = HostBatch::random(&problem, 0);
//! let outputs = decode_attn::decode_host_batch(&backend, &plan, &batch)?; // upload, decode, download
//! # let _ = outputs;
//! # Ok(())
//! # }
//! ```
//!
//! # Backends
//!
//! The CPU backend is always compiled in. The `cuda` and `hip` features (both
//! on by default) add the GPU backends; their vendor libraries are loaded with
//! dlopen when probed, so a missing driver is an [`Error::Unavailable`] value
//! with the reason, never a panic or a link error. [`Backend::auto`] takes the
//! first of CUDA, HIP and the CPU that works; [`Backend::from_env`] honours
//! `DECODE_ATTN_BACKEND` first. [`probe`] says, for each backend, whether it
//! is usable here and if not why.

use std::fmt;
use std::str::FromStr;

pub use decode_attn_core::*;
/// The CPU backend, and the f64 reference every backend is checked against.
pub use decode_attn_cpu::{reference, CpuBackend, CpuBuffer};
#[cfg(feature = "cuda")]
pub use decode_attn_cuda::{CUstream, CallerStream, CudaBackend, CudaBuffer, CudaOptions, DecodeKernel, KernelSource};
#[cfg(feature = "hip")]
pub use decode_attn_hip::{HipBackend, HipBuffer, HipOptions, KernelSource as HipKernelSource};

/// The environment variable [`Backend::from_env`] reads:
/// `cpu`, `cuda`, `hip`, `cuda:N`, `hip:N` or `auto`.
///
/// It is the only environment variable this crate reads, and only
/// [`Backend::from_env`] reads it.
pub const BACKEND_ENV: &str = "DECODE_ATTN_BACKEND";

/// Which backend to open: the parsed form of `auto`, `cpu`, `cuda[:N]`, `hip[:N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendSpec {
    /// The first of CUDA, HIP and the CPU that works on this machine.
    #[default]
    Auto,
    Cpu,
    Cuda {
        ordinal: usize,
    },
    Hip {
        ordinal: usize,
    },
}

impl FromStr for BackendSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let invalid = |why: &str| Error::Device {
            backend: "decode-attn",
            message: format!("invalid backend {text:?}: {why} (expected auto, cpu, cuda, cuda:N, hip or hip:N)"),
        };
        let trimmed = text.trim().to_ascii_lowercase();
        let (name, ordinal) = match trimmed.split_once(':') {
            Some((name, ordinal)) => {
                let ordinal =
                    ordinal.parse::<usize>().map_err(|_| invalid("the device ordinal must be a whole number"))?;
                (name, Some(ordinal))
            }
            None => (trimmed.as_str(), None),
        };
        match (name, ordinal) {
            ("auto", None) => Ok(BackendSpec::Auto),
            ("cpu", None) => Ok(BackendSpec::Cpu),
            ("cuda", ordinal) => Ok(BackendSpec::Cuda { ordinal: ordinal.unwrap_or(0) }),
            ("hip", ordinal) => Ok(BackendSpec::Hip { ordinal: ordinal.unwrap_or(0) }),
            ("auto" | "cpu", Some(_)) => Err(invalid("only cuda and hip take a device ordinal")),
            _ => Err(invalid("unknown backend name")),
        }
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendSpec::Auto => f.write_str("auto"),
            BackendSpec::Cpu => f.write_str("cpu"),
            BackendSpec::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
            BackendSpec::Hip { ordinal } => write!(f, "hip:{ordinal}"),
        }
    }
}

/// One device of any compiled-in kind.
pub enum Backend {
    Cpu(CpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(CudaBackend),
    #[cfg(feature = "hip")]
    Hip(HipBackend),
}

/// Memory of one [`Backend`]; a buffer only works with the backend kind that allocated it.
pub enum Buffer {
    Cpu(CpuBuffer),
    #[cfg(feature = "cuda")]
    Cuda(CudaBuffer),
    #[cfg(feature = "hip")]
    Hip(HipBuffer),
}

impl Buffer {
    /// Name of the backend kind that owns this buffer: "cpu", "cuda" or "hip".
    pub fn backend_name(&self) -> &'static str {
        match self {
            Buffer::Cpu(_) => "cpu",
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => "cuda",
            #[cfg(feature = "hip")]
            Buffer::Hip(_) => "hip",
        }
    }
}

impl DeviceBuffer for Buffer {
    fn len_bytes(&self) -> usize {
        match self {
            Buffer::Cpu(b) => b.len_bytes(),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(b) => b.len_bytes(),
            #[cfg(feature = "hip")]
            Buffer::Hip(b) => b.len_bytes(),
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_unavailable_in_this_build() -> Error {
    Error::Unavailable { backend: "cuda", reason: "this build of decode-attn has the `cuda` feature off".into() }
}

#[cfg(not(feature = "hip"))]
fn hip_unavailable_in_this_build() -> Error {
    Error::Unavailable { backend: "hip", reason: "this build of decode-attn has the `hip` feature off".into() }
}

/// How GPU backends are opened: where their kernels come from (embedded
/// ahead-of-time code, or the run-time compiler, NVRTC / hiprtc) and where
/// run-time compiled kernels are cached. The default reads nothing from the
/// environment and caches nothing on disk; [`BackendOptions::from_env`] is
/// what the `decode-attn` command uses.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct BackendOptions {
    #[cfg(feature = "cuda")]
    pub cuda: decode_attn_cuda::CudaOptions,
    #[cfg(feature = "hip")]
    pub hip: decode_attn_hip::HipOptions,
}

impl BackendOptions {
    /// Options from the vendor crates' documented variables:
    /// `DECODE_ATTN_CUDA_KERNELS=auto|embedded|nvrtc`,
    /// `DECODE_ATTN_HIP_KERNELS=auto|embedded|hiprtc` and the cache folder of
    /// run-time compiled kernels (`DECODE_ATTN_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/decode-attn`, else `~/.cache/decode-attn`).
    pub fn from_env() -> Result<BackendOptions> {
        Ok(BackendOptions {
            #[cfg(feature = "cuda")]
            cuda: decode_attn_cuda::CudaOptions::from_env()?,
            #[cfg(feature = "hip")]
            hip: decode_attn_hip::HipOptions::from_env()?,
        })
    }
}

impl BackendSpec {
    /// The spec in `DECODE_ATTN_BACKEND` ([`BACKEND_ENV`]); `Auto` when it is unset or empty.
    pub fn from_env() -> Result<BackendSpec> {
        match std::env::var(BACKEND_ENV) {
            Ok(value) if !value.trim().is_empty() => value.parse().map_err(|err| match err {
                Error::Device { backend, message } => {
                    Error::Device { backend, message: format!("{message} (from {BACKEND_ENV})") }
                }
                other => other,
            }),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(BackendSpec::Auto),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::Device { backend: "decode-attn", message: format!("{BACKEND_ENV} is not valid UTF-8") })
            }
        }
    }
}

impl Backend {
    /// The CPU backend (always available).
    pub fn cpu() -> Backend {
        Backend::Cpu(CpuBackend::new())
    }

    /// CUDA device `ordinal` with default options, or why it cannot be used.
    pub fn cuda(ordinal: usize) -> Result<Backend> {
        Backend::cuda_with(ordinal, &BackendOptions::default())
    }

    /// HIP device `ordinal` with default options, or why it cannot be used.
    pub fn hip(ordinal: usize) -> Result<Backend> {
        Backend::hip_with(ordinal, &BackendOptions::default())
    }

    fn cuda_with(ordinal: usize, options: &BackendOptions) -> Result<Backend> {
        #[cfg(feature = "cuda")]
        {
            CudaBackend::with_options(ordinal, options.cuda.clone()).map(Backend::Cuda)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (ordinal, options);
            Err(cuda_unavailable_in_this_build())
        }
    }

    fn hip_with(ordinal: usize, options: &BackendOptions) -> Result<Backend> {
        #[cfg(feature = "hip")]
        {
            HipBackend::with_options(ordinal, options.hip.clone()).map(Backend::Hip)
        }
        #[cfg(not(feature = "hip"))]
        {
            let _ = (ordinal, options);
            Err(hip_unavailable_in_this_build())
        }
    }

    /// The first of CUDA device 0, HIP device 0 and the CPU that works here.
    pub fn auto() -> Backend {
        Backend::auto_with_reasons(&BackendOptions::default()).0
    }

    /// Like [`Backend::auto`] with `options`, and also why each GPU backend
    /// tried before the chosen one was passed over.
    pub fn auto_with_reasons(options: &BackendOptions) -> (Backend, Vec<Error>) {
        let mut passed_over = Vec::new();
        for open in [Backend::cuda_with, Backend::hip_with] {
            match open(0, options) {
                Ok(backend) => return (backend, passed_over),
                Err(err) => passed_over.push(err),
            }
        }
        (Backend::cpu(), passed_over)
    }

    /// Opens the backend `spec` names, with default options. An explicit GPU
    /// that is not usable is an error, not a silent fall-back to the CPU.
    pub fn open(spec: BackendSpec) -> Result<Backend> {
        Backend::open_with(spec, &BackendOptions::default())
    }

    /// Opens the backend `spec` names, with `options`.
    pub fn open_with(spec: BackendSpec, options: &BackendOptions) -> Result<Backend> {
        match spec {
            BackendSpec::Auto => Ok(Backend::auto_with_reasons(options).0),
            BackendSpec::Cpu => Ok(Backend::cpu()),
            BackendSpec::Cuda { ordinal } => Backend::cuda_with(ordinal, options),
            BackendSpec::Hip { ordinal } => Backend::hip_with(ordinal, options),
        }
    }

    /// Opens `"auto"`, `"cpu"`, `"cuda"`, `"cuda:1"`, `"hip"`, `"hip:0"`, with default options.
    pub fn from_spec(spec: &str) -> Result<Backend> {
        Backend::open(spec.parse()?)
    }

    /// Opens the backend named by `DECODE_ATTN_BACKEND` ([`BACKEND_ENV`]:
    /// `cpu`, `cuda`, `hip`, `cuda:N`, `hip:N`, `auto`), or the first that works
    /// ([`Backend::auto`]) when it is unset or empty, with
    /// [`BackendOptions::from_env`]. A value that does not parse, or names an
    /// unusable GPU, is an error.
    ///
    /// This and the other `from_env` functions are the only places where
    /// decode-attn reads the environment.
    pub fn from_env() -> Result<Backend> {
        Backend::open_with(BackendSpec::from_env()?, &BackendOptions::from_env()?)
    }

    /// A one-line description: backend, device name and multiprocessor count.
    pub fn describe(&self) -> String {
        let props = self.device_props();
        format!("{}: {} ({} multiprocessors)", self.name(), props.name, props.num_sms)
    }
}

/// Whether one backend (or one device of it) can be used here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendReport {
    /// "cpu", "cuda:0", "hip" ...: a device when one was found, else the backend.
    pub name: String,
    pub available: bool,
    /// The device when available; why not, in the vendor's words, when not.
    pub detail: String,
}

type DeviceCounter = fn() -> Result<usize>;
type BackendOpener = fn(usize, &BackendOptions) -> Result<Backend>;

/// Probes every backend, including those compiled out, for `decode-attn devices`.
/// Opens each device found, so an entry marked available really is usable.
pub fn probe() -> Vec<BackendReport> {
    probe_with(&BackendOptions::default())
}

/// [`probe`], opening GPU devices with `options`.
pub fn probe_with(options: &BackendOptions) -> Vec<BackendReport> {
    let mut reports = Vec::new();
    let cpu = Backend::cpu();
    reports.push(BackendReport { name: "cpu".into(), available: true, detail: describe_props(cpu.device_props()) });
    let gpu_backends: [(&str, DeviceCounter, BackendOpener); 2] =
        [("cuda", cuda_device_count, Backend::cuda_with), ("hip", hip_device_count, Backend::hip_with)];
    for (name, count, open) in gpu_backends {
        match count() {
            Ok(0) => reports.push(BackendReport {
                name: name.into(),
                available: false,
                detail: "the runtime loaded but reports no devices".into(),
            }),
            Ok(count) => {
                for ordinal in 0..count {
                    let (available, detail) = match open(ordinal, options) {
                        Ok(backend) => (true, describe_props(backend.device_props())),
                        Err(err) => (false, err.to_string()),
                    };
                    reports.push(BackendReport { name: format!("{name}:{ordinal}"), available, detail });
                }
            }
            Err(err) => reports.push(BackendReport { name: name.into(), available: false, detail: err.to_string() }),
        }
    }
    reports
}

/// One line for `devices`. The bandwidth is the figure `auto` plans with, not a
/// measurement: on a CUDA GPU slower than an H200 it is the H200's
/// ([`crate::gpu_plan_gbps`]), so an H100 reads 4320, not its ~3000.
fn describe_props(props: &DeviceProps) -> String {
    format!("{}, {} multiprocessors, plans at ~{:.0} GB/s", props.name, props.num_sms, props.mem_bandwidth_gbps)
}

fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        decode_attn_cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(cuda_unavailable_in_this_build())
    }
}

fn hip_device_count() -> Result<usize> {
    #[cfg(feature = "hip")]
    {
        decode_attn_hip::device_count()
    }
    #[cfg(not(feature = "hip"))]
    {
        Err(hip_unavailable_in_this_build())
    }
}

/// The error for a buffer of one backend kind handed to another.
fn wrong_backend(backend: &'static str, buffer: &'static str, owner: &'static str) -> Error {
    Error::Device {
        backend,
        message: format!(
            "buffer `{buffer}` was allocated by the {owner} backend; every buffer of a call must come from this \
             {backend} backend's alloc"
        ),
    }
}

/// A concrete backend's buffer type, taken out of a [`Buffer`] when it is that kind.
trait Narrow: Sized {
    const BACKEND: &'static str;
    fn narrow<'a>(buffer: &'a Buffer, name: &'static str) -> Result<&'a Self>;
    fn narrow_mut<'a>(buffer: &'a mut Buffer, name: &'static str) -> Result<&'a mut Self>;
}

macro_rules! impl_narrow {
    ($ty:ty, $variant:ident, $backend:literal) => {
        impl Narrow for $ty {
            const BACKEND: &'static str = $backend;
            #[allow(unreachable_patterns)] // with one backend compiled in, the fall-back arm is dead
            fn narrow<'a>(buffer: &'a Buffer, name: &'static str) -> Result<&'a Self> {
                match buffer {
                    Buffer::$variant(inner) => Ok(inner),
                    other => Err(wrong_backend(Self::BACKEND, name, other.backend_name())),
                }
            }
            #[allow(unreachable_patterns)]
            fn narrow_mut<'a>(buffer: &'a mut Buffer, name: &'static str) -> Result<&'a mut Self> {
                match buffer {
                    Buffer::$variant(inner) => Ok(inner),
                    other => Err(wrong_backend(Self::BACKEND, name, other.backend_name())),
                }
            }
        }
    };
}

impl_narrow!(CpuBuffer, Cpu, "cpu");
#[cfg(feature = "cuda")]
impl_narrow!(CudaBuffer, Cuda, "cuda");
#[cfg(feature = "hip")]
impl_narrow!(HipBuffer, Hip, "hip");

fn narrow_decode_args<'a, T: Narrow>(args: DecodeArgs<'a, Buffer>) -> Result<DecodeArgs<'a, T>> {
    let DecodeArgs { q, k_cache, v_cache, seq_lens, kv_index, workspace, out, lse, softmax_scale } = args;
    Ok(DecodeArgs {
        q: T::narrow(q, "q")?,
        k_cache: T::narrow(k_cache, "k_cache")?,
        v_cache: T::narrow(v_cache, "v_cache")?,
        seq_lens: T::narrow(seq_lens, "seq_lens")?,
        kv_index: match kv_index {
            KvIndexBuffers::BlockTable { table, max_blocks_per_seq } => {
                KvIndexBuffers::BlockTable { table: T::narrow(table, "block_table")?, max_blocks_per_seq }
            }
            KvIndexBuffers::TokenIndices { indptr, indices } => KvIndexBuffers::TokenIndices {
                indptr: T::narrow(indptr, "kv_indptr")?,
                indices: T::narrow(indices, "kv_indices")?,
            },
        },
        workspace: T::narrow_mut(workspace, "workspace")?,
        out: T::narrow_mut(out, "out")?,
        lse: match lse {
            Some(lse) => Some(T::narrow_mut(lse, "lse")?),
            None => None,
        },
        softmax_scale,
    })
}

fn narrow_merge_args<'a, T: Narrow>(args: MergeArgs<'a, Buffer>) -> Result<MergeArgs<'a, T>> {
    let MergeArgs { num_tokens, num_heads, head_dim, dtype, prefix, prefix_lse, suffix, suffix_lse, out, out_lse } =
        args;
    Ok(MergeArgs {
        num_tokens,
        num_heads,
        head_dim,
        dtype,
        prefix: T::narrow(prefix, "prefix")?,
        prefix_lse: T::narrow(prefix_lse, "prefix_lse")?,
        suffix: T::narrow(suffix, "suffix")?,
        suffix_lse: T::narrow(suffix_lse, "suffix_lse")?,
        out: T::narrow_mut(out, "out")?,
        out_lse: match out_lse {
            Some(lse) => Some(T::narrow_mut(lse, "out_lse")?),
            None => None,
        },
    })
}

/// Runs `$body` with `$inner` bound to the concrete backend inside `$backend`.
macro_rules! dispatch {
    ($backend:expr, $inner:ident => $body:expr) => {
        match $backend {
            Backend::Cpu($inner) => $body,
            #[cfg(feature = "cuda")]
            Backend::Cuda($inner) => $body,
            #[cfg(feature = "hip")]
            Backend::Hip($inner) => $body,
        }
    };
}

impl DecodeAttention for Backend {
    type Buffer = Buffer;

    fn name(&self) -> &'static str {
        dispatch!(self, inner => inner.name())
    }

    fn device_props(&self) -> &DeviceProps {
        dispatch!(self, inner => inner.device_props())
    }

    fn supports(&self, problem: &DecodeProblem) -> Result<()> {
        dispatch!(self, inner => inner.supports(problem))
    }

    fn alloc(&self, bytes: usize) -> Result<Buffer> {
        match self {
            Backend::Cpu(inner) => inner.alloc(bytes).map(Buffer::Cpu),
            #[cfg(feature = "cuda")]
            Backend::Cuda(inner) => inner.alloc(bytes).map(Buffer::Cuda),
            #[cfg(feature = "hip")]
            Backend::Hip(inner) => inner.alloc(bytes).map(Buffer::Hip),
        }
    }

    fn upload(&self, dst: &mut Buffer, src: &[u8]) -> Result<()> {
        dispatch!(self, inner => inner.upload(Narrow::narrow_mut(dst, "dst")?, src))
    }

    fn download(&self, src: &Buffer, dst: &mut [u8]) -> Result<()> {
        dispatch!(self, inner => inner.download(Narrow::narrow(src, "src")?, dst))
    }

    fn decode(&self, plan: &Plan, args: DecodeArgs<'_, Buffer>) -> Result<()> {
        dispatch!(self, inner => inner.decode(plan, narrow_decode_args(args)?))
    }

    fn merge_attn_states(&self, args: MergeArgs<'_, Buffer>) -> Result<()> {
        dispatch!(self, inner => inner.merge_attn_states(narrow_merge_args(args)?))
    }

    fn synchronize(&self) -> Result<()> {
        dispatch!(self, inner => inner.synchronize())
    }

    fn time_us(&self, work: &mut dyn FnMut() -> Result<()>, warmup: usize, reps: usize) -> Result<f64> {
        dispatch!(self, inner => inner.time_us(work, warmup, reps))
    }

    fn copy_bandwidth_gbps(&self, bytes: usize) -> Result<f64> {
        dispatch!(self, inner => inner.copy_bandwidth_gbps(bytes))
    }

    fn plan(&self, problem: &DecodeProblem, policy: Policy) -> Result<Plan> {
        dispatch!(self, inner => inner.plan(problem, policy))
    }
}

/// How a timed run cycles over copies of a batch's KV pool so that no cache
/// holds what a call reads: enough pools (the batch's own included) to hold
/// `bytes` together, at least `min_copies` and at most `max_copies` of them,
/// cycled over again until one timed pass makes `min_calls` calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvRotation {
    pub bytes: usize,
    pub min_copies: usize,
    pub max_copies: usize,
    pub min_calls: usize,
}

impl KvRotation {
    /// On a GPU: 512 MiB (`bench_peers.py`'s L2 flush, far more than a 60 MB
    /// L2), 2 to 64 pools (two, so that a call never follows a call over the
    /// same pool, whose last tiles L2 may still hold; `bench_peers.py` caps at
    /// 64 too), and at least 8 calls per graph, so that a large pool's calls
    /// do not each carry the gap between two graph launches (the peers'
    /// harness puts hundreds of calls in one graph; an engine captures
    /// attention inside its whole forward pass).
    pub const GPU: KvRotation = KvRotation { bytes: 512 << 20, min_copies: 2, max_copies: 64, min_calls: 8 };

    /// A host rotation of `bytes` over at most `max_copies` pools, one pass.
    pub const fn host(bytes: usize, max_copies: usize) -> KvRotation {
        KvRotation { bytes, min_copies: 1, max_copies, min_calls: 1 }
    }

    /// Pools, the batch's own included, for a pool of `pool_bytes` (at least one).
    pub fn copies(&self, pool_bytes: usize) -> usize {
        self.bytes.div_ceil(pool_bytes.max(1)).max(self.min_copies).min(self.max_copies).max(1)
    }

    /// Passes over `copies` pools in one timed run (at least one).
    pub fn passes(&self, copies: usize) -> usize {
        self.min_calls.div_ceil(copies.max(1)).max(1)
    }
}

/// Device copies of a [`synth::HostBatch`]'s inputs, with an output, an LSE
/// buffer and a workspace sized for one plan: what a test or a benchmark hands
/// to `decode`.
pub struct DeviceBatch<B> {
    pub q: B,
    pub k_cache: B,
    pub v_cache: B,
    pub seq_lens: B,
    pub index: DeviceIndex<B>,
    pub workspace: B,
    pub out: B,
    /// f32 `[num_seqs, num_q_heads]`, written only by [`DeviceBatch::args_with_lse`]'s
    /// calls; `None` for a batch of no rows (device allocators may refuse zero bytes).
    pub lse: Option<B>,
}

/// The device side of [`synth::HostIndex`].
pub enum DeviceIndex<B> {
    BlockTable { table: B, max_blocks_per_seq: usize },
    TokenIndices { indptr: B, indices: B },
}

impl<B: DeviceBuffer> DeviceBatch<B> {
    /// Uploads `batch` to `backend` and allocates a workspace of `workspace_bytes`
    /// and an output filled with `out_fill` (e.g. `0xFF`, a NaN in every float type,
    /// to catch elements a kernel forgets to write).
    pub fn upload<D: DecodeAttention<Buffer = B> + ?Sized>(
        backend: &D,
        batch: &synth::HostBatch,
        workspace_bytes: u64,
        out_fill: u8,
    ) -> Result<Self> {
        let upload = |bytes: &[u8]| -> Result<B> {
            let mut buffer = backend.alloc(bytes.len())?;
            backend.upload(&mut buffer, bytes)?;
            Ok(buffer)
        };
        let index = match &batch.index {
            synth::HostIndex::BlockTable { table, max_blocks_per_seq } => DeviceIndex::BlockTable {
                table: upload(&synth::i32_bytes(table))?,
                max_blocks_per_seq: *max_blocks_per_seq,
            },
            synth::HostIndex::TokenIndices { indptr, indices } => {
                // A batch of empty sequences has no indices; one unused entry
                // keeps device allocators that refuse zero bytes out of it.
                let indices: &[i32] = if indices.is_empty() { &[0] } else { indices };
                DeviceIndex::TokenIndices {
                    indptr: upload(&synth::i32_bytes(indptr))?,
                    indices: upload(&synth::i32_bytes(indices))?,
                }
            }
        };
        // Same reason: an unsplit plan needs no workspace, but a 256-byte one costs nothing.
        let workspace_len = usize::try_from(workspace_bytes).unwrap_or(usize::MAX).max(256);
        let mut workspace = backend.alloc(workspace_len)?;
        backend.upload(&mut workspace, &vec![out_fill; workspace_len])?;
        Ok(DeviceBatch {
            q: upload(&batch.q)?,
            k_cache: upload(&batch.k_cache)?,
            v_cache: upload(&batch.v_cache)?,
            seq_lens: upload(&synth::i32_bytes(&batch.seq_lens))?,
            index,
            workspace,
            out: upload(&vec![out_fill; batch.problem.out_bytes()])?,
            lse: match batch.problem.num_seqs() * batch.problem.shape.num_q_heads * 4 {
                0 => None,
                bytes => Some(upload(&vec![out_fill; bytes])?),
            },
        })
    }

    /// The arguments of one `decode` over this batch, with the default softmax
    /// scale and no LSE.
    pub fn args(&mut self) -> DecodeArgs<'_, B> {
        self.own_args(false)
    }

    /// [`DeviceBatch::args`] asking for the rows' LSEs in [`DeviceBatch::lse`].
    pub fn args_with_lse(&mut self) -> DecodeArgs<'_, B> {
        self.own_args(true)
    }

    fn own_args(&mut self, with_lse: bool) -> DecodeArgs<'_, B> {
        let DeviceBatch { q, k_cache, v_cache, seq_lens, index, workspace, out, lse } = self;
        let lse = if with_lse { lse.as_mut() } else { None };
        DecodeArgs { lse, ..batch_args(q, k_cache, v_cache, seq_lens, index, workspace, out) }
    }

    /// Like [`DeviceBatch::args`], but reading K and V from other pools laid out
    /// like this batch's (a benchmark cycles over copies so no cache holds them).
    pub fn args_with_pools<'a>(&'a mut self, k_cache: &'a B, v_cache: &'a B) -> DecodeArgs<'a, B> {
        self.pool_args(k_cache, v_cache, false)
    }

    fn pool_args<'a>(&'a mut self, k_cache: &'a B, v_cache: &'a B, with_lse: bool) -> DecodeArgs<'a, B> {
        let DeviceBatch { q, seq_lens, index, workspace, out, lse, .. } = self;
        let lse = if with_lse { lse.as_mut() } else { None };
        DecodeArgs { lse, ..batch_args(q, k_cache, v_cache, seq_lens, index, workspace, out) }
    }

    /// Uploads copies of `batch`'s K and V pools, so that with the batch's own
    /// there are [`KvRotation::copies`] pools: a timed run that cycles over all
    /// of them reads more KV than any cache holds. Returns the extra copies only.
    pub fn upload_kv_copies<D: DecodeAttention<Buffer = B> + ?Sized>(
        backend: &D,
        batch: &synth::HostBatch,
        rotation: &KvRotation,
    ) -> Result<Vec<(B, B)>> {
        let copies = rotation.copies(batch.k_cache.len() + batch.v_cache.len());
        (1..copies)
            .map(|_| {
                let mut k = backend.alloc(batch.k_cache.len())?;
                backend.upload(&mut k, &batch.k_cache)?;
                let mut v = backend.alloc(batch.v_cache.len())?;
                backend.upload(&mut v, &batch.v_cache)?;
                Ok((k, v))
            })
            .collect()
    }

    /// Runs `plan` over this batch's own pool, then over each of `pools`
    /// (from [`DeviceBatch::upload_kv_copies`]), `passes` times over.
    pub fn decode_over_pools<D: DecodeAttention<Buffer = B> + ?Sized>(
        &mut self,
        backend: &D,
        plan: &Plan,
        pools: &[(B, B)],
        passes: usize,
    ) -> Result<()> {
        self.decode_over_pools_after(backend, plan, pools, passes, false, || Ok(()))
    }

    /// [`decode_over_pools`](Self::decode_over_pools), asking every call for
    /// the rows' LSEs when `with_lse` (into [`DeviceBatch::lse`]) and running
    /// `before` right before each call (`bench --cold`'s evictor).
    pub fn decode_over_pools_after<D: DecodeAttention<Buffer = B> + ?Sized>(
        &mut self,
        backend: &D,
        plan: &Plan,
        pools: &[(B, B)],
        passes: usize,
        with_lse: bool,
        mut before: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        for _ in 0..passes {
            before()?;
            backend.decode(plan, self.own_args(with_lse))?;
            for (k, v) in pools {
                before()?;
                backend.decode(plan, self.pool_args(k, v, with_lse))?;
            }
        }
        Ok(())
    }

    /// The output, decoded to f32.
    pub fn download_out<D: DecodeAttention<Buffer = B> + ?Sized>(&self, backend: &D, dtype: DType) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; self.out.len_bytes()];
        backend.download(&self.out, &mut bytes)?;
        Ok(dtype::decode(dtype, &bytes))
    }

    /// The LSE buffer, `[num_seqs, num_q_heads]` (what `args_with_lse`'s last call wrote).
    pub fn download_lse<D: DecodeAttention<Buffer = B> + ?Sized>(&self, backend: &D) -> Result<Vec<f32>> {
        let Some(lse) = &self.lse else { return Ok(Vec::new()) };
        let mut bytes = vec![0u8; lse.len_bytes()];
        backend.download(lse, &mut bytes)?;
        Ok(dtype::decode(DType::F32, &bytes))
    }
}

fn batch_args<'a, B>(
    q: &'a B,
    k_cache: &'a B,
    v_cache: &'a B,
    seq_lens: &'a B,
    index: &'a DeviceIndex<B>,
    workspace: &'a mut B,
    out: &'a mut B,
) -> DecodeArgs<'a, B> {
    let kv_index = match index {
        DeviceIndex::BlockTable { table, max_blocks_per_seq } => {
            KvIndexBuffers::BlockTable { table, max_blocks_per_seq: *max_blocks_per_seq }
        }
        DeviceIndex::TokenIndices { indptr, indices } => KvIndexBuffers::TokenIndices { indptr, indices },
    };
    DecodeArgs { q, k_cache, v_cache, seq_lens, kv_index, workspace, out, lse: None, softmax_scale: None }
}

/// Uploads `batch`, runs `plan` once, and returns the outputs as f32
/// `[num_seqs, num_q_heads, head_dim]`: the whole round trip in one call.
pub fn decode_host_batch<D: DecodeAttention + ?Sized>(
    backend: &D,
    plan: &Plan,
    batch: &synth::HostBatch,
) -> Result<Vec<f32>> {
    let mut device = DeviceBatch::upload(backend, batch, plan.workspace_bytes, 0)?;
    backend.decode(plan, device.args())?;
    device.download_out(backend, plan.problem.dtypes.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_rotation_counts_copies_and_passes() {
        const MIB: usize = 1 << 20;
        let gpu = KvRotation::GPU;
        // Small pools: as many copies as 512 MiB needs, capped at 64; one pass.
        assert_eq!((gpu.copies(4 * MIB), gpu.copies(32 * MIB), gpu.copies(128 * MIB)), (64, 16, 4));
        assert_eq!((gpu.passes(64), gpu.passes(16), gpu.passes(4)), (1, 1, 2));
        // 512 MiB and more: two copies, cycled over four times (8 calls).
        assert_eq!((gpu.copies(512 * MIB), gpu.copies(4096 * MIB)), (2, 2));
        assert_eq!(gpu.passes(2), 4);
        // The host's: at least one pool, one pass; empty pools count as one byte.
        let host = KvRotation::host(256 * MIB, 8);
        assert_eq!((host.copies(1024 * MIB), host.copies(64 * MIB), host.copies(0)), (1, 4, 8));
        assert_eq!(host.passes(1), 1);
    }

    #[test]
    fn parses_backend_specs() {
        assert_eq!("auto".parse::<BackendSpec>().unwrap(), BackendSpec::Auto);
        assert_eq!("CPU".parse::<BackendSpec>().unwrap(), BackendSpec::Cpu);
        assert_eq!("cuda".parse::<BackendSpec>().unwrap(), BackendSpec::Cuda { ordinal: 0 });
        assert_eq!("cuda:1".parse::<BackendSpec>().unwrap(), BackendSpec::Cuda { ordinal: 1 });
        assert_eq!("hip:3".parse::<BackendSpec>().unwrap(), BackendSpec::Hip { ordinal: 3 });
        for bad in ["", "metal", "cuda:x", "cpu:0", "cuda:-1"] {
            let err = bad.parse::<BackendSpec>().unwrap_err();
            assert!(err.to_string().contains("expected auto, cpu"), "{bad:?}: {err}");
        }
        for spec in ["auto", "cpu", "cuda:2", "hip:0"] {
            assert_eq!(spec.parse::<BackendSpec>().unwrap().to_string(), spec);
        }
    }

    #[test]
    fn cpu_is_always_available_and_auto_never_fails() {
        let reports = probe();
        assert_eq!(reports[0].name, "cpu");
        assert!(reports[0].available);
        // Every backend appears, usable or with its reason.
        for name in ["cuda", "hip"] {
            assert!(reports.iter().any(|r| r.name.starts_with(name)), "{reports:?}");
        }
        for report in reports.iter().filter(|r| !r.available) {
            assert!(!report.detail.is_empty(), "{report:?}");
        }
        let _ = Backend::auto();
        assert_eq!(Backend::from_spec("cpu").unwrap().name(), "cpu");
    }

    #[test]
    fn auto_tries_cuda_then_hip_then_the_cpu() {
        let (chosen, passed_over) = Backend::auto_with_reasons(&BackendOptions::default());
        let passed: Vec<&str> = passed_over
            .iter()
            .map(|err| match err {
                Error::Unavailable { backend, .. } | Error::Device { backend, .. } => *backend,
                _ => "?",
            })
            .collect();
        match chosen.name() {
            "cuda" => assert!(passed.is_empty(), "{passed_over:?}"),
            "hip" => assert_eq!(passed, ["cuda"], "{passed_over:?}"),
            _ => assert_eq!(passed, ["cuda", "hip"], "{passed_over:?}"),
        }
    }

    #[test]
    fn an_explicit_gpu_that_is_absent_is_an_error_not_the_cpu() {
        for spec in ["hip", "hip:3", "cuda:7"] {
            match Backend::from_spec(spec) {
                Ok(backend) => assert_ne!(backend.name(), "cpu", "{spec} fell back to the CPU"),
                Err(err) => assert!(err.to_string().contains(&spec[..spec.find(':').unwrap_or(spec.len())]), "{err}"),
            }
        }
    }

    #[test]
    fn a_buffer_of_another_backend_is_an_error() {
        let cpu = Backend::cpu();
        let mut buffer = cpu.alloc(16).unwrap();
        cpu.upload(&mut buffer, &[1; 16]).unwrap();
        // The only foreign buffer constructible without a GPU is none at all,
        // so check the message of the narrowing error directly.
        let err = wrong_backend("cuda", "q", buffer.backend_name());
        assert!(err.to_string().contains("allocated by the cpu backend"), "{err}");
    }
}

//! CUDA backend of decode-attn.
//!
//! * The driver is loaded at run time (cudarc, `dynamic-loading`): a binary
//!   built with this crate starts on a machine with no NVIDIA driver, and
//!   [`device_count`] says why there is no device instead of panicking.
//! * Kernels: the fatbin that nvcc built at compile time (SASS for sm_80 and
//!   sm_90, PTX for newer GPUs) when there was an nvcc; otherwise, or when the
//!   driver refuses it (a CUDA 13 fatbin on a 12.x driver), the embedded
//!   source compiled by NVRTC at first use and cached on disk.
//!
//! Layering follows cudarc: `params` passes core's mirror of the C ABI
//! (`decode_attn_core::abi`) by value, `nvrtc` wraps the
//! run-time compiler, and this file is the safe backend on top.

mod caller;
mod nvrtc;
mod params;
mod parts;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig};
use decode_attn_core::{
    AttentionShape, DType, DTypes, DecodeArgs, DecodeAttention, DecodeProblem, DeviceBuffer, DeviceProps, Error,
    KvLayout, MergeArgs, Plan, Policy, Result, GPU_LONE_CTA_SHARE, GPU_STREAM_LONE_CTA_SHARE,
};

pub use caller::CallerStream;
/// The driver's stream handle that [`CudaBackend::caller_stream`] takes
/// (`cudaStream_t` of the runtime API is the same pointer).
pub use cudarc::driver::sys::CUstream;
use decode_attn_core::abi::{
    check_alignment, decode_alignment, DecodeParams, MergeParams, GRID_HEADS_FIRST, GRID_SEQS_FIRST,
};
use decode_attn_core::env;
pub use nvrtc::{default_cache_dir, NVRTC_CANDIDATES};
use params::ByValue;
use parts::DecodeModules;

const BACKEND: &str = "cuda";

/// Threads per CTA of every decode kernel (DECODE_THREADS in kernels/cuda).
pub const DECODE_THREADS: u32 = 128;

/// Threads per CTA of the mma and stream kernels' split reducer
/// (DECODE_REDUCE_THREADS in kernels/cuda/decode_stream.cuh).
pub const REDUCE_THREADS: u32 = 256;

/// Dynamic shared memory of every stream-kernel launch: its ring of K/V
/// stages (DECODE_STREAM_RING_BYTES in kernels/cuda/decode_stream.cuh).
pub const STREAM_RING_BYTES: u32 = 65536;

/// Dynamic shared memory of a tensor-core kernel launch up to head_dim 128,
/// two CTAs per multiprocessor (DECODE_MMA_RING_BYTES in
/// kernels/cuda/decode_mma.cuh).
pub const MMA_RING_BYTES: u32 = 98304;

/// Dynamic shared memory of a tensor-core kernel launch at head_dim 256, one
/// CTA per multiprocessor: a ring twice as big (DECODE_MMA_WIDE_RING_BYTES)
/// and Q, 16 heads of 512 bytes (MmaGeometry<256>::SMEM_BYTES). Devices that
/// cannot give a CTA this much (before sm_90) run head_dim 256 on the stream
/// kernel.
pub const MMA_WIDE_SHARED_BYTES: u32 = 196608 + 16 * 512;

/// Query heads one CTA of the tensor-core kernel serves (the mma's M).
pub const MMA_HEADS_PER_CTA: usize = 16;

/// The head dims the tensor-core kernel is instantiated for (its
/// accumulators live in registers: up to 128, and 256 with Q in shared
/// memory); others (192) run on the stream kernel.
pub const MMA_HEAD_DIMS: [usize; 7] = [64, 80, 96, 112, 120, 128, 256];

/// Whether the tensor-core kernel's `(num_seqs, head CTAs, num_splits)`
/// grid launches heads first under `order` ([`GridOrder`]) on a device of
/// `num_sms` multiprocessors. The grid's y dimension holds at most 65535, so
/// more sequences than that stay sequences first.
fn heads_first(
    order: GridOrder,
    (num_seqs, head_ctas, num_splits): (u32, u32, u32),
    head_dim: usize,
    num_sms: u32,
) -> bool {
    let fits = num_seqs <= 65535;
    match order {
        GridOrder::SeqsFirst => false,
        GridOrder::HeadsFirst => fits,
        GridOrder::Auto => {
            let ctas = num_seqs as u64 * head_ctas as u64 * num_splits as u64;
            let resident = num_sms as u64 * mma_ctas_per_sm(head_dim) as u64;
            fits && ctas > resident
        }
    }
}

/// Tensor-core CTAs resident per multiprocessor (MmaGeometry::CTAS_PER_SM):
/// two 96 KiB rings, or one 200 KiB ring at head_dim 256.
fn mma_ctas_per_sm(head_dim: usize) -> u32 {
    if head_dim > 128 {
        1
    } else {
        2
    }
}

/// The tensor-core kernel's dynamic shared memory at `head_dim`.
fn mma_shared_bytes(head_dim: usize) -> u32 {
    if head_dim > 128 {
        MMA_WIDE_SHARED_BYTES
    } else {
        MMA_RING_BYTES
    }
}

/// Query heads times head dim that one CTA of the staged kernel can hold (it
/// stages the whole query group in shared memory). The stream kernel has no
/// limit: groups larger than 8 heads are served by several CTAs per KV head.
pub const MAX_GROUP_ELEMS: usize = 4096;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

const DECODE_SOURCE: &str = include_str!("../../../kernels/cuda/decode.cu");
/// The portable kv-head-grid kernel of the HIP backend, built here as CUDA
/// (through NVRTC, at first use) so that its indexing and merging run the
/// conformance suite on NVIDIA hardware.
const KVGRID_SOURCE: &str = include_str!("../../../kernels/hip/decode_kvgrid.hip");
const KVGRID_HEADERS: &[(&str, &str)] = &[
    ("da_portable.h", include_str!("../../../kernels/hip/da_portable.h")),
    ("decode_params.h", include_str!("../../../kernels/cuda/decode_params.h")),
];
/// Threads per workgroup of the kv-head-grid kernel (DECODE_KVGRID_THREADS).
pub const KVGRID_THREADS: u32 = 256;
const KERNEL_HEADERS: &[(&str, &str)] = &[
    ("decode_params.h", include_str!("../../../kernels/cuda/decode_params.h")),
    ("decode_stream.cuh", include_str!("../../../kernels/cuda/decode_stream.cuh")),
    ("decode_mma.cuh", include_str!("../../../kernels/cuda/decode_mma.cuh")),
];

/// Where kernels come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelSource {
    /// The embedded fatbin when it loads, else NVRTC.
    #[default]
    Auto,
    /// Only the nvcc-built fatbin embedded at compile time.
    Embedded,
    /// Always NVRTC (with the disk cache): what a build without nvcc does.
    Nvrtc,
}

/// Which decode kernel runs. All compute the same function and execute the
/// same plan; the conformance suite runs each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeKernel {
    /// The tensor-core kernel where it applies (f16 and bf16 with head_dim
    /// up to 128, or 256 on sm_90 and later), the stream kernel elsewhere.
    #[default]
    Auto,
    /// kernels/cuda/decode_mma.cuh: QK^T and PV as mma.m16n8k16 on 16-token
    /// tiles, up to 16 query heads per CTA. f16/bf16, head_dim <= 128 or
    /// 256 (where a CTA may have 200 KiB of shared memory: sm_90) only.
    Mma,
    /// kernels/cuda/decode_stream.cuh: warps stream their own tokens through
    /// a per-warp cp.async ring; CUDA-core math. Every dtype and head dim.
    Stream,
    /// The shared-memory kernel of decode.cu (cp.async ring of K/V tiles).
    Staged,
    /// kernels/hip/decode_kvgrid.hip, the HIP backend's portable kernel,
    /// compiled by NVRTC a part (element type and head dim) at a time, at
    /// the first plan that needs it: grid (num_seqs, num_splits,
    /// num_kv_heads), one workgroup per KV head's query group. Here to test
    /// the HIP kernel's logic on NVIDIA GPUs, not for speed.
    KvGrid,
}

#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    pub kernels: KernelSource,
    pub kernel: DecodeKernel,
    /// Query heads one CTA of the stream kernel serves, at most (1, 2, 4 or
    /// 8; 0 means 8). Smaller caps split a group over CTAs that read the same
    /// KV at about the same time, trading L2 traffic for registers.
    pub max_heads_per_cta: usize,
    /// Cache for NVRTC output; `None` compiles in every process.
    pub cache_dir: Option<PathBuf>,
    /// Which launches of the mma and stream kernels use programmatic
    /// dependent launch (sm_90 and newer; ignored below).
    pub programmatic_launch: ProgrammaticLaunch,
    /// How the tensor-core kernel's CTAs are numbered.
    pub grid_order: GridOrder,
    /// Whether the tensor-core kernel's warps may each take a split.
    pub warp_splits: WarpSplits,
    /// Whether a split plan whose grid would be mostly empty splits launches
    /// only its active pairs.
    pub packing: Packing,
    /// Whether `auto` cuts a plan of equal lengths by the batch.
    pub batch_rule: BatchRule,
    /// The streaming bandwidth (GB/s) `auto` plans for; `None`, the default,
    /// takes 0.9 of the peak the device's memory clock and bus width give
    /// (about 4330 on an H200), but no less than the H200's figure
    /// ([`decode_attn_core::gpu_plan_gbps`]): an H100 (about 3020) is
    /// planned as an H200, whose plans were faster there (s36, s37). For
    /// A/B timing of plans across devices: the split counts `auto` picks
    /// depend on it (`Some(3020.0)` gives an H100's own plans).
    pub plan_bandwidth_gbps: Option<f64>,
}

/// Whether `auto` gives a plan of equal lengths (the graph an engine captures
/// for a batch size) a split rule cut by the batch
/// ([`SplitRule::batch_splits`](decode_attn_core::SplitRule)): each replay's
/// sequences cut at the split length of its mean length, so that one long
/// sequence among short ones is spread over the grid instead of staying on
/// the CTAs the planned length gave it. Such plans launch packed (their CTAs
/// sum the batch's tiles from the lengths they read) and need the packed
/// entry points (`Packing` not `Off`).
///
/// Off by default: on the H200 (s28, planned for 65536 tokens) it made
/// replays with one long sequence among short ones 2.2-4.2 times faster, but
/// replays of spread lengths 5-29% slower and the planned lengths themselves
/// 15-36% slower, because packed CTAs stream slower than the plain grid's
/// (docs/PERFORMANCE.md, s28). An engine whose batches are mostly short
/// sequences with a few long ones turns it on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchRule {
    /// Never: the per-sequence rule, as planned.
    #[default]
    Off,
    /// Where the packed entry points take the problem.
    Auto,
}

/// Whether the tensor-core kernel launches only the active (sequence,
/// split) pairs of a split plan whose `(num_seqs, .., num_splits)` grid would
/// be almost all empty splits: one long sequence among many short ones, each
/// short one filling one split of many. Every empty CTA of the plain grid
/// still launches, reads its length and exits (about 0.6 µs of a CTA slot on
/// the H200); a packed grid `(head CTAs, pairs, 1)` has none, and its CTAs
/// number the pairs from the lengths they read, so a graph replayed with
/// longer sequences still covers every pair (decode_stream.cuh, packed_item).
/// The outputs are the plain grid's, bit for bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// Where the plain grid would have at least 8 empty CTAs per active
    /// one, or 2 in a batch of 64 sequences or more
    /// (`pack_min_empty_per_active`).
    #[default]
    Auto,
    /// Never: always the plain grid.
    Off,
    /// Every split plan of one split per CTA that the packed entry points
    /// take, however few of its grid's CTAs would be empty (for A/B timing).
    Always,
    /// Plans as if empty CTAs cost nothing wherever the problem may launch
    /// packed (`DeviceProps::empty_cta_us` 0), and packs every plan that
    /// has an empty CTA. An experiment (`DECODE_ATTN_CUDA_PACKED=plan`):
    /// s27 measured such plans slower on 9 of 12 ragged batches while packed
    /// CTAs streamed 5-14% slower than plain ones (their ring's alignment,
    /// s31, and a stack copy of their parameters, s33; both since removed),
    /// and s33, between the two fixes, on all 6 it timed. Warp-split plans
    /// never pack but are costed the same way here.
    Planned,
}

/// Whether `auto` may give each warp of a tensor-core CTA its own split
/// (`Plan::splits_per_cta`): where a query head has at most
/// `WARP_SPLIT_MAX_ROWS` partial rows, the CTA's warps skip their merge
/// through shared memory and store their own rows, which the reducer merges
/// with the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WarpSplits {
    /// Where `auto` chooses it.
    #[default]
    Auto,
    /// Never: the warps of a CTA always share one split.
    Off,
}

/// The order in which the tensor-core kernel's grid launches its CTAs; every
/// order computes the same outputs, bit for bit (a CTA's work does not
/// depend on when it runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GridOrder {
    /// Heads first where the grid is more than one wave of resident CTAs,
    /// else sequences first.
    #[default]
    Auto,
    /// `(num_seqs, head CTAs, num_splits)`: the CTAs of one KV head of
    /// consecutive sequences launch side by side.
    SeqsFirst,
    /// `(head CTAs, num_seqs, num_splits)`: the CTAs of one (sequence,
    /// split) launch side by side. A token's K (and V) rows of all KV heads
    /// are adjacent in the pool, so those CTAs read neighbouring bytes at
    /// about the same time. On the H200, A/B in one call, this was 0.4-1.7%
    /// faster on the grids of several waves measured (Llama-3-8B, B=64 and
    /// 256) and up to 4.0% on ragged batches, and within +-0.7% either way
    /// on grids of one wave (docs/PERFORMANCE.md, version 17).
    HeadsFirst,
}

/// Programmatic dependent launch (PDL): a kernel launched with it may start
/// before the previous kernel in the stream has finished, and executes
/// `griddepcontrol.wait` before it reads anything that kernel may write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProgrammaticLaunch {
    /// Every kernel starts after the previous one has finished.
    Off,
    /// The split reducer starts while the decode grid drains (the decode
    /// kernels let it, `griddepcontrol.launch_dependents`).
    Reducer,
    /// Also the decode kernel itself starts while whatever kernel precedes it
    /// drains; it waits before its first load (and so before any store), so
    /// the previous kernel may write Q, lengths, block tables or KV, and may
    /// still read our output. The default: the driver launches a dependent
    /// grid only once every CTA of the previous grid has run its trigger or
    /// exited, so our waiting CTAs take only what that grid's resident CTAs
    /// leave free and cannot hold any of them back. What it saves is part of
    /// the launch: 0.1-0.2 µs of a small call on the H200, within 0.3% either
    /// way on large ones (docs/PERFORMANCE.md, version 19). Where the
    /// previous kernel triggers early, our CTAs are placed wherever its CTAs
    /// leave room, which can be uneven (our own reducer did that, so it no
    /// longer triggers early); `Reducer` avoids it. In turn, the kernel the
    /// caller runs after us starts only as our last kernel's CTAs exit: the
    /// reducer, and the decode kernel of an unsplit call, never trigger
    /// early (docs/PERFORMANCE.md, versions 19 and 20).
    #[default]
    All,
}

impl ProgrammaticLaunch {
    fn decode_kernel(self) -> bool {
        self == ProgrammaticLaunch::All
    }

    fn reducer(self) -> bool {
        self != ProgrammaticLaunch::Off
    }
}

impl CudaOptions {
    /// Documented entry point that reads the environment:
    /// `DECODE_ATTN_CUDA_KERNELS=auto|embedded|nvrtc`,
    /// `DECODE_ATTN_CUDA_KERNEL=auto|mma|stream|staged|kvgrid`, `DECODE_ATTN_CUDA_HEADS_PER_CTA=1|2|4|8`,
    /// `DECODE_ATTN_CUDA_PDL=off|reducer|all`, `DECODE_ATTN_CUDA_GRID=auto|seqs|heads`,
    /// `DECODE_ATTN_CUDA_WARP_SPLITS=auto|off`, `DECODE_ATTN_CUDA_PACKED=auto|off|always|plan`,
    /// `DECODE_ATTN_CUDA_BATCH_RULE=off|auto`, `DECODE_ATTN_CUDA_PLAN_GBPS=<GB/s>`
    /// and the cache folder of [`default_cache_dir`].
    pub fn from_env() -> Result<Self> {
        let kernels = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_KERNELS",
            KernelSource::default(),
            &[("auto", KernelSource::Auto), ("embedded", KernelSource::Embedded), ("nvrtc", KernelSource::Nvrtc)],
        )?;
        let kernel = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_KERNEL",
            DecodeKernel::default(),
            &[
                ("auto", DecodeKernel::Auto),
                ("mma", DecodeKernel::Mma),
                ("stream", DecodeKernel::Stream),
                ("staged", DecodeKernel::Staged),
                ("kvgrid", DecodeKernel::KvGrid),
            ],
        )?;
        let max_heads_per_cta = match std::env::var("DECODE_ATTN_CUDA_HEADS_PER_CTA").ok().as_deref() {
            None | Some("") => 0,
            Some(text) => match text.parse::<usize>() {
                Ok(n @ (1 | 2 | 4 | 8)) => n,
                _ => {
                    return Err(Error::Unsupported {
                        backend: BACKEND,
                        what: format!("DECODE_ATTN_CUDA_HEADS_PER_CTA={text:?} (expected 1, 2, 4 or 8)"),
                    })
                }
            },
        };
        let programmatic_launch = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_PDL",
            ProgrammaticLaunch::default(),
            &[
                ("off", ProgrammaticLaunch::Off),
                ("reducer", ProgrammaticLaunch::Reducer),
                ("all", ProgrammaticLaunch::All),
                ("0", ProgrammaticLaunch::Off),
            ],
        )?;
        let grid_order = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_GRID",
            GridOrder::default(),
            &[("auto", GridOrder::Auto), ("seqs", GridOrder::SeqsFirst), ("heads", GridOrder::HeadsFirst)],
        )?;
        let warp_splits = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_WARP_SPLITS",
            WarpSplits::default(),
            &[("auto", WarpSplits::Auto), ("off", WarpSplits::Off)],
        )?;
        let packing = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_PACKED",
            Packing::default(),
            &[("auto", Packing::Auto), ("off", Packing::Off), ("always", Packing::Always), ("plan", Packing::Planned)],
        )?;
        let batch_rule = env::choice(
            BACKEND,
            "DECODE_ATTN_CUDA_BATCH_RULE",
            BatchRule::default(),
            &[("off", BatchRule::Off), ("auto", BatchRule::Auto)],
        )?;
        let plan_bandwidth_gbps = env::positive_number(BACKEND, "DECODE_ATTN_CUDA_PLAN_GBPS")?;
        Ok(CudaOptions {
            plan_bandwidth_gbps,
            kernels,
            kernel,
            max_heads_per_cta,
            cache_dir: default_cache_dir(),
            programmatic_launch,
            grid_order,
            warp_splits,
            packing,
            batch_rule,
        })
    }
}

fn driver_error(err: DriverError) -> Error {
    Error::Device { backend: BACKEND, message: err.to_string() }
}

/// Whether this build embeds nvcc-compiled kernels.
pub fn has_embedded_kernels() -> bool {
    embedded::FATBIN.is_some()
}

/// Number of CUDA devices, or why there are none to use.
pub fn device_count() -> Result<usize> {
    // SAFETY: only tries to dlopen the driver library under its known names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Unavailable {
            backend: BACKEND,
            reason: "no NVIDIA driver (libcuda.so.1 not found)".into(),
        });
    }
    match CudaContext::device_count() {
        Ok(0) => Err(Error::Unavailable { backend: BACKEND, reason: "the NVIDIA driver reports no device".into() }),
        Ok(n) => Ok(n as usize),
        Err(err) => Err(Error::Unavailable { backend: BACKEND, reason: format!("cuInit failed: {err}") }),
    }
}

/// Device memory: the backend's own ([`DecodeAttention::alloc`]) or a
/// caller's, borrowed without a copy ([`CudaBackend::borrow_device_memory`]).
/// Zero-length buffers hold no allocation (the driver refuses zero-byte
/// allocations); their address is null.
pub struct CudaBuffer {
    memory: Memory,
}

enum Memory {
    Empty,
    /// Allocated by this backend on its stream (freed in its order when
    /// dropped), and the slice's device address.
    Owned {
        slice: CudaSlice<u8>,
        address: u64,
    },
    /// The caller's; never freed here.
    Borrowed {
        address: u64,
        len_bytes: usize,
    },
}

impl CudaBuffer {
    /// The buffer's device address (null for an empty buffer).
    pub fn device_address(&self) -> u64 {
        match &self.memory {
            Memory::Empty => 0,
            Memory::Owned { address, .. } => *address,
            Memory::Borrowed { address, .. } => *address,
        }
    }

    /// Whether the memory is a caller's ([`CudaBackend::borrow_device_memory`]).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.memory, Memory::Borrowed { .. })
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.memory {
            Memory::Empty => "empty",
            Memory::Owned { .. } => "owned",
            Memory::Borrowed { .. } => "borrowed",
        };
        write!(f, "CudaBuffer({kind}, {} bytes at {:#x})", self.len_bytes(), self.device_address())
    }
}

impl DeviceBuffer for CudaBuffer {
    fn len_bytes(&self) -> usize {
        match &self.memory {
            Memory::Empty => 0,
            Memory::Owned { slice, .. } => slice.len(),
            Memory::Borrowed { len_bytes, .. } => *len_bytes,
        }
    }
}

/// One CUDA device with the decode kernels loaded, working on one stream.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: DecodeModules,
    /// The kv-head-grid kernel's modules (NVRTC's parts), when that kernel
    /// is selected.
    kvgrid_modules: Option<DecodeModules>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// The device, with the figures of the kernel the backend was opened
    /// with (for `Auto`, the tensor-core kernel's) at Llama's shapes; `plan`
    /// uses those of the kernel and shape of each problem (`props_for`).
    props: DeviceProps,
    kernel_origin: String,
    kernel: DecodeKernel,
    max_heads_per_cta: usize,
    /// What is launched programmatically (`Off` below sm_90).
    programmatic_launch: ProgrammaticLaunch,
    grid_order: GridOrder,
    warp_splits: WarpSplits,
    packing: Packing,
    batch_rule: BatchRule,
    /// Shared memory one CTA may opt in to (232448 bytes on sm_90, 166912 on
    /// sm_80): whether the tensor-core kernel's head_dim 256 fits.
    max_shared_per_cta: usize,
}

impl CudaBackend {
    /// Opens device `ordinal` with default options (no NVRTC cache).
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_options(ordinal, CudaOptions::default())
    }

    pub fn with_options(ordinal: usize, options: CudaOptions) -> Result<Self> {
        if let Some(gbps) = options.plan_bandwidth_gbps.filter(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: format!("CudaOptions::plan_bandwidth_gbps {gbps} (expected a positive number of GB/s)"),
            });
        }
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                backend: BACKEND,
                reason: format!("device {ordinal} requested but only {count} present"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_error)?;
        // SAFETY: the backend issues all its work on the one stream below, so
        // cudarc's cross-stream event tracking is not needed; turning it off
        // keeps graph capture free of stray event records.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_error)?;
        let arch = ctx.compute_capability().map_err(driver_error)?;
        let (modules, mut kernel_origin) = load_modules(&ctx, arch, &options)?;
        let kvgrid_modules = if options.kernel == DecodeKernel::KvGrid {
            let source = nvrtc::Source { name: "decode_kvgrid.hip", text: KVGRID_SOURCE, headers: KVGRID_HEADERS };
            kernel_origin.push_str(&format!(
                "; kv-head-grid kernel: NVRTC, sm_{}{}, an element type and head dim at a time",
                arch.0, arch.1
            ));
            Some(DecodeModules::parts(source, ctx.clone(), arch, options.cache_dir.clone()))
        } else {
            None
        };
        let attr = |a| ctx.attribute(a).map_err(driver_error);
        let num_sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        // Peak = memory clock (kHz) * 2 (double data rate) * bus width (bytes);
        // streaming reaches about 90% of it.
        let clock_khz = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0) as f64;
        let bus_bits = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0) as f64;
        // An unknown clock (0) gives the H200's figure, as any slower one does.
        let peak_gbps = clock_khz * 1e3 * 2.0 * bus_bits / 8.0 / 1e9;
        let mem_bandwidth_gbps =
            options.plan_bandwidth_gbps.unwrap_or(decode_attn_core::gpu_plan_gbps(0.9 * peak_gbps));
        let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let programmatic_launch = if major >= 9 { options.programmatic_launch } else { ProgrammaticLaunch::Off };
        let max_shared_per_cta =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as usize;
        let mut backend = CudaBackend {
            props: DeviceProps {
                name: ctx.name().map_err(driver_error)?,
                num_sms,
                ctas_per_sm: 2,
                mem_bandwidth_gbps,
                launch_overhead_us: 2.0,
                reduce_cta_gbps: decode_attn_core::GPU_REDUCE_CTA_GBPS,
                // Set below from the kernel in use, as ctas_per_sm is.
                tiles_per_cta_step: 1,
                lone_cta_share: GPU_LONE_CTA_SHARE,
                max_query_heads_per_cta: 0,
                empty_cta_us: decode_attn_core::GPU_EMPTY_CTA_US,
                splits_per_cta: 1,
                reduce_wait_us: None,
                cuts_by_batch: false,
            },
            ctx,
            stream,
            modules,
            kvgrid_modules,
            functions: Mutex::new(HashMap::new()),
            kernel_origin,
            kernel: options.kernel,
            max_heads_per_cta: if options.max_heads_per_cta == 0 { 8 } else { options.max_heads_per_cta },
            programmatic_launch,
            grid_order: options.grid_order,
            warp_splits: options.warp_splits,
            packing: options.packing,
            batch_rule: options.batch_rule,
            max_shared_per_cta,
        };
        // The kernel in use at a Llama-3-8B layer (bf16, d = 128, 16-token
        // blocks); `plan` asks per problem.
        let llama = DecodeProblem::new(
            AttentionShape::new(32, 8, 128)?,
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![1],
        )?;
        backend.props = backend.props_for(&llama)?;
        Ok(backend)
    }

    /// The launches that run `problem` with `num_splits` splits, up to
    /// `splits_per_cta` of them per CTA where the kernel can (the tensor-core
    /// kernel: one per warp; other kernels take one split per CTA).
    fn launches(&self, problem: &DecodeProblem, num_splits: u32, splits_per_cta: u32) -> Launch {
        let shape = problem.shape;
        let suffix = format!("{}_d{}", dtype_suffix(problem.dtypes.q), shape.head_dim);
        let num_seqs = problem.num_seqs() as u32;
        let num_kv_heads = shape.num_kv_heads as u32;
        match self.kernel_for(problem) {
            DecodeKernel::Auto | DecodeKernel::Mma => {
                let head_ctas = num_kv_heads * shape.group_size().div_ceil(MMA_HEADS_PER_CTA) as u32;
                // Any count up to the warps is correct (warps past it idle),
                // as long as the grid has ceil(num_splits / it) split CTAs.
                let splits_per_cta = if num_splits > 1 { splits_per_cta.clamp(1, DECODE_THREADS / 32) } else { 1 };
                let split_ctas = num_splits.div_ceil(splits_per_cta);
                let heads_first = self.heads_first((num_seqs, head_ctas, split_ctas), shape.head_dim);
                Launch {
                    main: mma_function(problem),
                    reduce: reduce_function(&suffix, shape.head_dim, num_splits),
                    splits_per_cta: splits_per_cta as i32,
                    grid: if heads_first {
                        (head_ctas, num_seqs, split_ctas)
                    } else {
                        (num_seqs, head_ctas, split_ctas)
                    },
                    grid_order: if heads_first { GRID_HEADS_FIRST } else { GRID_SEQS_FIRST },
                    threads: DECODE_THREADS,
                    reduce_threads: REDUCE_THREADS,
                    shared_mem_bytes: mma_shared_bytes(shape.head_dim),
                    query_heads_per_cta: MMA_HEADS_PER_CTA as u32,
                    programmatic: true,
                }
            }
            DecodeKernel::Stream => {
                let heads = stream_heads_per_cta(shape.group_size()).min(self.max_heads_per_cta);
                Launch {
                    main: format!("decode_stream_{suffix}_h{heads}"),
                    splits_per_cta: 1,
                    reduce: reduce_function(&suffix, shape.head_dim, num_splits),
                    grid: (num_seqs, num_kv_heads * shape.group_size().div_ceil(heads) as u32, num_splits),
                    grid_order: GRID_SEQS_FIRST,
                    threads: DECODE_THREADS,
                    reduce_threads: REDUCE_THREADS,
                    shared_mem_bytes: STREAM_RING_BYTES,
                    query_heads_per_cta: heads as u32,
                    programmatic: true,
                }
            }
            DecodeKernel::Staged => Launch {
                main: format!("decode_attn_{suffix}"),
                splits_per_cta: 1,
                reduce: format!("decode_attn_reduce_{suffix}"),
                grid: (num_seqs, num_kv_heads, num_splits),
                grid_order: GRID_SEQS_FIRST, // not read by this kernel
                threads: DECODE_THREADS,
                reduce_threads: DECODE_THREADS,
                shared_mem_bytes: 0,
                query_heads_per_cta: 0,
                programmatic: false,
            },
            DecodeKernel::KvGrid => Launch {
                main: format!("decode_kvgrid_{suffix}"),
                splits_per_cta: 1,
                reduce: format!("decode_kvgrid_reduce_{suffix}"),
                grid: (num_seqs, num_splits, num_kv_heads),
                grid_order: GRID_SEQS_FIRST, // not read by this kernel
                threads: KVGRID_THREADS,
                reduce_threads: KVGRID_THREADS,
                shared_mem_bytes: 0,
                query_heads_per_cta: 0,
                programmatic: false,
            },
        }
    }

    /// [`DecodeAttention::decode`] on `stream`, this backend's own or one of
    /// its context that a caller owns ([`CudaBackend::decode_on`]).
    fn enqueue_decode(&self, stream: sys::CUstream, plan: &Plan, args: DecodeArgs<'_, CudaBuffer>) -> Result<()> {
        let problem = &plan.problem;
        self.supports(problem)?;
        let checked = args.check(plan)?;
        if problem.num_seqs() == 0 {
            return Ok(());
        }
        let shape = problem.shape;
        // Caller-owned memory may sit at any offset of its allocation; the
        // backend's own is always aligned.
        let mut params = DecodeParams::new(plan, &args, &checked, |buffer, name| {
            check_alignment(name, buffer.device_address(), decode_alignment(name))
        })?;
        let num_splits = params.num_splits as u32;
        let split = num_splits > 1;
        let mut launch = self.launches(problem, num_splits, plan.splits_per_cta);
        let packed_pairs = self.packed_pairs(plan, &launch);
        if plan.rule.is_batch() && packed_pairs.is_none() {
            // Only the packed entry points sum the batch's tiles.
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: format!(
                    "a split rule cut by the batch (batch_splits {}) without a packed launch of {:?} for this problem",
                    plan.rule.batch_splits,
                    self.kernel_for(problem)
                ),
            });
        }
        if let Some(pairs) = packed_pairs {
            // Heads first, the pairs in y (at most 65535 CTAs there; each
            // takes every gridDim.y-th pair), one split per CTA.
            launch.main.push_str(if plan.rule.is_batch() { "_batch" } else { "_packed" });
            launch.grid = (launch.grid_head_ctas(), pairs.min(MAX_GRID_Y), 1);
            launch.splits_per_cta = 1;
            if plan.rule.is_batch() {
                launch.reduce =
                    format!("decode_stream_reduce_batch_{}_d{}", dtype_suffix(problem.dtypes.q), shape.head_dim);
            }
        }
        params.grid_order = launch.grid_order;
        params.splits_per_cta = launch.splits_per_cta;
        let params = ByValue(params);
        let num_seqs = problem.num_seqs() as u32;
        let main = self.function(&launch.main, launch.shared_mem_bytes)?;
        let config = LaunchConfig {
            grid_dim: launch.grid,
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.shared_mem_bytes,
        };
        let pdl = self.programmatic_launch;
        // A caller's thread may have another context current (or none).
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: `params` matches the kernel's `DecodeParams` (size-checked in
        // core's abi tests); every address in it points into a live allocation whose
        // size `DecodeArgs::check` verified against the plan, and the kernel
        // bounds-checks block ids, slots and lengths that live in device memory;
        // launched programmatically only where `launch.programmatic` says the
        // kernel waits (griddepcontrol.wait) before its first load.
        unsafe { self.launch(stream, &main, config, &params, launch.programmatic && pdl.decode_kernel()) }?;
        if split {
            let reduce = self.function(&launch.reduce, 0)?;
            let config = LaunchConfig {
                grid_dim: (num_seqs, shape.num_q_heads as u32, 1),
                block_dim: (launch.reduce_threads, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: as above; the reducer reads the partial rows the first
            // kernel wrote, in stream order or, launched programmatically,
            // after its griddepcontrol.wait.
            unsafe { self.launch(stream, &reduce, config, &params, launch.programmatic && pdl.reducer()) }?;
        }
        Ok(())
    }

    /// [`DecodeAttention::merge_attn_states`] on `stream` (as `enqueue_decode`).
    fn enqueue_merge(&self, stream: sys::CUstream, args: MergeArgs<'_, CudaBuffer>) -> Result<()> {
        args.check()?;
        if args.num_tokens == 0 || args.num_heads == 0 {
            return Ok(());
        }
        // The merge reads and writes an element at a time.
        let element =
            |name, buffer: &CudaBuffer| check_alignment(name, buffer.device_address(), args.dtype.size_bytes() as u64);
        let lse = |name, buffer: &CudaBuffer| check_alignment(name, buffer.device_address(), 4);
        let params = ByValue(MergeParams {
            prefix: element("prefix", args.prefix)?,
            prefix_lse: lse("prefix_lse", args.prefix_lse)?,
            suffix: element("suffix", args.suffix)?,
            suffix_lse: lse("suffix_lse", args.suffix_lse)?,
            out_lse: args.out_lse.as_deref().map_or(Ok(0), |b| lse("out_lse", b))?,
            out: element("out", args.out)?,
            num_tokens: args.num_tokens as i32,
            num_heads: args.num_heads as i32,
            head_dim: args.head_dim as i32,
            _pad: 0,
        });
        let f = self.function(&format!("merge_attn_states_{}", dtype_suffix(args.dtype)), 0)?;
        let config = LaunchConfig {
            grid_dim: (args.num_tokens as u32, args.num_heads as u32, 1),
            block_dim: (DECODE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: `params` matches `MergeParams`; `MergeArgs::check` verified
        // every buffer's size for these token, head and dim counts.
        unsafe { self.launch(stream, &f, config, &params, false) }
    }

    fn heads_first(&self, grid: (u32, u32, u32), head_dim: usize) -> bool {
        heads_first(self.grid_order, grid, head_dim, self.props.num_sms)
    }

    /// Whether `problem` may launch packed (`Packing`): the tensor-core
    /// kernel's `_packed` entry points exist for power-of-two block sizes and
    /// token indices at head dims up to 128 (at 256 their loop spills), and
    /// count at most `PACK_MAX_SEQS` sequences.
    fn may_pack(&self, problem: &DecodeProblem) -> bool {
        let pow2 = match problem.layout {
            KvLayout::BlockTable { kernel_block_size, .. } => kernel_block_size.is_power_of_two(),
            KvLayout::TokenIndices { .. } => true,
        };
        self.packing != Packing::Off
            && self.kernel_for(problem) == DecodeKernel::Mma
            && pow2
            && problem.shape.head_dim <= 128
            && problem.num_seqs() <= PACK_MAX_SEQS
    }

    /// The active (sequence, split) pairs of `plan`, where `launch` (the
    /// plain grid) would be at least `pack_min_empty_per_active` empty CTAs
    /// per active one, and a packed launch can take them: split plans of one
    /// split per CTA. The count is the plan's; the kernel counts the pairs
    /// of the lengths it reads, so a graph replayed with other lengths still
    /// covers them.
    /// A plan cut by the batch always launches packed, on its `_batch` entry
    /// point: one pair per CTA, and as many CTAs as the rule can make pairs
    /// at any lengths (`SplitRule::batch_pair_bound`).
    fn packed_pairs(&self, plan: &Plan, launch: &Launch) -> Option<u32> {
        let problem = &plan.problem;
        if !plan.use_split || launch.splits_per_cta > 1 || !self.may_pack(problem) {
            return None;
        }
        if plan.rule.is_batch() {
            let ctas = plan.rule.batch_pair_bound(problem.num_seqs());
            return u32::try_from(ctas).ok().filter(|&ctas| ctas <= MAX_GRID_Y);
        }
        let pairs = plan.active_pairs();
        let empty = problem.num_seqs() as u64 * plan.num_splits as u64 - pairs;
        let many_empty = match self.packing {
            Packing::Always => true,
            Packing::Planned => empty > 0,
            Packing::Auto | Packing::Off => empty >= pack_min_empty_per_active(problem.num_seqs()) * pairs,
        };
        let pairs = u32::try_from(pairs).ok()?;
        (pairs > 0 && many_empty).then_some(pairs)
    }

    /// The active (sequence, split) pairs a launch of `plan` packs
    /// ([`Packing`]), or `None` where it launches the plain grid.
    pub fn packed_pairs_of(&self, plan: &Plan) -> Option<u32> {
        let num_splits = plan.rule.num_splits.max(1);
        self.packed_pairs(plan, &self.launches(&plan.problem, num_splits, plan.splits_per_cta))
    }

    /// The kernel that runs `problem`: `Auto` resolved.
    pub fn kernel_for(&self, problem: &DecodeProblem) -> DecodeKernel {
        match self.kernel {
            DecodeKernel::Auto if mma_applies(problem, self.max_shared_per_cta) => DecodeKernel::Mma,
            DecodeKernel::Auto => DecodeKernel::Stream,
            chosen => chosen,
        }
    }

    /// The planner's figures for the kernel that runs `problem`: the
    /// occupancy of its launch (the stream kernel fits three CTAs per
    /// multiprocessor where the tensor-core kernel fits two, fewer at larger
    /// groups and head dims), the tiles a CTA streams side by side (the
    /// tensor-core kernel gives each of its 4 warps every 4th tile of a split,
    /// the stream kernel's warps step by at most that many, the staged and
    /// kv-grid kernels walk tiles with the whole CTA), how far one CTA
    /// alone on a multiprocessor gets, and how many query heads one CTA
    /// serves (from `launches`: 16 on the tensor-core kernel).
    pub fn props_for(&self, problem: &DecodeProblem) -> Result<DeviceProps> {
        let warps = DECODE_THREADS / 32;
        let warp_splits = if self.warp_splits == WarpSplits::Auto { warps } else { 1 };
        // The stream and tensor-core kernels write a lone split's output from
        // its CTA (decode_stream.cuh, cta_writes_output); the staged and
        // kv-grid kernels' reducers merge every split.
        let lone_split_wait = Some(decode_attn_core::GPU_REDUCE_WAIT_US);
        let (tiles_per_cta_step, lone_cta_share, splits_per_cta, reduce_wait_us) = match self.kernel_for(problem) {
            DecodeKernel::Auto | DecodeKernel::Mma => (warps, GPU_LONE_CTA_SHARE, warp_splits, lone_split_wait),
            DecodeKernel::Stream => (warps, GPU_STREAM_LONE_CTA_SHARE, 1, lone_split_wait),
            // Not measured: these two are opt-in kernels, not `Auto`'s.
            DecodeKernel::Staged | DecodeKernel::KvGrid => (1, GPU_LONE_CTA_SHARE, 1, None),
        };
        let launch = self.launches(problem, 1, 1);
        let ctas_per_sm = self
            .function(&launch.main, launch.shared_mem_bytes)?
            .occupancy_max_active_blocks_per_multiprocessor(launch.threads, launch.shared_mem_bytes as usize, None)
            .map_err(driver_error)?;
        Ok(DeviceProps {
            ctas_per_sm: ctas_per_sm.max(1),
            tiles_per_cta_step,
            lone_cta_share,
            max_query_heads_per_cta: launch.query_heads_per_cta,
            splits_per_cta,
            reduce_wait_us,
            cuts_by_batch: self.batch_rule == BatchRule::Auto && self.may_pack(problem),
            empty_cta_us: if self.packing == Packing::Planned && self.may_pack(problem) {
                0.0
            } else {
                self.props.empty_cta_us
            },
            ..self.props.clone()
        })
    }

    /// Captures the launches `work` makes on this backend's stream into a CUDA
    /// graph, for replay. The graph keeps the buffer addresses it was captured
    /// with; what those buffers hold (lengths, block tables, Q) is read at each
    /// replay, so a replay after new lengths are uploaded decodes the new batch.
    pub fn capture(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<DecodeGraph> {
        self.synchronize()?;
        self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(driver_error)?;
        let captured = work();
        // End the capture whatever `work` did, so the stream is usable again.
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver_error);
        captured?;
        let graph =
            graph?.ok_or_else(|| Error::Device { backend: BACKEND, message: "captured an empty graph".into() })?;
        Ok(DecodeGraph { graph })
    }

    /// Where the loaded kernels came from (embedded fatbin or NVRTC).
    pub fn kernel_origin(&self) -> &str {
        &self.kernel_origin
    }

    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx.compute_capability().map_err(driver_error)
    }

    /// Microseconds the work `enqueue` puts on the stream takes, between two
    /// device events (waits for it to finish).
    fn elapsed_us(&self, enqueue: impl FnOnce() -> Result<()>) -> Result<f64> {
        let start = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver_error)?;
        let end = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver_error)?;
        start.record(&self.stream).map_err(driver_error)?;
        enqueue()?;
        end.record(&self.stream).map_err(driver_error)?;
        end.synchronize().map_err(driver_error)?;
        Ok(start.elapsed_ms(&end).map_err(driver_error)? as f64 * 1e3)
    }

    /// The loaded kernel `name`, opted in (once, when first loaded) to the
    /// `dynamic_shared_bytes` its launches use; every launch of one function
    /// uses the same amount.
    fn function(&self, name: &str, dynamic_shared_bytes: u32) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().map_err(|_| Error::Device {
            backend: BACKEND,
            message: "kernel table lock poisoned by an earlier panic".into(),
        })?;
        if let Some(f) = functions.get(name) {
            return Ok(f.clone());
        }
        let module = match &self.kvgrid_modules {
            Some(kvgrid) if name.starts_with("decode_kvgrid_") => kvgrid.module_for(name)?,
            _ => self.modules.module_for(name)?,
        };
        let f = module.load_function(name).map_err(|e| Error::Device {
            backend: BACKEND,
            message: format!("kernel {name} missing from the loaded module ({}): {e}", self.kernel_origin),
        })?;
        if dynamic_shared_bytes > 0 {
            // Above 48 KB of dynamic shared memory needs an explicit opt-in per function.
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_shared_bytes as i32,
            )
            .map_err(driver_error)?;
        }
        functions.insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Launches `function` (one parameter, an ABI struct by value) on
    /// `stream`; with `programmatic`, with programmatic stream serialization:
    /// it may start before the previous kernel finishes.
    ///
    /// # Safety
    /// This backend's context must be current on the calling thread and
    /// `stream` a live stream of it; `params`
    /// must match the kernel's parameter and every address in it must be
    /// live; with `programmatic`, the kernel must wait (griddepcontrol.wait)
    /// before it reads anything the previous kernel writes.
    unsafe fn launch<P>(
        &self,
        stream: sys::CUstream,
        function: &CudaFunction,
        config: LaunchConfig,
        params: &ByValue<P>,
        programmatic: bool,
    ) -> Result<()> {
        // SAFETY: CUlaunchAttribute is plain data (an id and a union of
        // integers); all-zero is a valid value that the fields below complete.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let launch_config = sys::CUlaunchConfig {
            gridDimX: config.grid_dim.0,
            gridDimY: config.grid_dim.1,
            gridDimZ: config.grid_dim.2,
            blockDimX: config.block_dim.0,
            blockDimY: config.block_dim.1,
            blockDimZ: config.block_dim.2,
            sharedMemBytes: config.shared_mem_bytes,
            hStream: stream,
            attrs: &mut attribute,
            numAttrs: u32::from(programmatic),
        };
        // The kernel takes one parameter, the struct by value: the driver
        // copies it from this address during the call.
        let mut arg = &params.0 as *const P as *mut std::ffi::c_void;
        // SAFETY: the config, attribute and argument outlive the call; the
        // function belongs to this context; the caller vouches for the rest.
        unsafe { sys::cuLaunchKernelEx(&launch_config, function.cu_function(), &mut arg, std::ptr::null_mut()) }
            .result()
            .map_err(driver_error)
    }
}

/// A captured sequence of launches; see [`CudaBackend::capture`].
pub struct DecodeGraph {
    graph: cudarc::driver::CudaGraph,
}

impl DecodeGraph {
    /// Launches the graph on the backend's stream (asynchronous).
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().map_err(driver_error)
    }
}

/// decode.cu's kernels: the embedded fatbin where it loads (unless NVRTC is
/// asked for), else NVRTC's, a part at a time (`parts`); and a line saying
/// which.
fn load_modules(ctx: &Arc<CudaContext>, arch: (i32, i32), options: &CudaOptions) -> Result<(DecodeModules, String)> {
    let mut refused = None;
    if options.kernels != KernelSource::Nvrtc {
        match embedded::FATBIN {
            Some(fatbin) => match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(fatbin.to_vec())) {
                Ok(module) => {
                    let origin = "embedded fatbin (nvcc: sm_80, sm_90, compute_90 PTX)";
                    return Ok((DecodeModules::Whole(module), origin.into()));
                }
                Err(err) if options.kernels == KernelSource::Embedded => return Err(driver_error(err)),
                Err(err) => refused = Some(err.to_string()),
            },
            None if options.kernels == KernelSource::Embedded => {
                return Err(Error::Unavailable {
                    backend: BACKEND,
                    reason: "this build embeds no kernels (nvcc was not found at build time)".into(),
                })
            }
            None => {}
        }
    }
    let why = match refused {
        Some(err) => format!(" (the embedded fatbin was refused: {err})"),
        None => String::new(),
    };
    let origin = format!("NVRTC, sm_{}{}, an element type and head dim at a time at first use{why}", arch.0, arch.1);
    let source = nvrtc::Source { name: "decode.cu", text: DECODE_SOURCE, headers: KERNEL_HEADERS };
    Ok((DecodeModules::parts(source, ctx.clone(), arch, options.cache_dir.clone()), origin))
}

/// Query heads per CTA of the stream kernel: the smallest instantiation
/// (1, 2, 4 or 8) that holds the whole group, so that KV is read once; larger
/// groups take several CTAs of 8.
fn stream_heads_per_cta(group_size: usize) -> usize {
    match group_size {
        1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// One decode call's launches: the kernel, its reducer (split plans only).
struct Launch {
    main: String,
    reduce: String,
    grid: (u32, u32, u32),
    /// Splits one CTA of the main kernel takes (`DecodeParams::splits_per_cta`).
    splits_per_cta: i32,
    /// How the main kernel reads `grid` (`DecodeParams::grid_order`).
    grid_order: i32,
    threads: u32,
    reduce_threads: u32,
    shared_mem_bytes: u32,
    /// Query heads one CTA serves at most (0: a KV head's whole group); a
    /// wider group takes several CTAs per KV head in `grid`.
    query_heads_per_cta: u32,
    /// Both kernels execute griddepcontrol.wait before reading what the
    /// previous kernel may have written (the mma and stream kernels and
    /// decode_stream_reduce_*), so they may be launched programmatically.
    programmatic: bool,
}

impl Launch {
    /// The grid's head CTAs (its x dimension heads first, else its y).
    fn grid_head_ctas(&self) -> u32 {
        if self.grid_order == GRID_HEADS_FIRST {
            self.grid.0
        } else {
            self.grid.1
        }
    }
}

/// Sequences a packed launch counts in every CTA (decode_params.h:
/// DECODE_PACK_MAX_SEQS).
const PACK_MAX_SEQS: usize = 2048;

/// The most CTAs a grid's y dimension takes.
const MAX_GRID_Y: u32 = 65535;

/// Empty CTAs per active one from which a plan of `num_seqs` sequences
/// launches packed: 8 below `PACK_WIDE_BATCH` sequences, 2 from there.
/// Packed CTAs pay for their count (all the lengths read, a scan, two
/// barriers: 0.65-0.8 µs a short call, s33); the plain grid pays a CTA slot
/// for every empty split, which weighs most where the batch is wide and its
/// CTAs short. Fitted on an H100 (s34, s35; `docs/experiments/packing-threshold/`)
/// on 95 ragged batches of 16, 64 and 256 sequences, each planned for itself,
/// packed against the plain grid:
/// - 16 sequences: packed was 1.02-1.18x slower at 2.3 empty per active one
///   and below (both models), and for 8B 1.007-1.019x at 7.4-11.7 where 70B
///   gained 2-10%; so 8, as s34 set for every batch;
/// - 64 and 256 sequences: 0.61-0.996x from 1.9 up on both models, but
///   for three 70B batches at 1.008-1.013x (8.6-12.0 empty per active one,
///   packed under 8 as well); 8B's 65536x4+256x60, at 0.9, was 1.106x. So 2
///   there: 8B's batches of 64 and 256 at 1.9-7.8 ran 2-17% faster.
///
/// Geometric mean of `auto`'s time over the plain grid's on that set: 0.925
/// (8B 0.968, 70B 0.884), from 0.944 with 8 for every batch (8B 0.996). On
/// 32 batches of 32 and 128 sequences the fit had not seen (s35), `auto`
/// measured 0.931 (70B) and 0.977 (8B), worst 1.004; 8 for every batch
/// would have given 0.945 and 0.996. `auto` plans as for the plain grid.
fn pack_min_empty_per_active(num_seqs: usize) -> u64 {
    if num_seqs >= PACK_WIDE_BATCH {
        PACK_MIN_EMPTY_PER_ACTIVE_WIDE
    } else {
        PACK_MIN_EMPTY_PER_ACTIVE
    }
}

/// See [`pack_min_empty_per_active`].
const PACK_MIN_EMPTY_PER_ACTIVE: u64 = 8;
/// See [`pack_min_empty_per_active`].
const PACK_MIN_EMPTY_PER_ACTIVE_WIDE: u64 = 2;
/// The batch from which [`PACK_MIN_EMPTY_PER_ACTIVE_WIDE`] applies: no batch
/// between 16 and 64 sequences was measured.
const PACK_WIDE_BATCH: usize = 64;

/// Whether the tensor-core kernel takes `problem`: it has an instantiation
/// for its element type and head dim, and a CTA of it fits the device's
/// `max_shared_per_cta` bytes of shared memory. Every kernel block size the
/// layout accepts (a multiple of 16) has an entry point.
fn mma_applies(problem: &DecodeProblem, max_shared_per_cta: usize) -> bool {
    let head_dim = problem.shape.head_dim;
    matches!(problem.dtypes.q, DType::F16 | DType::Bf16)
        && MMA_HEAD_DIMS.contains(&head_dim)
        && mma_shared_bytes(head_dim) as usize <= max_shared_per_cta
}

/// The tensor-core kernel's entry point for `problem`: power-of-two block
/// sizes (and token indices) locate a tile with a shift and a mask, other
/// block sizes have their own entry point, with a division.
fn mma_function(problem: &DecodeProblem) -> String {
    let name = format!("decode_mma_{}_d{}", dtype_suffix(problem.dtypes.q), problem.shape.head_dim);
    match problem.layout {
        KvLayout::BlockTable { kernel_block_size, .. } if !kernel_block_size.is_power_of_two() => {
            format!("{name}_anyblock")
        }
        _ => name,
    }
}

/// Rows one split lane of the stream reducer loads in its first round of
/// loads (DECODE_REDUCE_ROWS_PER_LANE in kernels/cuda/decode_stream.cuh);
/// its wide entry point loads twice as many.
const REDUCE_ROWS_PER_LANE: usize = 8;

/// The stream reducer's entry point for a plan of `num_splits` splits:
/// `decode_stream_reduce_wide_*` where the plan has more splits than the
/// narrow one loads in its first round (64 at head_dim 128), which would
/// need a second round of dependent loads. Only there: its 128 registers a
/// thread let fewer of its CTAs share an SM, which made the 512-CTA reduces
/// of B = 64 10% slower on the H200 (docs/PERFORMANCE.md, version 25).
fn reduce_function(suffix: &str, head_dim: usize, num_splits: u32) -> String {
    let split_lanes = (REDUCE_THREADS as usize / (head_dim / 4).max(1)).max(1);
    if num_splits as usize > split_lanes * REDUCE_ROWS_PER_LANE {
        format!("decode_stream_reduce_wide_{suffix}")
    } else {
        format!("decode_stream_reduce_{suffix}")
    }
}

fn dtype_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        _ => "bf16",
    }
}

impl DecodeAttention for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> &'static str {
        BACKEND
    }

    /// The figures of the kernel the backend was opened with; [`plan`](Self::plan)
    /// uses those of the kernel that runs the problem.
    fn device_props(&self) -> &DeviceProps {
        &self.props
    }

    fn plan(&self, problem: &DecodeProblem, policy: Policy) -> Result<Plan> {
        self.supports(problem)?;
        let plan = decode_attn_core::plan(problem, policy, &self.props_for(problem)?)?;
        // On the NVRTC path, compile the problem's kernels now, not in the
        // first decode (which an engine may be capturing into a graph).
        let modules = match &self.kvgrid_modules {
            Some(kvgrid) if self.kernel == DecodeKernel::KvGrid => kvgrid,
            _ => &self.modules,
        };
        modules.prepare(problem.dtypes.kv, problem.shape.head_dim)?;
        Ok(plan)
    }

    fn supports(&self, problem: &DecodeProblem) -> Result<()> {
        problem.validate()?;
        let d = problem.dtypes;
        if d.q != d.kv || d.kv != d.out {
            return Err(Error::UnsupportedDTypes {
                backend: BACKEND,
                q: d.q,
                kv: d.kv,
                out: d.out,
                why: "the CUDA kernels take one element type for Q, KV and output",
            });
        }
        if self.kernel == DecodeKernel::Mma && !mma_applies(problem, self.max_shared_per_cta) {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: format!(
                    "the tensor-core kernel (DECODE_ATTN_CUDA_KERNEL=mma) takes f16 or bf16 with head_dim in \
                     {MMA_HEAD_DIMS:?} (256 where a CTA may have {MMA_WIDE_SHARED_BYTES} bytes of shared memory; \
                     this device: {}), not {:?} at head_dim {}",
                    self.max_shared_per_cta, problem.dtypes.q, problem.shape.head_dim
                ),
            });
        }
        let group_elems = problem.shape.group_size() * problem.shape.head_dim;
        if self.kernel == DecodeKernel::Staged && group_elems > MAX_GROUP_ELEMS {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: format!(
                    "{} query heads per KV head at head_dim {} ({group_elems} > {MAX_GROUP_ELEMS} elements per CTA)",
                    problem.shape.group_size(),
                    problem.shape.head_dim
                ),
            });
        }
        Ok(())
    }

    fn alloc(&self, bytes: usize) -> Result<CudaBuffer> {
        if bytes == 0 {
            return Ok(CudaBuffer { memory: Memory::Empty });
        }
        let slice = self.stream.alloc_zeros::<u8>(bytes).map_err(driver_error)?;
        // Event tracking is off (`with_options`), so taking the address records
        // nothing on the stream.
        let address = slice.device_ptr(&self.stream).0;
        Ok(CudaBuffer { memory: Memory::Owned { slice, address } })
    }

    fn upload(&self, dst: &mut CudaBuffer, src: &[u8]) -> Result<()> {
        if dst.len_bytes() != src.len() {
            return Err(Error::BufferSize { name: "upload destination", expected: src.len(), actual: dst.len_bytes() });
        }
        match &mut dst.memory {
            Memory::Empty => Ok(()),
            Memory::Owned { slice, .. } => self.stream.memcpy_htod(src, slice).map_err(driver_error),
            Memory::Borrowed { address, .. } => {
                self.ctx.bind_to_thread().map_err(driver_error)?;
                // SAFETY: `borrow_device_memory` checked that `src.len()` (the
                // buffer's length) bytes at `address` lie in one device
                // allocation of this context, and its caller vouched that the
                // allocation outlives the buffer. A pageable source is staged
                // by the driver before the call returns.
                unsafe { cudarc::driver::result::memcpy_htod_async(*address, src, self.stream.cu_stream()) }
                    .map_err(driver_error)
            }
        }
    }

    fn download(&self, src: &CudaBuffer, dst: &mut [u8]) -> Result<()> {
        if src.len_bytes() != dst.len() {
            return Err(Error::BufferSize {
                name: "download destination",
                expected: src.len_bytes(),
                actual: dst.len(),
            });
        }
        match &src.memory {
            Memory::Empty => Ok(()),
            Memory::Owned { slice, .. } => self.stream.memcpy_dtoh(slice, dst).map_err(driver_error),
            Memory::Borrowed { address, .. } => {
                self.ctx.bind_to_thread().map_err(driver_error)?;
                // SAFETY: as in `upload`, for `dst.len()` bytes at `address`;
                // `dst` stays borrowed until the synchronize below.
                unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, *address, self.stream.cu_stream()) }
                    .map_err(driver_error)
            }
        }?;
        self.stream.synchronize().map_err(driver_error)
    }

    fn decode(&self, plan: &Plan, args: DecodeArgs<'_, CudaBuffer>) -> Result<()> {
        self.enqueue_decode(self.stream.cu_stream(), plan, args)
    }

    fn merge_attn_states(&self, args: MergeArgs<'_, CudaBuffer>) -> Result<()> {
        self.enqueue_merge(self.stream.cu_stream(), args)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_error)
    }

    fn time_us(&self, work: &mut dyn FnMut() -> Result<()>, warmup: usize, reps: usize) -> Result<f64> {
        let graph = self.capture(work)?;
        for _ in 0..warmup {
            graph.replay()?;
        }
        let reps = reps.max(1);
        Ok(self.elapsed_us(|| (0..reps).try_for_each(|_| graph.replay()))? / reps as f64)
    }

    fn copy_bandwidth_gbps(&self, bytes: usize) -> Result<f64> {
        let src = self.alloc(bytes)?;
        let mut dst = self.alloc(bytes)?;
        let (Memory::Owned { slice: src, .. }, Memory::Owned { slice: dst, .. }) = (&src.memory, &mut dst.memory)
        else {
            return Err(Error::BufferSize { name: "copy bandwidth buffer", expected: 1, actual: 0 });
        };
        // Timed on the stream, not in a graph: a memcpy node of a graph may run
        // on a copy engine, which is slower than the kernel a stream copy uses
        // (and than what the peers' torch copy measures).
        let copies = 10;
        let mut run = || -> Result<f64> {
            let us = self
                .elapsed_us(|| (0..copies).try_for_each(|_| self.stream.memcpy_dtod(src, dst).map_err(driver_error)))?;
            Ok(us / copies as f64)
        };
        run()?; // warm-up
        let us = (0..3).map(|_| run()).collect::<Result<Vec<f64>>>()?.into_iter().fold(f64::INFINITY, f64::min);
        Ok(2.0 * bytes as f64 / (us * 1e3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decode_attn_core::{AttentionShape, DTypes};

    fn problem(dtype: DType, head_dim: usize, layout: KvLayout) -> DecodeProblem {
        let shape = AttentionShape::new(32, 8, head_dim).expect("a valid shape");
        DecodeProblem::new(shape, DTypes::uniform(dtype), layout, vec![100]).expect("a valid problem")
    }

    /// Opt-in shared memory per CTA of an H100/H200 (sm_90) and an A100 (sm_80).
    const SM90_SHARED: usize = 232448;
    const SM80_SHARED: usize = 166912;

    #[test]
    fn the_tensor_core_kernel_takes_f16_and_bf16_at_every_block_size() {
        assert!(mma_applies(&problem(DType::Bf16, 128, KvLayout::block_table(16)), SM90_SHARED));
        assert!(mma_applies(&problem(DType::F16, 128, KvLayout::block_table(64)), SM90_SHARED));
        assert!(mma_applies(&problem(DType::Bf16, 128, KvLayout::token_indices(1)), SM90_SHARED));
        assert!(mma_applies(&problem(DType::Bf16, 128, KvLayout::block_table(48)), SM90_SHARED));
        assert!(!mma_applies(&problem(DType::F32, 128, KvLayout::block_table(16)), SM90_SHARED));
    }

    #[test]
    fn plans_with_more_splits_than_the_reducers_first_round_take_the_wide_reducer() {
        // 256 threads over float4 columns: 8 split lanes at head_dim 128, 16
        // at 64, 4 at 256; 8 rows each in the narrow reducer's first round.
        assert_eq!(reduce_function("bf16_d128", 128, 2), "decode_stream_reduce_bf16_d128");
        assert_eq!(reduce_function("bf16_d128", 128, 64), "decode_stream_reduce_bf16_d128");
        assert_eq!(reduce_function("bf16_d128", 128, 65), "decode_stream_reduce_wide_bf16_d128");
        assert_eq!(reduce_function("bf16_d128", 128, 128), "decode_stream_reduce_wide_bf16_d128");
        assert_eq!(reduce_function("f16_d64", 64, 128), "decode_stream_reduce_f16_d64");
        assert_eq!(reduce_function("f16_d64", 64, 129), "decode_stream_reduce_wide_f16_d64");
        assert_eq!(reduce_function("f32_d256", 256, 32), "decode_stream_reduce_f32_d256");
        assert_eq!(reduce_function("f32_d256", 256, 33), "decode_stream_reduce_wide_f32_d256");
    }

    #[test]
    fn block_sizes_that_are_not_powers_of_two_have_their_own_entry_point() {
        let name = |layout| mma_function(&problem(DType::Bf16, 128, layout));
        assert_eq!(name(KvLayout::block_table(16)), "decode_mma_bf16_d128");
        assert_eq!(name(KvLayout::block_table(64)), "decode_mma_bf16_d128");
        assert_eq!(name(KvLayout::token_indices(1)), "decode_mma_bf16_d128");
        assert_eq!(name(KvLayout::block_table(48)), "decode_mma_bf16_d128_anyblock");
        assert_eq!(name(KvLayout::block_table(544)), "decode_mma_bf16_d128_anyblock");
    }

    #[test]
    fn head_dim_256_takes_the_tensor_core_kernel_where_its_shared_memory_fits() {
        let wide = problem(DType::Bf16, 256, KvLayout::block_table(16));
        assert!(mma_applies(&wide, SM90_SHARED));
        assert!(!mma_applies(&wide, SM80_SHARED), "{MMA_WIDE_SHARED_BYTES} bytes do not fit an A100's CTA");
        // Head dim 128 fits both; 192 has no instantiation.
        assert!(mma_applies(&problem(DType::F16, 128, KvLayout::block_table(16)), SM80_SHARED));
        assert!(!mma_applies(&problem(DType::Bf16, 192, KvLayout::block_table(16)), SM90_SHARED));
        assert_eq!(mma_shared_bytes(256), MMA_WIDE_SHARED_BYTES);
        assert_eq!(mma_shared_bytes(128), MMA_RING_BYTES);
    }

    #[test]
    fn auto_launches_heads_first_only_past_one_wave() {
        let auto = |grid, head_dim| heads_first(GridOrder::Auto, grid, head_dim, 132);
        // Llama-3-8B at B=64: 512 CTAs, two per multiprocessor: two waves.
        assert!(auto((64, 8, 1), 128));
        // B=4 s=16384: 8 splits, 256 CTAs, one wave of 264.
        assert!(!auto((4, 8, 8), 128));
        assert!(!auto((33, 8, 1), 128)); // exactly 264
        assert!(auto((34, 8, 1), 128));
        // head_dim 256: one CTA per multiprocessor.
        assert!(auto((17, 8, 1), 256));
        assert!(!auto((16, 8, 1), 256));
        // The y dimension's limit: sequences first whatever the order asks.
        assert!(!auto((70000, 8, 1), 128));
        assert!(!heads_first(GridOrder::HeadsFirst, (70000, 1, 1), 128, 132));
        assert!(heads_first(GridOrder::HeadsFirst, (1, 1, 1), 128, 132));
        assert!(!heads_first(GridOrder::SeqsFirst, (64, 8, 8), 128, 132));
    }

    /// A bandwidth `auto` cannot plan with is refused before any device is
    /// touched, quoting the value, whether or not a GPU is present.
    #[test]
    fn a_plan_bandwidth_that_is_not_positive_is_refused() {
        for gbps in [0.0, -3000.0, f64::NAN, f64::INFINITY] {
            let options = CudaOptions { plan_bandwidth_gbps: Some(gbps), ..CudaOptions::default() };
            let err = CudaBackend::with_options(0, options).err().expect("refused").to_string();
            assert!(err.contains(&format!("plan_bandwidth_gbps {gbps} (expected a positive")), "{err}");
        }
    }
}

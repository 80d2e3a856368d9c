//! ROCm/HIP backend of decode-attn.
//!
//! * The HIP runtime (`libamdhip64`) and hiprtc are loaded at run time with
//!   dlopen, so a binary built with this crate starts on machines with no
//!   ROCm at all, and [`device_count`] / [`HipBackend::new`] say why there is
//!   no device instead of panicking. Nothing links to ROCm at build time.
//! * Kernels (kernels/hip: the kv-head-grid partitioned kernel in
//!   decode_kvgrid.hip, the state merge in merge_states.hip, each file its
//!   own module): the code object compiled at build time for the device's
//!   architecture (gfx90a, gfx942) when build.rs found a compiler; otherwise,
//!   or for any other architecture, the embedded source compiled by hiprtc
//!   at first use for the device's exact `gcnArchName` and cached on disk.
//!   (clang-19 writes code object v5, which ROCm 5.x runtimes before v5
//!   support refuse: `Auto` then falls back to hiprtc, which emits what the
//!   runtime loads.) hiprtc builds the decode file a part at a time (one
//!   element type at one head dim, [`KernelPart`]), when a
//!   problem of that part is first planned or run; the merge file whole.
//!   The decode module (or hiprtc's first part, bf16 at head dim 128, whose
//!   occupancy the planner's figures take) loads when the backend opens,
//!   the merge module at the first merge.
//!
//! Layering follows cudarc: [`sys`] holds the raw C signatures, [`runtime`]
//! and [`hiprtc`] the checked calls (every failure an [`Error`] naming the
//! call and HIP's own error text), [`device`] the owning safe types, and this
//! file the backend on top.

pub mod device;
pub mod hiprtc;
pub mod kernels;
pub mod runtime;
pub mod sys;

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use decode_attn_core::{
    DType, DecodeArgs, DecodeAttention, DecodeProblem, DeviceBuffer, DeviceProps, Error, MergeArgs, Plan, Result,
};

use decode_attn_core::abi::{DecodeParams, MergeParams};
use decode_attn_core::kernel_part::KernelPart;
use device::{Context, DeviceMemory, Event, Function, Module, Stream};
pub use hiprtc::{default_cache_dir, Hiprtc, HIPRTC_CANDIDATES};
pub use runtime::{DeviceInfo, Runtime, RUNTIME_CANDIDATES};

const BACKEND: &str = "hip";

/// Where kernels come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelSource {
    /// The embedded code object for the device when there is one and it
    /// loads, else hiprtc.
    #[default]
    Auto,
    /// Only a code object embedded at build time.
    Embedded,
    /// Always hiprtc (with the disk cache).
    Hiprtc,
}

#[derive(Clone, Debug, Default)]
pub struct HipOptions {
    pub kernels: KernelSource,
    /// Cache for hiprtc output; `None` compiles in every process.
    pub cache_dir: Option<PathBuf>,
    /// Libraries tried for hiprtc, in order, before the runtime's own
    /// library; `None` means [`HIPRTC_CANDIDATES`].
    pub hiprtc_candidates: Option<Vec<PathBuf>>,
}

impl HipOptions {
    /// Documented entry point that reads the environment:
    /// `DECODE_ATTN_HIP_KERNELS=auto|embedded|hiprtc` and the cache folder of
    /// [`default_cache_dir`].
    pub fn from_env() -> Result<Self> {
        let kernels = decode_attn_core::env::choice(
            BACKEND,
            "DECODE_ATTN_HIP_KERNELS",
            KernelSource::Auto,
            &[("auto", KernelSource::Auto), ("embedded", KernelSource::Embedded), ("hiprtc", KernelSource::Hiprtc)],
        )?;
        Ok(HipOptions { kernels, cache_dir: default_cache_dir(), hiprtc_candidates: None })
    }
}

/// Whether this build embeds code objects compiled at build time, and for
/// which architectures (those every kernel file has one for).
pub fn embedded_architectures() -> Vec<&'static str> {
    kernels::architectures()
}

/// Number of HIP devices, or why there are none: no runtime library, a
/// runtime older than ROCm 5, or a runtime that finds no device
/// (`hipErrorNoDevice`), as an [`Error::Unavailable`] value.
pub fn device_count() -> Result<usize> {
    device_count_with(&Runtime::load()?)
}

fn device_count_with(runtime: &Runtime) -> Result<usize> {
    let count = runtime.device_count()?;
    if count == 0 {
        return Err(Error::Unavailable { backend: BACKEND, reason: format!("{} reports no device", runtime.library) });
    }
    runtime.check_supported_version()?;
    Ok(count)
}

/// Device memory on a HIP device. Zero-length buffers hold no allocation.
pub struct HipBuffer {
    memory: Option<DeviceMemory>,
}

impl DeviceBuffer for HipBuffer {
    fn len_bytes(&self) -> usize {
        self.memory.as_ref().map_or(0, DeviceMemory::len)
    }
}

/// One HIP device with the decode kernels loaded, working on one stream.
pub struct HipBackend {
    // Dropped in this order: kernel handles, then the modules they belong to,
    // then the stream, then (when the last buffer is gone) the runtime.
    // Lock order: `functions`, then `modules`.
    functions: Mutex<HashMap<String, Function>>,
    /// The modules of each kernel file loaded so far (never removed, so the
    /// handles in `functions` stay valid).
    modules: Mutex<Vec<FileModules>>,
    stream: Stream,
    ctx: Arc<Context>,
    info: DeviceInfo,
    props: DeviceProps,
    options: HipOptions,
    kernel_origin: String,
}

/// The modules of one kernel file (kernels::KernelFile) and where they came from.
struct FileModules {
    stem: &'static str,
    origin: String,
    modules: Modules,
}

enum Modules {
    /// The whole file in one module: its embedded code object, or hiprtc's
    /// compile of a file that is not built in parts (the merge).
    Whole(Module),
    /// hiprtc's compiles of the decode file, a part at a time, each when a
    /// function of it is first asked for.
    Parts { hiprtc: Hiprtc, source: &'static kernels::KernelFile, arch: String, loaded: Vec<(KernelPart, Module)> },
}

impl FileModules {
    /// The module that defines kernel `name`, compiling and loading its part
    /// first where the file is built in parts.
    fn module_for(&mut self, name: &str, ctx: &Arc<Context>, cache_dir: Option<&std::path::Path>) -> Result<&Module> {
        match &mut self.modules {
            Modules::Whole(module) => Ok(module),
            Modules::Parts { hiprtc, source, arch, loaded } => {
                let part = KernelPart::of_function(name).ok_or_else(|| Error::Device {
                    backend: BACKEND,
                    message: format!("kernel {name} belongs to no part of {}", source.name),
                })?;
                let index = match loaded.iter().position(|(p, _)| *p == part) {
                    Some(index) => index,
                    None => {
                        let code = hiprtc
                            .compile(&source.source(), &part.defines(), arch, cache_dir)
                            .map_err(|e| part.annotate(source.name, e))?;
                        loaded.push((part, Module::load(ctx, &code)?));
                        loaded.len() - 1
                    }
                };
                Ok(&loaded[index].1)
            }
        }
    }
}

impl HipBackend {
    /// Opens device `ordinal` with default options (no hiprtc cache).
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_options(ordinal, HipOptions::default())
    }

    pub fn with_options(ordinal: usize, options: HipOptions) -> Result<Self> {
        Self::open(Runtime::load()?, ordinal, &options)
    }

    /// Opens device `ordinal` of an already loaded runtime (tests load one
    /// from a path of their choosing).
    pub fn open(runtime: Runtime, ordinal: usize, options: &HipOptions) -> Result<Self> {
        let count = device_count_with(&runtime)?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                backend: BACKEND,
                reason: format!("device {ordinal} requested but only {count} present"),
            });
        }
        runtime.set_device(ordinal)?;
        let info = DeviceInfo::query(&runtime, ordinal)?;
        let ctx = Arc::new(Context { runtime, ordinal });
        let stream = Stream::new(&ctx)?;
        let decode_modules = load_file(&ctx, &info, options, kernels::DECODE_FILE)?;
        let kernel_origin = decode_modules.origin.clone();
        let peak = info.peak_bandwidth_gbps();
        let mut backend = HipBackend {
            props: DeviceProps {
                name: format!("{} ({})", info.name, info.arch_name),
                num_sms: info.compute_units.max(1),
                ctas_per_sm: 2,
                // Streaming reaches about 90% of the peak the clocks give.
                mem_bandwidth_gbps: if peak > 0.0 { 0.9 * peak } else { 1600.0 },
                // A dependent launch costs more on ROCm than on CUDA.
                launch_overhead_us: 4.0,
                // Not measured on AMD hardware: the H200 figure.
                reduce_cta_gbps: decode_attn_core::GPU_REDUCE_CTA_GBPS,
                // The kv-grid kernel walks its tiles with the whole workgroup.
                tiles_per_cta_step: 1,
                // Not measured on AMD hardware: the H200 tensor-core kernel's.
                lone_cta_share: decode_attn_core::GPU_LONE_CTA_SHARE,
                // The kv-grid kernel serves a KV head's whole group per workgroup.
                max_query_heads_per_cta: 0,
                // Not measured on AMD hardware: the H200 figure.
                empty_cta_us: decode_attn_core::GPU_EMPTY_CTA_US,
                // The kv-grid kernel's workgroup takes one split.
                splits_per_cta: 1,
                // Its reducer merges every split, lone or not.
                reduce_wait_us: None,
                cuts_by_batch: false,
            },
            functions: Mutex::new(HashMap::new()),
            modules: Mutex::new(vec![decode_modules]),
            stream,
            ctx,
            info,
            options: options.clone(),
            kernel_origin,
        };
        // The planner's occupancy: Llama-shaped workgroups of the kernel.
        let probe = backend.function(&kernels::decode_kernel(DType::Bf16, 128))?;
        // SAFETY: `probe` belongs to the module `backend` holds.
        if let Some(blocks) = unsafe { backend.ctx.runtime.occupancy(probe.raw(), kernels::THREADS) } {
            backend.props.ctas_per_sm = blocks;
        }
        Ok(backend)
    }

    /// Where the decode kernels came from (embedded code object or hiprtc).
    pub fn kernel_origin(&self) -> &str {
        &self.kernel_origin
    }

    /// `(file stem, origin)` of every module loaded so far: the decode
    /// kernels' always, the merge kernel's after the first merge.
    pub fn kernel_origins(&self) -> Vec<(&'static str, String)> {
        match self.modules.lock() {
            Ok(modules) => modules.iter().map(|m| (m.stem, m.origin.clone())).collect(),
            Err(_) => vec![(kernels::DECODE_FILE, self.kernel_origin.clone())],
        }
    }

    /// What the runtime reports about the device.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    fn function(&self, name: &str) -> Result<Function> {
        let mut functions = self.functions.lock().map_err(|_| Error::Device {
            backend: BACKEND,
            message: "kernel table lock poisoned by an earlier panic".into(),
        })?;
        if let Some(f) = functions.get(name) {
            return Ok(*f);
        }
        let stem = kernels::kernel_file(name);
        let mut modules = self.modules.lock().map_err(|_| Error::Device {
            backend: BACKEND,
            message: "module table lock poisoned by an earlier panic".into(),
        })?;
        let index = match modules.iter().position(|m| m.stem == stem) {
            Some(index) => index,
            None => {
                modules.push(load_file(&self.ctx, &self.info, &self.options, stem)?);
                modules.len() - 1
            }
        };
        let file = &mut modules[index];
        self.ctx.activate()?;
        let module = file.module_for(name, &self.ctx, self.options.cache_dir.as_deref())?;
        let f = module.function(name).map_err(|e| Error::Device {
            backend: BACKEND,
            message: format!("kernel {name} missing from the loaded {stem} module ({}): {e}", file.origin),
        })?;
        functions.insert(name.to_string(), f);
        Ok(f)
    }

    /// The device address of `buffer` (0 for an empty one), or an error when
    /// it lives on another device.
    fn addr(&self, buffer: &HipBuffer, name: &'static str) -> Result<u64> {
        match &buffer.memory {
            None => Ok(0),
            Some(memory) if memory.ordinal() == self.ctx.ordinal => Ok(memory.ptr()),
            Some(memory) => Err(Error::Device {
                backend: BACKEND,
                message: format!(
                    "buffer `{name}` lives on hip:{} but this backend is hip:{}",
                    memory.ordinal(),
                    self.ctx.ordinal
                ),
            }),
        }
    }

    /// Microseconds the work `enqueue` puts on the stream takes, between two
    /// device events (waits for it to finish).
    fn elapsed_us(&self, enqueue: impl FnOnce() -> Result<()>) -> Result<f64> {
        let start = Event::new(&self.ctx)?;
        let end = Event::new(&self.ctx)?;
        start.record(&self.stream)?;
        enqueue()?;
        end.record(&self.stream)?;
        end.synchronize()?;
        Ok(start.elapsed_ms(&end)? as f64 * 1e3)
    }
}

/// Why no embedded code object of kernel file `stem` serves `arch`, for messages.
fn no_embedded_object(stem: &str, arch: &str) -> String {
    let archs: Vec<&str> = kernels::file(stem).map_or(Vec::new(), |f| f.code_objects.iter().map(|o| o.0).collect());
    if archs.is_empty() {
        format!("this build embeds no HIP code objects for {arch} ({})", kernels::aot_note())
    } else {
        format!("this build embeds code objects for {} only, not {arch}", archs.join(", "))
    }
}

/// The modules of kernel file `stem` (decode_kvgrid, merge_states) for this
/// device: its embedded code object, else hiprtc (as `options` allow: the
/// decode file a part at a time, each compiled when first asked for), and a
/// note on where they come from.
fn load_file(ctx: &Arc<Context>, info: &DeviceInfo, options: &HipOptions, stem: &'static str) -> Result<FileModules> {
    let arch = info.arch_name.as_str();
    let mut why_hiprtc = no_embedded_object(stem, arch);
    let objects = kernels::file(stem).map_or(&[][..], |f| f.code_objects);
    if options.kernels != KernelSource::Hiprtc {
        match kernels::select(arch, objects) {
            Some((object_arch, bytes)) => match Module::load(ctx, bytes) {
                Ok(module) => {
                    let origin = format!("embedded code object ({object_arch})");
                    return Ok(FileModules { stem, origin, modules: Modules::Whole(module) });
                }
                Err(err) if options.kernels == KernelSource::Embedded => return Err(err),
                Err(err) => why_hiprtc = format!("the embedded {object_arch} code object was refused: {err}"),
            },
            None if options.kernels == KernelSource::Embedded => {
                return Err(Error::Unavailable { backend: BACKEND, reason: why_hiprtc })
            }
            None => {}
        }
    } else {
        why_hiprtc = "hiprtc was asked for".into();
    }
    let hiprtc = match &options.hiprtc_candidates {
        Some(candidates) => {
            let mut all: Vec<PathBuf> = candidates.clone();
            all.push(PathBuf::from(&ctx.runtime.library));
            Hiprtc::load_from(&all)
        }
        None => Hiprtc::load(Some(&ctx.runtime.library)),
    };
    let (hiprtc, source) = hiprtc_for(hiprtc, stem, &why_hiprtc)?;
    let (major, minor) = hiprtc.version();
    let origin = format!("hiprtc {major}.{minor} ({}), {arch}; {why_hiprtc}", hiprtc.library);
    if stem == kernels::DECODE_FILE {
        let origin = format!("{origin}; a part at a time");
        let modules = Modules::Parts { hiprtc, source, arch: arch.to_string(), loaded: Vec::new() };
        return Ok(FileModules { stem, origin, modules });
    }
    let code = hiprtc.compile(&source.source(), &[], arch, options.cache_dir.as_deref())?;
    Ok(FileModules { stem, origin, modules: Modules::Whole(Module::load(ctx, &code)?) })
}

/// `hiprtc` and the embedded source of kernel file `stem`, or why hiprtc
/// cannot build it (`why_hiprtc` is why the embedded code objects did not
/// serve).
fn hiprtc_for(hiprtc: Result<Hiprtc>, stem: &str, why_hiprtc: &str) -> Result<(Hiprtc, &'static kernels::KernelFile)> {
    let Some(file) = kernels::file(stem) else {
        return Err(Error::Unavailable {
            backend: BACKEND,
            reason: format!(
                "{why_hiprtc}, and it has no HIP kernel source for hiprtc (kernels/hip had no {stem}.hip at build time)"
            ),
        });
    };
    let hiprtc = hiprtc.map_err(|err| {
        let detail = match err {
            Error::Unavailable { reason, .. } => reason,
            other => other.to_string(),
        };
        Error::Unavailable {
            backend: BACKEND,
            reason: format!(
                "{why_hiprtc}, and hiprtc cannot compile the source: {detail}. Install ROCm's hiprtc (libhiprtc) or \
                 rebuild with clang-19 and the ROCm device libraries present"
            ),
        }
    })?;
    Ok((hiprtc, file))
}

impl DecodeAttention for HipBackend {
    type Buffer = HipBuffer;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn device_props(&self) -> &DeviceProps {
        &self.props
    }

    fn supports(&self, problem: &DecodeProblem) -> Result<()> {
        supports(problem)
    }

    /// Plans `problem`, and loads its kernels now: on the hiprtc path that
    /// compiles their part, once, here rather than in the first decode.
    fn plan(&self, problem: &DecodeProblem, policy: decode_attn_core::Policy) -> Result<Plan> {
        self.supports(problem)?;
        let plan = decode_attn_core::plan(problem, policy, &self.props)?;
        self.function(&kernels::decode_kernel(problem.dtypes.q, problem.shape.head_dim))?;
        Ok(plan)
    }

    fn alloc(&self, bytes: usize) -> Result<HipBuffer> {
        if bytes == 0 {
            return Ok(HipBuffer { memory: None });
        }
        Ok(HipBuffer { memory: Some(DeviceMemory::zeroed(&self.ctx, bytes, &self.stream)?) })
    }

    fn upload(&self, dst: &mut HipBuffer, src: &[u8]) -> Result<()> {
        if dst.len_bytes() != src.len() {
            return Err(Error::BufferSize { name: "upload destination", expected: src.len(), actual: dst.len_bytes() });
        }
        let ptr = self.addr(dst, "upload destination")?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.activate()?;
        // SAFETY: `dst` owns exactly `src.len()` bytes at `ptr` (checked above);
        // the copy is complete when the call returns.
        unsafe { self.ctx.runtime.memcpy_htod(ptr as *mut c_void, src, self.stream.raw()) }
    }

    fn download(&self, src: &HipBuffer, dst: &mut [u8]) -> Result<()> {
        if src.len_bytes() != dst.len() {
            return Err(Error::BufferSize {
                name: "download destination",
                expected: src.len_bytes(),
                actual: dst.len(),
            });
        }
        let ptr = self.addr(src, "download source")?;
        self.ctx.activate()?;
        if !dst.is_empty() {
            // SAFETY: `src` owns exactly `dst.len()` bytes at `ptr`; the copy
            // is ordered after earlier work on the stream and complete on return.
            unsafe { self.ctx.runtime.memcpy_dtoh(dst, ptr as *const c_void, self.stream.raw()) }?;
        }
        self.stream.synchronize()
    }

    fn decode(&self, plan: &Plan, args: DecodeArgs<'_, HipBuffer>) -> Result<()> {
        let problem = &plan.problem;
        self.supports(problem)?;
        let checked = args.check(plan)?;
        if plan.rule.is_batch() {
            // The portable kernel evaluates the per-sequence rule only; a
            // batch rule comes from a plan made for the CUDA backend.
            return Err(Error::Unsupported {
                backend: "hip",
                what: format!("a split rule cut by the batch (batch_splits {})", plan.rule.batch_splits),
            });
        }
        if problem.num_seqs() == 0 {
            return Ok(());
        }
        let launch = launch_shape(plan)?;
        let params = DecodeParams::new(plan, &args, &checked, |buffer, name| self.addr(buffer, name))?;
        // Both kernels are looked up before the first launch, so that a
        // missing one fails with nothing written.
        let dtype = problem.dtypes.q;
        let main = self.function(&kernels::decode_kernel(dtype, problem.shape.head_dim))?;
        let reduce = match launch.split {
            true => Some(self.function(&kernels::reduce_kernel(dtype, problem.shape.head_dim))?),
            false => None,
        };
        self.ctx.activate()?;
        let mut by_value = params;
        let mut kernel_params = [(&mut by_value as *mut DecodeParams).cast::<c_void>()];
        let block = (kernels::THREADS, 1, 1);
        // SAFETY: the kernels take one `DecodeParams` by value, which `by_value`
        // mirrors byte for byte (core's abi tests pin its layout); every address in
        // it points into a live allocation of this device whose size
        // `DecodeArgs::check` and `launch_shape` verified against the plan; the
        // kernels bound-check block ids, slots and lengths read from device
        // memory; the runtime copies the parameters at launch.
        unsafe { self.ctx.runtime.launch(main.raw(), launch.grid, block, 0, self.stream.raw(), &mut kernel_params) }?;
        if let Some(reduce) = reduce {
            // SAFETY: as above; the reducer reads the partial rows the first
            // kernel wrote, in stream order.
            unsafe {
                self.ctx.runtime.launch(
                    reduce.raw(),
                    launch.reduce_grid,
                    block,
                    0,
                    self.stream.raw(),
                    &mut kernel_params,
                )
            }?;
        }
        Ok(())
    }

    fn merge_attn_states(&self, args: MergeArgs<'_, HipBuffer>) -> Result<()> {
        args.check()?;
        if !kernels::DTYPES.contains(&args.dtype) {
            return Err(Error::UnsupportedDTypes {
                backend: BACKEND,
                q: args.dtype,
                kv: args.dtype,
                out: args.dtype,
                why: "the HIP merge kernel is built for f32, f16 and bf16",
            });
        }
        if args.num_tokens == 0 || args.num_heads == 0 {
            return Ok(());
        }
        let grid = kernels::merge_grid(args.num_tokens, args.num_heads, args.head_dim, args.dtype)?;
        let count = |value: usize, what: &str| {
            i32::try_from(value)
                .map_err(|_| Error::Unsupported { backend: BACKEND, what: format!("a merge of {value} {what}") })
        };
        let params = MergeParams {
            prefix: self.addr(args.prefix, "prefix")?,
            prefix_lse: self.addr(args.prefix_lse, "prefix_lse")?,
            suffix: self.addr(args.suffix, "suffix")?,
            suffix_lse: self.addr(args.suffix_lse, "suffix_lse")?,
            out: self.addr(args.out, "out")?,
            out_lse: match args.out_lse.as_deref() {
                Some(out_lse) => self.addr(out_lse, "out_lse")?,
                None => 0,
            },
            num_tokens: count(args.num_tokens, "tokens")?,
            num_heads: count(args.num_heads, "heads")?,
            head_dim: count(args.head_dim, "dims a head")?,
            _pad: 0,
        };
        // Looked up (the merge module loaded, at the first merge) before
        // anything is launched.
        let merge = self.function(&kernels::merge_kernel(args.dtype))?;
        self.ctx.activate()?;
        let mut by_value = params;
        let mut kernel_params = [(&mut by_value as *mut MergeParams).cast::<c_void>()];
        // SAFETY: merge_states_<T> takes one `MergeParams` by value, which
        // `by_value` mirrors byte for byte (core's abi tests pin its layout
        // against decode_params.h); `MergeArgs::check` verified that prefix,
        // suffix and out hold num_tokens * num_heads * head_dim elements of
        // `dtype` and the LSE buffers num_tokens * num_heads f32 each, `addr`
        // that all live on this device, and out_lse is null when absent, which
        // the kernel tests; `merge_grid` is the grid merge_states.hip expects
        // (threads past the last chunk return without touching memory); the
        // runtime copies the parameters at launch; a buffer dropped before the
        // kernel ends is freed by hipFree, which waits for the device first.
        unsafe {
            self.ctx.runtime.launch(
                merge.raw(),
                grid,
                (kernels::THREADS, 1, 1),
                0,
                self.stream.raw(),
                &mut kernel_params,
            )
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }

    /// HIP times `work`'s launches on the stream directly (no graph capture):
    /// `warmup` untimed runs, then `reps` runs between two events.
    fn time_us(&self, work: &mut dyn FnMut() -> Result<()>, warmup: usize, reps: usize) -> Result<f64> {
        for _ in 0..warmup {
            work()?;
        }
        self.synchronize()?;
        let reps = reps.max(1);
        Ok(self.elapsed_us(|| (0..reps).try_for_each(|_| work()))? / reps as f64)
    }

    fn copy_bandwidth_gbps(&self, bytes: usize) -> Result<f64> {
        if bytes == 0 {
            return Err(Error::BufferSize { name: "copy bandwidth buffer", expected: 1, actual: 0 });
        }
        let src = self.alloc(bytes)?;
        let dst = self.alloc(bytes)?;
        let (src, dst) = (self.addr(&src, "src")?, self.addr(&dst, "dst")?);
        let copies = 10;
        let run = || -> Result<f64> {
            let us = self.elapsed_us(|| {
                (0..copies).try_for_each(|_| {
                    // SAFETY: both buffers own `bytes` bytes and outlive the
                    // copies (elapsed_us waits for them).
                    unsafe {
                        self.ctx.runtime.memcpy_dtod_async(
                            dst as *mut c_void,
                            src as *const c_void,
                            bytes,
                            self.stream.raw(),
                        )
                    }
                })
            })?;
            Ok(us / copies as f64)
        };
        self.ctx.activate()?;
        run()?; // warm-up
        let us = (0..3).map(|_| run()).collect::<Result<Vec<f64>>>()?.into_iter().fold(f64::INFINITY, f64::min);
        Ok(2.0 * bytes as f64 / (us * 1e3))
    }
}

/// What the kernels run: one element type for Q, KV and the output (f32,
/// f16, bf16), the supported head dims, any group size (groups of more than
/// 16 query heads run in passes of 16 inside the kernel).
pub fn supports(problem: &DecodeProblem) -> Result<()> {
    problem.validate()?;
    let d = problem.dtypes;
    if d.q != d.kv || d.kv != d.out {
        return Err(Error::UnsupportedDTypes {
            backend: BACKEND,
            q: d.q,
            kv: d.kv,
            out: d.out,
            why: "the HIP kernels take one element type for Q, KV and output",
        });
    }
    if !kernels::DTYPES.contains(&d.q) {
        return Err(Error::UnsupportedDTypes {
            backend: BACKEND,
            q: d.q,
            kv: d.kv,
            out: d.out,
            why: "the HIP kernels are built for f32, f16 and bf16",
        });
    }
    Ok(())
}

/// The grids of one decode and where its partial rows go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LaunchShape {
    /// `(num_seqs, num_splits, num_kv_heads)`.
    grid: (u32, u32, u32),
    /// `(num_seqs, num_q_heads, 1)`, used only when `split`.
    reduce_grid: (u32, u32, u32),
    num_splits: u32,
    split: bool,
}

/// The launch for `plan`: an error, before anything runs, when the grid does
/// not fit. (`DecodeArgs::check` has already checked the workspace against
/// the partial rows the plan's split count implies.)
fn launch_shape(plan: &Plan) -> Result<LaunchShape> {
    let problem = &plan.problem;
    let shape = problem.shape;
    let num_splits = plan.rule.num_splits.max(1);
    let split = num_splits > 1;
    let dim = |value: usize, what: &str| {
        u32::try_from(value)
            .ok()
            .filter(|&v| v <= i32::MAX as u32)
            .ok_or_else(|| Error::Unsupported { backend: BACKEND, what: format!("a grid of {value} {what}") })
    };
    let num_seqs = dim(problem.num_seqs(), "sequences")?;
    Ok(LaunchShape {
        grid: (num_seqs, num_splits, dim(shape.num_kv_heads, "KV heads")?),
        reduce_grid: (num_seqs, dim(shape.num_q_heads, "query heads")?, 1),
        num_splits,
        split,
    })
}

#[cfg(test)]
mod tests {
    use decode_attn_core::shape::SUPPORTED_HEAD_DIMS;
    use decode_attn_core::{AttentionShape, DTypes, DeviceProps, KvLayout, Policy};

    use super::*;
    use crate::kernels::missing_symbols;

    #[test]
    fn no_usable_device_is_an_error_value_not_a_panic() {
        // CI has no AMD GPU (with or without a HIP runtime installed): the
        // probe must say why, never panic.
        let err = device_count().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Unavailable { backend: "hip", .. }), "{err:?}");
        match Runtime::load() {
            // Without a runtime the reason names every library tried.
            Err(_) => assert!(text.contains("libamdhip64.so.5"), "{text}"),
            // With one but no device, the runtime's own error name.
            Ok(runtime) => {
                assert!(runtime.version().is_ok());
                if runtime.device_count().is_err() {
                    assert!(text.contains("hipGetDeviceCount failed: hipError"), "{text}");
                }
            }
        }
        // Opening a device says the same, as an error value.
        let err = HipBackend::new(0).err().expect("no AMD GPU here");
        assert!(matches!(err, Error::Unavailable { backend: "hip", .. }), "{err:?}");
    }

    #[test]
    fn an_absent_runtime_is_unavailable_with_the_paths_tried() {
        let err = Runtime::load_from(&["/nonexistent/libamdhip64.so.6"]).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("hip backend is not available: no HIP runtime found"), "{text}");
        assert!(text.contains("/nonexistent/libamdhip64.so.6"), "{text}");
    }

    #[test]
    fn a_runtime_without_devices_reports_hip_error_no_device() {
        // Debian's libamdhip64 5.2 is installed on the CI machine, which has no AMD GPU.
        let Ok(runtime) = Runtime::load() else {
            eprintln!("no HIP runtime installed: skipping");
            return;
        };
        match HipBackend::open(runtime, 0, &HipOptions::default()) {
            Ok(_) => eprintln!("a HIP device is present: nothing to check"),
            Err(err) => {
                let text = err.to_string();
                assert!(matches!(err, Error::Unavailable { backend: "hip", .. }), "{err:?}");
                assert!(text.contains("hipErrorNoDevice") || text.contains("reports no device"), "{text}");
            }
        }
    }

    #[test]
    fn absent_hiprtc_explains_both_missing_paths() {
        for stem in [kernels::DECODE_FILE, kernels::MERGE_FILE, "not_a_kernel_file"] {
            let hiprtc = Hiprtc::load_from(&["/nonexistent/libhiprtc.so.6"]);
            let why = no_embedded_object(stem, "gfx1100");
            let err = hiprtc_for(hiprtc, stem, &why).err().unwrap();
            let text = err.to_string();
            assert!(matches!(err, Error::Unavailable { backend: "hip", .. }), "{err:?}");
            assert!(text.contains("gfx1100"), "{text}");
            if kernels::file(stem).is_some() {
                assert!(text.contains("hiprtc cannot compile the source: no hiprtc found"), "{text}");
                assert!(text.contains("/nonexistent/libhiprtc.so.6"), "{text}");
                assert!(text.contains("Install ROCm's hiprtc"), "{text}");
            } else {
                assert!(text.contains("no HIP kernel source"), "{text}");
                assert!(text.contains(&format!("no {stem}.hip")), "{text}");
            }
        }
    }

    /// The merge kernel's source through the installed hiprtc, for gfx90a (no
    /// device needed; seconds): every entry point is in the code object.
    /// Skips without hiprtc. (Not gfx942: ROCm 5's hiprtc, Debian's, aborts
    /// the process on an architecture it does not know.)
    #[test]
    fn hiprtc_compiles_the_merge_kernel_when_installed() {
        let arch = "gfx90a";
        let Ok(hiprtc) = Hiprtc::load(RUNTIME_CANDIDATES.first().copied()) else {
            eprintln!("hiprtc not installed: skipping");
            return;
        };
        let library = hiprtc.library.clone();
        let (hiprtc, file) = hiprtc_for(Ok(hiprtc), kernels::MERGE_FILE, "test").unwrap();
        let code = match hiprtc.compile(&file.source(), &[], arch, None) {
            Ok(code) => code,
            // As in hiprtc.rs: some distribution builds cannot compile without a device runtime.
            Err(err) => {
                eprintln!("hiprtc ({library}) could not compile here: {err}");
                return;
            }
        };
        eprintln!("{library}: merge {arch}: {} bytes", code.len());
        let names = kernels::kernel_names(kernels::MERGE_FILE);
        assert_eq!(missing_symbols(&code, &names), Vec::<String>::new(), "{arch}: symbols missing");
    }

    fn problem(heads: usize, kv_heads: usize, dtypes: DTypes, seq_lens: Vec<u32>) -> DecodeProblem {
        let shape = AttentionShape::new(heads, kv_heads, 128).unwrap();
        DecodeProblem::new(shape, dtypes, KvLayout::block_table(16), seq_lens).unwrap()
    }

    #[test]
    fn backend_and_buffers_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<HipBackend>();
        send_sync::<HipBuffer>();
    }

    #[test]
    fn supports_uniform_types_and_any_group() {
        assert!(supports(&problem(32, 8, DTypes::uniform(DType::Bf16), vec![10])).is_ok());
        assert!(supports(&problem(16, 1, DTypes::uniform(DType::F16), vec![10])).is_ok());
        assert!(supports(&problem(8, 8, DTypes::uniform(DType::F32), vec![10])).is_ok());
        assert!(supports(&problem(32, 1, DTypes::uniform(DType::Bf16), vec![10])).is_ok());
        let mixed = DTypes { q: DType::Bf16, kv: DType::F16, out: DType::Bf16 };
        assert!(matches!(supports(&problem(8, 8, mixed, vec![10])), Err(Error::UnsupportedDTypes { .. })));
    }

    /// The decode file's part of one element type at one head dim, through
    /// the installed hiprtc for gfx90a (no device needed), is what `load_file`
    /// builds on the hiprtc path: both of its entry points, and no other
    /// part's. Skips without hiprtc.
    #[test]
    fn hiprtc_compiles_a_part_of_the_decode_kernel_when_installed() {
        let Ok(hiprtc) = Hiprtc::load(RUNTIME_CANDIDATES.first().copied()) else {
            eprintln!("hiprtc not installed: skipping");
            return;
        };
        let library = hiprtc.library.clone();
        let (hiprtc, file) = hiprtc_for(Ok(hiprtc), kernels::DECODE_FILE, "test").unwrap();
        let part = KernelPart::of_problem(DType::F16, 64);
        let started = std::time::Instant::now();
        let code = match hiprtc.compile(&file.source(), &part.defines(), "gfx90a", None) {
            Ok(code) => code,
            Err(err) => {
                eprintln!("hiprtc ({library}) could not compile here: {err}");
                return;
            }
        };
        eprintln!("{library}: part {part}: {} bytes in {:.1} s", code.len(), started.elapsed().as_secs_f64());
        let own = [kernels::decode_kernel(DType::F16, 64), kernels::reduce_kernel(DType::F16, 64)];
        assert_eq!(missing_symbols(&code, &own), Vec::<String>::new());
        let others = [kernels::decode_kernel(DType::Bf16, 64), kernels::reduce_kernel(DType::F16, 128)];
        assert_eq!(missing_symbols(&code, &others), others.to_vec(), "another part's kernels in part {part}");
    }

    /// Every part of the decode file, and the merge file whole, through the
    /// installed hiprtc for gfx90a (no device needed). Minutes: run with
    /// `--ignored`.
    #[test]
    #[ignore]
    fn hiprtc_compiles_every_part_of_the_embedded_kernels() {
        let hiprtc = Hiprtc::load(RUNTIME_CANDIDATES.first().copied()).unwrap();
        let (hiprtc, decode) = hiprtc_for(Ok(hiprtc), kernels::DECODE_FILE, "test").unwrap();
        for &dtype in kernels::DTYPES {
            for &head_dim in SUPPORTED_HEAD_DIMS {
                let part = KernelPart::of_problem(dtype, head_dim);
                let started = std::time::Instant::now();
                let code = hiprtc.compile(&decode.source(), &part.defines(), "gfx90a", None).unwrap();
                eprintln!(
                    "{}: part {part}: {} bytes in {:.1} s",
                    decode.name,
                    code.len(),
                    started.elapsed().as_secs_f64()
                );
                let names = [kernels::decode_kernel(dtype, head_dim), kernels::reduce_kernel(dtype, head_dim)];
                assert_eq!(missing_symbols(&code, &names), Vec::<String>::new(), "part {part}");
            }
        }
        let merge = kernels::file(kernels::MERGE_FILE).unwrap();
        let code = hiprtc.compile(&merge.source(), &[], "gfx90a", None).unwrap();
        assert_eq!(missing_symbols(&code, &kernels::kernel_names(kernels::MERGE_FILE)), Vec::<String>::new());
    }

    #[test]
    fn launch_shapes_follow_the_plan_and_the_kernel_contract() {
        let props = DeviceProps { name: "MI300X".into(), num_sms: 304, ..DeviceProps::gpu_like(304) };
        let p = problem(32, 8, DTypes::uniform(DType::Bf16), vec![4096, 300]);
        let plan = decode_attn_core::plan(&p, Policy::Deterministic { tile_tokens: 256 }, &props).unwrap();
        let launch = launch_shape(&plan).unwrap();
        assert_eq!(launch.num_splits, plan.rule.num_splits);
        assert_eq!(launch.grid, (2, plan.rule.num_splits, 8));
        assert_eq!(launch.reduce_grid, (2, 32, 1));
        assert_eq!(launch.split, plan.rule.num_splits > 1);
        let unsplit = decode_attn_core::plan(&p, Policy::Fixed { splits: 1 }, &props).unwrap();
        let launch = launch_shape(&unsplit).unwrap();
        assert_eq!((launch.grid, launch.split), ((2, 1, 8), false));
    }
}

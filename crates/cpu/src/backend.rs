//! [`CpuBackend`]: the plan executed on host memory with rayon.

use std::time::Instant;

use decode_attn_core::merge::merge_state;
use decode_attn_core::{
    DecodeArgs, DecodeAttention, DecodeProblem, DeviceBuffer, DeviceProps, Error, MergeArgs, Plan, Result, SplitRule,
    TILE_TOKENS,
};
use rayon::prelude::*;

use crate::kernel::{self, Elt, Isa, Scratch, State, Work};
use crate::validate::{self, Index};

const BACKEND: &str = "cpu";

/// A call that reads at most this many bytes of K and V runs on the calling
/// thread, one work item after another. Handing a call to the pool and
/// waiting for it costs more than that much work: about 10-15 µs a call on
/// the 2-core development machine, spent in the kernel's scheduler waking
/// the workers and the caller (`perf`, docs/PERFORMANCE.md, s23).
const INLINE_KV_BYTES: usize = 128 << 10;

/// Host memory: the CPU backend's buffer type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuBuffer(pub Vec<u8>);

impl CpuBuffer {
    pub fn from_bytes(bytes: Vec<u8>) -> CpuBuffer {
        CpuBuffer(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl DeviceBuffer for CpuBuffer {
    fn len_bytes(&self) -> usize {
        self.0.len()
    }
}

#[derive(Debug)]
enum Pool {
    /// rayon's global pool.
    Global,
    Own(rayon::ThreadPool),
    /// None: a backend of one thread runs every call on the calling thread
    /// (`on_pool`), so it starts no worker that would only sit idle.
    Calling,
}

impl Pool {
    fn install<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        match self {
            Pool::Global | Pool::Calling => work(),
            Pool::Own(pool) => pool.install(work),
        }
    }
}

/// Decode attention on the CPU: validates every index on the host, then runs
/// the plan's work items on rayon (see the crate docs).
///
/// The first backend made in a process on Linux, where the CPU has AMX-BF16
/// tiles, asks the kernel once for the process's permission to use them
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, process-wide: signal frames grow by
/// the tiles' 8 KiB); where it is refused, the AVX512_BF16 loop runs.
#[derive(Debug)]
pub struct CpuBackend {
    pool: Pool,
    props: DeviceProps,
    isa: Isa,
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new()
    }
}

impl CpuBackend {
    /// Streaming bandwidth the planner's cost model assumes for a CPU, GB/s.
    pub const MEM_BANDWIDTH_GBPS: f64 = 10.0;
    /// Cost of the split's reduce as the planner sees it, microseconds.
    pub const LAUNCH_OVERHEAD_US: f64 = 5.0;

    /// On rayon's global pool.
    pub fn new() -> CpuBackend {
        CpuBackend::build(Pool::Global, rayon::current_num_threads())
    }

    /// Most workers [`CpuBackend::with_threads`] starts: 4096, past any
    /// machine's hardware threads (asking for a million hung the caller
    /// while the pool started them).
    pub const MAX_THREADS: usize = 4096;

    /// On a pool of its own with `threads` workers (1 to [`Self::MAX_THREADS`]; 0 means 1);
    /// with one, on the calling thread, starting none.
    pub fn with_threads(threads: usize) -> Result<CpuBackend> {
        let threads = threads.max(1);
        Error::check_range("CPU threads", threads as u64, 1, Self::MAX_THREADS as u64)?;
        if threads == 1 {
            return Ok(CpuBackend::build(Pool::Calling, 1));
        }
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| Error::Device {
            backend: BACKEND,
            message: format!("cannot start a pool of {threads} threads: {e}"),
        })?;
        Ok(CpuBackend::build(Pool::Own(pool), threads))
    }

    fn build(pool: Pool, threads: usize) -> CpuBackend {
        let threads = threads.max(1);
        let props = DeviceProps {
            name: format!("CPU ({threads} threads)"),
            // The global pool's size is the environment's; the planner takes
            // no more than MAX_DEVICE_UNITS.
            num_sms: u32::try_from(threads).unwrap_or(u32::MAX).min(decode_attn_core::backend::MAX_DEVICE_UNITS),
            ctas_per_sm: 1,
            mem_bandwidth_gbps: Self::MEM_BANDWIDTH_GBPS,
            launch_overhead_us: Self::LAUNCH_OVERHEAD_US,
            // One thread merges a query head's rows: a core's share of memory.
            reduce_cta_gbps: 10.0,
            // A task walks its tiles one after another.
            tiles_per_cta_step: 1,
            // One task per thread: never more than one per "multiprocessor".
            lone_cta_share: 1.0,
            // A task serves a KV head's whole query group.
            max_query_heads_per_cta: 0,
            // Only active splits become tasks.
            empty_cta_us: 0.0,
            // A task takes one split.
            splits_per_cta: 1,
            // The merge reads every split's partial row, lone or not.
            reduce_wait_us: None,
            cuts_by_batch: false,
        };
        CpuBackend { pool, props, isa: Isa::detect() }
    }

    /// The same backend restricted to portable code (no run-time selected
    /// SIMD path): for tests that compare the paths, and for debugging.
    pub fn portable(mut self) -> CpuBackend {
        self.isa = Isa::Portable;
        self
    }

    /// The same backend using at most AVX2 (not AVX-512) where it would
    /// otherwise use AVX-512: for tests that compare the paths.
    pub fn at_most_avx2(mut self) -> CpuBackend {
        self.isa = self.isa.at_most_avx2();
        self
    }

    /// The same backend without the bf16 dot products of AVX512_BF16 where
    /// the CPU has them (the plain AVX-512 path instead): for tests that
    /// compare the paths, and for timing one against the other.
    pub fn without_bf16_dot(mut self) -> CpuBackend {
        self.isa = self.isa.without_bf16_dot();
        self
    }

    /// The same backend without AMX tiles where the CPU has them (the
    /// AVX512_BF16 path instead): for tests that compare the paths, and for
    /// timing one against the other.
    pub fn without_amx(mut self) -> CpuBackend {
        self.isa = self.isa.without_amx();
        self
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.props.num_sms as usize
    }

    /// Whether work that reads `bytes` goes to the pool's threads, not the
    /// calling thread (`INLINE_KV_BYTES`).
    fn on_pool(&self, bytes: usize) -> bool {
        self.threads() > 1 && bytes > INLINE_KV_BYTES
    }

    /// The instruction set the hot loop runs: "amx-bf16" (bf16 KV with a
    /// bf16 or f16 output, 4-8 query heads per KV head or an even 10-16,
    /// head dims 64, 96 or 128; other problems on "avx512-bf16"'s loop),
    /// "avx512-bf16" (bf16 KV, head dims a multiple of 32; other problems on
    /// "avx512"'s loop), "avx512", "avx2" or "portable".
    pub fn instruction_set(&self) -> &'static str {
        self.isa.name()
    }
}

fn elts(problem: &DecodeProblem) -> Result<(Elt, Elt, Elt)> {
    let t = problem.dtypes;
    match (Elt::of(t.q), Elt::of(t.kv), Elt::of(t.out)) {
        (Some(q), Some(kv), Some(out)) => Ok((q, kv, out)),
        _ => Err(Error::UnsupportedDTypes {
            backend: BACKEND,
            q: t.q,
            kv: t.kv,
            out: t.out,
            why: "the CPU backend reads and writes f32, f16 and bf16 only",
        }),
    }
}

fn alloc_zeroed(bytes: usize) -> Result<Vec<u8>> {
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(bytes).map_err(|_| Error::Device {
        backend: BACKEND,
        message: format!("cannot allocate {bytes} bytes of host memory"),
    })?;
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    advise_huge_pages(&buffer);
    buffer.resize(bytes, 0);
    Ok(buffer)
}

/// Asks Linux to back the 2 MiB-aligned interior of `buffer`'s (not yet
/// touched) capacity with transparent huge pages: the KV pools are read at
/// scattered blocks, and 4 KiB pages make every block a TLB miss (about 10%
/// of a 64k-token decode on the 2-core development machine).
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn advise_huge_pages(buffer: &Vec<u8>) {
    const HUGE: usize = 2 << 20;
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14; // <asm-generic/mman-common.h>, x86-64 and aarch64 alike
    let start = buffer.as_ptr() as usize;
    let aligned = start.next_multiple_of(HUGE);
    let end = (start + buffer.capacity()) / HUGE * HUGE;
    if end > aligned {
        // SAFETY: the range lies inside the allocation `buffer` owns;
        // MADV_HUGEPAGE only changes how the kernel backs those pages, never
        // their contents or validity; a failure is harmless and ignored.
        unsafe {
            madvise(aligned as *mut std::ffi::c_void, end - aligned, MADV_HUGEPAGE);
        }
    }
}

/// How many consecutive KV heads one work item serves: as many as keep the
/// threads busy. An item walks the rows of all its KV heads in each slot, one
/// contiguous run, instead of one head's rows at a stride of a whole slot;
/// each head's arithmetic is the same whoever serves it, so the result does
/// not depend on this choice. `units` is the plan's `(sequence, split)` count.
fn kv_heads_per_item(num_kv_heads: usize, units: usize, threads: usize) -> usize {
    let num_kv_heads = num_kv_heads.max(1);
    let units = units.max(1);
    // The fewest items per `(sequence, split)` that give every thread nearly
    // the same number of items.
    (1..=num_kv_heads)
        .filter(|parts| num_kv_heads.is_multiple_of(*parts))
        .find(|&parts| {
            let items = units * parts;
            let rounds = items.div_ceil(threads.max(1));
            10 * items >= 9 * rounds * threads.max(1)
        })
        .map_or(1, |parts| num_kv_heads / parts)
}

fn put_f32s(dst: &mut [u8], src: &[f32]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

impl DecodeAttention for CpuBackend {
    type Buffer = CpuBuffer;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn device_props(&self) -> &DeviceProps {
        &self.props
    }

    fn supports(&self, problem: &DecodeProblem) -> Result<()> {
        problem.validate()?;
        elts(problem).map(|_| ())
    }

    fn alloc(&self, bytes: usize) -> Result<CpuBuffer> {
        alloc_zeroed(bytes).map(CpuBuffer)
    }

    fn upload(&self, dst: &mut CpuBuffer, src: &[u8]) -> Result<()> {
        if dst.0.len() != src.len() {
            return Err(Error::BufferSize { name: "upload source", expected: dst.0.len(), actual: src.len() });
        }
        dst.0.copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &CpuBuffer, dst: &mut [u8]) -> Result<()> {
        if dst.len() != src.0.len() {
            return Err(Error::BufferSize { name: "download destination", expected: src.0.len(), actual: dst.len() });
        }
        dst.copy_from_slice(&src.0);
        Ok(())
    }

    fn decode(&self, plan: &Plan, args: DecodeArgs<'_, CpuBuffer>) -> Result<()> {
        // The problem first: `check` divides by sizes that only a valid problem makes non-zero.
        self.supports(&plan.problem)?;
        let checked = args.check(plan)?;
        let (q_elt, kv_elt, out_elt) = elts(&plan.problem)?;
        let shape = plan.problem.shape;
        let split = plan.use_split && plan.rule.num_splits > 1;
        let num_splits = if split { plan.rule.num_splits as usize } else { 1 };
        let num_seqs = plan.problem.num_seqs();
        // The workspace this execution touches, whatever the plan's own figure says.
        let needed = if split { num_seqs * shape.num_q_heads * num_splits * (shape.head_dim + 2) * 4 } else { 0 };
        if args.workspace.len_bytes() < needed {
            return Err(Error::WorkspaceTooSmall { needed, actual: args.workspace.len_bytes() });
        }
        let (seq_lens, index) = validate::validate(plan, args.seq_lens, &args.kv_index, &checked)?;
        let tokens: usize = seq_lens.iter().map(|&s| s as usize).sum();
        let kv_bytes = tokens * 2 * shape.num_kv_heads * shape.head_dim * kv_elt.size();
        let threads = self.threads();
        let parallel = self.on_pool(kv_bytes);

        // An unsplit plan of fewer sequences than threads leaves threads idle:
        // the CPU cuts those sequences itself, into private splits of whole
        // slots (the same output within f32 rounding), merged from their
        // states in memory. Splits of at least 16 tiles (256 tokens):
        // a 1024-token sequence keeps 2 threads busy (at 64 tiles it ran
        // on one, 41% slower on the 2-core development machine).
        const PRIVATE_SPLIT_TILES: u32 = 16;
        let split_tokens = (PRIVATE_SPLIT_TILES * TILE_TOKENS) as usize;
        let longest = seq_lens.iter().copied().max().unwrap_or(0) as usize;
        // A batch rule cuts every sequence by the lengths of the whole batch.
        let batch_rule = plan.rule.for_batch(&seq_lens);
        let (private, rule, num_splits) = match (split, parallel && num_seqs < threads) {
            // As many splits as the longest sequence fills at 16 tiles each,
            // and no private splits where that is one: no merge for nothing.
            (false, true) if longest > split_tokens => {
                let splits = (4 * threads).min(64).min(longest.div_ceil(split_tokens));
                (true, SplitRule::new(splits as u32, PRIVATE_SPLIT_TILES), splits)
            }
            _ => (false, batch_rule, num_splits),
        };

        // Nothing has been written so far; from here on nothing fails.
        let exec = Exec {
            isa: self.isa,
            q: args.q.as_bytes(),
            k: args.k_cache.as_bytes(),
            v: args.v_cache.as_bytes(),
            q_elt,
            kv_elt,
            out_elt,
            num_kv_heads: shape.num_kv_heads,
            num_q_heads: shape.num_q_heads,
            head_dim: shape.head_dim,
            group: shape.group_size(),
            kv_heads_per_item: kv_heads_per_item(
                shape.num_kv_heads,
                num_seqs * num_splits,
                if parallel { threads } else { 1 },
            ),
            scale_log2: checked.scale_log2(),
            seq_lens,
            index,
            rule,
            parallel,
        };
        let out = args.out.as_bytes_mut();
        let workspace = args.workspace.as_bytes_mut();
        // Without a caller's LSE buffer the rows' LSEs go to a scratch one
        // (4 bytes a row), so that one code path writes them.
        let mut own_lse = Vec::new();
        let lse = match args.lse {
            Some(lse) => lse.as_bytes_mut(),
            None => {
                own_lse.resize(num_seqs * shape.num_q_heads * 4, 0u8);
                &mut own_lse[..]
            }
        };
        let mut run = || match (private, split) {
            (true, _) => exec.run_split(out, lse, None, num_splits),
            (false, true) => exec.run_split(out, lse, Some(workspace), num_splits),
            (false, false) => exec.run_unsplit(out, lse),
        };
        if parallel {
            self.pool.install(run);
        } else {
            run();
        }
        Ok(())
    }

    fn merge_attn_states(&self, args: MergeArgs<'_, CpuBuffer>) -> Result<()> {
        args.check()?;
        let elt = Elt::of(args.dtype).ok_or(Error::UnsupportedDTypes {
            backend: BACKEND,
            q: args.dtype,
            kv: args.dtype,
            out: args.dtype,
            why: "the CPU backend merges f32, f16 and bf16 states only",
        })?;
        let d = args.head_dim;
        let rows = args.num_tokens * args.num_heads;
        let row_bytes = d * elt.size();
        let prefix_lse = validate::read_f32s(args.prefix_lse.as_bytes());
        let suffix_lse = validate::read_f32s(args.suffix_lse.as_bytes());
        let (prefix, suffix) = (args.prefix.as_bytes(), args.suffix.as_bytes());
        let mut lses = vec![f32::NEG_INFINITY; rows];
        let out = args.out.as_bytes_mut();
        if row_bytes == 0 {
            for (r, lse) in lses.iter_mut().enumerate() {
                *lse = merge_state(&mut [], &[], prefix_lse[r], &[], suffix_lse[r]);
            }
        } else {
            let buffers = || (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d]);
            let row = |(a, b, o): &mut (Vec<f32>, Vec<f32>, Vec<f32>),
                       (r, (out, lse)): (usize, (&mut [u8], &mut f32))| {
                elt.decode(&prefix[r * row_bytes..(r + 1) * row_bytes], a);
                elt.decode(&suffix[r * row_bytes..(r + 1) * row_bytes], b);
                *lse = merge_state(o, a, prefix_lse[r], b, suffix_lse[r]);
                elt.encode(o, out);
            };
            // The states' bytes count as a decode's K and V.
            if self.on_pool(2 * rows * row_bytes) {
                self.pool.install(|| {
                    out.par_chunks_mut(row_bytes).zip(lses.par_iter_mut()).enumerate().for_each_init(buffers, row)
                });
            } else {
                let mut scratch = buffers();
                out.chunks_mut(row_bytes).zip(lses.iter_mut()).enumerate().for_each(|x| row(&mut scratch, x));
            }
        }
        if let Some(out_lse) = args.out_lse {
            put_f32s(out_lse.as_bytes_mut(), &lses);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn time_us(&self, work: &mut dyn FnMut() -> Result<()>, warmup: usize, reps: usize) -> Result<f64> {
        for _ in 0..warmup {
            work()?;
        }
        let reps = reps.max(1);
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = Instant::now();
            work()?;
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    fn copy_bandwidth_gbps(&self, bytes: usize) -> Result<f64> {
        let bytes = bytes.max(1);
        let src = {
            let mut src = alloc_zeroed(bytes)?;
            src.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            src
        };
        let mut dst = alloc_zeroed(bytes)?;
        dst.copy_from_slice(&src); // faults the destination's pages in
        let reps = (1usize << 28).div_ceil(bytes).clamp(3, 50);
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let seconds = times[times.len() / 2].max(1e-9);
        Ok(2.0 * bytes as f64 / seconds / 1e9)
    }
}

/// One validated decode call, ready to run.
struct Exec<'a> {
    isa: Isa,
    q: &'a [u8],
    k: &'a [u8],
    v: &'a [u8],
    q_elt: Elt,
    kv_elt: Elt,
    out_elt: Elt,
    num_kv_heads: usize,
    num_q_heads: usize,
    head_dim: usize,
    group: usize,
    /// Consecutive KV heads served by one work item (a divisor of `num_kv_heads`).
    kv_heads_per_item: usize,
    /// `softmax_scale * log2(e)`: scores are kept in log2 units.
    scale_log2: f32,
    seq_lens: Vec<u32>,
    index: Index,
    rule: SplitRule,
    /// Whether the work items run on the pool's threads (else one after
    /// another on the calling thread: `INLINE_KV_BYTES`).
    parallel: bool,
}

/// One work item of the split path: its index, and its output rows, their
/// LSEs, and where the caller's workspace is written, its partial
/// accumulators and partial `(m, l)` pairs.
type SplitItem<'w> = (usize, ((&'w mut [u8], &'w mut [u8]), Option<(&'w mut [u8], &'w mut [u8])>));

/// A row's LSE in the natural log from its `(m, l)`: max in log2 units and
/// sum of `exp2(s - m)`; `-inf` for a row of no tokens (`l` = 0).
fn lse_of(m: f32, l: f32) -> f32 {
    if l > 0.0 {
        (m + l.log2()) * std::f32::consts::LN_2
    } else {
        f32::NEG_INFINITY
    }
}

/// The rows of a sequence of no tokens: zeros, and LSEs of `-inf`.
fn write_empty_rows(out: &mut [u8], lse: &mut [u8]) {
    out.fill(0);
    lse.chunks_exact_mut(4).for_each(|x| x.copy_from_slice(&f32::NEG_INFINITY.to_le_bytes()));
}

/// Per-thread buffers of the unsplit path.
struct Worker {
    q: Vec<f32>,
    state: State,
    scratch: Scratch,
    row: Vec<f32>,
}

impl Exec<'_> {
    fn worker(&self) -> Worker {
        Worker {
            q: vec![0.0; self.item_heads() * self.head_dim],
            state: State::new(self.item_heads(), self.head_dim),
            scratch: Scratch::new(self.group, self.head_dim),
            row: vec![0.0; self.head_dim],
        }
    }

    /// Query heads of one work item: the groups of its KV heads.
    fn item_heads(&self) -> usize {
        self.kv_heads_per_item * self.group
    }

    /// Bytes of the output (or of Q) of one work item's query heads.
    fn group_bytes(&self, elt: Elt) -> usize {
        self.item_heads() * self.head_dim * elt.size()
    }

    /// The queries of the item whose first KV head is `kv_head`, scaled into log2 units.
    fn load_q(&self, seq: usize, kv_head: usize, dst: &mut [f32]) {
        let offset = (seq * self.num_q_heads + kv_head * self.group) * self.head_dim * self.q_elt.size();
        self.q_elt.decode(&self.q[offset..offset + self.group_bytes(self.q_elt)], dst);
        dst.iter_mut().for_each(|x| *x *= self.scale_log2);
    }

    fn attend(
        &self,
        seq: usize,
        kv_head: usize,
        range: (usize, usize),
        q: &[f32],
        state: &mut State,
        scratch: &mut Scratch,
    ) {
        let work = Work {
            k: self.k,
            v: self.v,
            slot_elems: self.num_kv_heads * self.head_dim,
            kv_head,
            kv_heads: self.kv_heads_per_item,
            head_dim: self.head_dim,
            slots: self.index.slots(seq),
            start: range.0,
            end: range.1,
            q,
            q_scale: self.scale_log2,
            weights_in_bf16: matches!(self.out_elt, Elt::Bf16 | Elt::F16),
        };
        kernel::attend(self.isa, self.kv_elt, &work, state, scratch);
    }

    /// One work item per `(sequence, KV heads)`, normalised output and its
    /// LSEs written directly.
    fn run_unsplit(&self, out: &mut [u8], lse: &mut [u8]) {
        let d = self.head_dim;
        let out_row = d * self.out_elt.size();
        let item = |w: &mut Worker, (item, (out, lse)): (usize, (&mut [u8], &mut [u8]))| {
            let items = self.num_kv_heads / self.kv_heads_per_item;
            let (seq, kv_head) = (item / items, item % items * self.kv_heads_per_item);
            let len = self.seq_lens[seq] as usize;
            if len == 0 {
                write_empty_rows(out, lse);
                return;
            }
            self.load_q(seq, kv_head, &mut w.q);
            w.state.reset();
            self.attend(seq, kv_head, (0, len), &w.q, &mut w.state, &mut w.scratch);
            for (h, (out, lse)) in out.chunks_exact_mut(out_row).zip(lse.chunks_exact_mut(4)).enumerate() {
                let inv = 1.0 / w.state.l[h];
                for (r, &a) in w.row.iter_mut().zip(&w.state.acc[h * d..(h + 1) * d]) {
                    *r = a * inv;
                }
                self.out_elt.encode(&w.row, out);
                lse.copy_from_slice(&lse_of(w.state.m[h], w.state.l[h]).to_le_bytes());
            }
        };
        let (item_bytes, lse_bytes) = (self.group_bytes(self.out_elt), self.item_heads() * 4);
        if self.parallel {
            out.par_chunks_mut(item_bytes)
                .zip(lse.par_chunks_mut(lse_bytes))
                .enumerate()
                .for_each_init(|| self.worker(), item);
        } else {
            let mut w = self.worker();
            out.chunks_mut(item_bytes).zip(lse.chunks_mut(lse_bytes)).enumerate().for_each(|x| item(&mut w, x));
        }
    }

    /// Work items `(sequence, KV head, split)`; each `(sequence, KV head)`
    /// group's heads are reduced over their active splits from the partial
    /// states in memory. Given the caller's workspace, the partial states are
    /// written there too, in the layout of `decode_params.h` (what a GPU
    /// backend's reducer reads, and what tests read back); the CPU's private
    /// splits have none to write.
    fn run_split(&self, out: &mut [u8], lse: &mut [u8], workspace: Option<&mut [u8]>, num_splits: usize) {
        let (g, d) = (self.item_heads(), self.head_dim);
        let (out_bytes, acc_bytes, ml_bytes) =
            (self.group_bytes(self.out_elt), g * num_splits * d * 4, g * num_splits * 2 * 4);
        let num_items = out.len() / out_bytes;
        // One item's rows of the workspace, or none.
        let partial_rows: Vec<Option<(&mut [u8], &mut [u8])>> = match workspace {
            Some(workspace) => {
                let rows = self.seq_lens.len() * self.num_q_heads * num_splits;
                let (acc_ws, rest) = workspace.split_at_mut(rows * d * 4);
                let ml_ws = &mut rest[..rows * 2 * 4];
                acc_ws.chunks_mut(acc_bytes).zip(ml_ws.chunks_mut(ml_bytes)).map(Some).collect()
            }
            None => (0..num_items).map(|_| None).collect(),
        };
        let item = |(item, ((out, lse), partial_rows)): SplitItem<'_>| {
            let items = self.num_kv_heads / self.kv_heads_per_item;
            let (seq, kv_head) = (item / items, item % items * self.kv_heads_per_item);
            let split = self.rule.split(self.seq_lens[seq]);
            let active = split.active_splits as usize;
            if active == 0 {
                write_empty_rows(out, lse);
                return;
            }
            let buffers = || (vec![0.0f32; g * d], Scratch::new(self.group, d));
            let split_state = |(q, scratch): &mut (Vec<f32>, Scratch), j: usize| {
                let (start, end) = split.token_range(j as u32);
                self.load_q(seq, kv_head, q);
                let mut state = State::new(g, d);
                self.attend(seq, kv_head, (start as usize, end as usize), q, &mut state, scratch);
                state
            };
            let states: Vec<State> = if self.parallel {
                (0..active).into_par_iter().map_init(buffers, split_state).collect()
            } else {
                let mut b = buffers();
                (0..active).map(|j| split_state(&mut b, j)).collect()
            };
            if let Some((acc_ws, ml_ws)) = partial_rows {
                for (j, state) in states.iter().enumerate() {
                    for h in 0..g {
                        let row = h * num_splits + j;
                        put_f32s(&mut acc_ws[row * d * 4..(row + 1) * d * 4], &state.acc[h * d..(h + 1) * d]);
                        put_f32s(&mut ml_ws[row * 8..(row + 1) * 8], &[state.m[h], state.l[h]]);
                    }
                }
            }
            self.reduce(out, lse, &states);
        };
        if self.parallel {
            out.par_chunks_mut(out_bytes)
                .zip(lse.par_chunks_mut(g * 4))
                .zip(partial_rows.into_par_iter())
                .enumerate()
                .for_each(item);
        } else {
            out.chunks_mut(out_bytes).zip(lse.chunks_mut(g * 4)).zip(partial_rows).enumerate().for_each(item);
        }
    }

    /// Merges the partial states of the splits of one group, each head with
    /// one division; writes each head's LSE.
    fn reduce(&self, out: &mut [u8], lse: &mut [u8], states: &[State]) {
        let d = self.head_dim;
        let mut sum = vec![0.0f32; d];
        let out_row = d * self.out_elt.size();
        for (h, (out, lse)) in out.chunks_exact_mut(out_row).zip(lse.chunks_exact_mut(4)).enumerate() {
            let m_max = states.iter().fold(f32::NEG_INFINITY, |m, s| m.max(s.m[h]));
            let mut total = 0.0f32;
            sum.fill(0.0);
            for state in states {
                let weight = (state.m[h] - m_max).exp2();
                total += weight * state.l[h];
                for (o, &p) in sum.iter_mut().zip(&state.acc[h * d..(h + 1) * d]) {
                    *o += weight * p;
                }
            }
            let inv = 1.0 / total;
            sum.iter_mut().for_each(|o| *o *= inv);
            self.out_elt.encode(&sum, out);
            lse.copy_from_slice(&lse_of(m_max, total).to_le_bytes());
        }
    }
}

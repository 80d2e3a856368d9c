//! The trait every backend implements, and the argument bundles it takes.

use serde::{Deserialize, Serialize};

use crate::{DType, DecodeProblem, Error, KvLayout, Plan, Result};

/// [`DeviceProps::reduce_cta_gbps`] of the CUDA reducer, measured on an H200
/// (bf16, d = 128, graph replay): each extra split of a sequence cost the
/// reduce about 0.02 us (70B at TP=8, B = 1, s = 1024..65536: 32 -> 64,
/// 64 -> 128 and 132 -> 256 splits), 520 bytes per 0.02 us.
pub const GPU_REDUCE_CTA_GBPS: f64 = 26.0;

/// [`DeviceProps::lone_cta_share`] of the tensor-core kernel on an H200: the
/// share of a multiprocessor's bandwidth one decode CTA reaches alone on it
/// where two fit. Llama-3-8B, B = 1, s = 65536 took 68.8 us with 16 splits
/// (one CTA per SM) against 67.7 us with 32 (two per SM).
pub const GPU_LONE_CTA_SHARE: f64 = 0.95;

/// The streaming bandwidth, GB/s, at which the CTA figures here were
/// measured: what the CUDA backend derives on an H200 (0.9 of the peak its
/// memory clock gives).
pub const GPU_FIT_GBPS: f64 = 4320.0;

/// The bandwidth `auto` plans a CUDA GPU with, from the figure `derived`
/// from its memory clock: at least [`GPU_FIT_GBPS`]. The planner's constants
/// (the lone-CTA shares, the reducer's rate, the fixed costs) were fitted on
/// an H200 at that figure, and a slower GPU planned with its own figure
/// picks worse plans. s36, H100 (3020 GB/s derived): the H200's plans took
/// 0.987 of the H100's own plans' time on 28 shapes (geometric mean). s36
/// then scaled the lone-CTA share by the bandwidth, capped so that it
/// reproduced the H200's plans on those 28; on 89 shapes held out from that
/// fit (eleven models, B 1-256; s37 calls 1 and 3) the H100's plans were
/// still slower than the H200's: 1.033 and 1.062 of their time (geometric
/// means of 40 and 49 shapes; worst 2.24, falcon-7b B = 32 s = 512, 4 splits
/// against 1; best 0.889; docs/measurements/2026-12-05-s37-h100-call1/ and
/// -call3/). A faster memory keeps its own figure: nothing faster was timed.
/// A figure that is not a positive number gives [`GPU_FIT_GBPS`].
pub fn gpu_plan_gbps(derived: f64) -> f64 {
    if derived.is_finite() && derived > GPU_FIT_GBPS {
        derived
    } else {
        GPU_FIT_GBPS
    }
}

/// [`DeviceProps::lone_cta_share`] of the CUDA stream kernel (CUDA cores; what
/// `auto` runs for f32, head_dim 192 and head_dim 256 before sm_90) on an
/// H200, where three of its CTAs fit on a multiprocessor: it is bound by
/// instruction issue, not by memory. Llama-3-8B, bf16, 48-token blocks (then
/// run on it), B = 16, s = 4096: 128 CTAs (one per SM) 193 us, 256 (two) 126 us,
/// 384 (three) 109 us; 10.9, 16.6 and 19.2 GB/s per multiprocessor
/// (docs/measurements/2026-12-02-s6-stream-kernel-sweep.log).
pub const GPU_STREAM_LONE_CTA_SHARE: f64 = 0.55;

/// [`DeviceProps::empty_cta_us`] of the CUDA decode kernels on an H200: a CTA
/// whose split has no tokens still launches, reads its sequence's length and
/// exits. Llama-3-70B at TP=8, B = 64, s = 16 (one tile per sequence), fixed:64
/// against fixed:256: 12288 more empty CTAs took 28.8 us more, 0.62 us of one
/// resident slot each (docs/measurements/2026-12-02-s8-ragged-call1.txt).
pub const GPU_EMPTY_CTA_US: f64 = 0.62;

/// [`DeviceProps::reduce_wait_us`] of the CUDA stream and tensor-core
/// kernels on an H200: what a split call's reducer adds where every sequence
/// has one active split, whose CTAs wrote the output themselves, so that the
/// reducer only waits for the decode grid. Measured on version 26 (s26 call
/// 5) as such a call against the same lengths unsplit, less the empty CTAs'
/// charge: Llama-3-8B B = 16 planned for 65536 tokens and run at 256, 8.84
/// against 7.02 us (1.52 net), at 1024 21.23 against 19.68 (1.25 net);
/// Llama-3-70B at TP=8 B = 64 at 256, 7.75 against 5.82 (1.48 net). (s25
/// measured 0.8-1.06 on its kernels.)
pub const GPU_REDUCE_WAIT_US: f64 = 1.4;

/// What the planner needs to know about a device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProps {
    pub name: String,
    /// Multiprocessors (CUDA SMs, HIP CUs, CPU worker threads).
    pub num_sms: u32,
    /// CTAs of the decode kernel resident on one multiprocessor at a time.
    pub ctas_per_sm: u32,
    /// Streaming bandwidth the cost model assumes, GB/s.
    pub mem_bandwidth_gbps: f64,
    /// Cost of one more dependent launch (the split's reduce), microseconds.
    pub launch_overhead_us: f64,
    /// GB/s at which one reducer CTA reads the partial rows of its query
    /// head (one row of `head_dim + 2` floats per active split): the part of
    /// the reduce that grows with the split count.
    pub reduce_cta_gbps: f64,
    /// Tiles one CTA streams side by side (one per warp, each warp taking
    /// every n-th tile of the split), so a split's time goes in steps of this
    /// many tiles: 9 tiles on 4 warps take as long as 12. 1 where a CTA
    /// walks its tiles one after another (the CPU).
    #[serde(default = "one")]
    pub tiles_per_cta_step: u32,
    /// The share of a multiprocessor's throughput one CTA reaches alone on
    /// it; `n` CTAs reach `1 - (1 - share)^n` of it, all `ctas_per_sm` of
    /// them the whole. Near 1 for a kernel that one CTA keeps memory-bound,
    /// lower where each CTA is bound by instruction issue.
    #[serde(default = "gpu_lone_cta_share")]
    pub lone_cta_share: f64,
    /// Query heads one CTA serves at most: a KV head whose group is larger
    /// takes `ceil(group / this)` CTAs per split, each streaming the KV
    /// head's tokens (16 on the CUDA tensor-core kernel, the mma's M). 0: one
    /// CTA serves a whole group, whatever its size.
    #[serde(default)]
    pub max_query_heads_per_cta: u32,
    /// Microseconds one resident CTA slot spends on a CTA whose split is
    /// empty (a short sequence's surplus splits in a grid cut for a longer
    /// one). 0 where empty work items are never launched (the CPU).
    #[serde(default)]
    pub empty_cta_us: f64,
    /// Splits one CTA can take, one per warp, each warp writing its own
    /// partial row (the CUDA tensor-core kernel: 4); 1 where a CTA's warps
    /// always share one split. `auto` uses it for small split counts
    /// ([`crate::plan::WARP_SPLIT_MAX_ROWS`]).
    #[serde(default = "one")]
    pub splits_per_cta: u32,
    /// Where a sequence's lone active split is written straight to the
    /// output by its CTA (the CUDA stream and tensor-core kernels, a split
    /// per CTA), the microseconds a split call's reducer still adds when no
    /// sequence has more than one active split: it only waits for the
    /// decode grid. `None` where the reducer merges every split, lone or
    /// not (partial rows written and read back, and a full reduce).
    #[serde(default)]
    pub reduce_wait_us: Option<f64>,
    /// Whether the kernel can cut by the batch ([`crate::SplitRule`]'s
    /// `batch_splits`): the CUDA tensor-core kernel's packed launches, whose
    /// CTAs read every sequence's length. `auto` then gives a plan of equal
    /// lengths (a captured graph's) a batch rule, so that a ragged replay
    /// spreads a long sequence over the grid.
    #[serde(default)]
    pub cuts_by_batch: bool,
}

/// serde's default for the counts that are 1 unless said otherwise.
pub(crate) fn one() -> u32 {
    1
}

fn gpu_lone_cta_share() -> f64 {
    GPU_LONE_CTA_SHARE
}

/// Most multiprocessors (or CPU threads) a device may report: 2^20, 7900
/// times an H200's 132.
pub const MAX_DEVICE_UNITS: u32 = 1 << 20;
/// Most CTAs per multiprocessor, tiles per CTA step and splits per CTA a
/// device may report (real ones: 1-4).
pub const MAX_PER_CTA_OR_SM: u32 = 1024;

impl DeviceProps {
    /// Refuses properties the planner's arithmetic cannot hold (its counts
    /// of CTAs and splits are 32-bit where they meet these): no
    /// multiprocessors, or counts past [`MAX_DEVICE_UNITS`] and
    /// [`MAX_PER_CTA_OR_SM`].
    pub fn validate(&self) -> Result<()> {
        if self.num_sms == 0 {
            return Err(Error::InvalidDevice { num_sms: self.num_sms });
        }
        Error::check_range("the device's num_sms", self.num_sms as u64, 0, MAX_DEVICE_UNITS as u64)?;
        Error::check_range("the device's ctas_per_sm", self.ctas_per_sm as u64, 0, MAX_PER_CTA_OR_SM as u64)?;
        Error::check_range(
            "the device's tiles_per_cta_step",
            self.tiles_per_cta_step as u64,
            0,
            MAX_PER_CTA_OR_SM as u64,
        )?;
        Error::check_range("the device's splits_per_cta", self.splits_per_cta as u64, 0, MAX_PER_CTA_OR_SM as u64)
    }

    /// An H100/H200-class GPU: what `decode-attn plan` assumes when told only `--sms`.
    pub fn gpu_like(num_sms: u32) -> Self {
        DeviceProps {
            name: format!("{num_sms}-SM GPU"),
            num_sms,
            ctas_per_sm: 2,
            // What the CUDA backend derives on an H200 (0.9 of the peak its
            // clocks give): with it, `decode-attn plan` cuts ragged batches
            // as the H200 does (s26: 4500 cut 64 lengths from 128 to 8192
            // in 2736-token chunks, 4.5% slower there than the device's 1648).
            mem_bandwidth_gbps: GPU_FIT_GBPS,
            launch_overhead_us: 2.0,
            reduce_cta_gbps: GPU_REDUCE_CTA_GBPS,
            tiles_per_cta_step: 4,
            lone_cta_share: GPU_LONE_CTA_SHARE,
            max_query_heads_per_cta: 16,
            empty_cta_us: GPU_EMPTY_CTA_US,
            splits_per_cta: 4,
            reduce_wait_us: Some(GPU_REDUCE_WAIT_US),
            cuts_by_batch: false,
        }
    }

    /// [`gpu_like`](Self::gpu_like) with what follows for `problem` from the
    /// CUDA backend's default kernel alone, without a device: at head_dim
    /// 256 (f16/bf16) the tensor-core kernel takes 200 KiB of shared memory,
    /// so one CTA per multiprocessor; the stream kernel (f32, head_dim 192)
    /// has no split per warp. What depends on the device's occupancy
    /// calculator (the stream kernel's CTAs per multiprocessor) stays as
    /// `gpu_like` has it.
    pub fn gpu_like_for(num_sms: u32, problem: &DecodeProblem) -> Self {
        let gpu = Self::gpu_like(num_sms);
        let half = matches!(problem.dtypes.q, DType::F16 | DType::Bf16);
        let head_dim = problem.shape.head_dim;
        if half && head_dim == 256 {
            DeviceProps { ctas_per_sm: 1, ..gpu }
        } else if half && head_dim <= 128 {
            gpu
        } else {
            DeviceProps { splits_per_cta: 1, ..gpu }
        }
    }

    /// Whether a split call's reducer merges partial rows for a sequence
    /// with `active_splits` active splits, in a plan of `splits_per_cta`
    /// splits per CTA: not for a lone split that its CTA writes itself
    /// ([`reduce_wait_us`](Self::reduce_wait_us)).
    pub fn merges(&self, active_splits: u32, splits_per_cta: u32) -> bool {
        self.reduce_wait_us.is_none() || splits_per_cta > 1 || active_splits != 1
    }

    /// CTAs per (sequence, KV head, split) for query groups of `group_size`.
    pub fn head_groups(&self, group_size: usize) -> u64 {
        match self.max_query_heads_per_cta {
            0 => 1,
            heads => (group_size.max(1) as u64).div_ceil(heads as u64),
        }
    }
}

/// Memory a backend owns: device memory for GPUs, host memory for the CPU.
pub trait DeviceBuffer {
    fn len_bytes(&self) -> usize;
}

/// Where each sequence's KV slots are, as device buffers of `i32`.
pub enum KvIndexBuffers<'a, B> {
    /// `[num_seqs, max_blocks_per_seq]` kernel block ids.
    BlockTable { table: &'a B, max_blocks_per_seq: usize },
    /// `kv_indptr: [num_seqs + 1]`, `kv_indices: [kv_indptr[num_seqs]]` slots.
    TokenIndices { indptr: &'a B, indices: &'a B },
}

impl<B> KvIndexBuffers<'_, B> {
    /// What the caller passed, for [`Error::PlanMismatch`].
    pub fn describe(&self) -> &'static str {
        match self {
            KvIndexBuffers::BlockTable { .. } => "a block table",
            KvIndexBuffers::TokenIndices { .. } => "token indices",
        }
    }
}

/// One decode call's buffers. Shapes (row-major, elements of the plan's dtypes):
/// `q`, `out`: `[num_seqs, num_q_heads, head_dim]`; `k_cache`, `v_cache`:
/// `[num_slots, num_kv_heads, head_dim]`; `seq_lens`: `[num_seqs]` of `i32`.
pub struct DecodeArgs<'a, B> {
    pub q: &'a B,
    pub k_cache: &'a B,
    pub v_cache: &'a B,
    pub seq_lens: &'a B,
    pub kv_index: KvIndexBuffers<'a, B>,
    /// At least `plan.workspace_bytes`; may be empty when the plan does not split.
    pub workspace: &'a mut B,
    pub out: &'a mut B,
    /// Where given, `[num_seqs, num_q_heads]` of `f32`: each output row's
    /// log-sum-exp in the natural log, `ln(sum_t exp(softmax_scale * q.k_t))`,
    /// as [`MergeArgs`]' LSEs read it (so a decode can be one side of a
    /// merge); `-inf` for a sequence of length 0.
    pub lse: Option<&'a mut B>,
    /// Defaults to `1 / sqrt(head_dim)`. Must be positive, with
    /// `softmax_scale * log2(e)` a finite `f32` ([`Error::InvalidScale`]).
    pub softmax_scale: Option<f32>,
}

/// Facts about the call derived from buffer sizes, checked once for every backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckedArgs {
    pub num_slots: usize,
    pub softmax_scale: f32,
    /// Row stride of the block table, or the number of token indices.
    pub index_len: usize,
}

/// The softmax scale in the base-2 form every kernel works in: scores are
/// kept in log2 units, `exp(scale * s) = 2^(scale_log2(scale) * s)`.
fn scale_log2(softmax_scale: f32) -> f32 {
    softmax_scale * std::f32::consts::LOG2_E
}

impl CheckedArgs {
    /// The scale in the base-2 form every kernel works in; finite, as checked.
    pub fn scale_log2(&self) -> f32 {
        scale_log2(self.softmax_scale)
    }
}

impl<B: DeviceBuffer> DecodeArgs<'_, B> {
    /// Checks every size the host can see against the plan.
    ///
    /// Contents in device memory (block ids, lengths) are checked by the CPU
    /// backend in full and guarded against on the GPU (never read out of
    /// bounds), since reading them back would cost a synchronisation.
    pub fn check(&self, plan: &Plan) -> Result<CheckedArgs> {
        let p = &plan.problem;
        // A plan is plain data (it may come edited from JSON): what bounds
        // the sizes below is checked again here.
        p.validate()?;
        plan.rule.check()?;
        let n = p.num_seqs();
        expect_len("q", self.q.len_bytes(), p.q_bytes())?;
        expect_len("out", self.out.len_bytes(), p.out_bytes())?;
        if let Some(lse) = &self.lse {
            expect_len("lse", lse.len_bytes(), n * p.shape.num_q_heads * 4)?;
        }
        expect_len("seq_lens", self.seq_lens.len_bytes(), n * 4)?;
        let slot_bytes = p.kv_bytes_per_token();
        let kv = self.k_cache.len_bytes();
        expect_len("v_cache", self.v_cache.len_bytes(), kv)?;
        let (unit, what) = match p.layout {
            KvLayout::BlockTable { kernel_block_size, .. } => (slot_bytes * kernel_block_size, "blocks"),
            KvLayout::TokenIndices { .. } => (slot_bytes, "slots"),
        };
        if kv % unit != 0 {
            return Err(Error::BufferNotWhole { name: "k_cache", actual: kv, unit, what });
        }
        let index_len = match (&self.kv_index, p.layout) {
            (KvIndexBuffers::BlockTable { table, max_blocks_per_seq }, KvLayout::BlockTable { .. }) => {
                // The caller's stride: a product past usize would wrap onto a
                // table of the right size.
                let table_bytes = n.checked_mul(*max_blocks_per_seq).and_then(|entries| entries.checked_mul(4));
                let Some(table_bytes) = table_bytes else {
                    return Err(Error::OutOfRange {
                        what: "max_blocks_per_seq",
                        value: *max_blocks_per_seq as u64,
                        min: 0,
                        max: (isize::MAX as usize / 4 / n.max(1)) as u64,
                    });
                };
                expect_len("block_table", table.len_bytes(), table_bytes)?;
                *max_blocks_per_seq
            }
            (KvIndexBuffers::TokenIndices { indptr, indices }, KvLayout::TokenIndices { .. }) => {
                expect_len("kv_indptr", indptr.len_bytes(), (n + 1) * 4)?;
                if indices.len_bytes() % 4 != 0 {
                    return Err(Error::BufferNotWhole {
                        name: "kv_indices",
                        actual: indices.len_bytes(),
                        unit: 4,
                        what: "i32 entries",
                    });
                }
                indices.len_bytes() / 4
            }
            (given, planned) => {
                return Err(Error::PlanMismatch { planned: planned.to_string(), given: given.describe().into() })
            }
        };
        // The kernels write the partial rows the rule implies (see
        // abi::DecodeParams::new), whatever a hand-edited plan says it needs.
        let needed = plan.workspace_bytes.max(partial_state_bytes(plan));
        if (self.workspace.len_bytes() as u64) < needed {
            return Err(Error::WorkspaceTooSmall { needed: needed as usize, actual: self.workspace.len_bytes() });
        }
        let softmax_scale = self.softmax_scale.unwrap_or_else(|| p.shape.default_scale());
        // Every kernel works in base 2 on `softmax_scale * log2(e)`: a scale
        // whose product overflows would turn every score to +-inf and the
        // output to NaN, so it is refused like a negative one.
        if !(softmax_scale > 0.0 && scale_log2(softmax_scale).is_finite()) {
            return Err(Error::InvalidScale(softmax_scale));
        }
        Ok(CheckedArgs { num_slots: kv / slot_bytes, softmax_scale, index_len })
    }
}

/// Bytes of split-K partial state a GPU launch of `plan` writes into the
/// workspace: `partial_acc` (f32 `[num_seqs, num_q_heads, num_splits,
/// head_dim]`) then `partial_ml` (f32 `[.., num_splits, 2]`); 0 unsplit.
pub fn partial_state_bytes(plan: &Plan) -> u64 {
    let shape = plan.problem.shape;
    if plan.rule.num_splits <= 1 {
        return 0;
    }
    let rows = plan.problem.num_seqs() as u64 * shape.num_q_heads as u64 * plan.rule.num_splits as u64;
    rows * (shape.head_dim as u64 + 2) * 4
}

/// The two-way state merge: `out = merge((prefix, prefix_lse), (suffix, suffix_lse))`.
///
/// Outputs are normalised attention outputs `[num_tokens, num_heads, head_dim]`
/// in `dtype`; LSEs are `f32 [num_tokens, num_heads]` in the **natural log**
/// (as FlashAttention and vLLM's `merge_attn_states` use). A state whose LSE is
/// `-inf` is empty and contributes nothing; two empty states give zeros.
pub struct MergeArgs<'a, B> {
    pub num_tokens: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
    pub prefix: &'a B,
    pub prefix_lse: &'a B,
    pub suffix: &'a B,
    pub suffix_lse: &'a B,
    pub out: &'a mut B,
    /// Optional merged LSE, `f32 [num_tokens, num_heads]`.
    pub out_lse: Option<&'a mut B>,
}

impl<B: DeviceBuffer> MergeArgs<'_, B> {
    pub fn check(&self) -> Result<()> {
        // Caller-given counts: a product past usize would wrap onto buffers
        // of the right size.
        let rows = self.num_tokens.checked_mul(self.num_heads);
        let sizes = rows.and_then(|rows| {
            let states = rows.checked_mul(self.head_dim)?.checked_mul(self.dtype.size_bytes())?;
            Some((states, rows.checked_mul(4)?))
        });
        let Some((states, lses)) = sizes.filter(|&(states, _)| states <= isize::MAX as usize) else {
            return Err(Error::OutOfRange {
                what: "num_tokens * num_heads * head_dim",
                value: (self.num_tokens as u128 * self.num_heads as u128 * self.head_dim as u128).min(u64::MAX as u128)
                    as u64,
                min: 0,
                max: isize::MAX as u64 / self.dtype.size_bytes() as u64,
            });
        };
        expect_len("prefix", self.prefix.len_bytes(), states)?;
        expect_len("suffix", self.suffix.len_bytes(), states)?;
        expect_len("out", self.out.len_bytes(), states)?;
        expect_len("prefix_lse", self.prefix_lse.len_bytes(), lses)?;
        expect_len("suffix_lse", self.suffix_lse.len_bytes(), lses)?;
        if let Some(out_lse) = &self.out_lse {
            expect_len("out_lse", out_lse.len_bytes(), lses)?;
        }
        Ok(())
    }
}

pub(crate) fn expect_len(name: &'static str, actual: usize, expected: usize) -> Result<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(Error::BufferSize { name, expected, actual })
    }
}

/// Decode attention over a paged KV cache, on one device.
///
/// A backend owns its memory type; `upload`/`download` move bytes between it
/// and the host. Calls may be asynchronous on GPUs: `synchronize` waits.
pub trait DecodeAttention {
    type Buffer: DeviceBuffer;

    /// Short backend name: "cpu", "cuda", "hip".
    fn name(&self) -> &'static str;

    fn device_props(&self) -> &DeviceProps;

    /// Which element-type combinations this backend runs; an error names why not.
    fn supports(&self, problem: &DecodeProblem) -> Result<()>;

    fn alloc(&self, bytes: usize) -> Result<Self::Buffer>;

    /// Copies `src` into `dst`, which must be exactly as long.
    fn upload(&self, dst: &mut Self::Buffer, src: &[u8]) -> Result<()>;

    /// Copies `src` into `dst`, which must be exactly as long. Waits for pending work.
    fn download(&self, src: &Self::Buffer, dst: &mut [u8]) -> Result<()>;

    /// Runs one decode step as `plan` says. On an error nothing of the
    /// caller's buffers has been written.
    fn decode(&self, plan: &Plan, args: DecodeArgs<'_, Self::Buffer>) -> Result<()>;

    /// The two-way attention-state merge (see [`MergeArgs`]).
    fn merge_attn_states(&self, args: MergeArgs<'_, Self::Buffer>) -> Result<()>;

    fn synchronize(&self) -> Result<()>;

    /// Microseconds per run of `work`, timed the way this device times best:
    /// on a GPU, `work` is captured once into a graph whose replays are timed
    /// with device events after `warmup` untimed replays; on the CPU, wall time.
    fn time_us(&self, work: &mut dyn FnMut() -> Result<()>, warmup: usize, reps: usize) -> Result<f64>;

    /// Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes
    /// written, for copies of `bytes` bytes: the yardstick of `bench`.
    fn copy_bandwidth_gbps(&self, bytes: usize) -> Result<f64>;

    /// Plans `problem` for this device.
    fn plan(&self, problem: &DecodeProblem, policy: crate::Policy) -> Result<Plan> {
        self.supports(problem)?;
        crate::plan(problem, policy, self.device_props())
    }
}

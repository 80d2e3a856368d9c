//! decode-attn-core: everything about decode attention that is not a kernel.
//!
//! * [`shape`] and [`dtype`]: the problem (heads, head dim, element types).
//! * [`layout`]: how the paged KV cache is indexed (block table or per-token
//!   indices) and [`layout::map_to_kernel_blocks`].
//! * [`plan`](mod@plan): the pure, host-side planner that turns a problem into a
//!   [`Plan`] (grid, split counts, scratch sizes, and the reason).
//! * [`backend`]: the [`DecodeAttention`] trait every backend implements.
//! * [`merge`]: the two-way attention-state merge, on the host.
//! * [`kernel_cache`]: the disk cache of kernels compiled at run time, and
//!   [`kernel_part`]: the part of a kernel file a run-time compiler builds
//!   at a time.
//! * [`env`](mod@env): options read from the environment by the backends' `from_env`.
//! * [`abi`]: the GPU kernels' launch parameters (decode_params.h), filled
//!   from a plan once for every GPU backend.
//!
//! Data flows one way: problem -> [`plan::plan`] -> [`Plan`] ->
//! [`DecodeAttention::decode`]. Nothing here touches a device
//! (the kernel cache touches only files).

pub mod abi;
pub mod backend;
pub mod dtype;
pub mod env;
pub mod error;
pub mod kernel_cache;
pub mod kernel_part;
pub mod layout;
pub mod merge;
pub mod plan;
pub mod shape;
pub mod synth;

pub use backend::{
    gpu_plan_gbps, CheckedArgs, DecodeArgs, DecodeAttention, DeviceBuffer, DeviceProps, KvIndexBuffers, MergeArgs,
    GPU_EMPTY_CTA_US, GPU_FIT_GBPS, GPU_LONE_CTA_SHARE, GPU_REDUCE_CTA_GBPS, GPU_REDUCE_WAIT_US,
    GPU_STREAM_LONE_CTA_SHARE,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use layout::{map_to_kernel_blocks, KvLayout, MAX_BLOCK_SLOTS};
pub use plan::{plan, KernelKind, Plan, Policy, PolicyDetail, SeqSplit, SparsePairs, SplitRule};
pub use shape::{AttentionShape, DTypes, DecodeProblem, MAX_HEADS, MAX_SEQ_LEN};

/// Tokens per split-granularity tile. Split boundaries always fall on a
/// multiple of this many tokens, on every backend, so that the CPU and GPU
/// executions of one plan cut the sequence in the same places.
pub const TILE_TOKENS: u32 = 16;

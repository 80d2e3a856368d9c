//! The one error type of decode-attn. Every variant names the offending value.

use crate::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    #[error("unknown dtype {0:?} (expected f32, f16 or bf16)")]
    UnknownDType(String),

    #[error("num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")]
    InvalidHeads { num_q_heads: usize, num_kv_heads: usize },

    #[error("head_dim {head_dim} is not supported (supported: {supported:?})")]
    UnsupportedHeadDim { head_dim: usize, supported: &'static [usize] },

    #[error("kernel block size {kernel_block_size} must be a positive multiple of 16")]
    InvalidKernelBlockSize { kernel_block_size: usize },

    #[error("kernel block size {kernel_block_size} does not divide the allocator block size {allocator_block_size}")]
    BlockSizeMismatch { kernel_block_size: usize, allocator_block_size: usize },

    #[error("page size {page_size} must be at least 1")]
    InvalidPageSize { page_size: usize },

    /// A count or size outside what decode-attn takes: the upper bounds lie
    /// far past any model's, so that every byte count derived from a value
    /// fits its integer.
    #[error("{what} is {value}; supported: {min} to {max}")]
    OutOfRange { what: &'static str, value: u64, min: u64, max: u64 },

    #[error("sequence {seq}: length {seq_len} exceeds the supported maximum of {max} tokens (lengths are i32 on the device)")]
    SeqLenTooLarge { seq: usize, seq_len: u64, max: u64 },

    #[error("{name}: expected {expected} bytes, got {actual}")]
    BufferSize { name: &'static str, expected: usize, actual: usize },

    #[error("{name}: {actual} bytes is not a whole number of {unit}-byte {what}")]
    BufferNotWhole { name: &'static str, actual: usize, unit: usize, what: &'static str },

    #[error("workspace too small: the plan needs {needed} bytes, got {actual}")]
    WorkspaceTooSmall { needed: usize, actual: usize },

    #[error("sequence {seq}: length {seq_len} is negative")]
    NegativeSeqLen { seq: usize, seq_len: i64 },

    #[error("sequence {seq}: length {seq_len} exceeds the {capacity} tokens its block-table row can address")]
    SeqTooLong { seq: usize, seq_len: usize, capacity: usize },

    #[error("sequence {seq}: block-table entry {index} is {block}, outside the {num_blocks} blocks of the KV cache")]
    BlockIdOutOfRange { seq: usize, index: usize, block: i64, num_blocks: usize },

    #[error("sequence {seq}: token {position} maps to slot {slot}, outside the {num_slots} slots of the KV cache")]
    SlotOutOfRange { seq: usize, position: usize, slot: i64, num_slots: usize },

    #[error("kv_indptr is not a valid prefix sum at sequence {seq}: [{start}, {end}) with {num_indices} indices")]
    InvalidIndptr { seq: usize, start: i64, end: i64, num_indices: usize },

    #[error("sequence {seq}: kv_indptr gives {indexed} tokens but seq_lens says {seq_len}")]
    IndptrLengthMismatch { seq: usize, indexed: usize, seq_len: usize },

    #[error("unknown policy {0:?} (expected auto, vllm, sglang, fixed:N or deterministic:TILE)")]
    UnknownPolicy(String),

    #[error("invalid policy {policy:?}: {why}")]
    InvalidPolicy { policy: String, why: &'static str },

    #[error("the device reports {num_sms} multiprocessors; need at least 1")]
    InvalidDevice { num_sms: u32 },

    /// The scale must be positive and small enough that the kernels' base-2
    /// form of it, `scale * log2(e)`, is a finite `f32` (at most about 2.36e38).
    #[error("softmax scale {0} is not a positive number whose product with log2(e) is a finite f32")]
    InvalidScale(f32),

    #[error("{backend} does not support q={q}, kv={kv}, out={out}: {why}")]
    UnsupportedDTypes { backend: &'static str, q: DType, kv: DType, out: DType, why: &'static str },

    #[error("{backend} does not support {what}")]
    Unsupported { backend: &'static str, what: String },

    #[error("the plan was made for {planned} but the call is for {given}")]
    PlanMismatch { planned: String, given: String },

    #[error("{backend} backend is not available: {reason}")]
    Unavailable { backend: &'static str, reason: String },

    #[error("{backend}: {message}")]
    Device { backend: &'static str, message: String },

    /// A caller's device memory that the backend cannot use as given.
    #[error("{backend}: {len_bytes} bytes at device address {address:#x} cannot be used: {why}")]
    ForeignMemory { backend: &'static str, address: u64, len_bytes: usize, why: String },

    /// A caller's stream that the backend cannot launch on.
    #[error("{backend}: stream {stream:#x} cannot be used: {why}")]
    ForeignStream { backend: &'static str, stream: u64, why: String },

    /// A buffer whose address the kernels cannot load from with their vector
    /// width (caller-owned memory at an offset; the backends' own allocations
    /// are always aligned).
    #[error("{name}: device address {address:#x} is not a multiple of {alignment} bytes")]
    Misaligned { name: &'static str, address: u64, alignment: u64 },
}

impl Error {
    /// `Ok` where `min <= value <= max`, else [`Error::OutOfRange`] naming
    /// `what`, `value` and the range: the one check behind every bound.
    pub fn check_range(what: &'static str, value: u64, min: u64, max: u64) -> Result<()> {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(Error::OutOfRange { what, value, min, max })
        }
    }
}

//! decode-attn-cpu: the CPU backend of decode-attn, and the reference that
//! judges every backend.
//!
//! * [`reference::decode_reference`]: decode attention in f64, plainly.
//! * [`CpuBackend`]: implements [`decode_attn_core::DecodeAttention`] on host
//!   memory ([`CpuBuffer`]). It validates every index and length on the host
//!   before writing anything, then executes the plan exactly as the GPU
//!   kernels do: work items `(sequence, KV heads, split)` cut by
//!   [`decode_attn_core::SplitRule::split`], run in parallel on rayon (a
//!   call of at most 128 KiB of K and V on the calling thread instead), each
//!   serving all query heads of its KV heads with an f32 online softmax
//!   (one item takes several consecutive KV heads, whose rows are one
//!   contiguous run of each slot, as many as keep the threads busy; an
//!   unsplit plan of fewer sequences than threads is cut into private splits
//!   of the backend's own, the same output within f32 rounding); the splits'
//!   partial states are reduced in memory, and a split plan also writes them
//!   into the caller's workspace as a GPU's reducer would read them
//!   (`partial_acc [num_seqs, num_q_heads, num_splits, head_dim]`, then
//!   `partial_ml [num_seqs, num_q_heads, num_splits, 2]`, max in log2 units,
//!   as in `kernels/cuda/decode_params.h`); private splits need none.
//!
//! The hot loop is picked once, at run time: for bf16 KV on a CPU with
//! AMX-BF16 tiles (and Linux's permission to use them), tile multiply-adds
//! (4-8 query heads per KV head or an even 10-16, head dims 64-128, a bf16
//! or f16 output); else, with AVX512_BF16, bf16 dot products (head dims
//! that are a multiple of 32; for a bf16 or f16 output the weights P
//! rounded to bf16 before P·V, as on the GPU); else AVX-512F intrinsics
//! (head dims that are a multiple of 16), else AVX2 + FMA + F16C
//! intrinsics, else portable Rust that LLVM vectorises. All compute an f32
//! online softmax over the same 16-token tiles; the scalar reference is the
//! judge.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
mod backend;
mod kernel;
pub mod reference;
mod validate;

pub use backend::{CpuBackend, CpuBuffer};

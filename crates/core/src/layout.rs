//! How a paged KV cache is indexed.
//!
//! The K and V pools are each `[num_slots, num_kv_heads, head_dim]`, a slot
//! being one token position. Two ways to find a sequence's slots:
//!
//! * **Block table** (vLLM): the pool is cut into kernel blocks of
//!   `kernel_block_size` slots; row `i` of a `[num_seqs, max_blocks_per_seq]`
//!   table of `i32` lists sequence `i`'s kernel blocks, so token `t` lives in
//!   slot `table[i][t / K] * K + t % K`. An allocator that hands out larger
//!   blocks (a multiple of the kernel block) converts its table once with
//!   [`map_to_kernel_blocks`].
//! * **Token indices** (SGLang): a flat `i32` list of slots, one per token,
//!   with `kv_indptr[i]..kv_indptr[i + 1]` the range of sequence `i`.
//!   `page_size` is the allocator's page (1 for token-level prefix sharing).

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::{Error, Result, TILE_TOKENS};

/// Most slots a block (kernel or allocator) or a page may hold: far past
/// any allocator's (vLLM's 16-256 tokens), and small enough that a block's
/// bytes (at most 2^20 slots of 2^26 bytes) fit a `usize`.
pub const MAX_BLOCK_SLOTS: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KvLayout {
    BlockTable { kernel_block_size: usize, allocator_block_size: usize },
    TokenIndices { page_size: usize },
}

impl KvLayout {
    /// A block table whose allocator block is the kernel block.
    pub const fn block_table(block_size: usize) -> Self {
        KvLayout::BlockTable { kernel_block_size: block_size, allocator_block_size: block_size }
    }

    pub const fn token_indices(page_size: usize) -> Self {
        KvLayout::TokenIndices { page_size }
    }

    pub fn validate(&self) -> Result<()> {
        match *self {
            KvLayout::BlockTable { kernel_block_size, allocator_block_size } => {
                check_block_sizes(kernel_block_size, allocator_block_size).map(|_| ())
            }
            KvLayout::TokenIndices { page_size } => {
                if page_size == 0 {
                    Err(Error::InvalidPageSize { page_size })
                } else {
                    Error::check_range("page size", page_size as u64, 1, MAX_BLOCK_SLOTS as u64)
                }
            }
        }
    }
}

impl fmt::Display for KvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KvLayout::BlockTable { kernel_block_size, allocator_block_size }
                if kernel_block_size == allocator_block_size =>
            {
                write!(f, "block-table(block {kernel_block_size})")
            }
            KvLayout::BlockTable { kernel_block_size, allocator_block_size } => {
                write!(f, "block-table(kernel block {kernel_block_size} in allocator block {allocator_block_size})")
            }
            KvLayout::TokenIndices { page_size } => write!(f, "token-indices(page {page_size})"),
        }
    }
}

/// Checks the pair and returns kernel blocks per allocator block.
fn check_block_sizes(kernel_block_size: usize, allocator_block_size: usize) -> Result<usize> {
    if kernel_block_size == 0 || kernel_block_size % TILE_TOKENS as usize != 0 {
        return Err(Error::InvalidKernelBlockSize { kernel_block_size });
    }
    if allocator_block_size == 0 || allocator_block_size % kernel_block_size != 0 {
        return Err(Error::BlockSizeMismatch { kernel_block_size, allocator_block_size });
    }
    // The allocator block is a multiple of the kernel block: this bounds both.
    Error::check_range("allocator block size", allocator_block_size as u64, 1, MAX_BLOCK_SLOTS as u64)?;
    Ok(allocator_block_size / kernel_block_size)
}

/// Rewrites a `[num_seqs, allocator_blocks_per_seq]` table of allocator block
/// ids as a `[num_seqs, allocator_blocks_per_seq * r]` table of kernel block
/// ids, `r = allocator_block_size / kernel_block_size`: allocator block `b`
/// becomes kernel blocks `b*r .. b*r + r`. Negative entries are padding and
/// stay `-1`. Returns the new table and its row stride.
///
/// A kernel block that does not divide the allocator block is an error here,
/// at set-up, never a slow path later.
pub fn map_to_kernel_blocks(
    allocator_table: &[i32],
    allocator_blocks_per_seq: usize,
    allocator_block_size: usize,
    kernel_block_size: usize,
) -> Result<(Vec<i32>, usize)> {
    let ratio = check_block_sizes(kernel_block_size, allocator_block_size)?;
    if allocator_blocks_per_seq == 0 || allocator_table.len() % allocator_blocks_per_seq != 0 {
        return Err(Error::BufferNotWhole {
            name: "allocator block table",
            actual: allocator_table.len(),
            unit: allocator_blocks_per_seq,
            what: "entries per row",
        });
    }
    let mut out = Vec::with_capacity(allocator_table.len() * ratio);
    for &block in allocator_table {
        for j in 0..ratio {
            out.push(if block < 0 { -1 } else { (block as i64 * ratio as i64 + j as i64) as i32 });
        }
    }
    Ok((out, allocator_blocks_per_seq * ratio))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_and_page_sizes_are_bounded() {
        assert!(KvLayout::block_table(MAX_BLOCK_SLOTS).validate().is_ok());
        let err = KvLayout::block_table(1 << 60).validate().unwrap_err();
        assert_eq!(err, Error::OutOfRange { what: "allocator block size", value: 1 << 60, min: 1, max: 1 << 20 });
        let huge_allocator = KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 1 << 40 };
        assert!(matches!(huge_allocator.validate(), Err(Error::OutOfRange { value, .. }) if value == 1 << 40));
        let err = KvLayout::token_indices(usize::MAX).validate().unwrap_err();
        assert!(matches!(err, Error::OutOfRange { what: "page size", .. }), "{err}");
        assert!(KvLayout::token_indices(MAX_BLOCK_SLOTS).validate().is_ok());
    }

    #[test]
    fn maps_allocator_blocks_to_kernel_blocks() {
        // Allocator block 64 tokens, kernel block 16: each id becomes four.
        let (table, stride) = map_to_kernel_blocks(&[3, 0, 7, -1], 2, 64, 16).unwrap();
        assert_eq!(stride, 8);
        assert_eq!(table, vec![12, 13, 14, 15, 0, 1, 2, 3, 28, 29, 30, 31, -1, -1, -1, -1]);
    }

    #[test]
    fn identical_sizes_are_the_identity() {
        let (table, stride) = map_to_kernel_blocks(&[5, 9, 2], 3, 32, 32).unwrap();
        assert_eq!((table, stride), (vec![5, 9, 2], 3));
    }

    #[test]
    fn kernel_block_must_divide_the_allocator_block() {
        let err = map_to_kernel_blocks(&[0], 1, 48, 32).unwrap_err();
        assert_eq!(err, Error::BlockSizeMismatch { kernel_block_size: 32, allocator_block_size: 48 });
        assert!(err.to_string().contains("48"));
        // The reverse (kernel block larger than the allocator's) is an error too.
        assert!(map_to_kernel_blocks(&[0], 1, 16, 32).is_err());
        assert_eq!(
            KvLayout::block_table(24).validate().unwrap_err(),
            Error::InvalidKernelBlockSize { kernel_block_size: 24 }
        );
    }

    #[test]
    fn page_size_zero_is_rejected() {
        assert!(KvLayout::token_indices(0).validate().is_err());
        assert!(KvLayout::token_indices(1).validate().is_ok());
    }
}

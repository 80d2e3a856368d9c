//! Checks the contents of a decode call's index buffers on the host, in full,
//! before anything is written: lengths, block ids, `kv_indptr` and slots.

use decode_attn_core::{CheckedArgs, Error, KvIndexBuffers, KvLayout, Plan, Result};

use crate::kernel::Slots;
use crate::CpuBuffer;

/// A validated index: every id that a token of a sequence uses is in range.
#[derive(Debug)]
pub(crate) enum Index {
    Blocks { table: Vec<i32>, stride: usize, block_size: usize },
    Tokens { indptr: Vec<i32>, indices: Vec<i32> },
}

impl Index {
    pub(crate) fn slots(&self, seq: usize) -> Slots<'_> {
        match self {
            Index::Blocks { table, stride, block_size } => {
                Slots::Blocks { row: &table[seq * stride..(seq + 1) * stride], block_size: *block_size }
            }
            Index::Tokens { indptr, indices } => {
                Slots::Tokens(&indices[indptr[seq] as usize..indptr[seq + 1] as usize])
            }
        }
    }
}

pub(crate) fn read_i32s(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The run-time sequence lengths and the validated index of one call.
pub(crate) fn validate(
    plan: &Plan,
    seq_lens: &CpuBuffer,
    kv_index: &KvIndexBuffers<'_, CpuBuffer>,
    checked: &CheckedArgs,
) -> Result<(Vec<u32>, Index)> {
    let lens = read_i32s(seq_lens.as_bytes());
    let mut seq_lens = Vec::with_capacity(lens.len());
    for (seq, &len) in lens.iter().enumerate() {
        if len < 0 {
            return Err(Error::NegativeSeqLen { seq, seq_len: len as i64 });
        }
        seq_lens.push(len as u32);
    }
    let num_slots = checked.num_slots;
    let index = match (kv_index, plan.problem.layout) {
        (KvIndexBuffers::BlockTable { table, max_blocks_per_seq }, KvLayout::BlockTable { kernel_block_size, .. }) => {
            let table = read_i32s(table.as_bytes());
            let stride = *max_blocks_per_seq;
            let capacity = stride.saturating_mul(kernel_block_size);
            let num_blocks = num_slots / kernel_block_size;
            for (seq, &len) in seq_lens.iter().enumerate() {
                let len = len as usize;
                if len > capacity {
                    return Err(Error::SeqTooLong { seq, seq_len: len, capacity });
                }
                let row = &table[seq * stride..(seq + 1) * stride];
                for (index, &block) in row[..len.div_ceil(kernel_block_size)].iter().enumerate() {
                    if block < 0 || block as usize >= num_blocks {
                        return Err(Error::BlockIdOutOfRange { seq, index, block: block as i64, num_blocks });
                    }
                }
            }
            Index::Blocks { table, stride, block_size: kernel_block_size }
        }
        (KvIndexBuffers::TokenIndices { indptr, indices }, KvLayout::TokenIndices { .. }) => {
            let indptr = read_i32s(indptr.as_bytes());
            let indices = read_i32s(indices.as_bytes());
            let num_indices = indices.len();
            for (seq, &len) in seq_lens.iter().enumerate() {
                let (start, end) = (indptr[seq], indptr[seq + 1]);
                if start < 0 || end < start || end as usize > num_indices {
                    return Err(Error::InvalidIndptr { seq, start: start as i64, end: end as i64, num_indices });
                }
                let indexed = (end - start) as usize;
                if indexed != len as usize {
                    return Err(Error::IndptrLengthMismatch { seq, indexed, seq_len: len as usize });
                }
                for (position, &slot) in indices[start as usize..end as usize].iter().enumerate() {
                    if slot < 0 || slot as usize >= num_slots {
                        return Err(Error::SlotOutOfRange { seq, position, slot: slot as i64, num_slots });
                    }
                }
            }
            Index::Tokens { indptr, indices }
        }
        // `DecodeArgs::check` has already refused a layout that is not the plan's.
        (given, planned) => {
            return Err(Error::PlanMismatch { planned: planned.to_string(), given: given.describe().into() })
        }
    };
    Ok((seq_lens, index))
}

pub(crate) fn read_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

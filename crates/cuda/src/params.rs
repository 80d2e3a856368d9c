//! Host mirrors of kernels/cuda/decode_params.h. Field order, types and
//! padding must match the C structs exactly; the size tests below catch drift.

use cudarc::driver::DeviceRepr;

/// `DecodeParams` of decode_params.h.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeParams {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub out: u64,
    pub seq_lens: u64,
    pub block_table: u64,
    pub kv_indptr: u64,
    pub kv_indices: u64,
    pub partial_acc: u64,
    pub partial_ml: u64,
    pub num_slots: i64,
    pub num_indices: i64,
    pub num_seqs: i32,
    pub num_q_heads: i32,
    pub num_kv_heads: i32,
    pub layout: i32,
    pub block_size: i32,
    pub max_blocks_per_seq: i32,
    pub num_splits: i32,
    pub min_tiles_per_split: i32,
    pub scale_log2: f32,
    pub _pad: i32,
}

/// `MergeParams` of decode_params.h.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MergeParams {
    pub prefix: u64,
    pub prefix_lse: u64,
    pub suffix: u64,
    pub suffix_lse: u64,
    pub out: u64,
    pub out_lse: u64,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub head_dim: i32,
    pub _pad: i32,
}

pub const LAYOUT_BLOCK_TABLE: i32 = 0;
pub const LAYOUT_TOKEN_INDICES: i32 = 1;

// SAFETY: both are plain-old-data #[repr(C)] structs of integers, floats and
// device addresses (u64 = CUdeviceptr), laid out as the C structs the kernels
// take by value; the driver copies them byte for byte into parameter memory.
unsafe impl DeviceRepr for DecodeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for MergeParams {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_c_structs() {
        // 10 pointers + 2 int64 + 10 int32/float = 80 + 16 + 40 bytes.
        assert_eq!(std::mem::size_of::<DecodeParams>(), 136);
        assert_eq!(std::mem::align_of::<DecodeParams>(), 8);
        // 6 pointers + 4 int32.
        assert_eq!(std::mem::size_of::<MergeParams>(), 64);
    }
}

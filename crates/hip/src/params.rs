//! Host mirror of `DecodeParams` in kernels/cuda/decode_params.h, the launch
//! ABI the HIP kernels share with the CUDA ones (crates/cuda/src/params.rs
//! holds the CUDA backend's copy). Field order, types and padding must match
//! the C struct exactly: the layout test below pins every offset, so a change
//! to the header that is not made here too fails `cargo test`.

/// `DecodeParams` of decode_params.h, passed to the kernels by value.
/// Device addresses are `u64` (`hipDeviceptr_t` on 64-bit hosts); null is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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

/// `DECODE_LAYOUT_BLOCK_TABLE` and `DECODE_LAYOUT_TOKEN_INDICES`.
pub const LAYOUT_BLOCK_TABLE: i32 = 0;
pub const LAYOUT_TOKEN_INDICES: i32 = 1;

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    #[test]
    fn layout_matches_decode_params_h() {
        // 10 pointers, 2 long longs, 8 ints, a float and the pad int.
        assert_eq!(size_of::<DecodeParams>(), 136);
        assert_eq!(align_of::<DecodeParams>(), 8);
        let pointers = [
            offset_of!(DecodeParams, q),
            offset_of!(DecodeParams, k_cache),
            offset_of!(DecodeParams, v_cache),
            offset_of!(DecodeParams, out),
            offset_of!(DecodeParams, seq_lens),
            offset_of!(DecodeParams, block_table),
            offset_of!(DecodeParams, kv_indptr),
            offset_of!(DecodeParams, kv_indices),
            offset_of!(DecodeParams, partial_acc),
            offset_of!(DecodeParams, partial_ml),
            offset_of!(DecodeParams, num_slots),
            offset_of!(DecodeParams, num_indices),
        ];
        assert_eq!(pointers, [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88]);
        let words = [
            offset_of!(DecodeParams, num_seqs),
            offset_of!(DecodeParams, num_q_heads),
            offset_of!(DecodeParams, num_kv_heads),
            offset_of!(DecodeParams, layout),
            offset_of!(DecodeParams, block_size),
            offset_of!(DecodeParams, max_blocks_per_seq),
            offset_of!(DecodeParams, num_splits),
            offset_of!(DecodeParams, min_tiles_per_split),
            offset_of!(DecodeParams, scale_log2),
            offset_of!(DecodeParams, _pad),
        ];
        assert_eq!(words, [96, 100, 104, 108, 112, 116, 120, 124, 128, 132]);
    }

    #[test]
    fn the_header_still_declares_these_fields_in_this_order() {
        // A cheap guard against drift in the C struct itself: the field names,
        // in order, as decode_params.h declares them.
        let header = include_str!("../../../kernels/cuda/decode_params.h");
        let body = header.split("struct DecodeParams {").nth(1).and_then(|rest| rest.split("};").next()).unwrap();
        let fields: Vec<&str> = body
            .lines()
            .filter_map(|line| line.split("//").next())
            .filter_map(|decl| decl.trim().strip_suffix(';'))
            .filter_map(|decl| decl.split_whitespace().last())
            .map(|name| name.trim_start_matches('*'))
            .collect();
        assert_eq!(
            fields,
            [
                "q",
                "k_cache",
                "v_cache",
                "out",
                "seq_lens",
                "block_table",
                "kv_indptr",
                "kv_indices",
                "partial_acc",
                "partial_ml",
                "num_slots",
                "num_indices",
                "num_seqs",
                "num_q_heads",
                "num_kv_heads",
                "layout",
                "block_size",
                "max_blocks_per_seq",
                "num_splits",
                "min_tiles_per_split",
                "scale_log2",
                "_pad",
            ]
        );
    }
}

// decode_params.h: the launch ABI shared by the Rust host code
// (crates/core/src/abi.rs mirrors it field for field, #[repr(C)]) and the
// kernels. Change both together.
//
// Tensors (row-major, contiguous):
//   q, out            [num_seqs, num_q_heads, head_dim]            (T)
//   k_cache, v_cache  [num_slots, num_kv_heads, head_dim]          (T)
//   seq_lens          [num_seqs]                                   (int32)
//   block_table       [num_seqs, max_blocks_per_seq] kernel blocks (int32)  layout 0
//   kv_indptr         [num_seqs + 1]                               (int32)  layout 1
//   kv_indices        [kv_indptr[num_seqs]] slots                  (int32)  layout 1
//   partial_acc       [num_seqs, num_q_heads, num_splits, head_dim] (f32, unnormalised)
//   partial_ml        [num_seqs, num_q_heads, num_splits, 2]        (f32: max in log2 units, sum)
//   out_lse           [num_seqs, num_q_heads]                       (f32, natural log), or null
//
// out_lse, where not null, gets each output row's log-sum-exp in the natural
// log, as merge_attn_states reads it: ln(sum_t exp(softmax_scale * q . k_t))
// = (m + log2(l)) * ln(2) with (m, l) the row's (max in log2 units, sum). A
// sequence of length 0 gets -inf (its output row is zeros); a guarded one
// (below) NaN. Whoever writes an output row writes its LSE: the CTA of an
// unsplit call or of a lone split, else the reducer.
//
// Query head h reads KV head h / (num_q_heads / num_kv_heads).
// Token t of sequence b lives in slot
//   layout 0: block_table[b * max_blocks_per_seq + t / block_size] * block_size + t % block_size
//   layout 1: kv_indices[kv_indptr[b] + t]
//
// Splits (must match decode_attn_core::plan::SplitRule::split exactly):
//   tiles           = ceil(seq_len / 16)
//   splits          = short_splits if 0 < short_splits < num_splits and tiles < short_below_tiles,
//                     num_splits otherwise
//   tiles_per_split = max(min_tiles_per_split, ceil(tiles / splits))
//   active_splits   = ceil(tiles / tiles_per_split)
//   split j covers tokens [j * tiles_per_split * 16, min((j + 1) * tiles_per_split * 16, seq_len))
//
// Splits per CTA: 1, or (the tensor-core kernel, num_splits > 1) one split
// per warp: CTA z of the grid takes splits [z * splits_per_cta, (z + 1) *
// splits_per_cta), warp w the split z * splits_per_cta + w, and each warp
// writes its own partial row; the grid's split dimension is then
// ceil(num_splits / splits_per_cta).
//
// Lone splits (the stream and tensor-core kernels): in a split call with
// splits_per_cta <= 1, a sequence with one active split has its output
// written by that split's CTAs, not by the reducer, and no partial row;
// the reducer leaves its output alone. The other kernels' reducers merge
// every active split.
//
// Guards: a sequence whose length is negative, longer than its block-table
// row, or whose slots or index range fall outside the pools, reads nothing
// out of bounds: its outputs (and LSEs) are written as NaN instead.
#pragma once

#define DECODE_TILE_TOKENS 16
#define DECODE_LAYOUT_BLOCK_TABLE 0
#define DECODE_LAYOUT_TOKEN_INDICES 1
#define DECODE_MAX_SPLITS 1024  // decode_attn_core::plan::MAX_SPLITS
#define DECODE_PACK_MAX_SEQS 2048  // sequences a packed launch counts in every CTA (core's BATCH_MAX_SEQS)
// Grid orders of the tensor-core and stream kernels (DecodeParams::grid_order):
// (num_seqs, head CTAs, num_splits), or the head CTAs of one (sequence,
// split) next to each other: (head CTAs, num_seqs, num_splits).
#define DECODE_GRID_SEQS_FIRST 0
#define DECODE_GRID_HEADS_FIRST 1

struct DecodeParams {
    const void* q;
    const void* k_cache;
    const void* v_cache;
    void* out;
    const int* seq_lens;
    const int* block_table;  // layout 0, else null
    const int* kv_indptr;    // layout 1, else null
    const int* kv_indices;   // layout 1, else null
    float* partial_acc;      // null when num_splits == 1
    float* partial_ml;       // null when num_splits == 1
    float* out_lse;          // null: no LSE is written
    long long num_slots;     // slots in each of k_cache and v_cache
    long long num_indices;   // entries of kv_indices (layout 1)
    int num_seqs;
    int num_q_heads;
    int num_kv_heads;
    int layout;
    int block_size;          // kernel block size (layout 0)
    int max_blocks_per_seq;  // block-table row stride (layout 0)
    int num_splits;
    int min_tiles_per_split;
    float scale_log2;        // softmax_scale * log2(e): scores are kept in log2 units
    int grid_order;          // the tensor-core and stream kernels' grid, DECODE_GRID_*
    int splits_per_cta;      // 1, or (tensor-core kernel, split calls) the CTA's warps take one split each
    int short_splits;        // 0, or the splits of a sequence of fewer than short_below_tiles tiles
    int short_below_tiles;
    int batch_splits;        // 0, or the rule cuts by the batch's mean length (see Splits)
};

struct MergeParams {
    const void* prefix;       // [num_tokens, num_heads, head_dim] (T), normalised
    const float* prefix_lse;  // [num_tokens, num_heads], natural log
    const void* suffix;
    const float* suffix_lse;
    void* out;
    float* out_lse;           // may be null
    int num_tokens;
    int num_heads;
    int head_dim;
    int _pad;
};

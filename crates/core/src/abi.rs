//! The kernels' launch ABI: host mirrors of the structs in
//! kernels/cuda/decode_params.h, which the CUDA kernels and the portable HIP
//! kernel share, and the one place that fills `DecodeParams` from a plan.
//! Field order, types and padding must match the C structs exactly: the
//! layout tests below pin every offset and re-read the header's field order,
//! so a change to the header that is not made here fails `cargo test`.
//!
//! Device addresses are `u64` (`CUdeviceptr`, `hipDeviceptr_t` on 64-bit
//! hosts); null is 0. The backends pass these structs to the kernels by value.

use crate::{CheckedArgs, DecodeArgs, Error, KvIndexBuffers, KvLayout, Plan, Result};

/// `DECODE_LAYOUT_BLOCK_TABLE` and `DECODE_LAYOUT_TOKEN_INDICES`.
pub const LAYOUT_BLOCK_TABLE: i32 = 0;
pub const LAYOUT_TOKEN_INDICES: i32 = 1;

/// The alignment in bytes the GPU decode kernels need of the buffer that
/// [`DecodeParams::new`] calls `name`: the element arrays (Q, K, V, output,
/// the workspace) are read and written up to 16 bytes at a time, the `i32`
/// arrays (lengths, block table, token indices) an element at a time. Every
/// row of the element arrays is a multiple of 16 bytes at every supported
/// head dim, so an aligned base keeps every row aligned. (The merge op reads
/// and writes an element at a time: it needs the element's size.)
pub fn decode_alignment(name: &str) -> u64 {
    match name {
        "seq_lens" | "block_table" | "kv_indptr" | "kv_indices" | "lse" => 4,
        _ => 16,
    }
}

/// `address`, or [`Error::Misaligned`] where it is not a multiple of
/// `alignment`. Null (an empty buffer) passes.
pub fn check_alignment(name: &'static str, address: u64, alignment: u64) -> Result<u64> {
    if address % alignment == 0 {
        Ok(address)
    } else {
        Err(Error::Misaligned { name, address, alignment })
    }
}

/// `DecodeParams` of decode_params.h.
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
    /// Null (0) when the call asks for no LSE.
    pub out_lse: u64,
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
    /// [`GRID_SEQS_FIRST`] or [`GRID_HEADS_FIRST`]: how the tensor-core and
    /// stream kernels read their grid (the launching backend sets it).
    pub grid_order: i32,
    /// 1, or (the tensor-core kernel's split calls) splits one CTA takes,
    /// one per warp; set by the CUDA backend from its launch.
    pub splits_per_cta: i32,
    /// [`SplitRule::short_splits`](crate::SplitRule::short_splits) and
    /// [`SplitRule::short_below_tiles`](crate::SplitRule::short_below_tiles).
    pub short_splits: i32,
    pub short_below_tiles: i32,
    /// [`SplitRule::batch_splits`](crate::SplitRule::batch_splits): 0, or
    /// the rule cuts by the batch's mean length (only the tensor-core
    /// kernel's packed entry points and the stream reducer evaluate it).
    pub batch_splits: i32,
}

/// `DECODE_GRID_SEQS_FIRST`: the grid is `(num_seqs, head CTAs, num_splits)`.
pub const GRID_SEQS_FIRST: i32 = 0;
/// `DECODE_GRID_HEADS_FIRST`: the grid is `(head CTAs, num_seqs,
/// num_splits)`, so the CTAs of one (sequence, split) launch side by side.
pub const GRID_HEADS_FIRST: i32 = 1;

/// `MergeParams` of decode_params.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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

impl DecodeParams {
    /// The parameters of `plan` over `args`, which `DecodeArgs::check`
    /// accepted as `checked`; `address(buffer, name)` is the backend's device
    /// address of a buffer. The split-K partials are carved from the
    /// workspace: `partial_acc` `[num_seqs, num_q_heads, num_splits,
    /// head_dim]` f32, then `partial_ml` `[.., num_splits, 2]` f32 (both null
    /// when unsplit).
    pub fn new<B>(
        plan: &Plan,
        args: &DecodeArgs<'_, B>,
        checked: &CheckedArgs,
        mut address: impl FnMut(&B, &'static str) -> Result<u64>,
    ) -> Result<DecodeParams> {
        let problem = &plan.problem;
        let shape = problem.shape;
        let (layout, block_size, max_blocks_per_seq, block_table, kv_indptr, kv_indices) = match args.kv_index {
            KvIndexBuffers::BlockTable { table, max_blocks_per_seq } => {
                // `DecodeArgs::check` refuses this mismatch; `CheckedArgs`
                // can be built without it, so it is an error here too.
                let KvLayout::BlockTable { kernel_block_size, .. } = problem.layout else {
                    return Err(Error::PlanMismatch {
                        planned: format!("{:?}", problem.layout),
                        given: "a block table".to_string(),
                    });
                };
                (LAYOUT_BLOCK_TABLE, kernel_block_size, max_blocks_per_seq, address(table, "block_table")?, 0, 0)
            }
            KvIndexBuffers::TokenIndices { indptr, indices } => {
                (LAYOUT_TOKEN_INDICES, 0, 0, 0, address(indptr, "kv_indptr")?, address(indices, "kv_indices")?)
            }
        };
        let num_splits = plan.rule.num_splits.max(1);
        let split = num_splits > 1;
        let workspace = address(args.workspace, "workspace")?;
        let acc_bytes = (problem.num_seqs() * shape.num_q_heads * num_splits as usize * shape.head_dim * 4) as u64;
        Ok(DecodeParams {
            q: address(args.q, "q")?,
            k_cache: address(args.k_cache, "k_cache")?,
            v_cache: address(args.v_cache, "v_cache")?,
            out: address(args.out, "out")?,
            seq_lens: address(args.seq_lens, "seq_lens")?,
            block_table,
            kv_indptr,
            kv_indices,
            partial_acc: if split { workspace } else { 0 },
            partial_ml: if split { workspace + acc_bytes } else { 0 },
            out_lse: match &args.lse {
                Some(lse) => address(lse, "lse")?,
                None => 0,
            },
            num_slots: checked.num_slots as i64,
            num_indices: if layout == LAYOUT_TOKEN_INDICES { checked.index_len as i64 } else { 0 },
            num_seqs: problem.num_seqs() as i32,
            num_q_heads: shape.num_q_heads as i32,
            num_kv_heads: shape.num_kv_heads as i32,
            layout,
            block_size: block_size as i32,
            max_blocks_per_seq: max_blocks_per_seq as i32,
            num_splits: num_splits as i32,
            // Clamped into i32: any length (an i32) has fewer tiles than this,
            // so a larger minimum means the same one split.
            min_tiles_per_split: plan.rule.min_tiles_per_split.min(i32::MAX as u32) as i32,
            scale_log2: checked.scale_log2(),
            grid_order: GRID_SEQS_FIRST,
            splits_per_cta: 1,
            // Both below num_splits and the longest length's tiles (the
            // planner's invariant), so they fit i32 as num_splits does.
            short_splits: plan.rule.short_splits.min(i32::MAX as u32) as i32,
            short_below_tiles: plan.rule.short_below_tiles.min(i32::MAX as u32) as i32,
            // Below num_splits (at most MAX_SPLITS).
            batch_splits: plan.rule.batch_splits.min(i32::MAX as u32) as i32,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;
    use crate::backend::partial_state_bytes;
    use crate::{AttentionShape, DType, DTypes, DecodeProblem, DeviceBuffer, DeviceProps, Policy};

    /// A buffer of `len` bytes at device address `base`.
    struct Fake {
        base: u64,
        len: usize,
    }
    impl DeviceBuffer for Fake {
        fn len_bytes(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn partials_are_carved_from_the_workspace_as_the_kernels_expect() {
        let shape = AttentionShape::new(32, 8, 128).unwrap();
        let problem =
            DecodeProblem::new(shape, DTypes::uniform(DType::Bf16), KvLayout::block_table(16), vec![4096, 300])
                .unwrap();
        let plan =
            crate::plan(&problem, Policy::Deterministic { tile_tokens: 256 }, &DeviceProps::gpu_like(304)).unwrap();
        assert!(plan.rule.num_splits > 1);
        let buffer = |base: u64, len: usize| Fake { base, len };
        let (q, k, v, lens) = (
            buffer(1 << 40, problem.q_bytes()),
            buffer(2 << 40, 1024 * problem.kv_bytes_per_token()),
            buffer(3 << 40, 1024 * problem.kv_bytes_per_token()),
            buffer(4 << 40, 2 * 4),
        );
        let table = buffer(5 << 40, 2 * 256 * 4);
        let mut out = buffer(6 << 40, problem.out_bytes());
        let mut workspace = buffer(7 << 40, plan.workspace_bytes as usize);
        let mut args = DecodeArgs {
            q: &q,
            k_cache: &k,
            v_cache: &v,
            seq_lens: &lens,
            kv_index: KvIndexBuffers::BlockTable { table: &table, max_blocks_per_seq: 256 },
            workspace: &mut workspace,
            out: &mut out,
            lse: None,
            softmax_scale: None,
        };
        let checked = args.check(&plan).unwrap();
        let params = DecodeParams::new(&plan, &args, &checked, |b, _| Ok(b.base)).unwrap();
        // The kernel's partial rows fill the plan's workspace exactly.
        let rows = 2 * 32 * plan.rule.num_splits as u64;
        assert_eq!(params.partial_acc, 7 << 40);
        assert_eq!(params.partial_ml - params.partial_acc, rows * 128 * 4);
        assert_eq!(partial_state_bytes(&plan), rows * 128 * 4 + rows * 8);
        assert_eq!(partial_state_bytes(&plan), plan.workspace_bytes);
        assert_eq!((params.num_splits as u32, params.layout, params.block_size), (plan.rule.num_splits, 0, 16));
        assert_eq!((params.max_blocks_per_seq, params.num_slots, params.num_indices), (256, 1024, 0));
        assert_eq!(params.out_lse, 0, "no LSE asked for");
        // An LSE buffer: its address goes to the kernels; one row short is refused.
        let mut lse = buffer(8 << 40, 2 * 32 * 4);
        args.lse = Some(&mut lse);
        let checked = args.check(&plan).unwrap();
        assert_eq!(DecodeParams::new(&plan, &args, &checked, |b, _| Ok(b.base)).unwrap().out_lse, 8 << 40);
        let mut short_lse = buffer(8 << 40, 32 * 4);
        args.lse = Some(&mut short_lse);
        assert_eq!(args.check(&plan), Err(Error::BufferSize { name: "lse", expected: 256, actual: 128 }));
        args.lse = None;
        // One byte short of what the kernels write is refused before any launch.
        let mut short = buffer(7 << 40, plan.workspace_bytes as usize - 1);
        args.workspace = &mut short;
        let err = args.check(&plan).unwrap_err();
        assert!(matches!(err, Error::WorkspaceTooSmall { .. }), "{err:?}");
        // So is a plan edited to claim it needs no workspace while it splits.
        let mut edited = plan.clone();
        edited.workspace_bytes = 0;
        let mut empty = buffer(0, 0);
        args.workspace = &mut empty;
        let err = args.check(&edited).unwrap_err();
        assert!(
            matches!(err, Error::WorkspaceTooSmall { needed, .. } if needed as u64 == plan.workspace_bytes),
            "{err:?}"
        );
    }

    #[test]
    fn a_block_table_for_a_token_index_plan_is_an_error_not_a_panic() {
        let shape = AttentionShape::new(8, 2, 64).unwrap();
        let problem =
            DecodeProblem::new(shape, DTypes::uniform(DType::F16), KvLayout::token_indices(1), vec![10]).unwrap();
        let plan = crate::plan(&problem, Policy::Auto, &DeviceProps::gpu_like(132)).unwrap();
        let buffer = |base: u64, len: usize| Fake { base, len };
        let (q, k, v, lens, table) =
            (buffer(1 << 40, 0), buffer(2 << 40, 0), buffer(3 << 40, 0), buffer(4 << 40, 0), buffer(5 << 40, 0));
        let (mut out, mut workspace) = (buffer(6 << 40, 0), buffer(7 << 40, 0));
        let args = DecodeArgs {
            q: &q,
            k_cache: &k,
            v_cache: &v,
            seq_lens: &lens,
            kv_index: KvIndexBuffers::BlockTable { table: &table, max_blocks_per_seq: 1 },
            workspace: &mut workspace,
            out: &mut out,
            lse: None,
            softmax_scale: None,
        };
        // Built by hand: `args.check(&plan)` would refuse these arguments.
        let checked = CheckedArgs { num_slots: 16, softmax_scale: 0.125, index_len: 1 };
        let err = DecodeParams::new(&plan, &args, &checked, |b, _| Ok(b.base)).unwrap_err();
        assert!(matches!(err, Error::PlanMismatch { .. }), "{err:?}");
        assert!(args.check(&plan).is_err());
    }

    #[test]
    fn layout_matches_decode_params_h() {
        // 11 pointers, 2 long longs, 13 ints and a float.
        assert_eq!(size_of::<DecodeParams>(), 160);
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
            offset_of!(DecodeParams, out_lse),
            offset_of!(DecodeParams, num_slots),
            offset_of!(DecodeParams, num_indices),
        ];
        assert_eq!(pointers, [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96]);
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
            offset_of!(DecodeParams, grid_order),
            offset_of!(DecodeParams, splits_per_cta),
            offset_of!(DecodeParams, short_splits),
            offset_of!(DecodeParams, short_below_tiles),
            offset_of!(DecodeParams, batch_splits),
        ];
        assert_eq!(words, [104, 108, 112, 116, 120, 124, 128, 132, 136, 140, 144, 148, 152, 156]);
    }

    #[test]
    fn merge_params_match_the_c_struct() {
        // 6 pointers + 4 int32.
        assert_eq!(size_of::<MergeParams>(), 64);
        assert_eq!(offset_of!(MergeParams, num_tokens), 48);
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
                "out_lse",
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
                "grid_order",
                "splits_per_cta",
                "short_splits",
                "short_below_tiles",
                "batch_splits",
            ]
        );
    }
    #[test]
    fn misaligned_addresses_are_refused_by_name_and_aligned_ones_pass() {
        assert_eq!(check_alignment("q", 0, decode_alignment("q")), Ok(0));
        assert_eq!(check_alignment("q", 4096 + 16, decode_alignment("q")), Ok(4112));
        assert_eq!(
            check_alignment("q", 4096 + 2, decode_alignment("q")),
            Err(Error::Misaligned { name: "q", address: 4098, alignment: 16 })
        );
        // The i32 arrays are read an element at a time.
        for name in ["seq_lens", "block_table", "kv_indptr", "kv_indices", "lse"] {
            assert_eq!(decode_alignment(name), 4, "{name}");
            assert!(check_alignment(name, 4100, 4).is_ok());
            assert!(check_alignment(name, 4102, 4).is_err());
        }
        for name in ["q", "k_cache", "v_cache", "out", "workspace"] {
            assert_eq!(decode_alignment(name), 16, "{name}");
        }
        let message = check_alignment("k_cache", 0x1008, 16).unwrap_err().to_string();
        assert!(message.contains("k_cache") && message.contains("0x1008") && message.contains("16"), "{message}");
    }
}

//! The decode-attention problem: heads, head dim, element types, KV layout, batch.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::{DType, Error, KvLayout, Result};

/// Head dims every backend supports.
pub const SUPPORTED_HEAD_DIMS: &[usize] = &[64, 80, 96, 112, 120, 128, 192, 256];

/// Most query heads (and so KV heads) a problem may have: 512 times the
/// largest model's 128, and small enough that a token's row over all heads
/// (at most 2^16 * 256 * 4 bytes) and every count of rows the planner and
/// the backends derive from it fit their integers.
pub const MAX_HEADS: usize = 1 << 16;

/// Longest sequence: the `seq_lens` buffers the kernels read are `i32`.
pub const MAX_SEQ_LEN: u32 = i32::MAX as u32;

/// The per-layer attention geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionShape {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    pub fn new(num_q_heads: usize, num_kv_heads: usize, head_dim: usize) -> Result<Self> {
        let shape = AttentionShape { num_q_heads, num_kv_heads, head_dim };
        shape.validate()?;
        Ok(shape)
    }

    pub fn validate(&self) -> Result<()> {
        if self.num_kv_heads == 0 || self.num_q_heads == 0 || self.num_q_heads % self.num_kv_heads != 0 {
            return Err(Error::InvalidHeads { num_q_heads: self.num_q_heads, num_kv_heads: self.num_kv_heads });
        }
        // num_kv_heads divides num_q_heads, so this bounds both.
        Error::check_range("num_q_heads", self.num_q_heads as u64, 1, MAX_HEADS as u64)?;
        if !SUPPORTED_HEAD_DIMS.contains(&self.head_dim) {
            return Err(Error::UnsupportedHeadDim { head_dim: self.head_dim, supported: SUPPORTED_HEAD_DIMS });
        }
        Ok(())
    }

    /// Query heads per KV head (g). GQA packing serves all of them from one read of KV.
    pub fn group_size(&self) -> usize {
        self.num_q_heads / self.num_kv_heads
    }

    /// Softmax scale used when the caller gives none: 1/sqrt(head_dim).
    pub fn default_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Element types of the three tensors. Accumulation is always f32 (f64 in the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DTypes {
    pub q: DType,
    pub kv: DType,
    pub out: DType,
}

impl DTypes {
    /// The same type for Q, KV and output.
    pub const fn uniform(dtype: DType) -> Self {
        DTypes { q: dtype, kv: dtype, out: dtype }
    }
}

/// One decode call: the geometry, the types, the layout and the batch's sequence lengths.
///
/// The lengths here are the host's view used for planning; the kernels read the
/// lengths from the `seq_lens` buffer at run time, so a plan stays valid (and
/// correct) for other lengths in the same batch size, e.g. in a replayed CUDA graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeProblem {
    pub shape: AttentionShape,
    pub dtypes: DTypes,
    pub layout: KvLayout,
    pub seq_lens: Vec<u32>,
}

impl DecodeProblem {
    pub fn new(shape: AttentionShape, dtypes: DTypes, layout: KvLayout, seq_lens: Vec<u32>) -> Result<Self> {
        let problem = DecodeProblem { shape, dtypes, layout, seq_lens };
        problem.validate()?;
        Ok(problem)
    }

    pub fn validate(&self) -> Result<()> {
        self.shape.validate()?;
        self.layout.validate()?;
        if let Some((seq, &seq_len)) = self.seq_lens.iter().enumerate().find(|&(_, &len)| len > MAX_SEQ_LEN) {
            return Err(Error::SeqLenTooLarge { seq, seq_len: seq_len as u64, max: MAX_SEQ_LEN as u64 });
        }
        Ok(())
    }

    pub fn num_seqs(&self) -> usize {
        self.seq_lens.len()
    }

    pub fn max_seq_len(&self) -> u32 {
        self.seq_lens.iter().copied().max().unwrap_or(0)
    }

    /// Bytes of one token position of K (or V) across all KV heads.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.shape.num_kv_heads * self.shape.head_dim * self.dtypes.kv.size_bytes()
    }

    /// Bytes of K and V that one decode call must read: 2 * h_kv * d * b per
    /// position (`u64::MAX` where that does not fit: no call reads so much).
    pub fn kv_bytes(&self) -> u64 {
        let tokens = self.seq_lens.iter().fold(0u64, |sum, &s| sum.saturating_add(s as u64));
        tokens.saturating_mul(2 * self.kv_bytes_per_token() as u64)
    }

    /// Bytes of Q (or the output, with `dtypes.out`): `[num_seqs, num_q_heads, head_dim]`.
    pub fn q_bytes(&self) -> usize {
        self.num_seqs() * self.shape.num_q_heads * self.shape.head_dim * self.dtypes.q.size_bytes()
    }

    pub fn out_bytes(&self) -> usize {
        self.num_seqs() * self.shape.num_q_heads * self.shape.head_dim * self.dtypes.out.size_bytes()
    }
}

impl fmt::Display for DecodeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "B={} h={} h_kv={} d={} q/kv/out={}/{}/{} {}",
            self.num_seqs(),
            self.shape.num_q_heads,
            self.shape.num_kv_heads,
            self.shape.head_dim,
            self.dtypes.q,
            self.dtypes.kv,
            self.dtypes.out,
            self.layout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_heads_with_the_values() {
        let err = AttentionShape::new(28, 5, 128).unwrap_err();
        assert_eq!(err, Error::InvalidHeads { num_q_heads: 28, num_kv_heads: 5 });
        assert!(err.to_string().contains("28") && err.to_string().contains('5'));
        assert!(AttentionShape::new(8, 0, 128).is_err());
        assert!(AttentionShape::new(28, 4, 128).is_ok(), "non-power-of-two groups are fine");
    }

    #[test]
    fn bounds_heads_and_lengths_so_sizes_cannot_wrap() {
        assert!(AttentionShape::new(MAX_HEADS, 8, 256).is_ok());
        // 2^62 query heads made every byte count wrap to 0 (s51's fuzzing).
        let err = AttentionShape::new(1 << 62, 1, 128).unwrap_err();
        assert_eq!(err, Error::OutOfRange { what: "num_q_heads", value: 1 << 62, min: 1, max: 1 << 16 });
        assert!(err.to_string().contains("4611686018427387904"), "{err}");
        let shape = AttentionShape::new(8, 2, 64).unwrap();
        let with_lens =
            |lens: Vec<u32>| DecodeProblem::new(shape, DTypes::uniform(DType::Bf16), KvLayout::block_table(16), lens);
        assert!(with_lens(vec![0, MAX_SEQ_LEN]).is_ok());
        let err = with_lens(vec![3, MAX_SEQ_LEN + 1]).unwrap_err();
        assert_eq!(err, Error::SeqLenTooLarge { seq: 1, seq_len: 1 << 31, max: i32::MAX as u64 });
    }

    #[test]
    fn rejects_unsupported_head_dim() {
        let err = AttentionShape::new(32, 8, 100).unwrap_err();
        assert!(err.to_string().contains("100"), "{err}");
        for &d in SUPPORTED_HEAD_DIMS {
            AttentionShape::new(32, 8, d).unwrap();
        }
    }

    #[test]
    fn kv_bytes_of_llama3_8b_layer() {
        let problem = DecodeProblem::new(
            AttentionShape::new(32, 8, 128).unwrap(),
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![2560],
        )
        .unwrap();
        assert_eq!(problem.kv_bytes(), 10_485_760);
    }
}

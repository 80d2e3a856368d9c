//! The judge of every backend: decode attention in f64, plainly.
//!
//! No tiles, no online softmax, no splits: for each sequence and query head,
//! all scores, their max, the exponentials, their sum, and the weighted sum of
//! values, in that order. Slow, and meant to be obviously right.

use decode_attn_core::dtype;
use decode_attn_core::synth::HostBatch;

/// Decode attention of `batch` in f64: `[num_seqs, num_q_heads, head_dim]`.
///
/// Query head `h` reads KV head `h / group_size`; inputs are decoded from
/// their dtypes; a sequence of length 0 (or a negative one) gives zeros; a
/// sequence with a token whose slot falls outside the index or the pool gives
/// NaN, as the kernels' guards do.
pub fn decode_reference(batch: &HostBatch, softmax_scale: f32) -> Vec<f64> {
    decode_reference_with_lse(batch, softmax_scale).0
}

/// [`decode_reference`] and each output row's log-sum-exp in the natural log,
/// `ln(sum_t exp(softmax_scale * q.k_t))`, `[num_seqs, num_q_heads]`: `-inf`
/// for a sequence of length 0, NaN where the output is NaN.
pub fn decode_reference_with_lse(batch: &HostBatch, softmax_scale: f32) -> (Vec<f64>, Vec<f64>) {
    let problem = &batch.problem;
    let shape = problem.shape;
    let (num_q_heads, num_kv_heads, d) = (shape.num_q_heads, shape.num_kv_heads, shape.head_dim);
    let group = shape.group_size();
    let scale = softmax_scale as f64;
    let q = dtype::decode(problem.dtypes.q, &batch.q);
    let k = dtype::decode(problem.dtypes.kv, &batch.k_cache);
    let v = dtype::decode(problem.dtypes.kv, &batch.v_cache);
    let num_seqs = batch.seq_lens.len();
    let mut out = vec![0.0f64; num_seqs * num_q_heads * d];
    let mut lse = vec![f64::NEG_INFINITY; num_seqs * num_q_heads];

    for (seq, &seq_len) in batch.seq_lens.iter().enumerate() {
        let seq_len = seq_len.max(0) as usize;
        if seq_len == 0 {
            continue;
        }
        let Some(slots) = (0..seq_len).map(|t| batch.slot(seq, t)).collect::<Option<Vec<usize>>>() else {
            out[seq * num_q_heads * d..][..num_q_heads * d].fill(f64::NAN);
            lse[seq * num_q_heads..][..num_q_heads].fill(f64::NAN);
            continue;
        };
        for h in 0..num_q_heads {
            let kv_head = h / group;
            let q_row = &q[(seq * num_q_heads + h) * d..][..d];
            // Where the row of `slot` for this KV head starts in K and in V.
            let at = |slot: usize| (slot * num_kv_heads + kv_head) * d;

            let scores: Vec<f64> = slots
                .iter()
                .map(|&slot| {
                    scale * q_row.iter().zip(&k[at(slot)..][..d]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|&s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            lse[seq * num_q_heads + h] = max + sum.ln();

            let o = &mut out[(seq * num_q_heads + h) * d..][..d];
            for (&slot, &w) in slots.iter().zip(&weights) {
                for (o, &x) in o.iter_mut().zip(&v[at(slot)..][..d]) {
                    *o += w * x as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
        }
    }
    (out, lse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use decode_attn_core::synth::HostIndex;
    use decode_attn_core::{AttentionShape, DType, DTypes, DecodeProblem, KvLayout};

    fn batch() -> HostBatch {
        let shape = AttentionShape::new(4, 2, 64).unwrap();
        let problem =
            DecodeProblem::new(shape, DTypes::uniform(DType::F32), KvLayout::block_table(16), vec![40, 20]).unwrap();
        HostBatch::random(&problem, 3)
    }

    #[test]
    fn slots_outside_the_index_or_the_pool_give_nan_not_a_panic() {
        let per_seq = 4 * 64;
        let scale = 0.125;
        // Sequence 1 grows past the blocks its row holds (3 rows of 16 tokens at most).
        let mut longer = batch();
        longer.seq_lens[1] = 100;
        let out = decode_reference(&longer, scale);
        assert!(out[..per_seq].iter().all(|x| x.is_finite()));
        assert!(out[per_seq..].iter().all(|x| x.is_nan()));
        // A negative block id in sequence 0's row.
        let mut negative = batch();
        let HostIndex::BlockTable { table, .. } = &mut negative.index else { panic!("a block table") };
        table[0] = -1;
        let out = decode_reference(&negative, scale);
        assert!(out[..per_seq].iter().all(|x| x.is_nan()));
        assert!(out[per_seq..].iter().all(|x| x.is_finite()));
    }
}

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
/// their dtypes; a sequence of length 0 (or a negative one) gives zeros.
pub fn decode_reference(batch: &HostBatch, softmax_scale: f32) -> Vec<f64> {
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

    for (seq, &seq_len) in batch.seq_lens.iter().enumerate() {
        let seq_len = seq_len.max(0) as usize;
        if seq_len == 0 {
            continue;
        }
        let slots: Vec<usize> = (0..seq_len).map(|t| batch.slot(seq, t)).collect();
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

            let o = &mut out[(seq * num_q_heads + h) * d..][..d];
            for (&slot, &w) in slots.iter().zip(&weights) {
                for (o, &x) in o.iter_mut().zip(&v[at(slot)..][..d]) {
                    *o += w * x as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
        }
    }
    out
}

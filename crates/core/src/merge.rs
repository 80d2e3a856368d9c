//! The two-way attention-state merge on the host.
//!
//! A state is a normalised output `o` and its log-sum-exp `lse` (natural log)
//! over the keys it saw. Two states over disjoint key sets merge exactly:
//!
//! ```text
//! m = max(lse_a, lse_b)
//! w_a = exp(lse_a - m), w_b = exp(lse_b - m)
//! o = (w_a * o_a + w_b * o_b) / (w_a + w_b),   lse = m + ln(w_a + w_b)
//! ```
//!
//! An empty state has `lse = -inf`; two empty states merge to zeros with `lse = -inf`.

/// Merges one head's two states into `out`; returns the merged LSE.
pub fn merge_state(out: &mut [f32], prefix: &[f32], prefix_lse: f32, suffix: &[f32], suffix_lse: f32) -> f32 {
    let m = prefix_lse.max(suffix_lse);
    if m == f32::NEG_INFINITY || m.is_nan() {
        out.iter_mut().for_each(|o| *o = 0.0);
        return f32::NEG_INFINITY;
    }
    let wa = (prefix_lse - m).exp();
    let wb = (suffix_lse - m).exp();
    let total = wa + wb;
    for ((o, &a), &b) in out.iter_mut().zip(prefix).zip(suffix) {
        *o = (wa * a + wb * b) / total;
    }
    m + total.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention of one query over scores `s` and values `v` (1-dim), with its LSE.
    fn attend(scores: &[f32], values: &[f32]) -> (f32, f32) {
        let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f32 = w.iter().sum();
        (w.iter().zip(values).map(|(w, v)| w * v).sum::<f32>() / l, m + l.ln())
    }

    #[test]
    fn merging_halves_equals_the_whole() {
        let scores = [0.3, -1.2, 2.5, 0.0, 1.1, -0.7];
        let values = [1.0, 2.0, -3.0, 0.5, 4.0, -1.5];
        let (whole, whole_lse) = attend(&scores, &values);
        let (a, la) = attend(&scores[..2], &values[..2]);
        let (b, lb) = attend(&scores[2..], &values[2..]);
        let mut out = [f32::NAN];
        let lse = merge_state(&mut out, &[a], la, &[b], lb);
        assert!((out[0] - whole).abs() < 1e-5, "{} vs {whole}", out[0]);
        assert!((lse - whole_lse).abs() < 1e-5);
    }

    #[test]
    fn empty_states_contribute_nothing() {
        let mut out = [f32::NAN; 2];
        let lse = merge_state(&mut out, &[1.0, 2.0], 0.5, &[9.0, 9.0], f32::NEG_INFINITY);
        assert_eq!(out, [1.0, 2.0]);
        assert_eq!(lse, 0.5);
        let lse = merge_state(&mut out, &[1.0, 2.0], f32::NEG_INFINITY, &[9.0, 9.0], f32::NEG_INFINITY);
        assert_eq!(out, [0.0, 0.0]);
        assert_eq!(lse, f32::NEG_INFINITY);
    }
}

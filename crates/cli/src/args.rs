//! Parsers for the command-line values that are not plain numbers.

use decode_attn::{BackendSpec, DType, KvLayout, Policy};

/// `block:16`, `block:16/64` (kernel block / allocator block) or `tokens:N` (page size N).
pub fn parse_layout(text: &str) -> Result<KvLayout, String> {
    let expected = "expected block:K, block:K/A (kernel block K in allocator blocks of A) or tokens:P (page size P)";
    let number =
        |s: &str| s.trim().parse::<usize>().map_err(|_| format!("{text:?}: {s:?} is not a number; {expected}"));
    let layout = match text.split_once(':') {
        Some(("block", sizes)) => match sizes.split_once('/') {
            Some((kernel, allocator)) => {
                KvLayout::BlockTable { kernel_block_size: number(kernel)?, allocator_block_size: number(allocator)? }
            }
            None => KvLayout::block_table(number(sizes)?),
        },
        Some(("tokens", page)) => KvLayout::token_indices(number(page)?),
        _ => return Err(format!("unknown layout {text:?}; {expected}")),
    };
    layout.validate().map_err(|err| err.to_string())?;
    Ok(layout)
}

/// Most sequences one batch may hold, however it is given (`--batch`,
/// `--lens`): far past any engine's batch, and few enough that a batch's
/// lengths, and the arithmetic on them, stay small.
pub const MAX_BATCH: usize = 1 << 20;

/// `--batch`: a number of sequences, 1 to [`MAX_BATCH`].
pub fn parse_batch(text: &str) -> Result<usize, String> {
    let batch = text.trim().parse::<u64>().map_err(|_| format!("{text:?} is not a number of sequences"))?;
    if batch == 0 {
        return Err("a batch needs at least one sequence".into());
    }
    if batch > MAX_BATCH as u64 {
        return Err(format!("{batch} sequences is more than any batch ({MAX_BATCH} at most)"));
    }
    Ok(batch as usize)
}

/// One batch's sequence lengths as `--lens` gives them, written out only when
/// its shape runs: many batches on a command line stay a few bytes each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lens {
    form: LensForm,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LensForm {
    /// (length, count) runs, in order, each count at least 1.
    Runs(Vec<(u32, usize)>),
    /// `count` lengths evenly spaced from `lo` to `hi`.
    Spread { count: usize, lo: u32, hi: u32 },
}

impl Lens {
    /// Sequences in the batch (1 to [`MAX_BATCH`]).
    pub fn count(&self) -> usize {
        match &self.form {
            LensForm::Runs(runs) => runs.iter().map(|&(_, count)| count).sum(),
            LensForm::Spread { count, .. } => *count,
        }
    }

    /// The longest length.
    pub fn max(&self) -> u32 {
        match &self.form {
            LensForm::Runs(runs) => runs.iter().map(|&(len, _)| len).max().unwrap_or(0),
            LensForm::Spread { hi, .. } => *hi,
        }
    }

    /// Every sequence's length, in order.
    pub fn to_vec(&self) -> Vec<u32> {
        match self.form {
            LensForm::Runs(ref runs) => runs.iter().flat_map(|&(len, count)| std::iter::repeat_n(len, count)).collect(),
            LensForm::Spread { count, lo, hi } => {
                let (count, lo, hi) = (count as u64, lo as u64, hi as u64);
                // At most 2^32 * 2^20: no overflow, and every length lies in lo..=hi.
                (0..count).map(|i| if count == 1 { lo } else { lo + (hi - lo) * i / (count - 1) } as u32).collect()
            }
        }
    }
}

/// One batch's sequence lengths: `LxC+LxC+...` (C sequences of length L, in
/// that order) or `spread:B:LO-HI` (B lengths evenly spaced from LO to HI),
/// at most [`MAX_BATCH`] sequences.
pub fn parse_lens(text: &str) -> Result<Lens, String> {
    let expected = "expected LxC+LxC... (C sequences of length L) or spread:B:LO-HI";
    let number = |s: &str| s.trim().parse::<u64>().map_err(|_| format!("{text:?}: {s:?} is not a number; {expected}"));
    let length = |len: u64| u32::try_from(len).map_err(|_| format!("{text:?}: length {len} does not fit in 32 bits"));
    let form = if let Some(spread) = text.strip_prefix("spread:") {
        let (count, range) = spread.split_once(':').ok_or_else(|| format!("{text:?}: {expected}"))?;
        let (lo, hi) = range.split_once('-').ok_or_else(|| format!("{text:?}: {expected}"))?;
        let (count, lo, hi) = (number(count)?, number(lo)?, number(hi)?);
        if count > MAX_BATCH as u64 {
            return Err(format!(
                "{text:?}: a spread of {count} sequences is more than any batch ({MAX_BATCH} at most)"
            ));
        }
        if hi < lo {
            return Err(format!("{text:?}: the spread's end {hi} is below its start {lo}"));
        }
        LensForm::Spread { count: count as usize, lo: length(lo)?, hi: length(hi)? }
    } else {
        let mut runs = Vec::new();
        let mut total = 0usize;
        for term in text.split('+') {
            let (len, count) = term.split_once('x').ok_or_else(|| format!("{text:?}: term {term:?}: {expected}"))?;
            let (len, count) = (number(len)?, number(count)?);
            if count > MAX_BATCH as u64 {
                return Err(format!(
                    "{text:?}: {count} sequences in one term is more than any batch ({MAX_BATCH} at most)"
                ));
            }
            total += count as usize;
            if total > MAX_BATCH {
                return Err(format!("{text:?}: {total} sequences is more than any batch ({MAX_BATCH} at most)"));
            }
            let len = length(len)?;
            if count > 0 {
                runs.push((len, count as usize));
            }
        }
        LensForm::Runs(runs)
    };
    let lens = Lens { form };
    if lens.count() == 0 {
        return Err(format!("{text:?}: a batch needs at least one sequence"));
    }
    Ok(lens)
}

pub fn parse_policy(text: &str) -> Result<Policy, String> {
    text.parse().map_err(|err: decode_attn::Error| err.to_string())
}

pub fn parse_dtype(text: &str) -> Result<DType, String> {
    text.parse().map_err(|err: decode_attn::Error| err.to_string())
}

pub fn parse_backend(text: &str) -> Result<BackendSpec, String> {
    text.parse().map_err(|err: decode_attn::Error| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(parse_layout("block:16").unwrap(), KvLayout::block_table(16));
        assert_eq!(
            parse_layout("block:16/64").unwrap(),
            KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 64 }
        );
        assert_eq!(parse_layout("tokens:1").unwrap(), KvLayout::token_indices(1));
        for bad in ["block:64/16", "block:24", "tokens:0", "paged", "block:x", "tokens:"] {
            assert!(parse_layout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ragged_batches() {
        let lens = |text: &str| parse_lens(text).unwrap().to_vec();
        assert_eq!(lens("32768x1+512x3"), vec![32768, 512, 512, 512]);
        assert_eq!(lens("spread:5:100-500"), vec![100, 200, 300, 400, 500]);
        assert_eq!(lens("spread:1:7-9"), vec![7]);
        assert_eq!(lens("spread:3:0-1"), vec![0, 0, 1]);
        assert_eq!(lens("7x0+9x2"), vec![9, 9]);
        assert_eq!(lens("spread:3:0-4294967295"), vec![0, 2147483647, 4294967295]);
        for bad in ["", "512", "512x", "x3", "512x0", "spread:0:1-2", "spread:2:9-1", "spread:2:1", "5000000000x1"] {
            assert!(parse_lens(bad).is_err(), "{bad}");
        }
        let many = parse_lens(&format!("spread:{MAX_BATCH}:1-9")).unwrap();
        assert_eq!((many.count(), many.max()), (MAX_BATCH, 9));
        assert_eq!(many.to_vec().len(), MAX_BATCH);
        assert_eq!(parse_lens(&format!("3x{}+4x1", MAX_BATCH - 1)).unwrap().count(), MAX_BATCH);
    }

    /// Batches past [`MAX_BATCH`] are refused before anything is allocated,
    /// naming the count, in every form (these counts would need terabytes).
    #[test]
    fn batches_past_the_cap_are_refused_by_count() {
        for (bad, count) in [
            ("spread:18446744073709551615:1-2", "18446744073709551615"),
            ("spread:1048577:1-2", "1048577"),
            ("1x1048577", "1048577"),
            ("1x18446744073709551615", "18446744073709551615"),
            ("1x1048576+2x1", "1048577"),
            ("1x1000000+2x1000000", "2000000"),
        ] {
            let err = parse_lens(bad).unwrap_err();
            assert!(err.contains(count) && err.contains("more than any batch"), "{bad}: {err}");
        }
        assert_eq!(parse_batch("1048576"), Ok(MAX_BATCH));
        for (bad, shown) in [
            ("10000000000", "10000000000"),
            ("4611686018427387904", "4611686018427387904"),
            ("1048577", "1048577"),
            ("0", "at least one"),
            ("-1", "\"-1\""),
        ] {
            let err = parse_batch(bad).unwrap_err();
            assert!(err.contains(shown), "{bad}: {err}");
        }
    }
}

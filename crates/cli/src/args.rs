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

/// One batch's sequence lengths: `LxC+LxC+...` (C sequences of length L, in
/// that order) or `spread:B:LO-HI` (B lengths evenly spaced from LO to HI).
pub fn parse_lens(text: &str) -> Result<Vec<u32>, String> {
    let expected = "expected LxC+LxC... (C sequences of length L) or spread:B:LO-HI";
    let number = |s: &str| s.trim().parse::<u64>().map_err(|_| format!("{text:?}: {s:?} is not a number; {expected}"));
    let lens: Vec<u64> = if let Some(spread) = text.strip_prefix("spread:") {
        let (count, range) = spread.split_once(':').ok_or_else(|| format!("{text:?}: {expected}"))?;
        let (lo, hi) = range.split_once('-').ok_or_else(|| format!("{text:?}: {expected}"))?;
        let (count, lo, hi) = (number(count)?, number(lo)?, number(hi)?);
        if hi < lo {
            return Err(format!("{text:?}: the spread's end {hi} is below its start {lo}"));
        }
        (0..count).map(|i| if count == 1 { lo } else { lo + (hi - lo) * i / (count - 1) }).collect()
    } else {
        let mut lens = Vec::new();
        for term in text.split('+') {
            let (len, count) = term.split_once('x').ok_or_else(|| format!("{text:?}: term {term:?}: {expected}"))?;
            let (len, count) = (number(len)?, number(count)?);
            if count > 1 << 20 {
                return Err(format!("{text:?}: {count} sequences in one term is more than any batch"));
            }
            lens.extend(std::iter::repeat_n(len, count as usize));
        }
        lens
    };
    if lens.is_empty() {
        return Err(format!("{text:?}: a batch needs at least one sequence"));
    }
    lens.into_iter()
        .map(|len| u32::try_from(len).map_err(|_| format!("{text:?}: length {len} does not fit in 32 bits")))
        .collect()
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
        assert_eq!(parse_lens("32768x1+512x3").unwrap(), vec![32768, 512, 512, 512]);
        assert_eq!(parse_lens("spread:5:100-500").unwrap(), vec![100, 200, 300, 400, 500]);
        assert_eq!(parse_lens("spread:1:7-9").unwrap(), vec![7]);
        assert_eq!(parse_lens("spread:3:0-1").unwrap(), vec![0, 0, 1]);
        for bad in ["", "512", "512x", "x3", "512x0", "spread:0:1-2", "spread:2:9-1", "spread:2:1", "5000000000x1"] {
            assert!(parse_lens(bad).is_err(), "{bad}");
        }
    }
}

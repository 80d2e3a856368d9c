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
}

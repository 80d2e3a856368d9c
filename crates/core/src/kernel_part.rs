//! The parts of a kernel file that a run-time compiler (NVRTC, hiprtc)
//! builds one at a time: one element type at one head dim.
//!
//! Why: compiling all of `kernels/cuda/decode.cu` (259 entry points) held a
//! first decode back by 150 s on an H100 machine (s45), and an engine uses
//! the kernels of one element type and one head dim. `decode.cu` and
//! `kernels/hip/decode_kvgrid.hip` compile one part alone when given
//! [`KernelPart::defines`] (decode.cu's "Parts" comment); the backends read
//! a function's part from its name ([`KernelPart::of_function`]).

use std::fmt;

use crate::shape::SUPPORTED_HEAD_DIMS;
use crate::{DType, Error};

/// A kernel file's entry points for one element type and one head dim;
/// head dim 0 is decode.cu's `merge_attn_states_<T>`, which has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelPart {
    /// Index into [`ELEMENT_NAMES`]; `DA_PART_TYPE` is this plus one.
    element: usize,
    head_dim: u32,
}

/// The element-type suffixes of the entry points, in the order of the
/// kernel files' `DA_PART_TYPE` numbers (1, 2, 3).
const ELEMENT_NAMES: [&str; 3] = ["f32", "f16", "bf16"];

impl KernelPart {
    /// The part holding the kernels of `dtype` at `head_dim`.
    pub fn of_problem(dtype: DType, head_dim: usize) -> KernelPart {
        let element = match dtype {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Bf16 => 2,
        };
        KernelPart { element, head_dim: u32::try_from(head_dim).unwrap_or(u32::MAX) }
    }

    /// The part that defines `function`, from the name alone: entry points
    /// are named `<kernel>_<T>_d<D>[_<variant>]` or `merge_attn_states_<T>`.
    pub fn of_function(function: &str) -> Option<KernelPart> {
        let element_of = |name: &str| ELEMENT_NAMES.iter().position(|e| *e == name);
        if let Some(element) = function.strip_prefix("merge_attn_states_") {
            return element_of(element).map(|element| KernelPart { element, head_dim: 0 });
        }
        let words: Vec<&str> = function.split('_').collect();
        words.windows(2).find_map(|pair| {
            let element = element_of(pair[0])?;
            let digits = pair[1].strip_prefix('d').filter(|d| d.bytes().all(|b| b.is_ascii_digit()))?;
            Some(KernelPart { element, head_dim: digits.parse().ok()? })
        })
    }

    /// Every part there is: each element type at head dim 0 (the merge's
    /// part of decode.cu) and at every supported head dim.
    pub fn all() -> impl Iterator<Item = KernelPart> {
        DType::ALL.into_iter().flat_map(|dtype| {
            std::iter::once(0).chain(SUPPORTED_HEAD_DIMS.iter().copied()).map(move |d| KernelPart::of_problem(dtype, d))
        })
    }

    /// The compiler options that make a kernel file this part alone.
    pub fn defines(&self) -> [String; 2] {
        [format!("-DDA_PART_TYPE={}", self.element + 1), format!("-DDA_PART_HEAD_DIM={}", self.head_dim)]
    }

    /// `err`, from compiling or loading this part of kernel file `file`,
    /// with a device error's message saying which file and part it was.
    pub fn annotate(&self, file: &str, err: Error) -> Error {
        match err {
            Error::Device { backend, message } => {
                Error::Device { backend, message: format!("{file}'s part {self}: {message}") }
            }
            other => other,
        }
    }
}

impl fmt::Display for KernelPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} head_dim {}", ELEMENT_NAMES[self.element], self.head_dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_their_parts() {
        let part = |name| KernelPart::of_function(name).map(|p| p.to_string());
        // decode.cu's names.
        assert_eq!(part("decode_mma_bf16_d128_anyblock").as_deref(), Some("bf16 head_dim 128"));
        assert_eq!(part("decode_stream_reduce_wide_f16_d256").as_deref(), Some("f16 head_dim 256"));
        assert_eq!(part("decode_stream_f32_d64_h8").as_deref(), Some("f32 head_dim 64"));
        assert_eq!(part("merge_attn_states_bf16").as_deref(), Some("bf16 head_dim 0"));
        // decode_kvgrid.hip's.
        assert_eq!(part("decode_kvgrid_bf16_d128").as_deref(), Some("bf16 head_dim 128"));
        assert_eq!(part("decode_kvgrid_reduce_f32_d80").as_deref(), Some("f32 head_dim 80"));
        for unknown in ["merge_attn_states_f64", "decode_mma_bf16", "decode_mma_bf16_dx", "decode_kvgrid_bf16_d", ""] {
            assert_eq!(part(unknown), None, "{unknown}");
        }
        assert_eq!(KernelPart::of_problem(DType::Bf16, 128), KernelPart::of_function("decode_attn_bf16_d128").unwrap());
        assert_eq!(KernelPart::of_problem(DType::F16, 80).defines(), ["-DDA_PART_TYPE=2", "-DDA_PART_HEAD_DIM=80"]);
        assert_eq!(KernelPart::of_problem(DType::F32, 0).defines(), ["-DDA_PART_TYPE=1", "-DDA_PART_HEAD_DIM=0"]);
    }

    #[test]
    fn annotated_errors_name_the_file_and_part() {
        let part = KernelPart::of_problem(DType::Bf16, 128);
        let device = Error::Device { backend: "cuda", message: "nvrtc failed".into() };
        let annotated =
            Error::Device { backend: "cuda", message: "decode.cu's part bf16 head_dim 128: nvrtc failed".into() };
        assert_eq!(part.annotate("decode.cu", device), annotated);
        let other = Error::Unavailable { backend: "hip", reason: "no hiprtc".into() };
        assert_eq!(part.annotate("decode.cu", other.clone()), other);
    }

    #[test]
    fn all_lists_each_part_once() {
        let all: Vec<KernelPart> = KernelPart::all().collect();
        assert_eq!(all.len(), 3 * (SUPPORTED_HEAD_DIMS.len() + 1));
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
        assert!(all.contains(&KernelPart::of_problem(DType::Bf16, 0)));
        assert!(all.contains(&KernelPart::of_problem(DType::F32, 256)));
    }
}

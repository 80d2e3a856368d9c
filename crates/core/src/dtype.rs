//! Element types of Q, the KV cache and the output.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::Error;

/// An element type. `#[non_exhaustive]` leaves room for fp8 KV with scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(DType::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            _ => Err(Error::UnknownDType(s.to_string())),
        }
    }
}

/// Encode `values` as little-endian elements of `dtype` (round to nearest even).
pub fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    for &v in values {
        match dtype {
            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            DType::Bf16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
        }
    }
    out
}

/// Decode little-endian elements of `dtype` into f32.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; bytes.len() / dtype.size_bytes()];
    decode_into(dtype, bytes, &mut out);
    out
}

/// Decode `out.len()` elements of `dtype` from the front of `bytes`.
#[inline]
pub fn decode_into(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                // bf16 is the top half of an f32: a shift, which vectorises.
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_exact_for_representable_values() {
        let values = [0.0f32, 1.0, -2.5, 0.15625, 1024.0];
        for dtype in DType::ALL {
            assert_eq!(decode(dtype, &encode(dtype, &values)), values, "{dtype}");
        }
    }

    #[test]
    fn parses_names() {
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
        assert_eq!("FP16".parse::<DType>().unwrap(), DType::F16);
        let err = "int8".parse::<DType>().unwrap_err();
        assert!(err.to_string().contains("int8"), "{err}");
    }
}

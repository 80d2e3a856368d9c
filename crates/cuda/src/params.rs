//! cudarc's view of the launch ABI: the kernels take the structs of
//! [`decode_attn_core::abi`] (decode_params.h) by value, and cudarc passes by
//! value the types that are `DeviceRepr`, a trait this crate can only give
//! to a type of its own.

use cudarc::driver::DeviceRepr;
use decode_attn_core::abi::{DecodeParams, MergeParams};

/// A launch-parameter struct of the ABI, passed by value.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct ByValue<T>(pub T);

// SAFETY: `ByValue` is transparent over plain-old-data #[repr(C)] structs of
// integers, floats and device addresses (u64 = CUdeviceptr), laid out as the
// C structs the kernels take by value (core's abi tests pin every offset);
// the driver copies them byte for byte into parameter memory.
unsafe impl DeviceRepr for ByValue<DecodeParams> {}
// SAFETY: as above.
unsafe impl DeviceRepr for ByValue<MergeParams> {}

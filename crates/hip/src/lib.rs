//! ROCm/HIP backend: the HIP runtime (`libamdhip64`) is loaded at run time, so
//! a binary built with this crate starts on machines with no ROCm at all.
//!
//! Status: [`runtime`] loads libamdhip64 and enumerates devices; the kernels
//! and launch path arrive with the kv-head-grid partitioned kernel (see
//! docs/ARCHITECTURE.md). Until then every constructor returns
//! [`Error::Unavailable`] with the reason, never a panic.

use decode_attn_core::{
    DecodeArgs, DecodeAttention, DecodeProblem, DeviceBuffer, DeviceProps, Error, MergeArgs, Result,
};

mod runtime;

pub use runtime::{Runtime, RUNTIME_CANDIDATES};

const BACKEND: &str = "hip";

/// Number of HIP devices, or why there are none to use: no runtime library,
/// a runtime that finds no device (`hipErrorNoDevice`), or devices this build
/// has no kernels for.
pub fn device_count() -> Result<usize> {
    let runtime = Runtime::load()?;
    let count = runtime.device_count()?;
    if count == 0 {
        return Err(Error::Unavailable { backend: BACKEND, reason: format!("{} reports no device", runtime.library) });
    }
    let name = runtime.device_name(0).unwrap_or_else(|err| err.to_string());
    Err(Error::Unavailable {
        backend: BACKEND,
        reason: format!("{count} device(s) ({name}, ...) found, but this build has no HIP kernels yet"),
    })
}

/// A HIP device. Not constructible until the HIP kernels land.
pub struct HipBackend {
    props: DeviceProps,
}

/// Device memory on a HIP device.
pub struct HipBuffer {
    len: usize,
}

impl DeviceBuffer for HipBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

impl HipBackend {
    pub fn new(_ordinal: usize) -> Result<Self> {
        device_count()?;
        Err(Error::Unavailable { backend: BACKEND, reason: "no HIP kernels in this build".into() })
    }
}

impl DecodeAttention for HipBackend {
    type Buffer = HipBuffer;

    fn name(&self) -> &'static str {
        BACKEND
    }
    fn device_props(&self) -> &DeviceProps {
        &self.props
    }
    fn supports(&self, _problem: &DecodeProblem) -> Result<()> {
        Err(unavailable())
    }
    fn alloc(&self, _bytes: usize) -> Result<HipBuffer> {
        Err(unavailable())
    }
    fn upload(&self, _dst: &mut HipBuffer, _src: &[u8]) -> Result<()> {
        Err(unavailable())
    }
    fn download(&self, _src: &HipBuffer, _dst: &mut [u8]) -> Result<()> {
        Err(unavailable())
    }
    fn decode(&self, _plan: &decode_attn_core::Plan, _args: DecodeArgs<'_, HipBuffer>) -> Result<()> {
        Err(unavailable())
    }
    fn merge_attn_states(&self, _args: MergeArgs<'_, HipBuffer>) -> Result<()> {
        Err(unavailable())
    }
    fn synchronize(&self) -> Result<()> {
        Err(unavailable())
    }
    fn time_us(&self, _work: &mut dyn FnMut() -> Result<()>, _warmup: usize, _reps: usize) -> Result<f64> {
        Err(unavailable())
    }
    fn copy_bandwidth_gbps(&self, _bytes: usize) -> Result<f64> {
        Err(unavailable())
    }
}

fn unavailable() -> Error {
    Error::Unavailable { backend: BACKEND, reason: "no HIP kernels in this build".into() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_usable_device_is_an_error_value_not_a_panic() {
        // CI has no AMD GPU (with or without a HIP runtime installed): the
        // probe must say why, never panic.
        let err = super::device_count().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("hip"), "{text}");
        match super::Runtime::load() {
            // Without a runtime the reason names every library tried.
            Err(_) => assert!(text.contains("libamdhip64.so.5"), "{text}"),
            // With one but no device, the runtime's own error name.
            Ok(runtime) => {
                assert!(runtime.version().is_ok());
                if runtime.device_count().is_err() {
                    assert!(text.contains("hipError"), "{text}");
                }
            }
        }
    }
}

//! ROCm/HIP backend: the HIP runtime (`libamdhip64`) is loaded at run time, so
//! a binary built with this crate starts on machines with no ROCm at all.
//!
//! Status: this crate probes for the runtime and reports what it found; the
//! kernels and launch path arrive with the kv-head-grid partitioned kernel
//! (see docs/ARCHITECTURE.md). Until then every constructor returns
//! [`Error::Unavailable`] with the reason, never a panic.

use decode_attn_core::{
    DecodeArgs, DecodeAttention, DecodeProblem, DeviceBuffer, DeviceProps, Error, MergeArgs, Result,
};

const BACKEND: &str = "hip";

/// Library names tried, in order, when probing for the HIP runtime.
pub const RUNTIME_CANDIDATES: &[&str] = &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];

/// Number of HIP devices, or why there are none to use.
pub fn device_count() -> Result<usize> {
    let mut tried = Vec::new();
    for name in RUNTIME_CANDIDATES {
        // SAFETY: loading a shared library runs its initialisers; libamdhip64's
        // are the vendor runtime's own and have no preconditions on our side.
        match unsafe { libloading::Library::new(*name) } {
            Ok(_) => {
                return Err(Error::Unavailable {
                    backend: BACKEND,
                    reason: format!("{name} is present, but this build has no HIP kernels yet"),
                })
            }
            Err(err) => tried.push(format!("{name}: {err}")),
        }
    }
    Err(Error::Unavailable { backend: BACKEND, reason: format!("no HIP runtime found ({})", tried.join("; ")) })
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
    fn a_missing_runtime_is_an_error_value_not_a_panic() {
        // No ROCm on CI: the probe must say so, naming what it tried.
        let err = super::device_count().unwrap_err();
        assert!(err.to_string().contains("hip"), "{err}");
    }
}

//! The HIP runtime (`libamdhip64`), loaded with dlopen: no build-time link to
//! any ROCm library, and a missing runtime is an error value naming every
//! library tried.
//!
//! Only the entry points whose C signatures are stable across ROCm 5 and 6
//! are bound here (device attributes, whose enum values moved between
//! releases, are not yet).

use std::ffi::{c_char, c_int, c_uint, CStr};

use decode_attn_core::{Error, Result};

const BACKEND: &str = "hip";

/// Library names tried, in order.
pub const RUNTIME_CANDIDATES: &[&str] = &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];

type HipError = c_int;

/// The loaded runtime and the entry points bound so far.
pub struct Runtime {
    // Keeps the library mapped while the pointers below are in use.
    _lib: libloading::Library,
    /// The file name that loaded.
    pub library: &'static str,
    init: unsafe extern "C" fn(c_uint) -> HipError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
}

impl Runtime {
    /// Loads the first runtime library that opens and binds its entry points.
    pub fn load() -> Result<Runtime> {
        let mut tried = Vec::new();
        for &name in RUNTIME_CANDIDATES {
            // SAFETY: loading libamdhip64 runs only the vendor runtime's
            // initialisers, which have no preconditions on the caller.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    return Self::bind(lib, name).map_err(|err| Error::Unavailable {
                        backend: BACKEND,
                        reason: format!("{name} lacks a HIP entry point: {err}"),
                    })
                }
                Err(err) => tried.push(format!("{name} ({err})")),
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            reason: format!("no HIP runtime found; tried {}", tried.join(", ")),
        })
    }

    fn bind(lib: libloading::Library, library: &'static str) -> std::result::Result<Runtime, libloading::Error> {
        // SAFETY: each symbol is looked up by its documented name and given the
        // signature of hip_runtime_api.h; `_lib` is stored beside the pointers,
        // so they stay valid as long as the Runtime.
        unsafe {
            Ok(Runtime {
                init: *lib.get(b"hipInit\0")?,
                get_device_count: *lib.get(b"hipGetDeviceCount\0")?,
                device_get_name: *lib.get(b"hipDeviceGetName\0")?,
                runtime_get_version: *lib.get(b"hipRuntimeGetVersion\0")?,
                get_error_string: *lib.get(b"hipGetErrorString\0")?,
                library,
                _lib: lib,
            })
        }
    }

    /// The runtime's name for an error code, e.g. `hipErrorNoDevice`.
    pub fn error_name(&self, code: HipError) -> String {
        // SAFETY: hipGetErrorString returns a pointer to a static,
        // NUL-terminated string for every code (an "unknown" one included).
        let text = unsafe { (self.get_error_string)(code) };
        if text.is_null() {
            return format!("HIP error {code}");
        }
        // SAFETY: non-null and NUL-terminated, as above.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &str, code: HipError) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(Error::Unavailable { backend: BACKEND, reason: format!("{call} failed: {}", self.error_name(code)) })
        }
    }

    /// Number of devices; an error (e.g. `hipErrorNoDevice`) when there is none.
    pub fn device_count(&self) -> Result<usize> {
        // hipInit's own error is not final: hipGetDeviceCount reports the reason better.
        // SAFETY: plain call with a flags word of 0, as documented.
        let _ = unsafe { (self.init)(0) };
        let mut count: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.check("hipGetDeviceCount", unsafe { (self.get_device_count)(&mut count) })?;
        Ok(count.max(0) as usize)
    }

    /// The device's marketing name.
    pub fn device_name(&self, ordinal: usize) -> Result<String> {
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds `name.len()` bytes; the runtime writes a
        // NUL-terminated string no longer than that.
        self.check("hipDeviceGetName", unsafe {
            (self.device_get_name)(name.as_mut_ptr(), name.len() as c_int, ordinal as c_int)
        })?;
        // SAFETY: NUL-terminated within the buffer (its last byte was never written).
        Ok(unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// The runtime's version number (HIP_VERSION encoding).
    pub fn version(&self) -> Result<i32> {
        let mut version: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.check("hipRuntimeGetVersion", unsafe { (self.runtime_get_version)(&mut version) })?;
        Ok(version)
    }
}

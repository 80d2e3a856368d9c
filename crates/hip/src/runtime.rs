//! The HIP runtime (`libamdhip64`), loaded with dlopen: no build-time link to
//! any ROCm library, and a missing runtime is an error value naming every
//! library tried.
//!
//! This is the checked layer over [`crate::sys`]: every call's return code
//! becomes an [`Error`] naming the call and the runtime's own words for the
//! code (`hipMalloc failed: hipErrorOutOfMemory (out of memory)`). Calls on
//! raw device addresses and handles are `unsafe fn`s; [`crate::device`]
//! wraps them in owning types.

use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
use std::path::Path;

use decode_attn_core::{Error, Result};

use crate::sys::{self, attr, HipError, RuntimeApi};

const BACKEND: &str = "hip";

/// Library names tried by [`Runtime::load`], in order.
pub const RUNTIME_CANDIDATES: &[&str] =
    &["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "amdhip64.dll"];

/// The loaded runtime and its bound entry points.
pub struct Runtime {
    pub(crate) api: RuntimeApi,
    /// The file name (or path) that loaded.
    pub library: String,
    // Keeps the library mapped while the pointers in `api` are in use.
    // Declared last so that it is dropped after them.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("library", &self.library).finish_non_exhaustive()
    }
}

fn unavailable(reason: String) -> Error {
    Error::Unavailable { backend: BACKEND, reason }
}

impl Runtime {
    /// Loads the first of [`RUNTIME_CANDIDATES`] that opens, and binds it.
    pub fn load() -> Result<Runtime> {
        Self::load_from(RUNTIME_CANDIDATES)
    }

    /// Loads the first of `candidates` (library names for the dynamic loader,
    /// or paths) that opens, and binds it. A library that opens but lacks a
    /// HIP entry point is an error naming the entry point, not a fall-through.
    pub fn load_from<S: AsRef<OsStr>>(candidates: &[S]) -> Result<Runtime> {
        let mut tried = Vec::new();
        for candidate in candidates {
            let name = candidate.as_ref();
            let shown = Path::new(name).display().to_string();
            // SAFETY: loading a HIP runtime runs only the vendor runtime's
            // initialisers, which have no preconditions on the caller.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    // SAFETY: `lib` is a HIP runtime by name; the table is
                    // stored beside `lib` in the Runtime and dropped before it.
                    let api = unsafe { RuntimeApi::bind(&lib) }
                        .map_err(|err| unavailable(format!("{shown} lacks a HIP entry point: {err}")))?;
                    return Ok(Runtime { api, library: shown, _lib: lib });
                }
                Err(err) => tried.push(format!("{shown} ({err})")),
            }
        }
        Err(unavailable(format!("no HIP runtime found; tried {}", tried.join(", "))))
    }

    /// The runtime's words for an error code: `hipErrorNoDevice (no ROCm-capable
    /// device is detected)`, or only the name when the two are the same.
    pub fn error_text(&self, code: HipError) -> String {
        // SAFETY: both return a pointer to a static, NUL-terminated string (or
        // null) for every code, an unknown one included.
        let (name, text) = unsafe { ((self.api.get_error_name)(code), (self.api.get_error_string)(code)) };
        let read = |p: *const c_char| -> Option<String> {
            // SAFETY: non-null pointers from the calls above are NUL-terminated statics.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        match (read(name), read(text)) {
            (Some(name), Some(text)) if name != text && !text.is_empty() => format!("{name} ({text})"),
            (Some(name), _) => name,
            (None, Some(text)) => text,
            (None, None) => format!("HIP error {code}"),
        }
    }

    /// `Ok` for `hipSuccess`, else an [`Error::Device`] naming `call`.
    pub(crate) fn check(&self, call: &str, code: HipError) -> Result<()> {
        if code == sys::HIP_SUCCESS {
            Ok(())
        } else {
            Err(Error::Device { backend: BACKEND, message: format!("{call} failed: {}", self.error_text(code)) })
        }
    }

    /// Number of devices; an [`Error::Unavailable`] naming the runtime's
    /// error (e.g. `hipErrorNoDevice`) when it cannot say.
    pub fn device_count(&self) -> Result<usize> {
        // hipInit's own error is not final: hipGetDeviceCount reports the reason better.
        // SAFETY: plain call with a flags word of 0, as documented.
        let _ = unsafe { (self.api.init)(0) };
        let mut count: c_int = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { (self.api.get_device_count)(&mut count) };
        if code != sys::HIP_SUCCESS {
            return Err(unavailable(format!("hipGetDeviceCount failed: {}", self.error_text(code))));
        }
        Ok(count.max(0) as usize)
    }

    /// The runtime's version number (HIP_VERSION encoding).
    pub fn version(&self) -> Result<i32> {
        let mut version: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.check("hipRuntimeGetVersion", unsafe { (self.api.runtime_get_version)(&mut version) })?;
        Ok(version)
    }

    /// [`Runtime::version`] as `major.minor.patch`.
    pub fn version_string(&self) -> Result<String> {
        let v = self.version()?;
        Ok(format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000))
    }

    /// An error unless the runtime is ROCm 5.0 or newer, whose
    /// `hipDeviceAttribute_t` values [`crate::sys::attr`] uses.
    pub fn check_supported_version(&self) -> Result<()> {
        let version = self.version()?;
        if version < sys::MIN_RUNTIME_VERSION {
            return Err(unavailable(format!(
                "{} is HIP {} but ROCm 5.0 or newer is required",
                self.library,
                self.version_string()?
            )));
        }
        Ok(())
    }

    /// The device's marketing name.
    pub fn device_name(&self, ordinal: usize) -> Result<String> {
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds `name.len() - 1` bytes plus a NUL the runtime
        // never overwrites (it is told one byte less).
        self.check("hipDeviceGetName", unsafe {
            (self.api.device_get_name)(name.as_mut_ptr(), name.len() as c_int - 1, ordinal as c_int)
        })?;
        // SAFETY: NUL-terminated within the buffer (its last byte was never written).
        Ok(unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// Makes `ordinal` the calling thread's current device.
    pub fn set_device(&self, ordinal: usize) -> Result<()> {
        // SAFETY: plain call; an out-of-range ordinal is an error code.
        self.check("hipSetDevice", unsafe { (self.api.set_device)(ordinal as c_int) })
    }

    /// One `hipDeviceGetAttribute` value (see [`crate::sys::attr`]).
    pub fn attribute(&self, attribute: c_int, ordinal: usize) -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: a valid out-pointer; an unknown attribute is an error code.
        self.check(&format!("hipDeviceGetAttribute({attribute})"), unsafe {
            (self.api.device_get_attribute)(&mut value, attribute, ordinal as c_int)
        })?;
        Ok(value)
    }

    /// The device's `gcnArchName`, e.g. `gfx942:sramecc+:xnack-`, from
    /// `hipGetDevicePropertiesR0600` (ROCm 6+), else `hipGetDevicePropertiesR0000`,
    /// else the unversioned `hipGetDeviceProperties` (ROCm 5), each read at the
    /// offset of its own layout.
    pub fn arch_name(&self, ordinal: usize) -> Result<String> {
        let variants = [
            ("hipGetDevicePropertiesR0600", self.api.get_device_properties_r0600, sys::PROPS_R0600_ARCH_OFFSET),
            ("hipGetDevicePropertiesR0000", self.api.get_device_properties_r0000, sys::PROPS_R0000_ARCH_OFFSET),
            ("hipGetDeviceProperties", self.api.get_device_properties, sys::PROPS_R0000_ARCH_OFFSET),
        ];
        let mut failures = Vec::new();
        for (call, function, offset) in variants {
            let Some(function) = function else { continue };
            // u64 elements: 8-byte aligned, as the struct (it holds size_t and pointers).
            let mut props = vec![0u64; sys::PROPS_BUFFER_BYTES / 8];
            // SAFETY: `props` is a zeroed, 8-aligned buffer larger than either
            // layout of hipDeviceProp_t, so the runtime writes within it.
            let code = unsafe { function(props.as_mut_ptr().cast::<c_void>(), ordinal as c_int) };
            if let Err(err) = self.check(call, code) {
                failures.push(err.to_string());
                continue;
            }
            // SAFETY: plain bytes of the buffer above, which lives until the end of the loop body.
            let bytes = unsafe { std::slice::from_raw_parts(props.as_ptr().cast::<u8>(), sys::PROPS_BUFFER_BYTES) };
            match read_arch_name(&bytes[offset..offset + sys::PROPS_ARCH_LEN]) {
                Some(name) => return Ok(name),
                None => failures.push(format!("{call} gave no gfx architecture name")),
            }
        }
        if failures.is_empty() {
            failures.push("the runtime exports no hipGetDeviceProperties".into());
        }
        Err(Error::Device { backend: BACKEND, message: failures.join("; ") })
    }

    // ------------------------------------------------------------ memory

    /// `hipMalloc`: `bytes` of device memory on the current device.
    pub fn malloc(&self, bytes: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        self.check(&format!("hipMalloc({bytes} bytes)"), unsafe { (self.api.malloc)(&mut ptr, bytes) })?;
        if ptr.is_null() && bytes > 0 {
            return Err(Error::Device { backend: BACKEND, message: format!("hipMalloc({bytes} bytes) gave null") });
        }
        Ok(ptr)
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `ptr` came from [`Runtime::malloc`] and is freed once, after all work using it.
    pub unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipFree", unsafe { (self.api.free)(ptr) })
    }

    /// `hipMemcpyWithStream` host to device: ordered after earlier work on
    /// `stream`, returns when the copy is done.
    ///
    /// # Safety
    /// `dst` is device memory of at least `src.len()` bytes; `stream` is live.
    pub unsafe fn memcpy_htod(&self, dst: *mut c_void, src: &[u8], stream: sys::Stream) -> Result<()> {
        // SAFETY: as promised by the caller; `src` is readable for its length.
        self.check("hipMemcpyWithStream(host to device)", unsafe {
            (self.api.memcpy_with_stream)(dst, src.as_ptr().cast(), src.len(), sys::MEMCPY_HOST_TO_DEVICE, stream)
        })
    }

    /// `hipMemcpyWithStream` device to host (returns when the copy is done).
    ///
    /// # Safety
    /// `src` is device memory of at least `dst.len()` bytes; `stream` is live.
    pub unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: *const c_void, stream: sys::Stream) -> Result<()> {
        // SAFETY: as promised by the caller; `dst` is writable for its length.
        self.check("hipMemcpyWithStream(device to host)", unsafe {
            (self.api.memcpy_with_stream)(dst.as_mut_ptr().cast(), src, dst.len(), sys::MEMCPY_DEVICE_TO_HOST, stream)
        })
    }

    /// `hipMemcpyAsync` device to device on `stream`.
    ///
    /// # Safety
    /// Both are device allocations of at least `bytes` bytes that outlive the
    /// copy; `stream` is live.
    pub unsafe fn memcpy_dtod_async(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        stream: sys::Stream,
    ) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipMemcpyAsync(device to device)", unsafe {
            (self.api.memcpy_async)(dst, src, bytes, sys::MEMCPY_DEVICE_TO_DEVICE, stream)
        })
    }

    /// `hipMemsetAsync` of `bytes` bytes to `value` on `stream`.
    ///
    /// # Safety
    /// `dst` is a device allocation of at least `bytes` bytes that outlives the
    /// operation; `stream` is live.
    pub unsafe fn memset_async(&self, dst: *mut c_void, value: u8, bytes: usize, stream: sys::Stream) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipMemsetAsync", unsafe { (self.api.memset_async)(dst, c_int::from(value), bytes, stream) })
    }

    // ------------------------------------------------------------ streams, events

    pub fn stream_create(&self) -> Result<sys::Stream> {
        let mut stream: sys::Stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        self.check("hipStreamCreate", unsafe { (self.api.stream_create)(&mut stream) })?;
        Ok(stream)
    }

    /// # Safety
    /// `stream` came from [`Runtime::stream_create`] and is destroyed once.
    pub unsafe fn stream_destroy(&self, stream: sys::Stream) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipStreamDestroy", unsafe { (self.api.stream_destroy)(stream) })
    }

    /// # Safety
    /// `stream` is live (or null, the default stream).
    pub unsafe fn stream_synchronize(&self, stream: sys::Stream) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipStreamSynchronize", unsafe { (self.api.stream_synchronize)(stream) })
    }

    pub fn event_create(&self) -> Result<sys::Event> {
        let mut event: sys::Event = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        self.check("hipEventCreate", unsafe { (self.api.event_create)(&mut event) })?;
        Ok(event)
    }

    /// # Safety
    /// `event` came from [`Runtime::event_create`] and is destroyed once.
    pub unsafe fn event_destroy(&self, event: sys::Event) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipEventDestroy", unsafe { (self.api.event_destroy)(event) })
    }

    /// # Safety
    /// `event` and `stream` are live.
    pub unsafe fn event_record(&self, event: sys::Event, stream: sys::Stream) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipEventRecord", unsafe { (self.api.event_record)(event, stream) })
    }

    /// # Safety
    /// `event` is live.
    pub unsafe fn event_synchronize(&self, event: sys::Event) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipEventSynchronize", unsafe { (self.api.event_synchronize)(event) })
    }

    /// Milliseconds between two recorded, completed events.
    ///
    /// # Safety
    /// Both events are live.
    pub unsafe fn event_elapsed_ms(&self, start: sys::Event, end: sys::Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: as promised by the caller; a valid out-pointer.
        self.check("hipEventElapsedTime", unsafe { (self.api.event_elapsed_time)(&mut ms, start, end) })?;
        Ok(ms)
    }

    // ------------------------------------------------------------ modules, launches

    /// `hipModuleLoadData` of a code object (ELF) for the current device.
    pub fn module_load_data(&self, image: &[u8]) -> Result<sys::Module> {
        if image.len() < 4 || &image[..4] != b"\x7fELF" {
            return Err(Error::Device {
                backend: BACKEND,
                message: format!("hipModuleLoadData: the image ({} bytes) is not an ELF code object", image.len()),
            });
        }
        let mut module: sys::Module = std::ptr::null_mut();
        // SAFETY: `image` is a whole ELF code object (its size is in its own
        // headers, which the loader reads); it outlives the call, and the
        // runtime copies what it keeps.
        self.check("hipModuleLoadData", unsafe { (self.api.module_load_data)(&mut module, image.as_ptr().cast()) })?;
        Ok(module)
    }

    /// # Safety
    /// `module` came from [`Runtime::module_load_data`], is unloaded once, and
    /// none of its functions is used afterwards.
    pub unsafe fn module_unload(&self, module: sys::Module) -> Result<()> {
        // SAFETY: as promised by the caller.
        self.check("hipModuleUnload", unsafe { (self.api.module_unload)(module) })
    }

    /// # Safety
    /// `module` is live; the function is valid while it is.
    pub unsafe fn module_get_function(&self, module: sys::Module, name: &str) -> Result<sys::Function> {
        let c_name = CString::new(name)
            .map_err(|_| Error::Device { backend: BACKEND, message: format!("kernel name {name:?} holds a NUL") })?;
        let mut function: sys::Function = std::ptr::null_mut();
        // SAFETY: as promised by the caller; a NUL-terminated name and a valid out-pointer.
        self.check(&format!("hipModuleGetFunction({name})"), unsafe {
            (self.api.module_get_function)(&mut function, module, c_name.as_ptr())
        })?;
        Ok(function)
    }

    /// `hipModuleLaunchKernel` with the kernel's arguments in `params`
    /// (one pointer per kernel parameter).
    ///
    /// # Safety
    /// `function` and `stream` are live; `params` has one pointer per kernel
    /// parameter, each to a value of that parameter's type and layout; every
    /// device address in them stays valid until the kernel has finished.
    pub unsafe fn launch(
        &self,
        function: sys::Function,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        stream: sys::Stream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: as promised by the caller; `extra` is null (parameters come
        // through `kernelParams` only).
        self.check("hipModuleLaunchKernel", unsafe {
            (self.api.module_launch_kernel)(
                function,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Workgroups of `threads` threads of `function` resident on one CU, when
    /// the runtime can say.
    ///
    /// # Safety
    /// `function` is live.
    pub unsafe fn occupancy(&self, function: sys::Function, threads: u32) -> Option<u32> {
        let occupancy = self.api.module_occupancy?;
        let mut blocks: c_int = 0;
        // SAFETY: as promised by the caller; a valid out-pointer.
        let code = unsafe { occupancy(&mut blocks, function, threads as c_int, 0) };
        (code == sys::HIP_SUCCESS && blocks > 0).then_some(blocks as u32)
    }
}

/// The `gfx...` name at the start of a NUL-terminated `gcnArchName` field.
fn read_arch_name(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    let name = std::str::from_utf8(&field[..end]).ok()?.trim();
    name.starts_with("gfx").then(|| name.to_string())
}

/// What the backend reads about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    /// Marketing name, e.g. `AMD Instinct MI300X`.
    pub name: String,
    /// `gcnArchName`, e.g. `gfx942:sramecc+:xnack-`.
    pub arch_name: String,
    pub compute_units: u32,
    pub wavefront_size: u32,
    pub max_shared_memory_per_block: u32,
    pub max_threads_per_block: u32,
    pub clock_khz: u32,
    pub memory_clock_khz: u32,
    pub memory_bus_width_bits: u32,
}

impl DeviceInfo {
    /// Reads everything the backend needs about device `ordinal`.
    pub fn query(runtime: &Runtime, ordinal: usize) -> Result<DeviceInfo> {
        let get = |attribute| runtime.attribute(attribute, ordinal).map(|v| v.max(0) as u32);
        Ok(DeviceInfo {
            ordinal,
            name: runtime.device_name(ordinal)?,
            arch_name: runtime.arch_name(ordinal)?,
            compute_units: get(attr::MULTIPROCESSOR_COUNT)?,
            wavefront_size: get(attr::WARP_SIZE)?,
            max_shared_memory_per_block: get(attr::MAX_SHARED_MEMORY_PER_BLOCK)?,
            max_threads_per_block: get(attr::MAX_THREADS_PER_BLOCK)?,
            // Clocks only feed the cost model: unknown is 0, not an error.
            clock_khz: get(attr::CLOCK_RATE).unwrap_or(0),
            memory_clock_khz: get(attr::MEMORY_CLOCK_RATE).unwrap_or(0),
            memory_bus_width_bits: get(attr::MEMORY_BUS_WIDTH).unwrap_or(0),
        })
    }

    /// Peak memory bandwidth from the clock and bus width (double data rate), GB/s; 0 when unknown.
    pub fn peak_bandwidth_gbps(&self) -> f64 {
        self.memory_clock_khz as f64 * 1e3 * 2.0 * self.memory_bus_width_bits as f64 / 8.0 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_are_read_up_to_the_nul() {
        let mut field = [0u8; 256];
        field[..22].copy_from_slice(b"gfx942:sramecc+:xnack-");
        assert_eq!(read_arch_name(&field).as_deref(), Some("gfx942:sramecc+:xnack-"));
        assert_eq!(read_arch_name(&[0u8; 256]), None);
        assert_eq!(read_arch_name(b"AMD Instinct\0"), None);
    }

    #[test]
    fn a_missing_library_names_every_candidate() {
        let err =
            Runtime::load_from(&["/nonexistent/libamdhip64.so", "libdecode-attn-no-such-runtime.so"]).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Unavailable { backend: "hip", .. }), "{err:?}");
        assert!(text.contains("no HIP runtime found"), "{text}");
        assert!(text.contains("/nonexistent/libamdhip64.so"), "{text}");
        assert!(text.contains("libdecode-attn-no-such-runtime.so"), "{text}");
    }

    #[test]
    fn a_library_that_is_not_hip_names_the_missing_entry_point() {
        // libc opens everywhere this test runs, and has no hipInit.
        let err = Runtime::load_from(&["libc.so.6"]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("libc.so.6 lacks a HIP entry point: hipInit"), "{text}");
    }

    #[test]
    fn peak_bandwidth_is_clock_times_two_times_bus_bytes() {
        let info = DeviceInfo {
            ordinal: 0,
            name: "MI250X".into(),
            arch_name: "gfx90a".into(),
            compute_units: 110,
            wavefront_size: 64,
            max_shared_memory_per_block: 65536,
            max_threads_per_block: 1024,
            clock_khz: 1_700_000,
            memory_clock_khz: 1_600_000,
            memory_bus_width_bits: 4096,
        };
        assert!((info.peak_bandwidth_gbps() - 1638.4).abs() < 1e-6);
    }
}

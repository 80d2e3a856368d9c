//! Raw bindings: the C types, constants and entry-point signatures of
//! `hip_runtime_api.h` and `hiprtc.h` that this crate uses, and the tables of
//! function pointers bound from the libraries loaded at run time.
//!
//! Nothing here checks a return code; [`crate::runtime`] and
//! [`crate::hiprtc`] do (cudarc's `sys` / `result` layering).
//!
//! # Version notes
//!
//! * The signatures below are unchanged from ROCm 5.0 to 7.x.
//! * `hipDeviceAttribute_t`: the values used here (see [`attr`]) are the same
//!   in ROCm 5.x (checked against Debian's 5.2 header by compiling it) and in
//!   ROCm 6.x/7.x (checked against the current `hip_runtime_api.h`): 6.0
//!   renamed some entries `hipDeviceAttributeUnusedN` and appended new ones,
//!   but moved none of those below. The layout before ROCm 5.0 differs, so
//!   [`MIN_RUNTIME_VERSION`] refuses older runtimes.
//! * `hipDeviceProp_t` did change layout in 6.0 (`hipGetDevicePropertiesR0600`),
//!   so the one field read from it, `gcnArchName`, is read at the offset of
//!   the variant actually called ([`PROPS_R0600_ARCH_OFFSET`],
//!   [`PROPS_R0000_ARCH_OFFSET`]), the way LLVM's `amdgpu-arch` does.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipError_t`.
pub type HipError = c_int;
/// `hiprtcResult`.
pub type HiprtcResult = c_int;
/// `hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`: opaque handles.
pub type Stream = *mut c_void;
pub type Event = *mut c_void;
pub type Module = *mut c_void;
pub type Function = *mut c_void;
/// `hiprtcProgram`.
pub type Program = *mut c_void;

pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_NO_DEVICE: HipError = 100;

/// `hipMemcpyKind`.
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// Oldest runtime accepted (HIP_VERSION encoding: major * 10^7 + minor * 10^5 + patch).
pub const MIN_RUNTIME_VERSION: i32 = 50_000_000;

/// `hipDeviceAttribute_t` values (same from ROCm 5.0 through 7.x; see the module doc).
pub mod attr {
    use std::ffi::c_int;
    pub const CLOCK_RATE: c_int = 5;
    pub const MAX_THREADS_PER_BLOCK: c_int = 56;
    pub const MEMORY_BUS_WIDTH: c_int = 59;
    pub const MEMORY_CLOCK_RATE: c_int = 60;
    pub const MULTIPROCESSOR_COUNT: c_int = 63;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 74;
    pub const WARP_SIZE: c_int = 87;
}

/// Bytes reserved for a `hipDeviceProp_t` of either layout (R0000: 792 bytes
/// in ROCm 5.2; R0600: 1472 bytes), with room to spare.
pub const PROPS_BUFFER_BYTES: usize = 4096;
/// Offset of `gcnArchName[256]` in `hipDeviceProp_tR0600` (ROCm 6.0 and later).
pub const PROPS_R0600_ARCH_OFFSET: usize = 1160;
/// Offset of `gcnArchName[256]` in the ROCm 5 layout (`hipDeviceProp_tR0000`,
/// and the unversioned `hipGetDeviceProperties` of ROCm 5).
pub const PROPS_R0000_ARCH_OFFSET: usize = 396;
pub const PROPS_ARCH_LEN: usize = 256;

/// Entry points of `libamdhip64`.
pub struct RuntimeApi {
    pub init: unsafe extern "C" fn(c_uint) -> HipError,
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    pub runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    pub get_error_name: unsafe extern "C" fn(HipError) -> *const c_char,
    pub set_device: unsafe extern "C" fn(c_int) -> HipError,
    pub device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    /// `hipGetDevicePropertiesR0600` (ROCm 6+), absent before.
    pub get_device_properties_r0600: Option<unsafe extern "C" fn(*mut c_void, c_int) -> HipError>,
    /// `hipGetDevicePropertiesR0000` (ROCm 6+, the ROCm 5 layout), absent before.
    pub get_device_properties_r0000: Option<unsafe extern "C" fn(*mut c_void, c_int) -> HipError>,
    /// Unversioned `hipGetDeviceProperties`: the ROCm 5 layout.
    pub get_device_properties: Option<unsafe extern "C" fn(*mut c_void, c_int) -> HipError>,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    pub free: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `hipMemcpyWithStream(dst, src, bytes, kind, stream)`: ordered on `stream`, returns when done.
    pub memcpy_with_stream: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> HipError,
    pub memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> HipError,
    pub memset_async: unsafe extern "C" fn(*mut c_void, c_int, usize, Stream) -> HipError,
    pub stream_create: unsafe extern "C" fn(*mut Stream) -> HipError,
    pub stream_destroy: unsafe extern "C" fn(Stream) -> HipError,
    pub stream_synchronize: unsafe extern "C" fn(Stream) -> HipError,
    pub event_create: unsafe extern "C" fn(*mut Event) -> HipError,
    pub event_destroy: unsafe extern "C" fn(Event) -> HipError,
    pub event_record: unsafe extern "C" fn(Event, Stream) -> HipError,
    pub event_synchronize: unsafe extern "C" fn(Event) -> HipError,
    pub event_elapsed_time: unsafe extern "C" fn(*mut f32, Event, Event) -> HipError,
    pub module_load_data: unsafe extern "C" fn(*mut Module, *const c_void) -> HipError,
    pub module_unload: unsafe extern "C" fn(Module) -> HipError,
    pub module_get_function: unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError,
    /// `hipModuleLaunchKernel(f, grid x/y/z, block x/y/z, shared bytes, stream, kernelParams, extra)`.
    #[allow(clippy::type_complexity)]
    pub module_launch_kernel: unsafe extern "C" fn(
        Function,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Stream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    /// `hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(out, f, block threads, dynamic shared bytes)`.
    pub module_occupancy: Option<unsafe extern "C" fn(*mut c_int, Function, c_int, usize) -> HipError>,
}

macro_rules! symbol {
    ($lib:expr, $name:literal) => {
        *$lib.get(concat!($name, "\0").as_bytes()).map_err(|err| format!("{}: {err}", $name))?
    };
}

macro_rules! optional {
    ($lib:expr, $name:literal) => {
        $lib.get(concat!($name, "\0").as_bytes()).ok().map(|symbol| *symbol)
    };
}

impl RuntimeApi {
    /// Binds every entry point; an error names the first one missing.
    ///
    /// # Safety
    /// `lib` must be a HIP runtime (its symbols have the signatures of
    /// `hip_runtime_api.h`), and the table must not outlive `lib`.
    pub unsafe fn bind(lib: &libloading::Library) -> Result<RuntimeApi, String> {
        // SAFETY: the caller promises `lib` is a HIP runtime; each symbol is
        // given the signature its documented name has there.
        unsafe {
            Ok(RuntimeApi {
                init: symbol!(lib, "hipInit"),
                get_device_count: symbol!(lib, "hipGetDeviceCount"),
                device_get_name: symbol!(lib, "hipDeviceGetName"),
                runtime_get_version: symbol!(lib, "hipRuntimeGetVersion"),
                get_error_string: symbol!(lib, "hipGetErrorString"),
                get_error_name: symbol!(lib, "hipGetErrorName"),
                set_device: symbol!(lib, "hipSetDevice"),
                device_get_attribute: symbol!(lib, "hipDeviceGetAttribute"),
                get_device_properties_r0600: optional!(lib, "hipGetDevicePropertiesR0600"),
                get_device_properties_r0000: optional!(lib, "hipGetDevicePropertiesR0000"),
                get_device_properties: optional!(lib, "hipGetDeviceProperties"),
                malloc: symbol!(lib, "hipMalloc"),
                free: symbol!(lib, "hipFree"),
                memcpy_with_stream: symbol!(lib, "hipMemcpyWithStream"),
                memcpy_async: symbol!(lib, "hipMemcpyAsync"),
                memset_async: symbol!(lib, "hipMemsetAsync"),
                stream_create: symbol!(lib, "hipStreamCreate"),
                stream_destroy: symbol!(lib, "hipStreamDestroy"),
                stream_synchronize: symbol!(lib, "hipStreamSynchronize"),
                event_create: symbol!(lib, "hipEventCreate"),
                event_destroy: symbol!(lib, "hipEventDestroy"),
                event_record: symbol!(lib, "hipEventRecord"),
                event_synchronize: symbol!(lib, "hipEventSynchronize"),
                event_elapsed_time: symbol!(lib, "hipEventElapsedTime"),
                module_load_data: symbol!(lib, "hipModuleLoadData"),
                module_unload: symbol!(lib, "hipModuleUnload"),
                module_get_function: symbol!(lib, "hipModuleGetFunction"),
                module_launch_kernel: symbol!(lib, "hipModuleLaunchKernel"),
                module_occupancy: optional!(lib, "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"),
            })
        }
    }
}

/// Entry points of hiprtc (`libhiprtc` in ROCm 6+, part of `libamdhip64` in ROCm 5).
pub struct HiprtcApi {
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> HiprtcResult,
    pub get_error_string: unsafe extern "C" fn(HiprtcResult) -> *const c_char,
    /// `hiprtcCreateProgram(prog, src, name, numHeaders, headers, includeNames)`.
    pub create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    pub compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> HiprtcResult,
    pub get_program_log_size: unsafe extern "C" fn(Program, *mut usize) -> HiprtcResult,
    pub get_program_log: unsafe extern "C" fn(Program, *mut c_char) -> HiprtcResult,
    pub get_code_size: unsafe extern "C" fn(Program, *mut usize) -> HiprtcResult,
    pub get_code: unsafe extern "C" fn(Program, *mut c_char) -> HiprtcResult,
    pub destroy_program: unsafe extern "C" fn(*mut Program) -> HiprtcResult,
}

impl HiprtcApi {
    /// Binds every entry point; an error names the first one missing.
    ///
    /// # Safety
    /// `lib` must export hiprtc with the signatures of `hiprtc.h`, and the
    /// table must not outlive `lib`.
    pub unsafe fn bind(lib: &libloading::Library) -> Result<HiprtcApi, String> {
        // SAFETY: as promised by the caller; signatures of hiprtc.h.
        unsafe {
            Ok(HiprtcApi {
                version: symbol!(lib, "hiprtcVersion"),
                get_error_string: symbol!(lib, "hiprtcGetErrorString"),
                create_program: symbol!(lib, "hiprtcCreateProgram"),
                compile_program: symbol!(lib, "hiprtcCompileProgram"),
                get_program_log_size: symbol!(lib, "hiprtcGetProgramLogSize"),
                get_program_log: symbol!(lib, "hiprtcGetProgramLog"),
                get_code_size: symbol!(lib, "hiprtcGetCodeSize"),
                get_code: symbol!(lib, "hiprtcGetCode"),
                destroy_program: symbol!(lib, "hiprtcDestroyProgram"),
            })
        }
    }
}

//! Run-time compilation through NVRTC, loaded with dlopen, and its disk cache.
//!
//! We load libnvrtc ourselves instead of through cudarc because cudarc's
//! library-name candidates follow the CUDA version its bindings were built
//! for (12.x here), while a CUDA 13 machine ships only `libnvrtc.so.13`. A
//! missing NVRTC is an error value naming every library tried.

use std::ffi::{c_char, c_int, CStr};
use std::path::Path;

use decode_attn_core::kernel_cache::{cache_key, cached_or_compile};
pub use decode_attn_core::kernel_cache::{default_cache_dir, Source};
use decode_attn_core::{Error, Result};

const BACKEND: &str = "cuda";

/// Library names tried in order: newest first, then the unversioned link.
pub const NVRTC_CANDIDATES: &[&str] =
    &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "libnvrtc.so.11.2", "nvrtc64_130_0.dll", "nvrtc64_120_0.dll"];

type Program = *mut std::ffi::c_void;
type NvrtcResult = c_int;

struct Nvrtc {
    // Keeps the library mapped while the function pointers below are in use.
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
}

fn device_error(message: String) -> Error {
    Error::Device { backend: BACKEND, message }
}

impl Nvrtc {
    fn load() -> Result<Nvrtc> {
        let mut tried = Vec::new();
        for name in NVRTC_CANDIDATES {
            // SAFETY: loading libnvrtc runs only NVIDIA's library initialisers,
            // which have no preconditions on the caller.
            match unsafe { libloading::Library::new(*name) } {
                Ok(lib) => return Self::bind(lib).map_err(|e| device_error(format!("{name}: {e}"))),
                Err(err) => tried.push(format!("{name} ({err})")),
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            reason: format!(
                "no embedded kernel loads on this driver and NVRTC is missing; tried {}. Put the CUDA \
                 toolkit's lib directory on LD_LIBRARY_PATH",
                tried.join(", ")
            ),
        })
    }

    fn bind(lib: libloading::Library) -> std::result::Result<Nvrtc, libloading::Error> {
        // SAFETY: each symbol is looked up by its documented NVRTC name and
        // given the signature of nvrtc.h (stable since CUDA 11.1); the
        // pointers stay valid because `_lib` is stored beside them.
        unsafe {
            Ok(Nvrtc {
                version: *lib.get(b"nvrtcVersion\0")?,
                create: *lib.get(b"nvrtcCreateProgram\0")?,
                compile: *lib.get(b"nvrtcCompileProgram\0")?,
                log_size: *lib.get(b"nvrtcGetProgramLogSize\0")?,
                log: *lib.get(b"nvrtcGetProgramLog\0")?,
                cubin_size: *lib.get(b"nvrtcGetCUBINSize\0")?,
                cubin: *lib.get(b"nvrtcGetCUBIN\0")?,
                destroy: *lib.get(b"nvrtcDestroyProgram\0")?,
                _lib: lib,
            })
        }
    }

    fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { (self.version)(&mut major, &mut minor) };
        (major, minor)
    }
}

/// Compiles `source` with the extra options `defines` to a cubin for
/// `sm_{major}{minor}`, or returns the cached cubin of an identical earlier
/// compile (same source, headers, options, architecture and NVRTC version)
/// from `cache_dir`.
pub fn compile_cubin(
    source: &Source<'_>,
    defines: &[String],
    arch: (i32, i32),
    cache_dir: Option<&Path>,
) -> Result<Vec<u8>> {
    let nvrtc = Nvrtc::load()?;
    let mut options =
        vec![format!("--gpu-architecture=sm_{}{}", arch.0, arch.1), "-std=c++17".into(), "-default-device".into()];
    options.extend_from_slice(defines);
    let key = cache_key("nvrtc", source, &options, nvrtc.version());
    let cached = cache_dir.map(|dir| dir.join(format!("{key}.cubin")));
    cached_or_compile(cached.as_deref(), |_| true, || compile_uncached(&nvrtc, source, &options))
}

fn compile_uncached(nvrtc: &Nvrtc, source: &Source<'_>, options: &[String]) -> Result<Vec<u8>> {
    let strings =
        source.program_strings(options).map_err(|_| device_error("kernel source contains a NUL byte".into()))?;

    let mut program: Program = std::ptr::null_mut();
    // SAFETY: every pointer is a NUL-terminated CString (or an array of them
    // with the stated length) that outlives the call.
    let status = unsafe {
        (nvrtc.create)(
            &mut program,
            strings.text.as_ptr(),
            strings.name.as_ptr(),
            strings.header_texts.len() as c_int,
            strings.header_texts.as_ptr(),
            strings.header_names.as_ptr(),
        )
    };
    if status != 0 {
        return Err(device_error(format!("nvrtcCreateProgram failed with status {status}")));
    }
    // SAFETY: `program` was created above; the options outlive the call.
    let status = unsafe { (nvrtc.compile)(program, strings.options.len() as c_int, strings.options.as_ptr()) };
    let result = if status != 0 {
        Err(device_error(format!(
            "NVRTC failed to compile {} ({options:?}):\n{}",
            source.name,
            program_log(nvrtc, program)
        )))
    } else {
        let mut size = 0usize;
        // SAFETY: `program` compiled successfully; `bytes` has room for `size` bytes.
        unsafe {
            (nvrtc.cubin_size)(program, &mut size);
            let mut bytes = vec![0u8; size];
            (nvrtc.cubin)(program, bytes.as_mut_ptr().cast());
            Ok(bytes)
        }
    };
    // SAFETY: destroys the program created above exactly once.
    unsafe { (nvrtc.destroy)(&mut program) };
    result
}

fn program_log(nvrtc: &Nvrtc, program: Program) -> String {
    let mut size = 0usize;
    // SAFETY: `program` is live; the buffer holds `size` bytes including the NUL.
    unsafe {
        (nvrtc.log_size)(program, &mut size);
        let mut log = vec![0u8; size.max(1)];
        (nvrtc.log)(program, log.as_mut_ptr().cast());
        CStr::from_bytes_until_nul(&log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

//! Run-time compilation through NVRTC, loaded with dlopen, and its disk cache.
//!
//! We load libnvrtc ourselves instead of through cudarc because cudarc's
//! library-name candidates follow the CUDA version its bindings were built
//! for (12.x here), while a CUDA 13 machine ships only `libnvrtc.so.13`. A
//! missing NVRTC is an error value naming every library tried.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};

use decode_attn_core::{Error, Result};
use sha2::{Digest, Sha256};

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

/// One source file and the headers it includes by name.
pub struct Source<'a> {
    pub name: &'a str,
    pub text: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
}

/// Compiles `source` to a cubin for `sm_{major}{minor}`, or returns the cached
/// cubin of an identical earlier compile (same source, headers, options,
/// architecture and NVRTC version) from `cache_dir`.
pub fn compile_cubin(source: &Source<'_>, arch: (i32, i32), cache_dir: Option<&Path>) -> Result<Vec<u8>> {
    let nvrtc = Nvrtc::load()?;
    let options =
        [format!("--gpu-architecture=sm_{}{}", arch.0, arch.1), "-std=c++17".into(), "-default-device".into()];
    let key = cache_key(source, &options, nvrtc.version());
    let cached = cache_dir.map(|dir| dir.join(format!("{key}.cubin")));
    if let Some(bytes) = cached.as_deref().and_then(|path| std::fs::read(path).ok()) {
        return Ok(bytes);
    }
    let cubin = compile_uncached(&nvrtc, source, &options)?;
    if let Some(path) = &cached {
        // The cache only saves time: failing to write it is not an error.
        let _ = write_atomically(path, &cubin);
    }
    Ok(cubin)
}

fn cache_key(source: &Source<'_>, options: &[String], version: (i32, i32)) -> String {
    let mut hash = Sha256::new();
    for part in [source.name, source.text].into_iter().chain(source.headers.iter().flat_map(|(n, t)| [*n, *t])) {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    for option in options {
        hash.update(option.as_bytes());
        hash.update([0]);
    }
    hash.update(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}", std::process::id(), path.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn cstring(text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| device_error("kernel source contains a NUL byte".into()))
}

fn compile_uncached(nvrtc: &Nvrtc, source: &Source<'_>, options: &[String]) -> Result<Vec<u8>> {
    let text = cstring(source.text)?;
    let name = cstring(source.name)?;
    let header_texts = source.headers.iter().map(|(_, t)| cstring(t)).collect::<Result<Vec<_>>>()?;
    let header_names = source.headers.iter().map(|(n, _)| cstring(n)).collect::<Result<Vec<_>>>()?;
    let header_text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let option_strings = options.iter().map(|o| cstring(o)).collect::<Result<Vec<_>>>()?;
    let option_ptrs: Vec<*const c_char> = option_strings.iter().map(|c| c.as_ptr()).collect();

    let mut program: Program = std::ptr::null_mut();
    // SAFETY: every pointer is a NUL-terminated CString (or an array of them
    // with the stated length) that outlives the call.
    let status = unsafe {
        (nvrtc.create)(
            &mut program,
            text.as_ptr(),
            name.as_ptr(),
            header_text_ptrs.len() as c_int,
            header_text_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    };
    if status != 0 {
        return Err(device_error(format!("nvrtcCreateProgram failed with status {status}")));
    }
    // SAFETY: `program` was created above; the options outlive the call.
    let status = unsafe { (nvrtc.compile)(program, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
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

/// Where compiled kernels are cached when the caller names no folder:
/// `$DECODE_ATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/decode-attn`, else
/// `$HOME/.cache/decode-attn`. This is the documented place where the CUDA
/// backend reads the environment (see `CudaOptions::from_env`).
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DECODE_ATTN_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("decode-attn"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("decode-attn"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_depends_on_everything() {
        let a = Source { name: "k.cu", text: "x", headers: &[("h.h", "y")] };
        let b = Source { name: "k.cu", text: "x", headers: &[("h.h", "z")] };
        let opts = ["--gpu-architecture=sm_90".to_string()];
        assert_ne!(cache_key(&a, &opts, (13, 0)), cache_key(&b, &opts, (13, 0)));
        assert_ne!(cache_key(&a, &opts, (13, 0)), cache_key(&a, &opts, (12, 9)));
        assert_eq!(cache_key(&a, &opts, (13, 0)), cache_key(&a, &opts, (13, 0)));
    }
}

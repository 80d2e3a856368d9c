//! hiprtc, the HIP run-time compiler, loaded with dlopen, and the on-disk
//! cache of what it compiles.
//!
//! ROCm 6 and later ship it as `libhiprtc.so.N`; ROCm 5 exports the same
//! entry points from `libamdhip64` itself, so the runtime's own library is
//! the last candidate. hiprtc needs no device: it compiles for the
//! architecture named in `--offload-arch`.

use std::ffi::{c_int, CStr, OsStr};
use std::path::Path;
use std::sync::Mutex;

use decode_attn_core::kernel_cache::{cache_key, cached_or_compile};
pub use decode_attn_core::kernel_cache::{default_cache_dir, Source};
use decode_attn_core::{Error, Result};

use crate::sys::{self, HiprtcApi};

const BACKEND: &str = "hip";

/// One hiprtc compile at a time in this process: ROCm 5.2's hiprtc (inside
/// libamdhip64, Debian's) crashes the process when two threads compile at
/// once (seen with two tests of this crate in parallel), and nothing says
/// later releases are thread-safe. Compiles are rare (once per kernel file,
/// then the disk cache), so the lock costs nothing that matters.
static COMPILE_LOCK: Mutex<()> = Mutex::new(());

/// Library names tried by [`Hiprtc::load`] before the runtime's own library.
pub const HIPRTC_CANDIDATES: &[&str] =
    &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5", "hiprtc0700.dll", "hiprtc0600.dll"];

/// The loaded compiler.
pub struct Hiprtc {
    api: HiprtcApi,
    /// The file name (or path) that loaded.
    pub library: String,
    // Keeps the library mapped while the pointers in `api` are in use.
    _lib: libloading::Library,
}

fn device_error(message: String) -> Error {
    Error::Device { backend: BACKEND, message }
}

impl Hiprtc {
    /// Loads the first of [`HIPRTC_CANDIDATES`], then `runtime_library` (ROCm 5
    /// keeps hiprtc inside libamdhip64), that opens and exports hiprtc.
    pub fn load(runtime_library: Option<&str>) -> Result<Hiprtc> {
        let mut candidates: Vec<&str> = HIPRTC_CANDIDATES.to_vec();
        candidates.extend(runtime_library);
        Self::load_from(&candidates)
    }

    /// Loads the first of `candidates` that opens and exports hiprtc; the
    /// error names every candidate and why it failed.
    pub fn load_from<S: AsRef<OsStr>>(candidates: &[S]) -> Result<Hiprtc> {
        let mut tried = Vec::new();
        for candidate in candidates {
            let name = candidate.as_ref();
            let shown = Path::new(name).display().to_string();
            // SAFETY: loading hiprtc (or the HIP runtime that contains it) runs
            // only the vendor's initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(name) } {
                // SAFETY: the table is stored beside `lib` and dropped before it.
                Ok(lib) => match unsafe { HiprtcApi::bind(&lib) } {
                    Ok(api) => return Ok(Hiprtc { api, library: shown, _lib: lib }),
                    Err(missing) => tried.push(format!("{shown} (no {missing})")),
                },
                Err(err) => tried.push(format!("{shown} ({err})")),
            }
        }
        Err(Error::Unavailable { backend: BACKEND, reason: format!("no hiprtc found; tried {}", tried.join(", ")) })
    }

    /// `(major, minor)` of the compiler.
    pub fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { (self.api.version)(&mut major, &mut minor) };
        (major, minor)
    }

    fn error_text(&self, code: sys::HiprtcResult) -> String {
        // SAFETY: returns a static NUL-terminated string (or null) for every code.
        let text = unsafe { (self.api.get_error_string)(code) };
        if text.is_null() {
            format!("hiprtc error {code}")
        } else {
            // SAFETY: non-null and NUL-terminated, as above.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        }
    }

    fn check(&self, call: &str, code: sys::HiprtcResult) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(device_error(format!("{call} failed: {}", self.error_text(code))))
        }
    }

    /// Compiles `source` with `defines` (`-DNAME=VALUE` options, such as a
    /// [`KernelPart`](decode_attn_core::kernel_part::KernelPart)'s) into a
    /// code object for `arch` (a `gcnArchName` such as
    /// `gfx942:sramecc+:xnack-`), or returns the cached object of an identical
    /// earlier compile (same source, headers, options, architecture and hiprtc
    /// version) from `cache_dir`.
    pub fn compile(
        &self,
        source: &Source<'_>,
        defines: &[String],
        arch: &str,
        cache_dir: Option<&Path>,
    ) -> Result<Vec<u8>> {
        let mut options = compile_options(arch);
        options.extend(defines.iter().cloned());
        let key = cache_key("hiprtc", source, &options, self.version());
        let cached = cache_dir.map(|dir| dir.join(format!("hip-{key}.hsaco")));
        let is_elf = |bytes: &[u8]| bytes.starts_with(b"\x7fELF");
        cached_or_compile(cached.as_deref(), is_elf, || self.compile_uncached(source, &options))
    }

    fn compile_uncached(&self, source: &Source<'_>, options: &[String]) -> Result<Vec<u8>> {
        // Poisoned (a panic in an earlier compile) still serialises.
        let _one_at_a_time = COMPILE_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let strings =
            source.program_strings(options).map_err(|_| device_error("kernel source contains a NUL byte".into()))?;

        let mut program: sys::Program = std::ptr::null_mut();
        // SAFETY: every pointer is a NUL-terminated CString (or an array of
        // them of the stated length) that outlives the call; hiprtc copies them.
        let code = unsafe {
            (self.api.create_program)(
                &mut program,
                strings.text.as_ptr(),
                strings.name.as_ptr(),
                strings.header_texts.len() as c_int,
                strings.header_texts.as_ptr(),
                strings.header_names.as_ptr(),
            )
        };
        self.check("hiprtcCreateProgram", code)?;
        // SAFETY: `program` was created above; the options outlive the call.
        let code =
            unsafe { (self.api.compile_program)(program, strings.options.len() as c_int, strings.options.as_ptr()) };
        let result = match self.check("hiprtcCompileProgram", code) {
            Err(err) => Err(device_error(format!(
                "{err} for {} ({}):\n{}",
                source.name,
                options.join(" "),
                self.program_log(program)
            ))),
            Ok(()) => self.code(program),
        };
        // SAFETY: destroys the program created above, exactly once.
        unsafe { (self.api.destroy_program)(&mut program) };
        result
    }

    fn code(&self, program: sys::Program) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: `program` compiled successfully; a valid out-pointer.
        self.check("hiprtcGetCodeSize", unsafe { (self.api.get_code_size)(program, &mut size) })?;
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` has room for the `size` bytes hiprtc writes.
        self.check("hiprtcGetCode", unsafe { (self.api.get_code)(program, bytes.as_mut_ptr().cast()) })?;
        if !bytes.starts_with(b"\x7fELF") {
            return Err(device_error(format!("hiprtc returned {size} bytes that are not an ELF code object")));
        }
        Ok(bytes)
    }

    fn program_log(&self, program: sys::Program) -> String {
        let mut size = 0usize;
        // SAFETY: `program` is live; a valid out-pointer.
        if unsafe { (self.api.get_program_log_size)(program, &mut size) } != 0 {
            return "(no log)".into();
        }
        let mut log = vec![0u8; size + 1];
        // SAFETY: the buffer holds the `size` bytes (NUL included) hiprtc writes, plus one.
        if unsafe { (self.api.get_program_log)(program, log.as_mut_ptr().cast()) } != 0 {
            return "(no log)".into();
        }
        CStr::from_bytes_until_nul(&log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// Options of every compile: the device's full architecture name (features
/// included, so the object matches the device exactly), C++17, -O3.
pub fn compile_options(arch: &str) -> Vec<String> {
    vec![format!("--offload-arch={arch}"), "-std=c++17".into(), "-O3".into()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_depends_on_everything() {
        let a = Source { name: "k.hip", text: "x", headers: &[("h.h", "y")] };
        let b = Source { name: "k.hip", text: "x", headers: &[("h.h", "z")] };
        let gfx942 = compile_options("gfx942");
        let gfx90a = compile_options("gfx90a");
        assert_ne!(cache_key("hiprtc", &a, &gfx942, (6, 2)), cache_key("hiprtc", &b, &gfx942, (6, 2)));
        assert_ne!(cache_key("hiprtc", &a, &gfx942, (6, 2)), cache_key("hiprtc", &a, &gfx90a, (6, 2)));
        assert_ne!(cache_key("hiprtc", &a, &gfx942, (6, 2)), cache_key("hiprtc", &a, &gfx942, (6, 3)));
        assert_eq!(cache_key("hiprtc", &a, &gfx942, (6, 2)), cache_key("hiprtc", &a, &gfx942, (6, 2)));
        // A part of a file is another compile than the whole, or another part.
        let part = |defines: &[&str]| {
            let mut options = gfx942.clone();
            options.extend(defines.iter().map(|d| d.to_string()));
            cache_key("hiprtc", &a, &options, (6, 2))
        };
        assert_ne!(part(&["-DDA_PART_TYPE=3", "-DDA_PART_HEAD_DIM=128"]), part(&[]));
        assert_ne!(
            part(&["-DDA_PART_TYPE=3", "-DDA_PART_HEAD_DIM=128"]),
            part(&["-DDA_PART_TYPE=3", "-DDA_PART_HEAD_DIM=64"])
        );
    }

    #[test]
    fn absent_hiprtc_names_every_library_tried() {
        let err = Hiprtc::load_from(&["/nonexistent/libhiprtc.so", "libc.so.6"]).err().unwrap();
        let text = err.to_string();
        assert!(matches!(err, Error::Unavailable { backend: "hip", .. }), "{err:?}");
        assert!(text.contains("no hiprtc found"), "{text}");
        assert!(text.contains("/nonexistent/libhiprtc.so"), "{text}");
        // A library that opens but does not export hiprtc says which entry point it lacks.
        assert!(text.contains("libc.so.6 (no hiprtcVersion"), "{text}");
    }

    #[test]
    fn compiles_a_kernel_without_a_device_when_hiprtc_is_installed() {
        let Ok(hiprtc) = Hiprtc::load(crate::runtime::RUNTIME_CANDIDATES.first().copied()) else {
            eprintln!("hiprtc not installed: skipping the run-time compile check");
            return;
        };
        let source = Source {
            name: "probe.hip",
            text: "#include \"probe.h\"\nextern \"C\" __global__ void probe(float* x) { x[threadIdx.x] = PROBE; }\n",
            headers: &[("probe.h", "#define PROBE 1.0f\n")],
        };
        match hiprtc.compile(&source, &[], "gfx90a", None) {
            Ok(code) => {
                assert!(code.starts_with(b"\x7fELF"), "not ELF");
                eprintln!(
                    "hiprtc {:?} ({}) compiled {} bytes for gfx90a",
                    hiprtc.version(),
                    hiprtc.library,
                    code.len()
                );
            }
            // Some distribution builds of hiprtc cannot compile without a
            // device runtime behind them; that must still be an error value.
            Err(err) => eprintln!("hiprtc ({}) could not compile here: {err}", hiprtc.library),
        }
    }
}

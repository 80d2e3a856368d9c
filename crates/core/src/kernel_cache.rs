//! The on-disk cache of kernels compiled at run time (NVRTC for CUDA, hiprtc
//! for HIP), shared by the GPU backends: one file per compile, named by a
//! hash of everything that decides its output, written atomically so that
//! processes sharing the folder never read half a file.

use std::ffi::{c_char, CString, NulError};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::Result;

/// One source file and the headers it includes, by the names it includes them as.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub name: &'a str,
    pub text: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
}

/// A source, its headers and compile options as the C strings that NVRTC's
/// and hiprtc's create- and compile-program calls take (their signatures
/// match). The pointer arrays point into the owned strings' heap buffers,
/// which stay put when this value moves.
pub struct ProgramStrings {
    pub text: CString,
    pub name: CString,
    pub header_texts: Vec<*const c_char>,
    pub header_names: Vec<*const c_char>,
    pub options: Vec<*const c_char>,
    _owned: Vec<CString>,
}

impl Source<'_> {
    /// The C strings of this source and `options`; an error if any holds a NUL byte.
    pub fn program_strings(&self, options: &[String]) -> std::result::Result<ProgramStrings, NulError> {
        let header_texts = c_strings(self.headers.iter().map(|(_, text)| *text))?;
        let header_names = c_strings(self.headers.iter().map(|(name, _)| *name))?;
        let option_strings = c_strings(options.iter().map(String::as_str))?;
        let pointers = |owned: &[CString]| owned.iter().map(|c| c.as_ptr()).collect();
        Ok(ProgramStrings {
            text: CString::new(self.text)?,
            name: CString::new(self.name)?,
            header_texts: pointers(&header_texts),
            header_names: pointers(&header_names),
            options: pointers(&option_strings),
            _owned: header_texts.into_iter().chain(header_names).chain(option_strings).collect(),
        })
    }
}

fn c_strings<'a>(texts: impl Iterator<Item = &'a str>) -> std::result::Result<Vec<CString>, NulError> {
    texts.map(CString::new).collect()
}

/// A hex SHA-256 of the source, its headers, the options and the compiler
/// (`compiler` names it, `version` is its version).
pub fn cache_key(compiler: &str, source: &Source<'_>, options: &[String], version: (i32, i32)) -> String {
    let mut hash = Sha256::new();
    for part in [source.name, source.text].into_iter().chain(source.headers.iter().flat_map(|(n, t)| [*n, *t])) {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    for option in options {
        hash.update(option.as_bytes());
        hash.update([0]);
    }
    hash.update(format!("{compiler} {}.{}", version.0, version.1).as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes cached at `path` when there are some that `usable` accepts, else
/// `compile()`'s, stored at `path` for next time. No `path`: always compiles.
pub fn cached_or_compile(
    path: Option<&Path>,
    usable: impl Fn(&[u8]) -> bool,
    compile: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    if let Some(bytes) = path.and_then(|path| std::fs::read(path).ok()) {
        if usable(&bytes) {
            return Ok(bytes);
        }
    }
    let bytes = compile()?;
    if let Some(path) = path {
        // The cache only saves time: failing to write it is not an error.
        let _ = write_atomically(path, &bytes);
    }
    Ok(bytes)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}", std::process::id(), path.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Where compiled kernels are cached when the caller names no folder:
/// `$DECODE_ATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/decode-attn`, else
/// `$HOME/.cache/decode-attn`, for every backend. Read only by the backends'
/// documented `from_env` entry points.
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
    fn program_strings_point_at_each_header_and_option_and_refuse_nul() {
        let source = Source { name: "k.cu", text: "x", headers: &[("a.h", "A"), ("b.h", "B")] };
        let options = ["-O3".to_string()];
        let strings = source.program_strings(&options).unwrap();
        // SAFETY: the pointers point into `strings`' own NUL-terminated buffers, alive here.
        let read = |ptrs: &[*const c_char]| -> Vec<String> {
            ptrs.iter().map(|&p| unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap().to_string()).collect()
        };
        assert_eq!((strings.text.to_str().unwrap(), strings.name.to_str().unwrap()), ("x", "k.cu"));
        assert_eq!(read(&strings.header_texts), ["A", "B"]);
        assert_eq!(read(&strings.header_names), ["a.h", "b.h"]);
        assert_eq!(read(&strings.options), ["-O3"]);
        let bad = Source { name: "k.cu", text: "x\0y", headers: &[] };
        assert!(bad.program_strings(&[]).is_err());
    }

    #[test]
    fn cache_key_depends_on_everything() {
        let a = Source { name: "k.cu", text: "x", headers: &[("h.h", "y")] };
        let b = Source { name: "k.cu", text: "x", headers: &[("h.h", "z")] };
        let sm90 = ["--gpu-architecture=sm_90".to_string()];
        let sm80 = ["--gpu-architecture=sm_80".to_string()];
        assert_ne!(cache_key("nvrtc", &a, &sm90, (13, 0)), cache_key("nvrtc", &b, &sm90, (13, 0)));
        assert_ne!(cache_key("nvrtc", &a, &sm90, (13, 0)), cache_key("nvrtc", &a, &sm80, (13, 0)));
        assert_ne!(cache_key("nvrtc", &a, &sm90, (13, 0)), cache_key("nvrtc", &a, &sm90, (12, 9)));
        assert_ne!(cache_key("nvrtc", &a, &sm90, (13, 0)), cache_key("hiprtc", &a, &sm90, (13, 0)));
        assert_eq!(cache_key("nvrtc", &a, &sm90, (13, 0)), cache_key("nvrtc", &a, &sm90, (13, 0)));
    }

    #[test]
    fn compiles_once_then_reads_the_cache_and_recompiles_what_is_unusable() {
        let dir = std::env::temp_dir().join(format!("decode-attn-cache-test-{}", std::process::id()));
        let path = dir.join("k.bin");
        let compiles = std::cell::Cell::new(0);
        let compile = || {
            compiles.set(compiles.get() + 1);
            Ok(b"ELF!".to_vec())
        };
        let elf = |b: &[u8]| b.starts_with(b"ELF");
        assert_eq!(cached_or_compile(Some(&path), elf, compile).unwrap(), b"ELF!");
        assert_eq!(cached_or_compile(Some(&path), elf, compile).unwrap(), b"ELF!");
        assert_eq!(compiles.get(), 1);
        std::fs::write(&path, b"junk").unwrap();
        assert_eq!(cached_or_compile(Some(&path), elf, compile).unwrap(), b"ELF!");
        assert_eq!(compiles.get(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

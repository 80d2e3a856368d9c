//! The on-disk cache of kernels compiled at run time (NVRTC for CUDA, hiprtc
//! for HIP), shared by the GPU backends: one file per compile, named by a
//! hash of everything that decides its output, written atomically so that
//! processes sharing the folder never read half a file.

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

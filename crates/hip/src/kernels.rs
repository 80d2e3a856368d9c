//! What this build embeds of kernels/hip (see build.rs), the kernel names the
//! backend launches and the file each lives in, the merge kernel's launch
//! grid, and the choice of a code object for a device.

use decode_attn_core::shape::SUPPORTED_HEAD_DIMS;
use decode_attn_core::{DType, Error, Result};

/// One kernel file of kernels/hip as this build embeds it. Each file is its
/// own code object, loaded as its own module (through hiprtc, the decode
/// file is a module per part: lib.rs's `FileModules`).
#[derive(Debug)]
pub struct KernelFile {
    /// File stem, e.g. `decode_kvgrid` ([`DECODE_FILE`], [`MERGE_FILE`]).
    pub stem: &'static str,
    /// `STEM.hip`, the name hiprtc compiles the text under.
    pub name: &'static str,
    pub text: &'static str,
    /// The headers the source includes, under the names it includes them by.
    pub headers: &'static [(&'static str, &'static str)],
    /// `(architecture, ELF code object)` compiled at build time; empty without a toolchain.
    pub code_objects: &'static [(&'static str, &'static [u8])],
}

impl KernelFile {
    /// The file as hiprtc compiles it: its text and headers, under its name.
    pub fn source(&self) -> crate::hiprtc::Source<'static> {
        crate::hiprtc::Source { name: self.name, text: self.text, headers: self.headers }
    }
}

mod embedded {
    use super::KernelFile;
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// kernels/hip/decode_kvgrid.hip: the decode kernel and its reducer.
pub const DECODE_FILE: &str = "decode_kvgrid";
/// kernels/hip/merge_states.hip: the two-way state merge.
pub const MERGE_FILE: &str = "merge_states";

/// The kernel files this build embeds (those kernels/hip had at build time).
pub fn files() -> &'static [KernelFile] {
    embedded::FILES
}

/// The embedded file `stem`, if kernels/hip had it at build time.
pub fn file(stem: &str) -> Option<&'static KernelFile> {
    files().iter().find(|f| f.stem == stem)
}

/// How the code objects came to be (or why there are none), for messages.
pub fn aot_note() -> &'static str {
    embedded::AOT_NOTE
}

/// Architectures every embedded file has a code object for.
pub fn architectures() -> Vec<&'static str> {
    let Some((first, rest)) = files().split_first() else { return Vec::new() };
    first
        .code_objects
        .iter()
        .map(|(arch, _)| *arch)
        .filter(|arch| rest.iter().all(|f| f.code_objects.iter().any(|(a, _)| a == arch)))
        .collect()
}

/// Threads per workgroup of every kernel (decode_kvgrid.hip's
/// `DECODE_KVGRID_THREADS`, merge_states.hip's `MERGE_STATES_THREADS`).
pub const THREADS: u32 = 256;

/// merge_states.hip's `MERGE_STATES_GRID_X`: workgroups per grid row of a merge.
pub const MERGE_GRID_X: u64 = 65536;

/// Grid rows of a merge at most (the y dimension of a grid, as on CUDA).
pub const MERGE_MAX_GRID_Y: u64 = 65535;

/// Element types the kernels are instantiated for (one type for Q, KV and out).
pub const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

fn dtype_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        _ => "bf16",
    }
}

/// `decode_kvgrid_<T>_d<D>`: grid `(num_seqs, num_splits, num_kv_heads)`.
pub fn decode_kernel(dtype: DType, head_dim: usize) -> String {
    format!("decode_kvgrid_{}_d{head_dim}", dtype_suffix(dtype))
}

/// `decode_kvgrid_reduce_<T>_d<D>`: grid `(num_seqs, num_q_heads)`, only when split.
pub fn reduce_kernel(dtype: DType, head_dim: usize) -> String {
    format!("decode_kvgrid_reduce_{}_d{head_dim}", dtype_suffix(dtype))
}

/// `merge_states_<T>`: grid [`merge_grid`], any head dim.
pub fn merge_kernel(dtype: DType) -> String {
    format!("merge_states_{}", dtype_suffix(dtype))
}

/// The file (stem) whose module holds kernel `name`.
pub fn kernel_file(name: &str) -> &'static str {
    if name.starts_with("merge_states_") {
        MERGE_FILE
    } else {
        DECODE_FILE
    }
}

/// Every entry point of file `stem` the backend may look up.
pub fn kernel_names(stem: &str) -> Vec<String> {
    let mut names = Vec::new();
    for &dtype in DTYPES {
        if stem == MERGE_FILE {
            names.push(merge_kernel(dtype));
        } else if stem == DECODE_FILE {
            for &d in SUPPORTED_HEAD_DIMS {
                names.push(decode_kernel(dtype, d));
                names.push(reduce_kernel(dtype, d));
            }
        }
    }
    names
}

/// Every entry point the backend may look up, in every file.
pub fn all_kernel_names() -> Vec<String> {
    [DECODE_FILE, MERGE_FILE].iter().flat_map(|stem| kernel_names(stem)).collect()
}

/// The grid of `merge_states_<T>` over `num_tokens * num_heads` rows of
/// `head_dim` elements of `dtype` (merge_states.hip's contract): one thread
/// per 16-byte chunk of a row (a row of head dim 0 is one chunk, which writes
/// the LSE), `THREADS` a workgroup, workgroups in rows of [`MERGE_GRID_X`].
/// An error, before anything runs, when that takes more than
/// [`MERGE_MAX_GRID_Y`] rows.
pub fn merge_grid(num_tokens: usize, num_heads: usize, head_dim: usize, dtype: DType) -> Result<(u32, u32, u32)> {
    let too_big = || Error::Unsupported {
        backend: "hip",
        what: format!("a merge of {num_tokens} tokens x {num_heads} heads x {head_dim} dims (more than one grid)"),
    };
    let per_chunk = (16 / dtype.size_bytes()) as u64;
    let chunks_per_row = if head_dim == 0 { 1 } else { (head_dim as u64).div_ceil(per_chunk) };
    let workgroups = (num_tokens as u64)
        .checked_mul(num_heads as u64)
        .and_then(|rows| rows.checked_mul(chunks_per_row))
        .ok_or_else(too_big)?
        .div_ceil(THREADS as u64);
    let rows = workgroups.div_ceil(MERGE_GRID_X);
    if rows > MERGE_MAX_GRID_Y {
        return Err(too_big());
    }
    Ok((workgroups.min(MERGE_GRID_X) as u32, rows as u32, 1))
}

/// The processor part of a `gcnArchName`: `gfx942:sramecc+:xnack-` -> `gfx942`.
pub fn processor(arch_name: &str) -> &str {
    arch_name.split(':').next().unwrap_or(arch_name).trim()
}

/// A target feature setting of an architecture name, e.g. `xnack` -> `Some('-')`.
fn feature(arch_name: &str, name: &str) -> Option<char> {
    arch_name.split(':').skip(1).find_map(|f| f.strip_prefix(name)).and_then(|rest| rest.chars().next())
}

/// Whether a code object built for `object_arch` runs on a device reporting
/// `device_arch`: the same processor, and every feature the object pins
/// (`:xnack+`, `:sramecc-`) set the same way on the device. Objects built
/// without feature settings (what build.rs makes) run on either setting.
pub fn compatible(object_arch: &str, device_arch: &str) -> bool {
    if processor(object_arch) != processor(device_arch) || processor(object_arch).is_empty() {
        return false;
    }
    object_arch.split(':').skip(1).all(|pinned| {
        let (name, setting) = pinned.split_at(pinned.len().saturating_sub(1));
        match feature(device_arch, name) {
            Some(device_setting) => setting.starts_with(device_setting),
            None => true,
        }
    })
}

/// The best embedded object for a device: a compatible one, preferring the
/// one that pins the most features.
pub fn select<'a>(device_arch: &str, objects: &'a [(&'a str, &'a [u8])]) -> Option<&'a (&'a str, &'a [u8])> {
    objects.iter().filter(|(arch, _)| compatible(arch, device_arch)).max_by_key(|(arch, _)| arch.matches(':').count())
}

/// The entry points a code object lacks of those named: each must stand in
/// it as a NUL-terminated symbol name. For the tests of the embedded and the
/// hiprtc-compiled objects.
#[cfg(test)]
pub(crate) fn missing_symbols(code: &[u8], names: &[String]) -> Vec<String> {
    let exported = |name: &String| {
        let needle = [name.as_bytes(), b"\0"].concat();
        code.windows(needle.len()).any(|w| w == needle.as_slice())
    };
    names.iter().filter(|name| !exported(name)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_chosen_by_processor_and_pinned_features() {
        let objects: &[(&str, &[u8])] = &[("gfx90a", b"a"), ("gfx942", b"b"), ("gfx942:xnack+", b"c")];
        assert_eq!(select("gfx942:sramecc+:xnack-", objects).map(|o| o.0), Some("gfx942"));
        assert_eq!(select("gfx942:sramecc+:xnack+", objects).map(|o| o.0), Some("gfx942:xnack+"));
        assert_eq!(select("gfx90a:sramecc-:xnack-", objects).map(|o| o.0), Some("gfx90a"));
        assert_eq!(select("gfx90a", objects).map(|o| o.0), Some("gfx90a"));
        // Another processor never matches, however close its name.
        assert_eq!(select("gfx940:sramecc+:xnack-", objects), None);
        assert_eq!(select("gfx9", objects), None);
        assert_eq!(select("gfx1100", objects), None);
        assert_eq!(select("", objects), None);
        assert_eq!(select("gfx942", &[]), None);
        assert_eq!(processor("gfx942:sramecc+:xnack-"), "gfx942");
    }

    #[test]
    fn kernel_names_follow_the_contract() {
        assert_eq!(decode_kernel(DType::Bf16, 128), "decode_kvgrid_bf16_d128");
        assert_eq!(reduce_kernel(DType::F16, 64), "decode_kvgrid_reduce_f16_d64");
        assert_eq!(decode_kernel(DType::F32, 256), "decode_kvgrid_f32_d256");
        assert_eq!(merge_kernel(DType::F32), "merge_states_f32");
        assert_eq!(merge_kernel(DType::F16), "merge_states_f16");
        assert_eq!(merge_kernel(DType::Bf16), "merge_states_bf16");
        assert_eq!(kernel_names(DECODE_FILE).len(), 3 * SUPPORTED_HEAD_DIMS.len() * 2);
        assert_eq!(kernel_names(MERGE_FILE), ["merge_states_f32", "merge_states_f16", "merge_states_bf16"]);
        assert!(kernel_names("other").is_empty());
        assert_eq!(all_kernel_names().len(), 3 * SUPPORTED_HEAD_DIMS.len() * 2 + 3);
        // Each name is found in the file that defines it.
        for stem in [DECODE_FILE, MERGE_FILE] {
            for name in kernel_names(stem) {
                assert_eq!(kernel_file(&name), stem, "{name}");
            }
        }
    }

    /// The chunk indices a merge grid's threads take, as merge_states.hip
    /// computes them: `(y * MERGE_GRID_X + x) * THREADS + tid`.
    fn merge_index_range(grid: (u32, u32, u32)) -> std::ops::Range<u64> {
        let (x, y, z) = grid;
        assert_eq!(z, 1);
        assert!(u64::from(x) <= MERGE_GRID_X && u64::from(y) <= MERGE_MAX_GRID_Y);
        // Several rows only when the first is full: the indices are contiguous.
        assert!(y <= 1 || u64::from(x) == MERGE_GRID_X, "{grid:?}");
        let last_group = u64::from(y.saturating_sub(1)) * MERGE_GRID_X + u64::from(x);
        0..last_group * u64::from(THREADS)
    }

    #[test]
    fn merge_grids_cover_every_chunk_once_with_no_idle_workgroup() {
        let cases = [
            // (tokens, heads, head_dim, dtype, chunks)
            (3, 8, 128, DType::Bf16, 3 * 8 * 16),
            (3, 8, 128, DType::F32, 3 * 8 * 32),
            (1, 1, 0, DType::F16, 1),
            (700, 2, 0, DType::F32, 1400),
            (5, 7, 3, DType::Bf16, 35),
            (5, 7, 100, DType::F16, 35 * 13),
            (5, 7, 100, DType::F32, 35 * 25),
            (4096, 32, 256, DType::Bf16, 4096 * 32 * 32),
            (1 << 20, 64, 128, DType::F32, (1u64 << 26) * 32),
            (1 << 22, 128, 256, DType::F16, (1u64 << 29) * 32),
        ];
        for (tokens, heads, d, dtype, chunks) in cases {
            let grid = merge_grid(tokens, heads, d, dtype).unwrap();
            let range = merge_index_range(grid);
            let threads = u64::from(THREADS);
            assert!(range.end >= chunks, "{tokens}x{heads}x{d} {dtype:?}: {grid:?} covers {range:?}, not {chunks}");
            assert!(range.end - chunks < threads, "{tokens}x{heads}x{d} {dtype:?}: {grid:?} has idle workgroups");
        }
        assert_eq!(merge_grid(3, 8, 128, DType::Bf16).unwrap(), (2, 1, 1));
        assert_eq!(merge_grid(1, 1, 1, DType::F32).unwrap(), (1, 1, 1));
        // One chunk past a full grid row starts a second one.
        let full_row = (MERGE_GRID_X * u64::from(THREADS)) as usize;
        assert_eq!(merge_grid(full_row, 1, 4, DType::F32).unwrap(), (65536, 1, 1));
        assert_eq!(merge_grid(full_row + 1, 1, 4, DType::F32).unwrap(), (65536, 2, 1));
        // Beyond 65535 grid rows (or usize overflow): an error, not a wrapped launch.
        let err = merge_grid(1 << 31, 1 << 20, 256, DType::F32).unwrap_err();
        assert!(matches!(err, Error::Unsupported { backend: "hip", .. }), "{err:?}");
        assert!(merge_grid(usize::MAX, 2, 8, DType::F32).is_err());
    }

    #[test]
    fn merge_source_states_the_constants_the_host_uses() {
        let Some(merge) = file(MERGE_FILE) else {
            eprintln!("kernels/hip/merge_states.hip was not there when this was built");
            return;
        };
        let define = |name: &str| -> Option<u64> {
            merge.text.lines().find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some("#define") && words.next() == Some(name))
                    .then(|| words.next().and_then(|v| v.parse().ok()))
                    .flatten()
            })
        };
        assert_eq!(define("MERGE_STATES_THREADS"), Some(u64::from(THREADS)));
        assert_eq!(define("MERGE_STATES_GRID_X"), Some(MERGE_GRID_X));
        for name in kernel_names(MERGE_FILE) {
            let stem = name.rsplit_once('_').unwrap().1;
            assert!(merge.text.contains(&format!("MST_ENTRY({stem}, ")), "no entry for {name}");
        }
        if let Some(decode) = file(DECODE_FILE) {
            assert!(decode.text.contains(&format!("#define DECODE_KVGRID_THREADS {THREADS}")));
        }
    }

    #[test]
    fn this_build_embeds_both_kernel_files() {
        let stems: Vec<&str> = files().iter().map(|f| f.stem).collect();
        assert_eq!(stems, [DECODE_FILE, MERGE_FILE]);
        // Code objects for the same architectures in every file, or none at all.
        let archs = architectures();
        for f in files() {
            assert_eq!(f.code_objects.len(), archs.len(), "{}: {}", f.stem, aot_note());
        }
    }

    #[test]
    fn embedded_code_objects_are_elf_and_export_every_kernel() {
        // Without a toolchain at build time there is nothing to check: say so.
        if architectures().is_empty() {
            eprintln!("no embedded HIP code objects ({})", aot_note());
            return;
        }
        for f in files() {
            for (arch, bytes) in f.code_objects {
                assert!(bytes.starts_with(b"\x7fELF"), "{}.{arch}: not ELF", f.stem);
                // e_machine (offset 18, little-endian) is EM_AMDGPU = 224.
                assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 224, "{}.{arch}: not an AMDGPU object", f.stem);
                let names = kernel_names(f.stem);
                assert_eq!(missing_symbols(bytes, &names), Vec::<String>::new(), "{}.{arch}: symbols missing", f.stem);
            }
        }
    }

    #[test]
    fn embedded_sources_bring_every_header_they_include() {
        if files().is_empty() {
            eprintln!("kernels/hip had no source when this was built");
            return;
        }
        for f in files() {
            assert_eq!(f.name, format!("{}.hip", f.stem));
            for (header, _) in f.headers {
                assert!(!header.is_empty());
            }
            for line in f.text.lines().filter(|l| l.trim_start().starts_with("#include \"")) {
                let included = line.split('"').nth(1).unwrap();
                assert!(f.headers.iter().any(|(h, _)| *h == included), "{}: {included} is not embedded", f.stem);
            }
        }
    }
}

//! Where the decode kernels' functions come from: one module holding all of
//! decode.cu (the embedded fatbin), or, on the NVRTC path, one module per
//! part of a kernel file, compiled when a function of that part is first
//! asked for (decode.cu's, and the kv-head-grid kernel's, which CUDA always
//! builds with NVRTC).
//!
//! Why parts: NVRTC's compile of the whole of decode.cu (259 entry points)
//! held a first decode back by 150 s on an H100 machine (s45), and an engine uses the kernels of one
//! element type and one head dim. Both files compile one part when given
//! `-DDA_PART_TYPE` and `-DDA_PART_HEAD_DIM` (decode.cu's "Parts"
//! comment); a part of decode.cu is about a twentieth of it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule};
use decode_attn_core::{DType, Error, Result};

use crate::nvrtc;

const BACKEND: &str = "cuda";

/// A kernel file's entry points for one element type and one head dim;
/// head dim 0 is decode.cu's `merge_attn_states_<T>`, which has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelPart {
    /// Index into [`ELEMENT_NAMES`]; `DA_PART_TYPE` is this plus one.
    element: usize,
    head_dim: u32,
}

/// The element-type suffixes of the entry points, in the order of
/// decode.cu's `DA_TYPE_*` numbers (1, 2, 3).
const ELEMENT_NAMES: [&str; 3] = ["f32", "f16", "bf16"];

impl KernelPart {
    /// The part holding the kernels of `dtype` at `head_dim`.
    pub(crate) fn of_problem(dtype: DType, head_dim: usize) -> KernelPart {
        let suffix = crate::dtype_suffix(dtype);
        let element = ELEMENT_NAMES.iter().position(|e| *e == suffix).unwrap_or(ELEMENT_NAMES.len() - 1);
        KernelPart { element, head_dim: head_dim as u32 }
    }

    /// The part that defines `function`, from the name alone: entry points
    /// are named `<kernel>_<T>_d<D>[_<variant>]` or `merge_attn_states_<T>`.
    pub(crate) fn of_function(function: &str) -> Option<KernelPart> {
        let element_of = |name: &str| ELEMENT_NAMES.iter().position(|e| *e == name);
        if let Some(element) = function.strip_prefix("merge_attn_states_") {
            return element_of(element).map(|element| KernelPart { element, head_dim: 0 });
        }
        let words: Vec<&str> = function.split('_').collect();
        words.windows(2).find_map(|pair| {
            let element = element_of(pair[0])?;
            let digits = pair[1].strip_prefix('d').filter(|d| d.bytes().all(|b| b.is_ascii_digit()))?;
            Some(KernelPart { element, head_dim: digits.parse().ok()? })
        })
    }

    /// The compiler options that make a kernel file this part alone.
    pub(crate) fn defines(&self) -> [String; 2] {
        [format!("-DDA_PART_TYPE={}", self.element + 1), format!("-DDA_PART_HEAD_DIM={}", self.head_dim)]
    }
}

impl std::fmt::Display for KernelPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} head_dim {}", ELEMENT_NAMES[self.element], self.head_dim)
    }
}

/// A kernel file's modules; see the module docs.
pub(crate) enum DecodeModules {
    Whole(Arc<CudaModule>),
    Parts(PartModules),
}

/// `source` compiled by NVRTC for `arch` a part at a time, each cached in
/// `cache_dir`.
pub(crate) struct PartModules {
    source: nvrtc::Source<'static>,
    ctx: Arc<CudaContext>,
    arch: (i32, i32),
    cache_dir: Option<PathBuf>,
    loaded: Mutex<HashMap<KernelPart, Arc<CudaModule>>>,
}

impl DecodeModules {
    pub(crate) fn parts(
        source: nvrtc::Source<'static>,
        ctx: Arc<CudaContext>,
        arch: (i32, i32),
        cache_dir: Option<PathBuf>,
    ) -> DecodeModules {
        DecodeModules::Parts(PartModules { source, ctx, arch, cache_dir, loaded: Mutex::new(HashMap::new()) })
    }

    /// The module that defines `function`, compiling and loading its part
    /// first if it is not loaded yet.
    pub(crate) fn module_for(&self, function: &str) -> Result<Arc<CudaModule>> {
        match self {
            DecodeModules::Whole(module) => Ok(module.clone()),
            DecodeModules::Parts(parts) => {
                let part = KernelPart::of_function(function).ok_or_else(|| Error::Device {
                    backend: BACKEND,
                    message: format!("kernel {function} belongs to no part of {}", parts.source.name),
                })?;
                parts.load(part)
            }
        }
    }

    /// Compiles and loads the part of `dtype` at `head_dim` now, if that is
    /// how these modules are built, so that the launches which need it (in
    /// a graph capture, say) find it loaded.
    pub(crate) fn prepare(&self, dtype: DType, head_dim: usize) -> Result<()> {
        match self {
            DecodeModules::Whole(_) => Ok(()),
            DecodeModules::Parts(parts) => parts.load(KernelPart::of_problem(dtype, head_dim)).map(drop),
        }
    }
}

impl PartModules {
    fn load(&self, part: KernelPart) -> Result<Arc<CudaModule>> {
        // Held across the compile, so that two threads asking for one part
        // compile it once.
        let mut loaded = self.loaded.lock().map_err(|_| Error::Device {
            backend: BACKEND,
            message: "kernel module lock poisoned by an earlier panic".into(),
        })?;
        if let Some(module) = loaded.get(&part) {
            return Ok(module.clone());
        }
        let name = self.source.name;
        let cubin =
            nvrtc::compile_cubin(&self.source, &part.defines(), self.arch, self.cache_dir.as_deref()).map_err(|e| {
                match e {
                    Error::Device { backend, message } => {
                        Error::Device { backend, message: format!("{name}'s part {part}: {message}") }
                    }
                    other => other,
                }
            })?;
        let module = self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).map_err(crate::driver_error)?;
        loaded.insert(part, module.clone());
        Ok(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::process::Command;

    #[test]
    fn names_map_to_their_parts() {
        let part = |name| KernelPart::of_function(name).map(|p| p.to_string());
        assert_eq!(part("decode_mma_bf16_d128_anyblock").as_deref(), Some("bf16 head_dim 128"));
        assert_eq!(part("decode_stream_reduce_wide_f16_d256").as_deref(), Some("f16 head_dim 256"));
        assert_eq!(part("decode_stream_f32_d64_h8").as_deref(), Some("f32 head_dim 64"));
        assert_eq!(part("merge_attn_states_bf16").as_deref(), Some("bf16 head_dim 0"));
        for unknown in ["merge_attn_states_f64", "decode_mma_bf16", "decode_mma_bf16_dx", "decode_kvgrid_bf16_d"] {
            assert_eq!(part(unknown), None, "{unknown}");
        }
        assert_eq!(KernelPart::of_problem(DType::Bf16, 128), KernelPart::of_function("decode_attn_bf16_d128").unwrap());
        assert_eq!(KernelPart::of_problem(DType::F16, 80).defines(), ["-DDA_PART_TYPE=2", "-DDA_PART_HEAD_DIM=80"]);
    }

    /// The entry points of kernel file `file` (from the workspace root) after
    /// the C preprocessor with `defines`: each name, and its definition's
    /// text up to the end of its body (launch bounds, parameters, the call).
    fn entry_points(cxx: &str, file: &str, defines: &[String]) -> BTreeMap<String, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Command::new(cxx)
            .args(["-E", "-P", "-x", "c++", "-I"])
            .arg(root.join("kernels/hip"))
            .arg("-I")
            .arg(root.join("kernels/cuda"))
            .args(defines)
            .arg(root.join(file))
            .output()
            .unwrap_or_else(|e| panic!("{cxx}: {e}"));
        assert!(out.status.success(), "{cxx} -E {file} {defines:?}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        // `__global__ void __launch_bounds__(...) NAME(const DecodeParams p) { body(p); }`
        text.split("__global__")
            .skip(1)
            .map(|rest| {
                let definition = rest.split_once('}').map_or(rest, |(head, _)| head);
                let after_bounds = definition.split_once(')').map_or(definition, |(_, after)| after);
                let name = after_bounds.split('(').next().unwrap_or("").trim().to_string();
                (name, definition.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .collect()
    }

    /// Every entry point of each whole file lies in exactly the part that
    /// `of_function` names for it, defined there as in the whole file, and
    /// the parts hold nothing else. Run through the C preprocessor alone,
    /// so it needs no CUDA compiler.
    #[test]
    fn the_parts_divide_the_kernel_files_as_the_names_say() {
        let candidates = std::env::var("CXX").ok().into_iter().chain(["c++", "g++", "clang++"].map(String::from));
        let Some(cxx) = candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok()) else {
            assert!(
                std::env::var_os("DECODE_ATTN_REQUIRE_CXX").is_none(),
                "no C++ compiler ($CXX, c++, g++, clang++) and DECODE_ATTN_REQUIRE_CXX is set"
            );
            eprintln!("skipped: no C++ compiler to preprocess the kernel files");
            return;
        };
        for (file, at_least) in [("kernels/cuda/decode.cu", 250), ("kernels/hip/decode_kvgrid.hip", 48)] {
            let whole = entry_points(&cxx, file, &[]);
            assert!(whole.len() >= at_least, "{file}: found only {} entry points: {whole:?}", whole.len());
            let mut union = BTreeMap::new();
            let head_dims = [0, 64, 80, 96, 112, 120, 128, 192, 256];
            for element in 0..ELEMENT_NAMES.len() {
                for head_dim in head_dims {
                    let part = KernelPart { element, head_dim };
                    let found = entry_points(&cxx, file, &part.defines());
                    for (name, definition) in &found {
                        assert_eq!(KernelPart::of_function(name), Some(part), "{file}: {name} is in part {part}");
                        assert_eq!(whole.get(name), Some(definition), "{file}: {name} as part {part} and whole");
                    }
                    union.extend(found);
                }
            }
            assert_eq!(union, whole, "{file}: the parts together are the whole file");
        }
    }

    /// Every part of both kernel files compiles through NVRTC for sm_90 and
    /// sm_80. NVRTC needs no GPU, but a library (`LD_LIBRARY_PATH` with
    /// libnvrtc.so.13 or .12) and minutes of CPU, so this runs on request:
    /// `cargo test -p decode-attn-cuda --lib -- --ignored every_part`.
    #[test]
    #[ignore]
    fn every_part_compiles_with_nvrtc() {
        let files = [
            nvrtc::Source { name: "decode.cu", text: crate::DECODE_SOURCE, headers: crate::KERNEL_HEADERS },
            nvrtc::Source { name: "decode_kvgrid.hip", text: crate::KVGRID_SOURCE, headers: crate::KVGRID_HEADERS },
        ];
        for arch in [(9, 0), (8, 0)] {
            for source in &files {
                for element in 0..ELEMENT_NAMES.len() {
                    for head_dim in [0, 64, 80, 96, 112, 120, 128, 192, 256] {
                        let part = KernelPart { element, head_dim };
                        let started = std::time::Instant::now();
                        let cubin = nvrtc::compile_cubin(source, &part.defines(), arch, None)
                            .unwrap_or_else(|e| panic!("{} part {part} for {arch:?}: {e}", source.name));
                        eprintln!(
                            "{} sm_{}{} {part}: {} bytes in {:.1} s",
                            source.name,
                            arch.0,
                            arch.1,
                            cubin.len(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
            }
        }
    }
}

//! Where the decode kernels' functions come from: one module holding all of
//! decode.cu (the embedded fatbin), or, on the NVRTC path, one module per
//! part of a kernel file ([`KernelPart`]: one element type at one head dim),
//! compiled when a function of that part is first asked for (decode.cu's,
//! and the kv-head-grid kernel's, which CUDA always builds with NVRTC).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule};
use decode_attn_core::kernel_part::KernelPart;
use decode_attn_core::{DType, Error, Result};

use crate::nvrtc;

const BACKEND: &str = "cuda";

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
        let cubin = nvrtc::compile_cubin(&self.source, &part.defines(), self.arch, self.cache_dir.as_deref())
            .map_err(|e| part.annotate(self.source.name, e))?;
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
            for part in KernelPart::all() {
                let found = entry_points(&cxx, file, &part.defines());
                for (name, definition) in &found {
                    assert_eq!(KernelPart::of_function(name), Some(part), "{file}: {name} is in part {part}");
                    assert_eq!(whole.get(name), Some(definition), "{file}: {name} as part {part} and whole");
                }
                union.extend(found);
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
                for part in KernelPart::all() {
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

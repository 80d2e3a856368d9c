//! How the kernels are compiled ahead of time, in one place: which nvcc,
//! which architectures, which flags.
//!
//! `cargo xtask kernels` and the build scripts of crates/cuda and crates/hip
//! each include this file (`#[path]`). The build scripts embed the fatbin and
//! code objects the xtask leaves in `target/kernels` instead of compiling
//! again; that is only sound while both compile with the same flags, which
//! this file makes true by construction rather than by two copies kept equal
//! by hand. What each caller adds on top changes no code: the xtask's
//! `-Xptxas -v`, `-keep` and warnings-as-errors, the build script's
//! `--rocm-path`. Compared section by section (docs/PERFORMANCE.md, s54),
//! the two fatbins differ only in ptxas's note of its own options, the two
//! HIP code objects only in clang's per-compile `__hip_cuid_` symbol.
//!
//! Only the standard library: the build scripts and the xtask have no other
//! dependency.

use std::env;
use std::path::{Path, PathBuf};

/// Where `cargo xtask kernels` installs nvcc (PyPI's wheels), under the
/// workspace root.
pub fn tools_nvcc(workspace: &Path) -> PathBuf {
    workspace.join(".tools/cuda/nvidia/cu13/bin/nvcc")
}

/// The nvcc both the xtask and the build script use: `$DECODE_ATTN_NVCC`,
/// then [`tools_nvcc`], `$CUDA_HOME/bin`, `/usr/local/cuda/bin` and `PATH`,
/// the first that is a file.
pub fn find_nvcc(workspace: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = env::var_os("DECODE_ATTN_NVCC") {
        candidates.push(path.into());
    }
    candidates.push(tools_nvcc(workspace));
    if let Some(home) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("bin/nvcc"));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|dir| dir.join("nvcc")));
    }
    candidates.into_iter().find(|c| c.is_file())
}

/// Real NVIDIA architectures embedded as SASS (A100, H100/H200); PTX of the
/// newest rides along so that newer GPUs JIT it.
pub const CUDA_ARCHS: &[&str] = &["80", "90"];

/// AMD architectures compiled to code objects (MI200, MI300).
pub const HIP_ARCHS: &[&str] = &["gfx90a", "gfx942"];

/// nvcc's arguments for a fatbin of every [`CUDA_ARCHS`] plus PTX of the
/// newest; the caller adds its `-I` folders, the input and `-o`.
/// `--threads 0` compiles the architectures in parallel.
pub fn nvcc_args(nvcc: &Path) -> Vec<String> {
    let mut args: Vec<String> =
        ["-std=c++17", "-O3", "--fatbin", "-Werror", "all-warnings", "--threads", "0"].map(String::from).to_vec();
    for arch in CUDA_ARCHS {
        args.push(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    if let Some(newest) = CUDA_ARCHS.last() {
        args.push(format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
    }
    if let Some(cccl) = nvcc_cccl_include(nvcc) {
        args.push(format!("-I{}", cccl.display()));
    }
    args
}

/// The PyPI wheels keep the CCCL headers (cuda/std/...) in a folder of their
/// own, which nvcc does not search by itself; other installs have none.
fn nvcc_cccl_include(nvcc: &Path) -> Option<PathBuf> {
    let cccl = nvcc.parent()?.parent()?.join("include/cccl");
    cccl.is_dir().then_some(cccl)
}

/// clang's arguments for one device-only HIP code object (plain ELF, not an
/// offload bundle) for `arch`, linked against the ROCm device libraries in
/// `device_libs`; the caller adds its `-I` folders, `-c`, the input and `-o`.
pub fn hip_clang_args(arch: &str, device_libs: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["-x", "hip", "-std=c++17", "-O3", "--offload-device-only", "--no-gpu-bundle-output"]
        .map(String::from)
        .to_vec();
    args.push(format!("--offload-arch={arch}"));
    args.push(format!("--rocm-device-lib-path={}", device_libs.display()));
    args
}

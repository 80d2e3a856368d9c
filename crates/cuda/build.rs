//! Compiles kernels/cuda/*.cu ahead of time when nvcc is available, and
//! always embeds the source so that the backend can fall back to NVRTC.
//!
//! nvcc is looked for in `$DECODE_ATTN_NVCC`, then `.tools/cuda` of the
//! workspace (where `cargo xtask kernels` installs it), `$CUDA_HOME/bin`,
//! `/usr/local/cuda/bin` and `PATH`. `DECODE_ATTN_REQUIRE_NVCC=1` turns a
//! missing nvcc into a build error (CI sets it, so that a kernel that does
//! not compile fails the build). A kernel that fails to compile with an nvcc
//! that exists is always a build error.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Real architectures embedded as SASS, plus PTX of the newest for newer GPUs.
const ARCHS: &[&str] = &["80", "90"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.parent().and_then(Path::parent).unwrap().to_path_buf();
    let kernels = workspace.join("kernels").join("cuda");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["DECODE_ATTN_NVCC", "DECODE_ATTN_REQUIRE_NVCC", "CUDA_HOME", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed={}", kernels.display());
    let tools_nvcc = workspace.join(".tools/cuda/nvidia/cu13/bin/nvcc");
    println!("cargo:rerun-if-changed={}", tools_nvcc.display());

    let source = kernels.join("decode.cu");
    let fatbin = out.join("decode.fatbin");
    let embedded = match find_nvcc(&tools_nvcc) {
        Some(nvcc) => {
            compile(&nvcc, &source, &kernels, &fatbin);
            true
        }
        None if env::var("DECODE_ATTN_REQUIRE_NVCC").is_ok_and(|v| v == "1") => {
            panic!("DECODE_ATTN_REQUIRE_NVCC=1 but no nvcc was found (run `cargo xtask kernels` to install one)")
        }
        None => {
            println!("cargo:warning=nvcc not found: CUDA kernels will be compiled by NVRTC at first use");
            false
        }
    };
    let generated = if embedded {
        format!("pub const FATBIN: Option<&[u8]> = Some(include_bytes!({:?}));\n", fatbin.display().to_string())
    } else {
        "pub const FATBIN: Option<&[u8]> = None;\n".to_string()
    };
    std::fs::write(out.join("embedded.rs"), generated).unwrap();
}

fn find_nvcc(tools_nvcc: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = env::var_os("DECODE_ATTN_NVCC") {
        candidates.push(path.into());
    }
    candidates.push(tools_nvcc.to_path_buf());
    if let Some(home) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("bin/nvcc"));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|dir| dir.join("nvcc")));
    }
    candidates.into_iter().find(|c| c.is_file())
}

fn compile(nvcc: &Path, source: &Path, include: &Path, fatbin: &Path) {
    let mut cmd = Command::new(nvcc);
    cmd.args(["-std=c++17", "-O3", "--fatbin", "-Werror", "all-warnings"]);
    for arch in ARCHS {
        cmd.arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    }
    let newest = ARCHS.last().unwrap();
    cmd.arg(format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
    // The PyPI wheels keep CCCL headers apart; harmless elsewhere.
    if let Some(prefix) = nvcc.parent().and_then(Path::parent) {
        let cccl = prefix.join("include/cccl");
        if cccl.is_dir() {
            cmd.arg(format!("-I{}", cccl.display()));
        }
    }
    cmd.arg(format!("-I{}", include.display())).arg(source).arg("-o").arg(fatbin);
    let output = cmd.output().unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
    if !output.status.success() {
        panic!(
            "nvcc failed on {}:\n{}{}",
            source.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

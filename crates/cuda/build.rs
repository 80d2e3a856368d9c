//! Compiles kernels/cuda/*.cu ahead of time when nvcc is available, and
//! always embeds the source so that the backend can fall back to NVRTC.
//!
//! When `cargo xtask kernels` has left `target/kernels/cuda/decode.fatbin`
//! (the same nvcc flags, kernels/toolchain.rs, plus its checks) newer than
//! every file of kernels/cuda and than those flags, that fatbin is embedded
//! instead of compiling again: CI compiles decode.cu once, in that step,
//! where clippy's build and the tests' build would each run this script and
//! its nvcc (about five minutes each on two cores).
//!
//! nvcc is looked for in `$DECODE_ATTN_NVCC`, then `.tools/cuda` of the
//! workspace (where `cargo xtask kernels` installs it), `$CUDA_HOME/bin`,
//! `/usr/local/cuda/bin` and `PATH`. `DECODE_ATTN_REQUIRE_NVCC=1` turns a
//! missing nvcc into a build error (CI sets it, so that a kernel that does
//! not compile fails the build). A kernel that fails to compile with an nvcc
//! that exists is always a build error.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// The nvcc, flags and architectures `cargo xtask kernels` compiles with too.
#[allow(dead_code)] // the HIP half is crates/hip's
#[path = "../../kernels/toolchain.rs"]
mod toolchain;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.parent().and_then(Path::parent).unwrap().to_path_buf();
    let kernels = workspace.join("kernels").join("cuda");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["DECODE_ATTN_NVCC", "DECODE_ATTN_REQUIRE_NVCC", "CUDA_HOME", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed={}", kernels.display());
    let tools_nvcc = toolchain::tools_nvcc(&workspace);
    // Only paths that exist: Cargo reruns a script on every build while a
    // path it watches is missing.
    if tools_nvcc.is_file() {
        println!("cargo:rerun-if-changed={}", tools_nvcc.display());
    }

    let source = kernels.join("decode.cu");
    let fatbin = out.join("decode.fatbin");
    let embedded = match (prebuilt(&workspace, &kernels), toolchain::find_nvcc(&workspace)) {
        (Some(prebuilt), _) => {
            if let Err(err) = fs::copy(&prebuilt, &fatbin) {
                panic!("cannot copy {} to {}: {err}", prebuilt.display(), fatbin.display());
            }
            true
        }
        (None, Some(nvcc)) => {
            compile(&nvcc, &source, &kernels, &fatbin);
            true
        }
        (None, None) if env::var("DECODE_ATTN_REQUIRE_NVCC").is_ok_and(|v| v == "1") => {
            panic!("DECODE_ATTN_REQUIRE_NVCC=1 but no nvcc was found (run `cargo xtask kernels` to install one)")
        }
        (None, None) => {
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

/// `target/kernels/cuda/decode.fatbin` where `cargo xtask kernels` left it
/// newer than every file of kernels/cuda (the kernel and the headers it
/// includes) and than kernels/toolchain.rs (how it was compiled).
fn prebuilt(workspace: &Path, kernels: &Path) -> Option<PathBuf> {
    let fatbin = workspace.join("target/kernels/cuda/decode.fatbin");
    let built = fs::metadata(&fatbin).and_then(|m| m.modified()).ok()?;
    println!("cargo:rerun-if-changed={}", fatbin.display());
    let newest_input = fs::read_dir(kernels)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .chain([workspace.join("kernels/toolchain.rs")])
        .map(|path| fs::metadata(&path).and_then(|m| m.modified()).ok())
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()?;
    (built >= newest_input).then_some(fatbin)
}

fn compile(nvcc: &Path, source: &Path, include: &Path, fatbin: &Path) {
    let mut cmd = Command::new(nvcc);
    cmd.args(toolchain::nvcc_args(nvcc));
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

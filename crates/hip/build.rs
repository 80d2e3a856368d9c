//! Embeds the HIP kernels: always their source (for hiprtc at run time), and
//! code objects for gfx90a and gfx942 when a compiler is here at build time.
//!
//! * Kernel files: [`KERNELS`] (`kernels/hip/NAME.hip`), each its own code
//!   object and, at run time, its own module: the kv-head-grid decode kernel
//!   and the state merge.
//! * Source: each file and every header it includes with `#include "..."`
//!   (looked up in `kernels/hip`, then `kernels/cuda`, as `cargo xtask
//!   kernels` does), each under the name it is included by. A file that is
//!   not there is not embedded and the backend says so at run time.
//! * Code objects: compiled with clang (`$DECODE_ATTN_HIP_CLANG`, else
//!   `clang-19` on `PATH` or in `/usr/lib/llvm-19/bin`) when the HIP headers
//!   (`hip/hip_runtime.h`) and the ROCm device libraries are present too.
//!   Device libraries: `$DECODE_ATTN_HIP_DEVICE_LIBS`, else the workspace's
//!   `.tools/hip-device-libs` (what `cargo xtask kernels` prepares), else
//!   Debian's `amdgcn/bitcode` folder (with `oclc_isa_version_942.bc` linked to
//!   the 940 one in `OUT_DIR`, which is all gfx942 needs from it). Every file
//!   and architecture compiles in parallel (about two minutes on two cores,
//!   nearly all of it the decode kernel). When `cargo xtask kernels` has left
//!   up-to-date objects of every file in `target/kernels/hip` (newer than the
//!   file and every header it includes), those are embedded instead of
//!   compiling again.
//! * `DECODE_ATTN_HIP_AOT=0` skips the code objects (a faster build; the
//!   backend then compiles through hiprtc at first use);
//!   `DECODE_ATTN_REQUIRE_HIP_AOT=1` makes a missing toolchain a build error.
//!   A kernel that fails to compile with a toolchain that is present is
//!   always a build error.
//!
//! The generated `embedded.rs` holds `FILES: &[KernelFile]` (see
//! src/kernels.rs) and `AOT_NOTE`.
//!
//! A machine with no ROCm and no clang builds this crate with no code
//! objects; nothing here links to any ROCm library.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The flags and architectures `cargo xtask kernels` compiles with too.
#[allow(dead_code)] // the CUDA half is crates/cuda's
#[path = "../../kernels/toolchain.rs"]
mod toolchain;

use toolchain::HIP_ARCHS as ARCHS;
/// The kernel files of kernels/hip (stems), in the order src/kernels.rs names them.
const KERNELS: &[&str] = &["decode_kvgrid", "merge_states"];
const DEBIAN_DEVICE_LIBS: &[&str] =
    &["/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode", "/opt/rocm/amdgcn/bitcode"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.parent().and_then(Path::parent).unwrap().to_path_buf();
    let hip_dir = workspace.join("kernels/hip");
    let cuda_dir = workspace.join("kernels/cuda");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in [
        "DECODE_ATTN_HIP_CLANG",
        "DECODE_ATTN_HIP_DEVICE_LIBS",
        "DECODE_ATTN_HIP_AOT",
        "DECODE_ATTN_REQUIRE_HIP_AOT",
        "ROCM_PATH",
        "PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed={}", cuda_dir.join("decode_params.h").display());

    let mut files: Vec<KernelFile> = Vec::new();
    for stem in KERNELS {
        let source = hip_dir.join(format!("{stem}.hip"));
        println!("cargo:rerun-if-changed={}", source.display());
        if !source.is_file() {
            // Rerun when it appears (the folder's listing changes).
            println!("cargo:rerun-if-changed={}", hip_dir.display());
            continue;
        }
        let headers = included_headers(&source, &[&hip_dir, &cuda_dir]);
        for (_, path) in &headers {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        files.push(KernelFile { stem, source, headers });
    }

    let (objects, note) = if files.is_empty() {
        (Vec::new(), "kernels/hip had no source at build time".to_string())
    } else {
        match prebuilt(&workspace, &files) {
            Some(found) => found,
            None => code_objects(&workspace, &hip_dir, &cuda_dir, &files, &out),
        }
    };

    let mut generated = String::from("pub const FILES: &[KernelFile] = &[\n");
    for KernelFile { stem, source, headers } in &files {
        let _ = writeln!(generated, "    KernelFile {{");
        let _ = writeln!(generated, "        stem: {stem:?},");
        let _ = writeln!(generated, "        name: {:?},", format!("{stem}.hip"));
        let _ = writeln!(generated, "        text: include_str!({:?}),", source.display().to_string());
        generated.push_str("        headers: &[\n");
        for (name, path) in headers {
            let _ = writeln!(generated, "            ({name:?}, include_str!({:?})),", path.display().to_string());
        }
        generated.push_str("        ],\n        code_objects: &[\n");
        for object in objects.iter().filter(|o| o.stem == *stem) {
            let path = object.path.display().to_string();
            let _ = writeln!(generated, "            ({:?}, include_bytes!({path:?})),", object.arch);
        }
        generated.push_str("        ],\n    },\n");
    }
    generated.push_str("];\n");
    let _ = writeln!(generated, "pub const AOT_NOTE: &str = {note:?};");
    fs::write(out.join("embedded.rs"), generated).unwrap();
}

/// One kernel file of kernels/hip and the headers it includes (name as
/// written, path found).
struct KernelFile {
    stem: &'static str,
    source: PathBuf,
    headers: Vec<(String, PathBuf)>,
}

impl KernelFile {
    /// The file and every header it includes.
    fn inputs(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.source.as_path()).chain(self.headers.iter().map(|(_, p)| p.as_path()))
    }
}

/// One code object: kernel file (stem), architecture, path.
struct Object {
    stem: &'static str,
    arch: &'static str,
    path: PathBuf,
}

/// Every `#include "name"` reachable from `file`, as (name as written, path
/// found), each once, looked up in `dirs` in order (the file's own folder first).
fn included_headers(file: &Path, dirs: &[&Path]) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let mut pending = vec![file.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(text) = fs::read_to_string(&current) else { continue };
        for line in text.lines() {
            let line = line.trim_start();
            let Some(rest) = line.strip_prefix('#').map(str::trim_start) else { continue };
            let Some(rest) = rest.strip_prefix("include").map(str::trim_start) else { continue };
            let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) else { continue };
            if found.iter().any(|(n, _)| n == name) {
                continue;
            }
            let own = current.parent().map(Path::to_path_buf);
            let path = own
                .iter()
                .map(PathBuf::as_path)
                .chain(dirs.iter().copied())
                .map(|d| d.join(name))
                .find(|p| p.is_file());
            if let Some(path) = path {
                found.push((name.to_string(), path.clone()));
                pending.push(path);
            }
        }
    }
    found
}

/// The code objects `cargo xtask kernels` left in `target/kernels/hip` (same
/// compiler and flags, plus -Werror), when there is one for every file and
/// architecture and each is newer than every input of its file: CI compiles
/// the kernels once, in that step, instead of again in each cargo build.
fn prebuilt(workspace: &Path, files: &[KernelFile]) -> Option<(Vec<Object>, String)> {
    if env::var("DECODE_ATTN_HIP_AOT").is_ok_and(|v| v == "0") {
        return None;
    }
    let dir = workspace.join("target/kernels/hip");
    let mut objects = Vec::new();
    // How they were compiled is an input of every object.
    let flags = workspace.join("kernels/toolchain.rs");
    for file in files {
        let newest_input = file
            .inputs()
            .chain([flags.as_path()])
            .filter_map(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
            .max()?;
        for arch in ARCHS {
            let path = dir.join(format!("{}.{arch}.hsaco", file.stem));
            // Watched only once it exists: Cargo reruns a script on every
            // build while a path it watches is missing.
            let modified = fs::metadata(&path).and_then(|m| m.modified()).ok()?;
            println!("cargo:rerun-if-changed={}", path.display());
            if modified < newest_input {
                return None;
            }
            objects.push(Object { stem: file.stem, arch, path });
        }
    }
    Some((objects, format!("compiled by `cargo xtask kernels` for {}", ARCHS.join(", "))))
}

/// Compiles the code objects of every file for every architecture when the
/// toolchain is here; returns them and a note on what was done, for the
/// backend's messages.
fn code_objects(
    workspace: &Path,
    hip_dir: &Path,
    cuda_dir: &Path,
    files: &[KernelFile],
    out: &Path,
) -> (Vec<Object>, String) {
    if env::var("DECODE_ATTN_HIP_AOT").is_ok_and(|v| v == "0") {
        return (Vec::new(), "DECODE_ATTN_HIP_AOT=0 at build time".into());
    }
    let toolchain = find_clang().ok_or("no clang-19 (or $DECODE_ATTN_HIP_CLANG) at build time").and_then(|clang| {
        let rocm = find_hip_headers().ok_or("no HIP headers (hip/hip_runtime.h) at build time")?;
        let libs = device_libs(workspace, out).ok_or("no ROCm device libraries at build time")?;
        Ok((clang, rocm, libs))
    });
    let (clang, rocm_path, libs) = match toolchain {
        Ok(found) => found,
        Err(why) => {
            if env::var("DECODE_ATTN_REQUIRE_HIP_AOT").is_ok_and(|v| v == "1") {
                panic!("DECODE_ATTN_REQUIRE_HIP_AOT=1 but {why} (apt-get install clang-19 lld-19 libamdhip64-dev rocm-device-libs)");
            }
            println!(
                "cargo:warning=HIP kernels not compiled ahead of time ({why}): hiprtc will compile them at first use"
            );
            return (Vec::new(), why.to_string());
        }
    };
    // Every (file, architecture) at once; waited for in order below.
    let jobs: Vec<(Object, &Path, std::io::Result<std::process::Child>)> = files
        .iter()
        .flat_map(|file| ARCHS.iter().map(move |arch| (file, *arch)))
        .map(|(file, arch)| {
            let object = Object { stem: file.stem, arch, path: out.join(format!("{}.{arch}.hsaco", file.stem)) };
            let mut cmd = Command::new(&clang);
            cmd.args(toolchain::hip_clang_args(arch, &libs));
            if let Some(rocm) = &rocm_path {
                cmd.arg(format!("--rocm-path={}", rocm.display()));
            }
            cmd.arg(format!("-I{}", hip_dir.display()))
                .arg(format!("-I{}", cuda_dir.display()))
                .arg("-c")
                .arg(&file.source)
                .arg("-o")
                .arg(&object.path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let child = cmd.spawn();
            (object, file.source.as_path(), child)
        })
        .collect();
    let mut objects = Vec::new();
    for (object, source, child) in jobs {
        let output: Output = child
            .and_then(|c| c.wait_with_output())
            .unwrap_or_else(|err| panic!("could not run {}: {err}", clang.display()));
        if !output.status.success() || !object.path.is_file() {
            panic!(
                "{} failed on {} for {}:\n{}{}",
                clang.display(),
                source.display(),
                object.arch,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        objects.push(object);
    }
    let note = format!("compiled by {} for {} at build time", clang.display(), ARCHS.join(", "));
    (objects, note)
}

fn find_clang() -> Option<PathBuf> {
    if let Some(path) = env::var_os("DECODE_ATTN_HIP_CLANG") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|dir| dir.join("clang-19")));
    }
    candidates.push("/usr/lib/llvm-19/bin/clang".into());
    candidates.into_iter().find(|c| c.is_file())
}

/// `Some(None)`: the headers are where clang looks by itself (`/usr/include`);
/// `Some(Some(root))`: a ROCm root to pass as `--rocm-path`.
fn find_hip_headers() -> Option<Option<PathBuf>> {
    if Path::new("/usr/include/hip/hip_runtime.h").is_file() {
        return Some(None);
    }
    let roots = env::var_os("ROCM_PATH").map(PathBuf::from).into_iter().chain([PathBuf::from("/opt/rocm")]);
    roots.into_iter().find(|root| root.join("include/hip/hip_runtime.h").is_file()).map(Some)
}

fn device_libs(workspace: &Path, out: &Path) -> Option<PathBuf> {
    let has_942 = |dir: &Path| dir.join("oclc_isa_version_942.bc").is_file();
    if let Some(dir) = env::var_os("DECODE_ATTN_HIP_DEVICE_LIBS") {
        return Some(PathBuf::from(dir));
    }
    let tools = workspace.join(".tools/hip-device-libs");
    if has_942(&tools) {
        return Some(tools);
    }
    let source = DEBIAN_DEVICE_LIBS.iter().map(PathBuf::from).find(|d| d.join("oclc_isa_version_940.bc").is_file())?;
    if has_942(&source) {
        return Some(source);
    }
    // A folder of links to Debian's bitcode plus the 942 ISA file it lacks
    // (identical to the 940 one for code generation; see xtask's hip_device_libs).
    let folder = out.join("hip-device-libs");
    let _ = fs::remove_dir_all(&folder);
    fs::create_dir_all(&folder).ok()?;
    for entry in fs::read_dir(&source).ok()?.flatten() {
        link(&entry.path(), &folder.join(entry.file_name()))?;
    }
    link(&source.join("oclc_isa_version_940.bc"), &folder.join("oclc_isa_version_942.bc"))?;
    Some(folder)
}

#[cfg(unix)]
fn link(original: &Path, link: &Path) -> Option<()> {
    std::os::unix::fs::symlink(original, link).ok()
}

#[cfg(not(unix))]
fn link(original: &Path, link: &Path) -> Option<()> {
    fs::copy(original, link).ok().map(|_| ())
}

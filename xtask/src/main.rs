//! Project automation, run as `cargo xtask <task>` (an alias in .cargo/config.toml).
//!
//! * `kernels`: compile every kernel for every target, failing on any error,
//!   warning, register spill or (CUDA) dynamic shared memory aligned to less
//!   than 128 bytes: kernels/cuda with nvcc, kernels/hip with
//!   clang-19 for AMD and, as CUDA, with nvcc (the portable kernels the CUDA
//!   backend can compile with NVRTC). Installs nvcc 13.0 from PyPI wheels
//!   into `.tools/cuda` when no nvcc is found (no CUDA install or GPU needed).
//! * `ci`: what `.ci/run` runs: formatting, kernels, clippy, the test suite.
//! * `bench [ARGS]`: `decode-attn bench --grid peers` on the default backend.
//! * `test-all-gpus`: the conformance sweep (`decode-attn check`) on every
//!   CUDA and HIP device present, one after another, one row per device.
//! * `miri`: the CPU backend's SIMD loops (crates/cpu/tests/unsafe_loops.rs)
//!   under Miri, which checks their `unsafe` code; needs a nightly toolchain
//!   with the miri component, so CI does not run it.
//!
//! Only the standard library, so that `cargo xtask` builds in seconds.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

type Result<T, E = String> = std::result::Result<T, E>;

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  kernels       compile every kernel under kernels/ for every target (sm_80, sm_90 + PTX;
                gfx90a, gfx942 once kernels/hip has sources, whose .hip files are also
                compiled as CUDA for sm_80, sm_90); fails on any warning or spill
  ci            cargo fmt --check, kernels, clippy -D warnings, cargo test --workspace
  bench [ARGS]  decode-attn bench --grid peers on the default backend (ARGS are passed on)
  test-all-gpus the conformance sweep on every CUDA and HIP device present, serially;
                one row per device; fails on any failure; says so when there is no GPU
  miri          the CPU backend's AVX2 and portable loops (crates/cpu/tests/unsafe_loops.rs)
                under Miri, two tests at a time; needs `rustup toolchain install nightly
                --component miri`";

/// The nvcc wheels, all from one CUDA release: 13.0 is what the GPU machine's driver runs.
const NVCC_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.*",
    "nvidia-nvvm==13.0.*",
    "nvidia-cuda-crt==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
    "nvidia-cuda-cccl==13.0.*",
];

// The nvcc, flags and architectures, shared with the build scripts of
// crates/cuda and crates/hip, which embed what this compiles.
#[path = "../../kernels/toolchain.rs"]
mod toolchain;

use toolchain::{find_nvcc, tools_nvcc, CUDA_ARCHS, HIP_ARCHS};

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let outcome = match args.first().map(String::as_str) {
        Some("kernels") if args.len() == 1 => kernels().map(|_| ()),
        Some("ci") if args.len() == 1 => ci(),
        Some("bench") => bench(&args[1..]),
        Some("test-all-gpus") if args.len() == 1 => test_all_gpus(),
        Some("miri") if args.len() == 1 => miri(),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("unknown or malformed task {:?}\n\n{USAGE}", args.join(" "))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    // xtask/ sits directly under the workspace root.
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs `cmd` with inherited output; an error names the command.
fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|err| format!("cannot run {shown}: {err}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

/// Runs `cmd` capturing its output; returns (success, stdout + stderr).
fn capture(cmd: &mut Command) -> Result<(bool, String)> {
    let shown = format!("{cmd:?}");
    let output = cmd.output().map_err(|err| format!("cannot run {shown}: {err}"))?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Ok((output.status.success(), text))
}

fn sources(dir: &Path, extensions: &[&str]) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(format!("cannot list {}: {err}", dir.display())),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().and_then(OsStr::to_str).is_some_and(|ext| extensions.contains(&ext)))
        .collect();
    files.sort();
    Ok(files)
}

// ---------------------------------------------------------------- kernels

/// What `kernels` found, for `ci` to hand on to the cargo builds.
struct KernelTools {
    nvcc: Option<PathBuf>,
    /// Whether kernels/hip compiled (into target/kernels/hip, which
    /// crates/hip/build.rs then embeds instead of compiling again).
    hip: bool,
}

fn kernels() -> Result<KernelTools> {
    let root = workspace_root();
    // Both vendors always run, so one report shows every kernel that fails,
    // and at once: nvcc alone keeps about 1.3 of two cores busy (it
    // parallelises only across architectures), so clang's HIP builds run in
    // what it leaves (CI's kernel step: docs/PERFORMANCE.md, s54).
    let (cuda, hip) = std::thread::scope(|scope| {
        let hip = scope.spawn(|| compile_hip_kernels(&root));
        let cuda = compile_cuda_kernels(&root);
        (cuda, hip.join().unwrap_or_else(|_| Err("kernels/hip: the compiling thread panicked".to_string())))
    });
    match (cuda, hip) {
        (Ok(nvcc), Ok(hip)) => Ok(KernelTools { nvcc, hip }),
        (Err(err), Ok(_)) | (Ok(_), Err(err)) => Err(err),
        (Err(cuda), Err(hip)) => Err(format!("{cuda}\n{hip}")),
    }
}

/// Installs nvcc 13.0 from PyPI's wheels into `.tools/cuda`: pip downloads
/// them, they are unpacked into one prefix (the wheels are plain zips), and the
/// executables get back the mode bits zip extraction drops.
fn install_nvcc(root: &Path) -> Result<PathBuf> {
    let tools = root.join(".tools");
    let staging = tools.join("cuda.partial");
    let wheels = tools.join("cuda-wheels");
    println!("kernels: no nvcc found; installing CUDA 13.0 nvcc from PyPI wheels into .tools/cuda");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&wheels).map_err(|err| format!("cannot create {}: {err}", wheels.display()))?;
    let python = env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    run(Command::new(&python)
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest"])
        .arg(&wheels)
        .args(NVCC_WHEELS))
    .map_err(|err| format!("{err}\n(pip is needed: apt-get install python3-pip, or set PYTHON)"))?;
    for wheel in sources(&wheels, &["whl"])? {
        // Only the 13.0 wheels: an older download left in the folder must not mix in.
        let name = wheel.file_name().and_then(OsStr::to_str).unwrap_or_default();
        if !name.contains("-13.0.") {
            continue;
        }
        run(Command::new(&python).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&staging))?;
    }
    let prefix = staging.join("nvidia/cu13");
    for dir in ["bin", "nvvm/bin"] {
        let dir = prefix.join(dir);
        let entries = fs::read_dir(&dir).map_err(|err| format!("the wheels gave no {}: {err}", dir.display()))?;
        for entry in entries.flatten() {
            set_executable(&entry.path())?;
        }
    }
    let target = tools.join("cuda");
    let _ = fs::remove_dir_all(&target);
    // Renamed into place only when complete, so an interrupted install is retried.
    fs::rename(&staging, &target).map_err(|err| format!("cannot move the install into place: {err}"))?;
    // pip keeps its own download cache; the unpacked prefix is all that is needed.
    let _ = fs::remove_dir_all(&wheels);
    let nvcc = tools_nvcc(root);
    if nvcc.is_file() {
        Ok(nvcc)
    } else {
        Err(format!("the wheels installed no {}", nvcc.display()))
    }
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if path.is_file() {
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .map_err(|err| format!("cannot chmod {}: {err}", path.display()))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<()> {
    Ok(())
}

/// One entry function's ptxas report.
#[derive(Debug, Default, PartialEq)]
struct PtxasEntry {
    function: String,
    arch: String,
    registers: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// Parses `-Xptxas -v` output: "Compiling entry function 'f' for 'sm_90'",
/// then "N bytes spill stores, M bytes spill loads" and "Used R registers".
fn parse_ptxas(log: &str) -> Vec<PtxasEntry> {
    let mut entries: Vec<PtxasEntry> = Vec::new();
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let end = line.find(what)?;
        line[..end].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let function = parts.next().unwrap_or_default().to_string();
            let arch = parts.nth(1).unwrap_or_default().to_string();
            entries.push(PtxasEntry { function, arch, ..Default::default() });
        } else if let Some(entry) = entries.last_mut() {
            if let Some(n) = number_before(line, "bytes spill stores") {
                entry.spill_stores = n;
            }
            if let Some(n) = number_before(line, "bytes spill loads") {
                entry.spill_loads = n;
            }
            if let Some(n) = number_before(line, "registers") {
                entry.registers = n;
            }
        }
    }
    entries
}

/// Every `.cu` directly in `kernels/cuda` (the kernels; `kernels/cuda/test/`
/// holds a standalone host-side check, which is not a kernel to ship), and
/// every portable `.hip` of `kernels/hip` compiled as CUDA (`-x cu`, include
/// folders `kernels/cuda` and `kernels/hip`): the CUDA backend compiles
/// decode_kvgrid.hip with NVRTC when it selects that kernel, so its NVIDIA
/// build is checked here the same way as decode.cu's (warnings as errors, no
/// spills), into `target/kernels/cuda-portable` (a check only: nothing embeds
/// those fatbins).
fn compile_cuda_kernels(root: &Path) -> Result<Option<PathBuf>> {
    let cuda_dir = root.join("kernels/cuda");
    let hip_dir = root.join("kernels/hip");
    let native = sources(&cuda_dir, &["cu"])?;
    let portable = sources(&hip_dir, &["hip"])?;
    if native.is_empty() && portable.is_empty() {
        println!("kernels/cuda: no .cu sources, nothing to compile");
        return Ok(None);
    }
    let nvcc = match find_nvcc(root) {
        Some(nvcc) => nvcc,
        None => install_nvcc(root)?,
    };
    let (_, version) = capture(Command::new(&nvcc).arg("--version"))?;
    let release = version.lines().find(|l| l.contains("release")).unwrap_or("version unknown").trim().to_string();
    println!("kernels/cuda: {} ({release})", nvcc.display());
    let native_out = root.join("target/kernels/cuda");
    let portable_out = root.join("target/kernels/cuda-portable");
    let native_includes = [cuda_dir.as_path()];
    let portable_includes = [cuda_dir.as_path(), hip_dir.as_path()];
    let jobs: Vec<(&PathBuf, bool, &[&Path], &Path)> = native
        .iter()
        .map(|file| (file, false, &native_includes[..], native_out.as_path()))
        .chain(portable.iter().map(|file| (file, true, &portable_includes[..], portable_out.as_path())))
        .collect();
    // Every file at once, for the same reason as the two vendors (`kernels`).
    let outcomes = at_once(jobs.iter().map(|&(file, as_cuda, includes, out_dir)| {
        let nvcc = &nvcc;
        move || nvcc_check(nvcc, file, as_cuda, includes, out_dir)
    }));
    let mut failed = Vec::new();
    for (&(file, as_cuda, _, _), outcome) in jobs.iter().zip(outcomes) {
        if !outcome? {
            failed.push(if as_cuda { format!("{} (as CUDA)", file_name(file)) } else { file_name(file) });
        }
    }
    if failed.is_empty() {
        Ok(Some(nvcc))
    } else {
        Err(format!("kernels/cuda: {} failed: {}", failed.len(), failed.join(", ")))
    }
}

/// Runs every task on a thread of its own and returns their outcomes in
/// order; a task that panics counts as one that failed.
fn at_once<T: Send>(tasks: impl Iterator<Item = impl FnOnce() -> Result<T> + Send>) -> Vec<Result<T>> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = tasks.map(|task| scope.spawn(task)).collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or_else(|_| Err("a task's thread panicked".to_string())))
            .collect()
    })
}

fn file_name(file: &Path) -> String {
    file.file_name().and_then(OsStr::to_str).unwrap_or("kernel").to_string()
}

/// Compiles one file with nvcc for every [`CUDA_ARCHS`] (SASS, plus PTX of
/// the newest) into `out_dir/STEM.fatbin`, `-x cu` when `as_cuda` (a file
/// whose extension nvcc would not take as CUDA), with `includes` as `-I`
/// folders. Prints one line (or the failure's details, in one piece, as
/// other files compile beside it); returns whether it compiled with no
/// warning and no spill.
fn nvcc_check(nvcc: &Path, file: &Path, as_cuda: bool, includes: &[&Path], out_dir: &Path) -> Result<bool> {
    fs::create_dir_all(out_dir).map_err(|err| format!("cannot create {}: {err}", out_dir.display()))?;
    let stem = file.file_stem().and_then(OsStr::to_str).unwrap_or("kernel");
    let keep = keep_dir(out_dir, stem);
    // Fresh, so that no PTX of an earlier build is checked.
    let _ = fs::remove_dir_all(&keep);
    fs::create_dir_all(&keep).map_err(|err| format!("cannot create {}: {err}", keep.display()))?;
    let started = Instant::now();
    let (ok, log) = capture(&mut nvcc_command(nvcc, file, as_cuda, includes, out_dir))?;
    let entries = parse_ptxas(&log);
    let spills: Vec<String> = entries
        .iter()
        .filter(|e| e.spill_stores > 0 || e.spill_loads > 0)
        .map(|e| {
            format!("{} ({}): {} B spill stores, {} B spill loads", e.function, e.arch, e.spill_stores, e.spill_loads)
        })
        .collect();
    let warnings: Vec<&str> = log.lines().filter(|l| l.to_ascii_lowercase().contains("warning")).collect();
    let mut misaligned = Vec::new();
    let mut ptx_files = 0;
    if ok {
        for ptx in sources(&keep, &["ptx"])? {
            ptx_files += 1;
            let text = fs::read_to_string(&ptx).map_err(|err| format!("cannot read {}: {err}", ptx.display()))?;
            misaligned.extend(misaligned_dynamic_shared(&text).into_iter().map(|(array, align)| {
                format!(
                    "{}: dynamic shared array {array} aligned to {align} bytes, under {DYNAMIC_SHARED_ALIGN} \
                     (declare it with DA_DYNAMIC_SHARED)",
                    file_name(&ptx)
                )
            }));
        }
        if ptx_files == 0 {
            misaligned.push(format!("nvcc kept no PTX in {}: the alignment check had nothing to read", keep.display()));
        }
    }
    // The intermediates (about 100 MB for decode.cu) are of no use once read.
    let _ = fs::remove_dir_all(&keep);
    let name = if as_cuda { format!("{} (as CUDA)", file_name(file)) } else { file_name(file) };
    let seconds = started.elapsed().as_secs_f64();
    if !ok || !spills.is_empty() || !warnings.is_empty() || !misaligned.is_empty() {
        let mut report = format!("{name}: FAILED after {seconds:.1} s\n");
        if !ok {
            // The compiler's own messages, without ptxas's per-function chatter.
            for line in log.lines().filter(|l| !l.starts_with("ptxas info") && !l.starts_with("    ")) {
                report.push_str(&format!("    {line}\n"));
            }
        }
        for line in warnings.iter().map(|w| w.to_string()).chain(spills).chain(misaligned) {
            report.push_str(&format!("    {line}\n"));
        }
        print!("{report}");
        return Ok(false);
    }
    let archs: Vec<&str> = {
        let mut a: Vec<&str> = entries.iter().map(|e| e.arch.as_str()).collect();
        a.sort();
        a.dedup();
        a
    };
    let max_registers = entries.iter().map(|e| e.registers).max().unwrap_or(0);
    println!(
        "{name}: ok in {seconds:.1} s; {} entry functions x {} ({}), PTX compute_{}; max {max_registers} registers, \
         no spills, no warnings, no dynamic shared memory under {DYNAMIC_SHARED_ALIGN}-byte alignment ({ptx_files} PTX)",
        entries.len() / archs.len().max(1),
        archs.len(),
        archs.join(", "),
        CUDA_ARCHS.last().unwrap_or(&"?")
    );
    Ok(true)
}

/// The nvcc command of [`nvcc_check`].
fn nvcc_command(nvcc: &Path, file: &Path, as_cuda: bool, includes: &[&Path], out_dir: &Path) -> Command {
    let stem = file.file_stem().and_then(OsStr::to_str).unwrap_or("kernel");
    let mut cmd = Command::new(nvcc);
    if as_cuda {
        cmd.args(["-x", "cu"]);
    }
    cmd.args(toolchain::nvcc_args(nvcc));
    // ptxas's registers and spills, read by `nvcc_check`.
    cmd.args(["-Xptxas", "-v"]);
    for dir in includes {
        cmd.arg(format!("-I{}", dir.display()));
    }
    // The intermediate files, the PTX among them, for `misaligned_dynamic_shared`.
    cmd.arg("-keep").arg("-keep-dir").arg(keep_dir(out_dir, stem));
    cmd.arg(file).arg("-o").arg(out_dir.join(format!("{stem}.fatbin")));
    cmd
}

/// Where [`nvcc_command`] keeps one file's intermediates.
fn keep_dir(out_dir: &Path, stem: &str) -> PathBuf {
    out_dir.join(format!("{stem}.keep"))
}

/// The smallest alignment the kernels' dynamic shared memory may have. The
/// K/V rings live there and are filled by 16-byte `cp.async` copies of whole
/// 128-byte lines: a ring 32 bytes off a 128-byte boundary took 8 shared
/// memory wavefronts a warp where 4 do and streamed 7-9% slower
/// (docs/PERFORMANCE.md, s31). A static `__shared__` variable declared beside
/// it is what moved it, so every dynamic array declares the alignment
/// (`DA_DYNAMIC_SHARED` in kernels/cuda/decode_stream.cuh) and this check
/// keeps a new kernel from forgetting it.
const DYNAMIC_SHARED_ALIGN: u32 = 128;

/// Every `.extern .shared` array in `ptx` (dynamic shared memory) whose
/// declared alignment is under [`DYNAMIC_SHARED_ALIGN`], as `(name, align)`;
/// a declaration without `.align` counts as its element size's alignment.
fn misaligned_dynamic_shared(ptx: &str) -> Vec<(String, u32)> {
    ptx.lines()
        .map(str::trim)
        .filter(|line| line.starts_with(".extern .shared"))
        .filter_map(|line| {
            let words: Vec<&str> = line.trim_end_matches(';').split_whitespace().collect();
            let align = match words.iter().position(|w| *w == ".align") {
                Some(i) => words.get(i + 1)?.parse().ok()?,
                // `.b8` .. `.b64`, `.f32` ..: the element's own size.
                None => words.iter().find_map(|w| w.get(2..)?.parse::<u32>().ok()).map_or(1, |bits| bits / 8),
            };
            let name = words.last()?.split('[').next()?.to_string();
            (align < DYNAMIC_SHARED_ALIGN).then_some((name, align))
        })
        .collect()
}

/// HIP kernels (`kernels/hip/*.hip` or `*.cpp`), compiled device-only for each
/// of [`HIP_ARCHS`] with clang into plain code objects (`target/kernels/hip/
/// NAME.ARCH.hsaco`, ELF, not offload bundles): Debian's clang-19 knows gfx942,
/// which its hipcc 5.2 does not. The toolchain is installed only when there is
/// something to compile ([`ensure_hip_toolchain`]).
fn compile_hip_kernels(root: &Path) -> Result<bool> {
    let dir = root.join("kernels/hip");
    let files = sources(&dir, &["hip", "cpp"])?;
    if files.is_empty() {
        println!("kernels/hip: no .hip or .cpp sources, nothing to compile");
        return Ok(false);
    }
    let clang = ensure_hip_toolchain()?;
    let device_libs = hip_device_libs(root)?;
    let out_dir = root.join("target/kernels/hip");
    fs::create_dir_all(&out_dir).map_err(|err| format!("cannot create {}: {err}", out_dir.display()))?;
    let mut failed = Vec::new();
    for file in &files {
        let started = Instant::now();
        let name = file.file_name().and_then(OsStr::to_str).unwrap_or("kernel").to_string();
        let stem = file.file_stem().and_then(OsStr::to_str).unwrap_or("kernel");
        // Every architecture at once: one clang uses one core.
        let outcomes = at_once(HIP_ARCHS.iter().map(|&arch| {
            let mut cmd = Command::new(&clang);
            cmd.args(toolchain::hip_clang_args(arch, &device_libs))
                .args(["-Wall", "-Wextra", "-Werror"])
                .arg(format!("-I{}", dir.display()))
                .arg(format!("-I{}", root.join("kernels/cuda").display()))
                .arg("-c")
                .arg(file)
                .arg("-o")
                .arg(out_dir.join(format!("{stem}.{arch}.hsaco")));
            move || capture(&mut cmd)
        }));
        let mut problems = Vec::new();
        for (arch, outcome) in HIP_ARCHS.iter().zip(outcomes) {
            let (ok, log) = outcome?;
            if !ok || log.to_ascii_lowercase().contains("warning") {
                problems.push(format!("{arch}:\n{log}"));
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        if problems.is_empty() {
            println!("{name}: ok in {seconds:.1} s; {}", HIP_ARCHS.join(", "));
        } else {
            // In one piece, as the CUDA files compile beside it.
            let mut report = format!("{name}: FAILED after {seconds:.1} s\n");
            for problem in problems {
                report.push_str(&format!("    {}\n", problem.replace('\n', "\n    ")));
            }
            print!("{report}");
            failed.push(name);
        }
    }
    if failed.is_empty() {
        Ok(true)
    } else {
        Err(format!("kernels/hip: {} failed: {}", failed.len(), failed.join(", ")))
    }
}

/// Debian folder of the ROCm device libraries (package rocm-device-libs).
const DEBIAN_DEVICE_LIBS: &str = "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode";

/// clang-19, with lld-19, the HIP headers and the ROCm device libraries,
/// installing with apt-get the Debian packages of whichever are missing.
fn ensure_hip_toolchain() -> Result<PathBuf> {
    let present = [
        ("clang-19", which("clang-19").is_some()),
        ("lld-19", which("ld.lld-19").is_some()),
        ("libamdhip64-dev", Path::new("/usr/include/hip/hip_runtime.h").is_file()),
        ("rocm-device-libs", Path::new(DEBIAN_DEVICE_LIBS).join("oclc_isa_version_940.bc").is_file()),
    ];
    let missing: Vec<&str> = present.iter().filter(|(_, found)| !found).map(|(package, _)| *package).collect();
    if !missing.is_empty() {
        println!("kernels/hip: installing {} (Debian) to compile for {}", missing.join(", "), HIP_ARCHS.join(", "));
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        run(Command::new("apt-get").args(["install", "-y", "-qq"]).args(&missing))?;
    }
    which("clang-19").ok_or_else(|| "apt-get installed clang-19 but it is not on PATH".to_string())
}

/// A device-library folder for clang: Debian's ROCm bitcode, plus an
/// `oclc_isa_version_942.bc` copied from the 940 one, which Debian's set lacks
/// (the two differ only in the ISA version constant the libraries never read
/// for code generation).
fn hip_device_libs(root: &Path) -> Result<PathBuf> {
    let folder = root.join(".tools/hip-device-libs");
    if folder.join("oclc_isa_version_942.bc").is_file() {
        return Ok(folder);
    }
    let candidates =
        ["/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode", "/opt/rocm/amdgcn/bitcode"];
    let source =
        candidates.iter().map(PathBuf::from).find(|dir| dir.join("oclc_isa_version_940.bc").is_file()).ok_or_else(
            || {
                format!(
                    "no ROCm device libraries (oclc_isa_version_940.bc) in {}: apt-get install rocm-device-libs",
                    candidates.join(", ")
                )
            },
        )?;
    fs::create_dir_all(&folder).map_err(|err| format!("cannot create {}: {err}", folder.display()))?;
    for entry in fs::read_dir(&source).map_err(|err| format!("cannot list {}: {err}", source.display()))?.flatten() {
        let path = entry.path();
        if let Some(file_name) = path.file_name() {
            fs::copy(&path, folder.join(file_name)).map_err(|err| format!("cannot copy {}: {err}", path.display()))?;
        }
    }
    fs::copy(source.join("oclc_isa_version_940.bc"), folder.join("oclc_isa_version_942.bc"))
        .map_err(|err| format!("cannot create oclc_isa_version_942.bc: {err}"))?;
    Ok(folder)
}

fn which(program: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path).map(|dir| dir.join(program)).find(|candidate| candidate.is_file())
}

// ---------------------------------------------------------------- ci, bench

fn ci() -> Result<()> {
    let root = workspace_root();
    let started = Instant::now();
    let step = |name: &str| println!("\n==> {name} ({:.0} s so far)", started.elapsed().as_secs_f64());

    step("cargo fmt --all -- --check");
    run(cargo().current_dir(&root).args(["fmt", "--all", "--", "--check"]))?;

    // Kernels before the Rust builds: a kernel error fails fast, and the
    // nvcc installed here lets crates/cuda embed compiled kernels.
    step("cargo xtask kernels");
    let tools = kernels()?;
    let with_kernels = |cmd: &mut Command| {
        if let Some(nvcc) = &tools.nvcc {
            // crates/cuda/build.rs: use this nvcc, and fail rather than fall back to NVRTC.
            cmd.env("DECODE_ATTN_NVCC", nvcc).env("DECODE_ATTN_REQUIRE_NVCC", "1");
        }
        if tools.hip {
            // crates/hip/build.rs: embed the code objects just compiled into
            // target/kernels/hip (no second compile), and fail rather than
            // leave them to hiprtc.
            cmd.env("DECODE_ATTN_REQUIRE_HIP_AOT", "1");
        }
    };

    step("cargo clippy --workspace --all-targets -- -D warnings");
    let mut clippy = cargo();
    clippy.current_dir(&root).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]);
    with_kernels(&mut clippy);
    run(&mut clippy)?;

    // The README's test command.
    step("cargo test --workspace");
    let mut test = cargo();
    test.current_dir(&root).args(["test", "--workspace"]);
    with_kernels(&mut test);
    // tests/tests/emulated_kernels.rs: fail, not skip, without a C++ compiler.
    test.env("DECODE_ATTN_REQUIRE_CXX", "1");
    run(&mut test)?;

    println!("\nci: all steps passed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn bench(extra: &[String]) -> Result<()> {
    run(cargo()
        .current_dir(workspace_root())
        .args(["run", "--release", "-p", "decode-attn-cli", "--", "bench", "--grid", "peers"])
        .args(extra))
}

// ---------------------------------------------------------------- test-all-gpus

/// One line of `decode-attn devices`: `cuda:0  available  NVIDIA H200, ...`.
#[derive(Debug, PartialEq, Eq)]
struct DeviceLine {
    spec: String,
    available: bool,
    detail: String,
}

/// The GPU devices (`cuda:N`, `hip:N`) and the absent GPU backends (`cuda`,
/// `hip`, with the reason) that `decode-attn devices` printed.
fn parse_devices(text: &str) -> Vec<DeviceLine> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let spec = words.next()?;
            let state = words.next()?;
            let backend = spec.split(':').next()?;
            if !(backend == "cuda" || backend == "hip") || !(state == "available" || state == "absent") {
                return None;
            }
            Some(DeviceLine {
                spec: spec.into(),
                available: state == "available",
                detail: words.collect::<Vec<_>>().join(" "),
            })
        })
        .collect()
}

/// `(passed, failed, skipped)` from the closing line of `decode-attn check`.
fn parse_check_summary(text: &str) -> Option<(u32, u32, u32)> {
    let line = text.lines().rev().find(|line| line.contains(" passed, ") && line.contains(" failed"))?;
    let count = |word: &str| -> Option<u32> {
        let words: Vec<&str> = line.split(|c: char| c == ',' || c.is_whitespace()).filter(|w| !w.is_empty()).collect();
        let at = words.iter().position(|w| *w == word)?;
        words.get(at.checked_sub(1)?)?.parse().ok()
    };
    Some((count("passed")?, count("failed")?, count("skipped").unwrap_or(0)))
}

fn test_all_gpus() -> Result<()> {
    let root = workspace_root();
    let mut build = cargo();
    build.current_dir(&root).args(["build", "--release", "-q", "-p", "decode-attn-cli"]);
    let tools_nvcc = tools_nvcc(&root);
    if tools_nvcc.is_file() {
        build.env("DECODE_ATTN_NVCC", &tools_nvcc);
    }
    run(&mut build)?;
    let cli = root.join("target/release/decode-attn");
    let (ok, listing) = capture(Command::new(&cli).arg("devices"))?;
    if !ok {
        return Err(format!("decode-attn devices failed:\n{listing}"));
    }
    let lines = parse_devices(&listing);
    let devices: Vec<&DeviceLine> = lines.iter().filter(|d| d.spec.contains(':')).collect();
    if devices.is_empty() {
        println!("test-all-gpus: no GPU on this machine; nothing to test.");
        for absent in &lines {
            println!("  {}: {}", absent.spec, absent.detail);
        }
        return Ok(());
    }
    println!(
        "{:8}  {:>6}  {:>6}  {:>7}  {:>7}  {:6}  device",
        "device", "passed", "failed", "skipped", "seconds", "result"
    );
    let mut failures = 0;
    for device in devices {
        let started = Instant::now();
        let (passed, failed, skipped, verdict) = if !device.available {
            (0, 0, 0, "FAIL (cannot open)")
        } else {
            // One device at a time: each sweep has its device to itself.
            let (ok, text) = capture(Command::new(&cli).args(["check", "--backend", &device.spec]))?;
            match parse_check_summary(&text) {
                Some((p, f, s)) if ok && f == 0 && p > 0 => (p, f, s, "PASS"),
                Some((p, f, s)) => (p, f, s, "FAIL"),
                None => {
                    eprintln!("{}: no summary from decode-attn check:\n{text}", device.spec);
                    (0, 0, 0, "FAIL (no summary)")
                }
            }
        };
        if verdict != "PASS" {
            failures += 1;
        }
        println!(
            "{:8}  {passed:>6}  {failed:>6}  {skipped:>7}  {:>7.1}  {verdict:6}  {}",
            device.spec,
            started.elapsed().as_secs_f64(),
            device.detail
        );
    }
    if failures == 0 {
        Ok(())
    } else {
        Err(format!("{failures} device(s) failed the conformance sweep"))
    }
}

/// The tests of crates/cpu/tests/unsafe_loops.rs in two halves, run at
/// once (Miri interprets on one core); about 121 and 162 s in s55.
const MIRI_TESTS: [&[&str]; 2] = [
    &["every_head_group_size", "portable_loop"],
    &["head_dims_with_tails_and_four_byte_elements", "layouts_and_splits"],
];

/// `cargo xtask miri`: see [`MIRI_TESTS`] and the task list.
fn miri() -> Result<()> {
    let root = workspace_root();
    // rustup's `cargo` proxy, which takes `+nightly` (the `CARGO` this runs
    // under is stable's own binary); the toolchain it was started with is
    // not passed on.
    let nightly_cargo = || {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&root).env_remove("RUSTUP_TOOLCHAIN").env_remove("CARGO").arg("+nightly");
        cmd
    };
    let (ok, version) = capture(nightly_cargo().args(["miri", "--version"]))?;
    if !ok {
        return Err(format!(
            "Miri is not installed: `rustup toolchain install nightly --component miri` ({})",
            version.trim()
        ));
    }
    println!("==> {} on crates/cpu/tests/unsafe_loops.rs", version.trim());
    // The AVX2 loop needs these features at compile time, where Miri reads
    // them (it runs no CPUID). Stacked Borrows, Miri's default, and strict
    // provenance: the tests' one-thread backends start no rayon pool, whose
    // crossbeam-epoch breaks both (and leaks its global state).
    let rustflags = if cfg!(target_arch = "x86_64") { "-C target-feature=+avx2,+fma,+f16c" } else { "" };
    let miri_test = || {
        let mut cmd = nightly_cargo();
        cmd.env("RUSTFLAGS", rustflags).env("MIRIFLAGS", "-Zmiri-strict-provenance");
        cmd.args(["miri", "test", "-q", "-p", "decode-attn-cpu", "--test", "unsafe_loops"]);
        cmd
    };
    // Built once, before the halves share the target folder.
    run(miri_test().arg("--no-run"))?;
    let started = Instant::now();
    let outcomes = at_once(MIRI_TESTS.iter().map(|tests| {
        let mut cmd = miri_test();
        cmd.args(["--", "--exact"]).args(tests.iter());
        move || {
            let (ok, log) = capture(&mut cmd)?;
            println!("--- {} ({:.0} s)\n{}", tests.join(", "), started.elapsed().as_secs_f64(), log.trim_end());
            if ok {
                Ok(())
            } else {
                Err(format!("under Miri, {} failed", tests.join(", ")))
            }
        }
    }));
    let failed: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
    if failed.is_empty() {
        println!("==> Miri found nothing in {:.0} s", started.elapsed().as_secs_f64());
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_device_listing() {
        let text = "cpu     available  CPU (16 threads), 16 multiprocessors, ~10 GB/s assumed
cuda:0  available  NVIDIA H200, 132 multiprocessors, ~4424 GB/s assumed
cuda:1  absent     cuda: out of memory
hip     absent     hip backend is not available: no HIP runtime found
auto picks cuda: NVIDIA H200 (132 multiprocessors)
";
        let lines = parse_devices(text);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            DeviceLine {
                spec: "cuda:0".into(),
                available: true,
                detail: "NVIDIA H200, 132 multiprocessors, ~4424 GB/s assumed".into()
            }
        );
        assert!(!lines[1].available);
        assert_eq!(lines[2].spec, "hip");
    }

    #[test]
    fn parses_the_check_summary() {
        assert_eq!(parse_check_summary("PASS  x\n126 passed, 0 failed, 32 skipped\n"), Some((126, 0, 32)));
        assert_eq!(parse_check_summary("3 passed, 1 failed\n"), Some((3, 1, 0)));
        assert_eq!(parse_check_summary("nothing here"), None);
    }

    #[test]
    fn portable_kernels_compile_as_cuda_with_both_include_folders() {
        let root = Path::new("/w");
        let (cuda, hip) = (root.join("kernels/cuda"), root.join("kernels/hip"));
        let out = root.join("target/kernels/cuda-portable");
        let file = hip.join("merge_states.hip");
        let cmd = nvcc_command(Path::new("/nonexistent/bin/nvcc"), &file, true, &[&cuda, &hip], &out);
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args[..2], ["-x", "cu"]);
        for expected in [
            "-Werror",
            "all-warnings",
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90,code=sm_90",
            "-I/w/kernels/cuda",
            "-I/w/kernels/hip",
            "/w/kernels/hip/merge_states.hip",
            "/w/target/kernels/cuda-portable/merge_states.fatbin",
        ] {
            assert!(args.iter().any(|a| a == expected), "no {expected} in {args:?}");
        }
        let at = |s: &str| args.iter().position(|a| a == s).unwrap();
        assert_eq!(at("-Xptxas") + 1, at("-v"), "ptxas must report spills");
        assert_eq!(args[at("-keep-dir") + 1], "/w/target/kernels/cuda-portable/merge_states.keep");
        assert!(at("-keep") < at("-keep-dir"), "the PTX is kept for the alignment check");
        // decode.cu is CUDA by its extension: no -x, only its own folder.
        let native = nvcc_command(Path::new("nvcc"), &cuda.join("decode.cu"), false, &[&cuda], root);
        let args: Vec<String> = native.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(!args.iter().any(|a| a == "-x" || a == "-I/w/kernels/hip"), "{args:?}");
    }

    #[test]
    fn finds_dynamic_shared_arrays_under_128_byte_alignment() {
        let ptx = "\
.version 9.0
.extern .shared .align 128 .b8 mma_ring[];
.extern .shared .align 16 .b8 stream_ring[];
    .extern .shared .b32 words[];
.extern .shared .align 256 .b8 wide[];
.shared .align 4 .u32 _ZZ6kernelE5count;
.global .align 1 .b8 table[16];
";
        assert_eq!(misaligned_dynamic_shared(ptx), [("stream_ring".to_string(), 16), ("words".to_string(), 4)]);
        assert!(misaligned_dynamic_shared(".extern .shared .align 128 .b8 mma_ring[];\n").is_empty());
    }

    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "\
ptxas info    : Compiling entry function 'decode_attn_bf16_d128' for 'sm_90'
ptxas info    : Function properties for decode_attn_bf16_d128
    16 bytes stack frame, 28 bytes spill stores, 60 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 42912 bytes smem
ptxas info    : Compiling entry function 'merge_attn_states_f32' for 'sm_80'
ptxas info    : Function properties for merge_attn_states_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 31 registers, used 0 barriers, 416 bytes cmem[0]
";
        let entries = parse_ptxas(log);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0],
            PtxasEntry {
                function: "decode_attn_bf16_d128".into(),
                arch: "sm_90".into(),
                registers: 128,
                spill_stores: 28,
                spill_loads: 60
            }
        );
        assert_eq!((entries[1].registers, entries[1].spill_stores, entries[1].spill_loads), (31, 0, 0));
    }
}

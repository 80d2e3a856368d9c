//! The GPU kernels' logic, checked on the CPU: the standalone C++ checks in
//! `kernels/cuda/test` and `kernels/hip/test`, built with this machine's C++
//! compiler against `kernels/cuda/test/cuda_emu.h` (a CTA as fibers;
//! `cp.async`, `mma.sync`, MFMA, votes and shuffles emulated with their
//! documented semantics) and run. Each compares every kernel's output, the
//! output poisoned first, with an f64 reference on random data, across head
//! dims, dtypes, groups, layouts, block sizes and split counts.
//!
//! So a change to a kernel is checked on every CI run, which has no GPU. A
//! Linux machine without a C++ compiler (`$CXX`, `c++`, `g++` or `clang++`) skips
//! these tests and says so, unless `DECODE_ATTN_REQUIRE_CXX` is set, as
//! `cargo xtask ci` sets it: there a missing compiler fails.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits under the workspace root").to_path_buf()
}

/// The first C++ compiler that answers `--version`.
fn cxx() -> Option<String> {
    let candidates = std::env::var("CXX").ok().into_iter().chain(["c++", "g++", "clang++"].map(String::from));
    candidates.into_iter().find(|cxx| Command::new(cxx).arg("--version").output().is_ok_and(|out| out.status.success()))
}

/// The compiler, or `None` after saying why these tests are skipped.
fn cxx_or_skip(test: &str) -> Option<String> {
    if !cfg!(target_os = "linux") {
        // cuda_emu.h's fibers start through <ucontext.h>, which other
        // systems deprecate or lack.
        eprintln!("{test}: skipped, the emulator runs on Linux only");
        return None;
    }
    let found = cxx();
    if found.is_none() {
        assert!(
            std::env::var_os("DECODE_ATTN_REQUIRE_CXX").is_none(),
            "{test}: no C++ compiler ($CXX, c++, g++, clang++) and DECODE_ATTN_REQUIRE_CXX is set"
        );
        eprintln!("{test}: skipped, no C++ compiler found ($CXX, c++, g++, clang++)");
    }
    found
}

/// Builds `source` (relative to the workspace root) with `defines` into
/// this test target's scratch directory as `name`.
fn build(cxx: &str, name: &str, source: &str, defines: &[&str]) -> PathBuf {
    let root = workspace_root();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let out = Command::new(cxx)
        .args(["-std=c++17", "-O1", "-x", "c++"])
        .args(defines)
        .arg("-I")
        .arg(root.join("kernels/hip"))
        .arg("-I")
        .arg(root.join("kernels/cuda"))
        .arg(root.join(source))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    assert!(out.status.success(), "{cxx} {source} {defines:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// Runs `exe` and returns its standard output, failing on a non-zero exit.
fn run(exe: &Path, args: &[&str]) -> String {
    let out = Command::new(exe).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} exited with {}:\n{stdout}\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The number just before `word` on the last line of `stdout` that starts
/// with `prefix` and holds `word`: ("", " failed") in "690 passed, 0 failed"
/// gives 0, ("wave 32: ", " cases") in "wave 32: 60 cases, ..." gives 60.
fn number_before(stdout: &str, prefix: &str, word: &str) -> usize {
    let line = stdout
        .lines()
        .rev()
        .find(|line| line.starts_with(prefix) && line.contains(word))
        .unwrap_or_else(|| panic!("no line `{prefix}..{word}` in:\n{stdout}"));
    let head = &line[..line.find(word).unwrap_or(0)];
    let digits = head.rsplit(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty());
    digits.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no number before `{word}` in `{line}`"))
}

/// Checks a summary line `{prefix}N cases, M failed...`: some cases ran and
/// none failed.
fn assert_cases_passed(stdout: &str, prefix: &str, what: &str) {
    assert!(number_before(stdout, prefix, " cases") > 0, "{what}: no `{prefix}` case run:\n{stdout}");
    assert_eq!(number_before(stdout, prefix, " failed"), 0, "{what}:\n{stdout}");
}

/// `decode_test.cu` built once for the CUDA tests below (they run in
/// parallel), or `None` without a compiler.
fn decode_test() -> Option<&'static Path> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cxx = cxx_or_skip("cuda decode_test")?;
            Some(build(&cxx, "decode_emu", "kernels/cuda/test/decode_test.cu", &["-DDA_EMULATE"]))
        })
        .as_deref()
}

/// Runs `decode_test` with `args` and checks that every case passed and
/// that each of `kernels` ran some.
fn check_decode(args: &[&str], kernels: &[&str]) {
    let Some(exe) = decode_test() else { return };
    let stdout = run(exe, args);
    assert!(number_before(&stdout, "", " passed") > 0, "{args:?}: no case passed:\n{stdout}");
    assert_eq!(number_before(&stdout, "", " failed"), 0, "{args:?}:\n{stdout}");
    for kernel in kernels {
        assert_cases_passed(&stdout, kernel, &format!("decode_test {args:?}"));
    }
}

/// Every case on the stream and tensor-core kernels (`quick`: no timing,
/// there is no GPU to time).
#[test]
fn cuda_decode_kernels_match_the_reference_on_the_emulator() {
    check_decode(&["quick"], &["stream kernel: ", "mma kernel: "]);
}

/// The split cases of the stream and tensor-core kernels through the wide
/// reducer (the cases it does not change are not run again).
#[test]
fn cuda_wide_reducer_matches_the_reference_on_the_emulator() {
    check_decode(&["quick", "wide"], &["stream kernel: ", "mma kernel: "]);
}

/// The tensor-core kernel with its grids heads first, as `auto` launches it
/// past one wave.
#[test]
fn cuda_mma_kernel_heads_first_matches_the_reference_on_the_emulator() {
    check_decode(&["mma", "heads"], &["mma kernel: "]);
}

/// The tensor-core kernel with a split per warp, as `auto` plans small batches.
#[test]
fn cuda_mma_kernel_warp_splits_match_the_reference_on_the_emulator() {
    check_decode(&["mma", "warps"], &["mma kernel: "]);
}

/// `kvgrid_test.cu` built for a `wave`-lane wave, with the MFMA path or
/// without, and run. One test each, so that the harness spreads the three
/// builds and runs over its threads.
fn check_kvgrid(wave: u32, mfma: bool) {
    let Some(cxx) = cxx_or_skip("hip kvgrid_test") else { return };
    let name = format!("kvgrid_emu{wave}{}", if mfma { "" } else { "_generic" });
    let wave_define = format!("-DDA_EMU_WAVE={wave}");
    let mut defines = vec![wave_define.as_str()];
    if !mfma {
        defines.push("-DKVG_NO_MFMA");
    }
    let exe = build(&cxx, &name, "kernels/hip/test/kvgrid_test.cu", &defines);
    assert_cases_passed(&run(&exe, &[]), &format!("wave {wave}: "), &name);
}

#[test]
fn hip_kvgrid_kernels_match_the_reference_on_the_emulator_wave32() {
    check_kvgrid(32, true);
}

#[test]
fn hip_kvgrid_kernels_match_the_reference_on_the_emulator_wave64() {
    check_kvgrid(64, true);
}

/// The 64-lane wave without the MFMA path (the generic loop).
#[test]
fn hip_kvgrid_kernels_match_the_reference_on_the_emulator_wave64_generic() {
    check_kvgrid(64, false);
}

#[test]
fn hip_merge_kernel_matches_the_reference_on_the_emulator() {
    let Some(cxx) = cxx_or_skip("hip merge_test") else { return };
    for wave in [32, 64] {
        let exe = build(
            &cxx,
            &format!("merge_emu{wave}"),
            "kernels/hip/test/merge_test.cu",
            &[&format!("-DDA_EMU_WAVE={wave}")],
        );
        assert_cases_passed(&run(&exe, &[]), &format!("wave {wave}: "), &format!("merge_emu{wave}"));
    }
}

//! The built `decode-attn` binary itself: it links to no vendor library (the
//! GPU backends dlopen theirs), and it runs on a machine without a GPU.

use std::path::Path;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_decode-attn");

/// Libraries the binary must not name as NEEDED: each is loaded at run time.
const VENDOR_LIBRARIES: &[&str] = &["libcuda", "libnvrtc", "libamdhip64", "libhiprtc", "libnvidia", "libhsa"];

/// The DT_NEEDED entries of a little-endian ELF64 file (what `readelf -d`
/// lists as NEEDED), read from its section headers without any tool.
fn needed_libraries(bytes: &[u8]) -> Result<Vec<String>, String> {
    let u16_at = |at: usize| bytes.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |at: usize| bytes.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    let u64_at = |at: usize| bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    if !bytes.starts_with(b"\x7fELF") || bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        return Err("not a little-endian ELF64 file".into());
    }
    let shoff = u64_at(0x28).ok_or("truncated header")? as usize;
    let shentsize = u16_at(0x3a).ok_or("truncated header")? as usize;
    let shnum = u16_at(0x3c).ok_or("truncated header")? as usize;
    // (type, offset, size, link) of section `i`.
    let section = |i: usize| -> Option<(u32, usize, usize, usize)> {
        let at = shoff + i * shentsize;
        Some((u32_at(at + 4)?, u64_at(at + 0x18)? as usize, u64_at(at + 0x20)? as usize, u32_at(at + 0x28)? as usize))
    };
    const SHT_DYNAMIC: u32 = 6;
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    let mut needed = Vec::new();
    let mut found_dynamic = false;
    for i in 0..shnum {
        let (kind, offset, size, link) = section(i).ok_or("truncated section table")?;
        if kind != SHT_DYNAMIC {
            continue;
        }
        found_dynamic = true;
        let (_, strtab, strsize, _) = section(link).ok_or("bad string table link")?;
        for entry in (offset..offset + size).step_by(16) {
            let tag = u64_at(entry).ok_or("truncated dynamic section")?;
            if tag == DT_NULL {
                break;
            }
            if tag == DT_NEEDED {
                let name_at = strtab + u64_at(entry + 8).ok_or("truncated dynamic section")? as usize;
                let end = bytes[name_at..strtab + strsize].iter().position(|&b| b == 0).ok_or("unterminated name")?;
                needed.push(String::from_utf8_lossy(&bytes[name_at..name_at + end]).into_owned());
            }
        }
    }
    if !found_dynamic {
        return Err("no dynamic section".into());
    }
    Ok(needed)
}

#[test]
fn the_binary_needs_no_vendor_library() {
    let bytes = std::fs::read(BINARY).unwrap_or_else(|e| panic!("cannot read {BINARY}: {e}"));
    let needed = needed_libraries(&bytes).unwrap_or_else(|e| panic!("{BINARY}: {e}"));
    // The parser works: a Rust binary on glibc always needs libc.
    assert!(needed.iter().any(|n| n.starts_with("libc.so")), "{BINARY}: NEEDED {needed:?}");
    let vendor: Vec<&String> = needed.iter().filter(|n| VENDOR_LIBRARIES.iter().any(|v| n.starts_with(v))).collect();
    assert!(vendor.is_empty(), "{} links to {vendor:?} (NEEDED: {needed:?})", Path::new(BINARY).display());
}

#[test]
fn the_binary_runs_and_says_why_each_gpu_backend_is_absent() {
    let output = Command::new(BINARY)
        .arg("devices")
        .env_remove("DECODE_ATTN_BACKEND")
        .env_remove("DECODE_ATTN_CUDA_KERNELS")
        .env_remove("DECODE_ATTN_HIP_KERNELS")
        .output()
        .expect("run decode-attn devices");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "decode-attn devices failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.first().is_some_and(|l| l.starts_with("cpu") && l.contains("available")), "{stdout}");
    for backend in ["cuda", "hip"] {
        let line =
            lines.iter().find(|l| l.starts_with(backend)).unwrap_or_else(|| panic!("no {backend} line:\n{stdout}"));
        // Usable here, or absent with the reason: name, state, then words.
        assert!(line.contains("available") || line.contains("absent"), "{line}");
        assert!(line.split_whitespace().count() >= 3, "no reason given: {line}");
    }
    assert!(lines.last().is_some_and(|l| l.starts_with("auto picks ")), "{stdout}");
}

/// `bench --cold` on the CPU: a checked, timed row whose CSV mode says cold.
#[test]
fn bench_cold_times_behind_the_evictor_and_labels_its_rows() {
    let csv = std::env::temp_dir().join(format!("decode-attn-cold-{}.csv", std::process::id()));
    let output = Command::new(BINARY)
        .args(["bench", "--backend", "cpu", "--model", "llama3-70b-tp8", "--batch", "4", "--seq-len", "16384"])
        .arg("--cold")
        .arg("--csv")
        .arg(&csv)
        .output()
        .expect("run decode-attn bench --cold");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench --cold failed:\n{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.lines().any(|l| l.starts_with("# cold: each timed call right after an f32 decode")), "{stdout}");
    // The copy is timed again at the end, so that drift during the run shows.
    assert!(stdout.lines().any(|l| l.starts_with("# copy at the end ")), "{stdout}");
    let rows = std::fs::read_to_string(&csv).expect("the CSV was written");
    let _ = std::fs::remove_file(&csv);
    let row: Vec<&str> = rows.lines().nth(1).unwrap_or_else(|| panic!("no row:\n{rows}")).split(',').collect();
    assert_eq!(&row[..5], ["llama3-70b-tp8", "4", "16384", "decode-attn", "cold/cpu/auto"], "{rows}");
    let us: f64 = row[5].parse().expect("us is a number");
    assert!(us > 0.0 && us.is_finite(), "{rows}");
}

/// `bench --lse` on the CPU: every row's LSEs checked against the
/// reference (an empty sequence's `-inf` included), the error printed on the
/// row, and the CSV's mode labelled so the rows join apart from plain ones.
#[test]
fn bench_lse_checks_and_labels_the_rows_lses() {
    let csv = std::env::temp_dir().join(format!("decode-attn-lse-{}.csv", std::process::id()));
    let output = Command::new(BINARY)
        .args(["bench", "--backend", "cpu", "--model", "llama3-70b-tp8", "--lens", "700x2+0x1+33x1"])
        .args(["--policy", "auto,fixed:4", "--lse", "--csv"])
        .arg(&csv)
        .output()
        .expect("run decode-attn bench --lse");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench --lse failed:\n{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let errors: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split_once(" lse_err ").map(|(_, err)| err.trim().parse().expect("lse_err is a number")))
        .collect();
    assert_eq!(errors.len(), 2, "one lse_err per row:\n{stdout}");
    assert!(errors.iter().all(|&err| err < 1e-2), "{stdout}");
    let rows = std::fs::read_to_string(&csv).expect("the CSV was written");
    let _ = std::fs::remove_file(&csv);
    let modes: Vec<&str> = rows.lines().skip(1).map(|l| l.split(',').nth(4).unwrap_or("")).collect();
    assert_eq!(modes, ["cpu/lse/auto", "cpu/lse/fixed:4"], "{rows}");
}

/// `bench --lens` with a split plan that leaves most (sequence, split) pairs
/// empty says how many are active under its row; a batch of equal lengths,
/// every pair active, gets no such line. The CSV names each batch and its
/// split count, so that rows sharing B and s can be told apart.
#[test]
fn bench_says_how_sparse_a_ragged_batchs_split_grid_is() {
    let csv = std::env::temp_dir().join(format!("decode-attn-ragged-{}.csv", std::process::id()));
    let output = Command::new(BINARY)
        .args(["bench", "--backend", "cpu", "--model", "llama3-70b-tp8", "--lens", "4096x1+64x15,1024x4"])
        .args(["--policy", "fixed:8", "--csv"])
        .arg(&csv)
        .output()
        .expect("run decode-attn bench --lens");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed:\n{stdout}{}", String::from_utf8_lossy(&output.stderr));
    // 4096 tokens in 8 splits of 32 tiles; each 64-token sequence's 4 tiles
    // in splits of 1 tile: 8 + 15 * 4 = 68 of the 16 x 8 pairs.
    let notes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("#   fixed:8: ")).collect();
    assert_eq!(
        notes,
        ["#   fixed:8: 68 of the 16 x 8 (sequence, split) pairs active; 0.9 empty per active one"],
        "{stdout}"
    );
    let rows = std::fs::read_to_string(&csv).expect("the CSV was written");
    let _ = std::fs::remove_file(&csv);
    let lines: Vec<&str> = rows.lines().collect();
    assert_eq!(lines.first(), Some(&"model,B,s,peer,mode,us,tbs,pct_copy,relerr,splits,lens"), "{rows}");
    let tails: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').skip(9).collect()).collect();
    assert_eq!(tails, [["8", "4096x1+64x15"], ["8", "1024x4"]], "{rows}");
}

/// `bench --plan-seq-len` on the CPU: planned for long sequences, run (and
/// checked against the reference) at shorter ones, labelled in the CSV; a
/// plan length shorter than a shape is refused before anything runs.
#[test]
fn bench_planned_for_longer_sequences_runs_checked_rows_at_the_shapes_lengths() {
    let csv = std::env::temp_dir().join(format!("decode-attn-plan-{}.csv", std::process::id()));
    let output = Command::new(BINARY)
        .args(["bench", "--backend", "cpu", "--model", "llama3-8b", "--batch", "2", "--seq-len", "300"])
        .args(["--plan-seq-len", "5000", "--csv"])
        .arg(&csv)
        .output()
        .expect("run decode-attn bench --plan-seq-len");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed:\n{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let rows = std::fs::read_to_string(&csv).expect("the CSV was written");
    let _ = std::fs::remove_file(&csv);
    let row: Vec<&str> = rows.lines().nth(1).unwrap_or_else(|| panic!("no row:\n{rows}")).split(',').collect();
    assert_eq!(&row[..5], ["llama3-8b", "2", "300", "decode-attn", "cpu/plan5000/auto"], "{rows}");
    let relerr: f64 = row[8].parse().expect("relerr is a number");
    assert!(relerr < 1e-2, "{rows}");

    let refused = Command::new(BINARY)
        .args(["bench", "--backend", "cpu", "--model", "llama3-8b", "--batch", "1", "--seq-len", "300"])
        .args(["--plan-seq-len", "299"])
        .output()
        .expect("run decode-attn bench --plan-seq-len");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("--plan-seq-len 299 is shorter"), "{stderr}");
}

/// `plan --gbps` plans for another GPU's bandwidth as the CUDA backend
/// would: a slower one (an H100, about 3020 GB/s) as an H200 (4320), whose
/// plans were faster there (s37), so 70B at TP=8, s = 4096 keeps the H200's
/// 64 CTAs; a faster one (8000) by its own figure, 32. A bandwidth that is
/// not a positive number is refused, quoted.
#[test]
fn plan_takes_the_bandwidth_of_the_gpu_it_plans_for() {
    let grid = |extra: &[&str]| -> String {
        let output = Command::new(BINARY)
            .args(["plan", "--model", "llama3-70b-tp8", "--seq-len", "4096"])
            .args(extra)
            .output()
            .expect("run decode-attn plan");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "plan failed:\n{stdout}{}", String::from_utf8_lossy(&output.stderr));
        stdout.lines().find(|l| l.starts_with("grid")).unwrap_or_else(|| panic!("no grid line:\n{stdout}")).to_string()
    };
    for (extra, ctas) in [
        (&[][..], "(1, 1, 64) = 64 CTAs"),
        (&["--gbps", "3020"][..], "(1, 1, 64) = 64 CTAs"),
        (&["--gbps", "8000"][..], "(1, 1, 32) = 32 CTAs"),
    ] {
        let line = grid(extra);
        assert!(line.starts_with(&format!("grid        {ctas}")), "{extra:?}: {line}");
    }
    let refused = Command::new(BINARY)
        .args(["plan", "--model", "llama3-8b", "--seq-len", "4133", "--gbps", "0"])
        .output()
        .expect("run decode-attn plan");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("\"0\" is not a positive number of GB/s"), "{stderr}");
}

/// Runs the binary with `args`, expecting a refusal: a failing exit status
/// that is neither a panic (101) nor an abort or a kill (no code), with
/// every one of `named` in its stderr, before any work. Returns the stderr.
fn refused(args: &[&str], named: &[&str]) -> String {
    let started = std::time::Instant::now();
    let output = Command::new(BINARY)
        .args(args)
        .env_remove("DECODE_ATTN_BACKEND")
        .output()
        .unwrap_or_else(|e| panic!("run decode-attn {args:?}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        matches!(output.status.code(), Some(code) if code != 0 && code != 101 && code != 134),
        "decode-attn {args:?}: {}\n{stderr}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    for value in named {
        assert!(stderr.contains(value), "decode-attn {args:?}: stderr does not name {value}:\n{stderr}");
    }
    // Refused before any batch is generated or copy timed.
    assert!(started.elapsed().as_secs() < 20, "decode-attn {args:?} took {:?}", started.elapsed());
    stderr
}

/// A batch past 2^20 sequences is refused by its count, in `plan` and in
/// `bench`, as `--batch` or `--lens` (such counts once asked the allocator
/// for 40 GB, or overflowed a capacity).
#[test]
fn batches_past_the_cap_are_refused_naming_the_count() {
    for batch in ["10000000000", "4611686018427387904", "1048577"] {
        refused(&["plan", "--model", "llama3-8b", "--seq-len", "10", "--batch", batch], &[batch, "1048576 at most"]);
        let bench = ["bench", "--backend", "cpu", "--model", "llama3-8b", "--batch", batch, "--seq-len", "1"];
        refused(&bench, &[batch, "1048576 at most"]);
    }
    for (lens, count) in [("spread:18446744073709551615:1-2", "18446744073709551615"), ("1x1048576+1x1", "1048577")] {
        refused(&["bench", "--backend", "cpu", "--lens", lens], &[count, "1048576 at most"]);
    }
}

/// A shape whose synthetic KV pool would not fit in memory is refused by
/// what the pool takes, not by the KV it reads: 2^20 one-token sequences
/// read 4 GiB of llama3-8b's KV but fill 2^20 whole blocks of 16 slots, and
/// a quarter more spare (80 GiB).
#[test]
fn a_pool_too_large_for_memory_is_refused_before_anything_runs() {
    let stderr = refused(&["bench", "--backend", "cpu", "--model", "llama3-8b", "--lens", "1x1048576"], &["1x1048576"]);
    assert!(
        stderr.contains("of host memory") && stderr.contains("80.0 GiB of K and V pool in 1310721 blocks of 16 slots"),
        "{stderr}"
    );
}

/// `--plan-seq-len` past the kernels' i32 lengths is refused, and so is one
/// whose widened block table would not fit (64 rows of 2^27 blocks: 32 GiB).
#[test]
fn a_plan_length_too_long_or_too_wide_is_refused() {
    let bench = ["bench", "--backend", "cpu", "--model", "llama3-8b", "--batch", "64", "--seq-len", "16"];
    refused(&[&bench[..], &["--plan-seq-len", "4294967295"]].concat(), &["--plan-seq-len 4294967295", "2147483647"]);
    let stderr = refused(&[&bench[..], &["--plan-seq-len", "2147483647"]].concat(), &["planned for 2147483647 tokens"]);
    assert!(stderr.contains("32.0 GiB of block table"), "{stderr}");
}

/// Lengths past i32::MAX (the device's lengths) are refused by the problem's
/// validation, naming the length, before the CLI computes anything from them.
#[test]
fn lengths_past_i32_are_refused_naming_the_length() {
    refused(&["plan", "--model", "llama3-8b", "--seq-len", "4294967295"], &["4294967295"]);
    refused(&["plan", "--model", "llama3-8b", "--seq-len", "4294967295", "--batch", "1048576"], &["4294967295"]);
    let bench = ["bench", "--backend", "cpu", "--model", "llama3-8b", "--batch", "1", "--seq-len", "4294967295"];
    refused(&bench, &["4294967295"]);
    refused(&["bench", "--backend", "cpu", "--lens", "2147483648x1+1x1048575"], &["2147483648"]);
}

#[test]
fn the_elf_reader_rejects_what_is_not_elf() {
    assert!(needed_libraries(b"#!/bin/sh\n").is_err());
    assert!(needed_libraries(b"\x7fELF\x01\x01").is_err());
}

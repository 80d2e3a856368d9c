#!/bin/bash
# s50 call 1, main at a437dc3 plus the probe's nhd-kbs256o. First s49's
# call 2, the coarse-order layout probe, never run, with nhd-kbs256o (the
# stable in-kernel sort with the ring's first stages issued before it), 2
# rounds alternated; then GPU conformance on the library as it now stands
# (the gpu test binary and `check --backend cuda`; not run since the
# `_sorted` entry points were removed in 0cb9ee9). The issue's table is
# call 2 (one call held both until a machine was taken back mid-call).
# Copy this file and ../lib.sh into .gpu, carry .gpu, run
# `bash .gpu/call1.sh`. Results: $OUT/c1.tgz.
cd "$(dirname "$0")"
. ./lib.sh c1 300
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
B=bin/decode-attn
nvcc -O3 -std=c++17 -arch=sm_90 -o $R/layout ../kernels/cuda/probe/layout_probe.cu > $R/layout-build.txt 2>&1; step build $?
# nhd-shuf (bit 0), nhd-sort (12), nhd-b16/64/256 (17-19), nhd-kb64/256 (20-21), nhd-kbs256 (22), nhd-kbs256o (23);
# by default (the device time left was short) shuf, sort, b256, kbs256 and kbs256o; PROBE_MASK=0xFE1001 for all
[ -x $R/layout ] && { timeout $(cap 150) $R/layout 2 ${PROBE_MASK:-0xC81001} > $R/layout.txt 2>&1; step layout $?; rm -f $R/layout; }
cat $R/layout.txt
T=$(ls tests/gpu-* | head -1)
timeout $(cap 120) $T --test-threads=1 > $R/test-gpu.txt 2>&1; step test-gpu $?
grep -E "FAILED|panicked|test result" $R/test-gpu.txt | head
timeout $(cap 90) $B check --backend cuda > $R/check.txt 2>&1; step check $?
tail -2 $R/check.txt

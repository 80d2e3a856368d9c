#!/bin/bash
# s51: the issue's table on an H200 only (the targets are the H200's; the
# session's first machine was an H100, whose table is s51's c2). Exits at
# once on any other GPU, so a call that lands on an H100 costs only its
# start. Then s50's call 2 (ours, then the peers, compare.py) and, in the
# time left, the layout probe's coarse orders (s50's call 1 probe step).
# Copy this file, ../s50/call2.sh and ../lib.sh into .gpu, carry .gpu, run
# `bash .gpu/h200.sh`. Results: $OUT/c2.tgz, $OUT/c4.tgz.
cd "$(dirname "$0")"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
bash ./call2.sh
. ./lib.sh c4 230
nvcc -O3 -std=c++17 -arch=sm_90 -o $R/layout ../kernels/cuda/probe/layout_probe.cu > $R/layout-build.txt 2>&1; step build $?
[ -x $R/layout ] && { timeout $(cap 150) $R/layout 2 ${PROBE_MASK:-0xC81001} > $R/layout.txt 2>&1; step layout $?; rm -f $R/layout; }
cat $R/layout.txt

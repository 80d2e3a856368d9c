#!/bin/bash
# s38 call 3: layout_probe.cu's L2 prefetch of tiles beyond the copies
# (nhd-pf2, nhd-pf4) against the shuffled and in-order NHD pools and dense
# KV (mask 0xCB), four rounds. Results: $OUT/r3.tgz.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/r3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/layout kernels/cuda/probe/layout_probe.cu > $R/build.log 2>&1 || exit 1
timeout 300 /tmp/layout 4 0xCB > $R/layout-pf.txt 2>&1; echo rc=$?
cat $R/layout-pf.txt; tar czf $OUT/r3.tgz -C $OUT r3

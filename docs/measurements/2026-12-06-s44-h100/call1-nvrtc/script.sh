#!/bin/bash
# s43 call 1, by the GPU that comes. H200: s36's table-h200.sh (the issue's
# grid beside the peers, main's staged binary). An H100: main's kernels at
# HEAD (comments changed since s42's last GPU run) through `check` on both
# kernels, and kernels/cuda/probe/fixed_cost_probe.cu, never run on an
# H100: what a plain streaming read of 0.5 MiB-1 GiB reaches there, the
# ceiling the grid's small and mid shapes are read against.
# Stage main (`gpu-stage --peers --bin decode-attn`); copy this file and
# ../s36/table-h200.sh into .gpu; carry .gpu and kernels; run
# `bash .gpu/call1.sh`. Results: $OUT/c1.tgz (or $OUT/t.tgz on an H200).
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
B=.gpu/bin/decode-attn
timeout 90 $B check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 120 $B check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -1 $R/check-kvgrid.log
timeout 150 nvcc -O3 -std=c++17 -arch=sm_90a -o $R/probe kernels/cuda/probe/fixed_cost_probe.cu > $R/probe-build.log 2>&1; step probe-build $?
timeout 200 $R/probe > $R/fixed-cost-probe.txt 2>&1; step probe $?; rm -f $R/probe
timeout 60 $B bench --backend cuda --csv $R/small.csv > $R/small.txt 2>&1; step small $?
cat $R/fixed-cost-probe.txt

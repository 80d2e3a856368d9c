#!/bin/bash
# s44 call, by the GPU that comes. H200: s36's table-h200.sh (the issue's
# grid beside the peers, main's staged binary). An H100: `check` on both
# kernels and the small bench (main's kernels are s42's; s42 checked them on
# an H100, this repeats it on a binary with the fatbin embedded: s44's first
# call staged one without it, and NVRTC's first compile outlasted check's
# 90 s). Stage main after `cargo xtask kernels` (gpu-stage --peers --bin
# decode-attn), copy this file and ../s36/table-h200.sh into .gpu, carry
# .gpu, run `bash .gpu/call1.sh`. Results: $OUT/c1.tgz (or $OUT/t.tgz on an H200).
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
B=.gpu/bin/decode-attn
timeout 120 $B check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 150 $B check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -1 $R/check-kvgrid.log
timeout 60 $B bench --backend cuda --csv $R/small.csv > $R/small.log 2>&1; step small $?
head -1 $R/small.log; grep -i 'kernel' $R/check.log | head -2

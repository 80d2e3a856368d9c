#!/bin/bash
# s47 call 2, on any GPU, after call 1: the garbage-index test under
# compute-sanitizer memcheck, the whole gpu test binary, then the CUDA
# backend on NVRTC parts (KernelPart now in core, b2a66b7): the small bench
# and `check --backend cuda` with the kv-head-grid kernel, each from a fresh
# cache. Capped at 330 s. Carry .gpu holding this file; run `bash
# .gpu/call2.sh`. Results: $OUT/c2.tgz.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=${OUT:-/tmp/out}; R=$OUT/c2; mkdir -p $R
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c2.tgz -C $OUT c2; }
cap() { local left=$(( 330 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
T=$(ls .gpu/tests/gpu-*)
timeout $(cap 80) compute-sanitizer --tool memcheck --error-exitcode 9 $T garbage --test-threads=1 > $R/memcheck-garbage.log 2>&1; step memcheck-garbage $?; tail -3 $R/memcheck-garbage.log
timeout $(cap 120) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep -E "^test |test result" $R/test-gpu.log | tail -20
DECODE_ATTN_CUDA_KERNELS=nvrtc DECODE_ATTN_CACHE_DIR=$(mktemp -d) timeout $(cap 60) .gpu/bin/decode-attn bench --backend cuda > $R/nvrtc-small.log 2>&1; step nvrtc-small $?; tail -3 $R/nvrtc-small.log
DECODE_ATTN_CUDA_KERNEL=kvgrid DECODE_ATTN_CACHE_DIR=$(mktemp -d) timeout $(cap 100) .gpu/bin/decode-attn check --backend cuda > $R/kvgrid-check.log 2>&1; step kvgrid-check $?; tail -1 $R/kvgrid-check.log

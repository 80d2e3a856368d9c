#!/bin/bash
# s45 call 3, on any GPU: the kv-head-grid kernel (always NVRTC on CUDA)
# compiled a part at a time: its conformance sweep with a fresh cache, the
# small bench's first use against the build before, and the gpu tests.
# Stage main (gpu-stage --peers --bin decode-attn after `cargo xtask
# kernels`), copy the build before the change to .gpu/old/decode-attn and
# this file to .gpu, carry .gpu, run `bash .gpu/call3.sh`. Results:
# $OUT/c3.tgz.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c3; mkdir -p $R
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt; cat $R/gpu.txt
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
cap() { local left=$(( 220 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
secs() { local l=$1; shift; local a=$(date +%s%N); "$@"; local rc=$?
  echo "$l $(( ($(date +%s%N) - a) / 1000000 )) ms rc=$rc" >> $R/times.txt; return $rc; }
export DECODE_ATTN_CUDA_KERNEL=kvgrid
DECODE_ATTN_CACHE_DIR=$(mktemp -d) secs kvgrid-check-fresh timeout $(cap 240) .gpu/bin/decode-attn check --backend cuda > $R/kvgrid-check.log 2>&1; step kvgrid-check $?; tail -1 $R/kvgrid-check.log
DECODE_ATTN_CACHE_DIR=$(mktemp -d) secs kvgrid-small-fresh timeout $(cap 120) .gpu/bin/decode-attn bench --backend cuda > $R/kvgrid-small.log 2>&1; step kvgrid-small $?
DECODE_ATTN_CACHE_DIR=$(mktemp -d) secs old-kvgrid-small-fresh timeout $(cap 120) .gpu/old/decode-attn bench --backend cuda > $R/old-kvgrid-small.log 2>&1; step old-kvgrid-small $?
unset DECODE_ATTN_CUDA_KERNEL
T=$(ls .gpu/tests/gpu-*)
secs test-gpu timeout $(cap 200) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep "test result" $R/test-gpu.log
cat $R/times.txt

#!/bin/bash
# s45 call: decode.cu compiled by NVRTC a part (element type, head dim) at a
# time. On an H200 the issue's table comes first (s36's table-h200.sh, in
# .gpu). Stage main (gpu-stage --peers --bin decode-attn, after `cargo xtask
# kernels`), copy the build before the change to .gpu/old/decode-attn and this
# file and ../s36/table-h200.sh to .gpu, carry .gpu, run `bash
# .gpu/call1.sh`. Results: $OUT/c1.tgz (and $OUT/t.tgz on an H200).
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R
t0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash .gpu/table-h200.sh | tail -3; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
nproc >> $R/gpu.txt
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
# cap SECONDS: that, or what is left of the call's 575 s if less.
cap() { local left=$(( 575 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
# secs LABEL CMD...: runs CMD, appends its wall time to times.txt.
secs() { local l=$1; shift; local a=$(date +%s%N); "$@"; local rc=$?
  echo "$l $(( ($(date +%s%N) - a) / 1000000 )) ms rc=$rc" >> $R/times.txt; return $rc; }
B=.gpu/bin/decode-attn
# The embedded fatbin (decode.cu built whole by nvcc).
timeout $(cap 90) $B check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
# NVRTC, fresh cache: the small bench needs bf16 at head_dim 128 only.
export DECODE_ATTN_CUDA_KERNELS=nvrtc
export DECODE_ATTN_CACHE_DIR=$(mktemp -d)
secs nvrtc-small-fresh timeout $(cap 120) $B bench --backend cuda --csv $R/nvrtc-small.csv > $R/nvrtc-small-fresh.log 2>&1; step nvrtc-small-fresh $?
tail -1 $R/nvrtc-small-fresh.log; ls -la $DECODE_ATTN_CACHE_DIR > $R/nvrtc-cache-after-small.txt
secs nvrtc-small-warm timeout $(cap 60) $B bench --backend cuda > $R/nvrtc-small-warm.log 2>&1; step nvrtc-small-warm $?
unset DECODE_ATTN_CUDA_KERNELS
# The GPU tests (the NVRTC test compiles two parts without a cache; merge's NVRTC run, three).
T=$(ls .gpu/tests/gpu-*)
secs test-gpu timeout $(cap 200) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep "test result" $R/test-gpu.log
# Before the change: NVRTC compiles the whole file at first use.
DECODE_ATTN_CUDA_KERNELS=nvrtc DECODE_ATTN_CACHE_DIR=$(mktemp -d) secs old-nvrtc-small-fresh timeout $(cap 240) .gpu/old/decode-attn bench --backend cuda > $R/old-nvrtc-small-fresh.log 2>&1
step old-nvrtc-small-fresh $?
# Every part the conformance sweep uses, one after another (same cache as above).
DECODE_ATTN_CUDA_KERNELS=nvrtc secs nvrtc-check timeout $(cap 300) $B check --backend cuda > $R/nvrtc-check.log 2>&1; step nvrtc-check $?; tail -1 $R/nvrtc-check.log
ls $DECODE_ATTN_CACHE_DIR | wc -l > $R/nvrtc-cache-after-check.txt
cat $R/times.txt

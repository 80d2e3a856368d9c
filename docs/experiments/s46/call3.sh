#!/bin/bash
# s46 call 3, main after KernelPart moved to core (b2a66b7) and the GPU
# garbage test (a1eb6db), on any GPU: the gpu tests and the garbage test
# under compute-sanitizer memcheck; then on an H200 the issue's table beside
# the peers (s36's table-h200.sh, in .gpu), on any other GPU the small bench
# and `check --backend cuda` on NVRTC parts with fresh caches (capped at
# 240 s). Carry .gpu holding table-h200.sh and this file; run `bash
# .gpu/call3.sh`. Results: $OUT/t.tgz on an H200, else $OUT/c3.tgz.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
H200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c3; mkdir -p $R
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
cap() { local left=$(( 240 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
secs() { local l=$1; shift; local a=$(date +%s%N); "$@"; local rc=$?
  echo "$l $(( ($(date +%s%N) - a) / 1000000 )) ms rc=$rc" >> $R/times.txt; return $rc; }
T=$(ls .gpu/tests/gpu-*)
secs test-gpu timeout $(cap 120) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep "test result" $R/test-gpu.log
secs memcheck-garbage timeout $(cap 90) compute-sanitizer --tool memcheck --error-exitcode 9 $T garbage --test-threads=1 > $R/memcheck-garbage.log 2>&1; step memcheck-garbage $?; tail -3 $R/memcheck-garbage.log
if [ "$H200" -gt 0 ]; then cat $R/times.txt; cd .gpu; TABLE_BUDGET=$(( 560 - $(date +%s) + t0 )) exec bash table-h200.sh; fi
export DECODE_ATTN_CUDA_KERNELS=nvrtc
DECODE_ATTN_CACHE_DIR=$(mktemp -d) secs nvrtc-small-fresh timeout $(cap 60) .gpu/bin/decode-attn bench --backend cuda > $R/nvrtc-small.log 2>&1; step nvrtc-small $?
DECODE_ATTN_CACHE_DIR=$(mktemp -d) secs nvrtc-check-fresh timeout $(cap 200) .gpu/bin/decode-attn check --backend cuda > $R/nvrtc-check.log 2>&1; step nvrtc-check $?; tail -1 $R/nvrtc-check.log
cat $R/times.txt

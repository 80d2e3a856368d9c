#!/bin/bash
# s41 call 1: main's kernels through the conformance sweep on a GPU for the
# first time since da_log2 (658f15f; s40 ran the sweep on 3ea441b, log2f):
# 1. `decode-attn check --backend cuda`, the default kernels and the
#    kv-head-grid kernel (the LSE checked on every case);
# 2. the staged test binaries but `binary` (it runs cargo), in the time left.
# Stage main (`gpu-stage --peers --bin decode-attn`), copy this file into
# .gpu, carry .gpu, run as `bash .gpu/call1.sh`. Results: $OUT/c1.tgz,
# saved after each step.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s); CAP=${CAP:-570}
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
timeout 90 .gpu/bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -2 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 120 .gpu/bin/decode-attn check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -2 $R/check-kvgrid.log
for t in $(ls .gpu/tests/* | grep -v '/binary'); do
  left=$(( CAP - $(date +%s) + t0 )); [ $left -lt 20 ] && break
  name=$(basename $t)
  timeout $(( left < 250 ? left : 250 )) $t --test-threads=1 > $R/tests/$name.log 2>&1; step "test $name" $?
  grep -E "^test result|FAILED|panicked" $R/tests/$name.log | head -8
done

#!/bin/bash
# s47 call 1, main at 5aba35d, on any GPU. First the GPU garbage-index test
# alone (never yet run on a GPU). On an H200 then the issue's table beside the
# peers (s36's table-h200.sh) in what is left of 570 s; on any other GPU the
# garbage test under compute-sanitizer memcheck and the whole gpu test binary.
# Carry .gpu holding this file and table-h200.sh; run `bash .gpu/call1.sh`.
# Results: $OUT/t.tgz (table) and $OUT/c1.tgz.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
H200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
cap() { local left=$(( 200 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
T=$(ls .gpu/tests/gpu-*)
timeout 40 $T garbage --test-threads=1 > $R/garbage.log 2>&1; step garbage $?; grep -E "test result|panicked|mismatch" $R/garbage.log | head
if [ "$H200" -gt 0 ]; then cd .gpu; TABLE_BUDGET=$(( 575 - $(date +%s) + t0 )) exec bash table-h200.sh; fi
timeout $(cap 80) compute-sanitizer --tool memcheck --error-exitcode 9 $T garbage --test-threads=1 > $R/memcheck-garbage.log 2>&1; step memcheck-garbage $?; tail -3 $R/memcheck-garbage.log
timeout $(cap 120) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep -E "^test |test result" $R/test-gpu.log | tail -20

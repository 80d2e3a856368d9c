#!/bin/bash
# s46 call 5, on any GPU, with the session's last device time: the garbage
# test alone, then under compute-sanitizer memcheck, then the whole gpu test
# binary in what is left (capped at 110 s). Carry .gpu holding this file;
# run `bash .gpu/call5.sh`. Results: $OUT/c5.tgz.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=${OUT:-/tmp/out}; R=$OUT/c5; mkdir -p $R
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c5.tgz -C $OUT c5; }
cap() { local left=$(( 110 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
T=$(ls .gpu/tests/gpu-*)
timeout $(cap 30) $T garbage --test-threads=1 > $R/garbage.log 2>&1; step garbage $?; grep "test result" $R/garbage.log
timeout $(cap 70) compute-sanitizer --tool memcheck --error-exitcode 9 $T garbage --test-threads=1 > $R/memcheck-garbage.log 2>&1; step memcheck-garbage $?; tail -3 $R/memcheck-garbage.log
timeout $(cap 100) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep -E "^test |test result" $R/test-gpu.log | tail -20

#!/bin/bash
# s46 call 4, on any GPU, when little device time is left: s46 call 3's
# first two steps only, the gpu tests and the garbage test under
# compute-sanitizer memcheck (capped at 150 s). Carry .gpu holding this
# file; run `bash .gpu/call4.sh`. Results: $OUT/c3.tgz.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=${OUT:-/tmp/out}; R=$OUT/c3; mkdir -p $R
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
cap() { local left=$(( 150 - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
secs() { local l=$1; shift; local a=$(date +%s%N); "$@"; local rc=$?
  echo "$l $(( ($(date +%s%N) - a) / 1000000 )) ms rc=$rc" >> $R/times.txt; return $rc; }
T=$(ls .gpu/tests/gpu-*)
secs test-gpu timeout $(cap 100) $T --test-threads=1 > $R/test-gpu.log 2>&1; step test-gpu $?; grep "test result" $R/test-gpu.log
secs memcheck-garbage timeout $(cap 90) compute-sanitizer --tool memcheck --error-exitcode 9 $T garbage --test-threads=1 > $R/memcheck-garbage.log 2>&1; step memcheck-garbage $?; tail -3 $R/memcheck-garbage.log
cat $R/times.txt

#!/bin/bash
# s42 call 5, the session's last device time (about 380 s with the start).
# H200: our side of the issue's grid on main's final kernels (`bench --grid
# peers`), against s26's table (version 26 on an H200), and `check`; too
# little time is left for the peers. Otherwise: racecheck and synccheck over
# `check --backend cuda` on the final kernels (5457aee moved the reducer's
# LSE store behind its barrier; call 3 ran memcheck on that code).
# Uses call 4's staging; copy this file into .gpu; carry .gpu; run `bash
# .gpu/call5.sh`. Results: $OUT/c5.tgz.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; R=$OUT/c5; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c5.tgz -C $OUT c5; }
if grep -q H200 $R/gpu.txt; then
  timeout 150 bin/decode-attn bench --backend cuda --grid peers --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
  timeout 40 bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
  exit 0
fi
for tool in racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 bin/decode-attn check --backend cuda > $R/$tool.log 2>&1; step $tool $?
  tail -2 $R/$tool.log
done

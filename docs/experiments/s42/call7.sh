#!/bin/bash
# s42 call 7, the last ~260 s of device time. H200: our side of the issue's
# grid on main's final kernels, B = 1 and 4 first (the targets' small
# shapes), then 16 and 64, against s26's table. Otherwise: `bench --grid
# small` on the final build (call 4's staging) against 85c7b88, alternated
# three times. Results: $OUT/c7.tgz.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; R=$OUT/c7; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c7.tgz -C $OUT c7; }
if grep -q H200 $R/gpu.txt; then
  timeout 60 bin/decode-attn bench --backend cuda --grid peers --batch 1,4 --csv $R/ours-b1-4.csv > $R/ours-b1-4.txt 2>&1; step ours-b1-4 $?
  timeout 80 bin/decode-attn bench --backend cuda --grid peers --batch 16,64 --csv $R/ours-b16-64.csv > $R/ours-b16-64.txt 2>&1; step ours-b16-64 $?
  exit 0
fi
for r in 1 2 3; do
  timeout 30 bin/decode-attn-85c7b88 bench --backend cuda --csv $R/old-r$r.csv > $R/old-r$r.txt 2>&1; step old-r$r $?
  timeout 30 bin/decode-attn bench --backend cuda --csv $R/main-r$r.csv > $R/main-r$r.txt 2>&1; step main-r$r $?
done
for v in old main; do echo "$v $(for r in 1 2 3; do tail -n +2 $R/$v-r$r.csv | cut -d, -f6 | tr '\n' ' '; echo -n '| '; done)"; done | tee $R/summary.txt

#!/bin/bash
# s44 call 2, with about 380 s of device time left. H200: the issue's grid
# beside the peers as in ../s36/table-h200.sh, the peers cut at 300 s. An
# H100: `check --backend cuda` on the default kernel (fatbin embedded) and
# the small bench. Carry .gpu (staged after `cargo xtask kernels`); run
# `bash .gpu/call2.sh` (this file copied into .gpu). Results: $OUT/c2.tgz.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; R=$OUT/c2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c2.tgz -C $OUT c2; }
if grep -q H200 $R/gpu.txt; then
  timeout 120 bin/decode-attn bench --backend cuda --grid peers --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
  timeout $(( 320 - $(date +%s) + t0 )) python3 peers/bench_peers.py --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
  python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1; step compare $?
  tail -45 $R/compare.txt
else
  timeout 100 bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
  timeout 60 bin/decode-attn bench --backend cuda --csv $R/small.csv > $R/small.log 2>&1; step small $?
  head -2 $R/check.log; cat $R/small.log
fi

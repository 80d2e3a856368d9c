#!/bin/bash
# s36: the issue's grid (B 1-64, s 1024-65536, both models) on an H200, ours
# then the peers in the same call; compare.py with and without SDPA. Carry
# .gpu (gpu-stage --peers --bin decode-attn). Results: $OUT/t.tgz.
cd "$(dirname "$0")"
R=$OUT/t; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/t.tgz -C $OUT t; }
timeout 200 bin/decode-attn bench --backend cuda --grid peers --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
timeout $(( ${TABLE_BUDGET:-570} - $(date +%s) + t0 )) python3 peers/bench_peers.py --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
grep -v ',torch-sdpa,' $R/peers.csv > $R/peers-paged.csv
python3 peers/compare.py $R/ours.csv $R/peers-paged.csv > $R/compare-paged.txt 2>&1
python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1; step compare $?
cat $R/compare.txt

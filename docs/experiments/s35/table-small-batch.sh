#!/bin/bash
# s35 call 5: the grid at B = 1 and 4 (the rows its B=1 and B<=4
# targets are about), ours then the peers in the same call, on whatever GPU
# the call gets; compare.py with and without SDPA. Carry .gpu (staged with
# `gpu-stage --peers --bin decode-attn`); results: $OUT/table.tgz.
cd .gpu
R=$OUT/table; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/table.tgz -C $OUT table; }
bin/decode-attn bench --backend cuda --grid peers --batch 1,4 --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
SHAPES=""
for m in llama3-8b llama3-70b-tp8; do for b in 1 4; do for s in 1024 4096 16384 65536; do SHAPES="$SHAPES,$m:$b:$s"; done; done; done
python3 peers/bench_peers.py --shapes ${SHAPES#,} --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
grep -v ',torch-sdpa,' $R/peers.csv > $R/peers-paged.csv
python3 peers/compare.py $R/ours.csv $R/peers-paged.csv > $R/compare-paged.txt 2>&1
python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1; step compare $?
cat $R/compare.txt

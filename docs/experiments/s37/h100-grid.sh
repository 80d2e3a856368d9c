#!/bin/bash
# s37, staged: the issue's grid at B = 1, 4 and 16 (BATCHES to change it) on
# the GPU the call gets, ours then the peers (SDPA included) in the same
# call; compare.py with and without SDPA. For an H100 after heldout.sh: s35
# ran these rows with the plans before be03842 (8B B=16 s=4096 then split,
# now unsplit), so this is the rerun beside SDPA that s36 had no time for.
# Copy into .gpu (gpu-stage --peers --bin decode-attn); run from anywhere.
# Results: $OUT/grid.tgz, saved after each step.
cd "$(dirname "$0")"
R=$OUT/grid; mkdir -p $R
BATCHES=${BATCHES:-1,4,16}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/grid.tgz -C $OUT grid; }
timeout 200 bin/decode-attn bench --backend cuda --grid peers --batch $BATCHES --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
SHAPES=""
for m in llama3-8b llama3-70b-tp8; do for b in ${BATCHES//,/ }; do for s in 1024 4096 16384 65536; do SHAPES="$SHAPES,$m:$b:$s"; done; done; done
timeout $(( 570 - $(date +%s) + t0 )) python3 peers/bench_peers.py --shapes ${SHAPES#,} --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
grep -v ',torch-sdpa,' $R/peers.csv > $R/peers-paged.csv
python3 peers/compare.py $R/ours.csv $R/peers-paged.csv > $R/compare-paged.txt 2>&1
python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1; step compare $?
cat $R/compare.txt

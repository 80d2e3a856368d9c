#!/bin/bash
# s36 call 2, on an H100. Carry .gpu (gpu-stage --bin decode-attn at the
# commit that scales the lone-CTA share by the bandwidth, lone_cta_share_at)
# and run `bash .gpu/call2.sh` from the repository root. Results:
# $OUT/c2.tgz, saved after each step.
#  1. Every peers-grid shape (B <= 64; 8B B=256 exceeds bench's 8 GiB) whose
#     H100 plan the scaled share changes: `auto` (the new plan) against
#     fixed:N, the split count s35's `auto` launched there (`decode-attn plan
#     --gbps 3020` before and after), twice, alternated.
#  2. Packing at 24 and 40 sequences (no batch of 17-63 was in the fit):
#     packing-threshold/run.sh with NS="24 40", 70B at TP=8, then 8B with one
#     long sequence, as time allows.
cd .gpu
R=$OUT/c2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c2.tgz -C $OUT c2; }
ab() { # name model batch lens old_splits
  timeout 60 bin/decode-attn bench --backend cuda --model $2 --batch $3 --seq-len $4 --policy auto,fixed:$5 >> $R/ab-$1.txt 2>&1; step "ab-$1 $2 B=$3" $?
}
for rep in 1 2; do
  ab $rep llama3-8b 1 65536 32
  ab $rep llama3-8b 4 4096,16384,65536 8
  ab $rep llama3-8b 16 4096,16384,65536 2
  ab $rep llama3-70b-tp8 4 65536 64
  ab $rep llama3-70b-tp8 16 16384,65536 16
  ab $rep llama3-70b-tp8 64 4096,16384,65536 4
done
MODEL=llama3-70b-tp8 NS="24 40" BENCH_TIMEOUT=100 OUT=$R bash -c "cd .. && bash .gpu/packing-threshold.sh" > $R/pt70.log 2>&1; step pt70 $?
[ $(( $(date +%s) - t0 )) -lt 300 ] && { MODEL=llama3-8b KS=1 NS="24 40" BENCH_TIMEOUT=80 OUT=$R bash -c "cd .. && bash .gpu/packing-threshold.sh" > $R/pt8.log 2>&1; step pt8 $?; }
echo done

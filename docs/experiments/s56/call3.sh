#!/bin/bash
# s56 call 3: on an H200, the issue's table beside the peers first
# (../s50/call2.sh); then, on any GPU, the tensor-core kernel's grid order
# A/B on the 8B shapes whose grid is one wave (`auto` launches those
# sequences first; the layout probe found heads first 0.1-0.6% faster on
# an H100, s56): DECODE_ATTN_CUDA_GRID=auto against heads, alternated
# three times in one call. Copy this file, ../s50/call2.sh and ../lib.sh
# into .gpu, carry .gpu, run `bash .gpu/call3.sh`. Results: $OUT/c2.tgz
# (H200 only), $OUT/c3.tgz.
cd "$(dirname "$0")"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
case "$name" in *H200*) bash ./call2.sh ;; esac
. ./lib.sh c3 ${C3_CAP:-200}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
for round in 1 2 3; do
  for order in auto heads; do
    for b in 16 4; do
      lens=1024,4096,16384,65536; [ $b = 4 ] && lens=16384,65536
      DECODE_ATTN_CUDA_GRID=$order timeout $(cap 60) bin/decode-attn bench --backend cuda --model llama3-8b \
        --batch $b --seq-len $lens --csv $R/$order-b$b-r$round.csv > $R/$order-b$b-r$round.txt 2>&1
      step "$order b$b r$round" $?
    done
  done
done

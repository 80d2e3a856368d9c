#!/bin/bash
# s28 call 1: graph plans replayed ragged (baseline, main 296c83a + Packing::Always), and packed vs plain at equal lengths.
cd .gpu
mkdir -p $OUT/r
R=$OUT/r
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
LENS=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
for m in llama3-8b llama3-70b-tp8; do
  bin/decode-attn bench --backend cuda --model $m --lens $LENS --csv $R/own-$m.csv > $R/own-$m.txt 2>&1
  bin/decode-attn bench --backend cuda --model $m --lens $LENS --plan-seq-len 65536 --csv $R/graph-$m.csv > $R/graph-$m.txt 2>&1
done
DECODE_ATTN_CUDA_PACKED=always bin/decode-attn bench --backend cuda --grid peers --csv $R/grid-always.csv > $R/grid-always.txt 2>&1
DECODE_ATTN_CUDA_PACKED=off bin/decode-attn bench --backend cuda --grid peers --csv $R/grid-off.csv > $R/grid-off.txt 2>&1
DECODE_ATTN_CUDA_PACKED=always bin/decode-attn bench --backend cuda --grid peers --csv $R/grid-always2.csv > $R/grid-always2.txt 2>&1
tar czf $OUT/r.tgz -C $OUT r

#!/bin/bash
# s28 call 3: the `_batch` entry (one pair per CTA, num_seqs*(batch_splits+1) CTAs): correctness, ragged graph replays and equal lengths, batch vs off; gpu.rs and caller.rs.
cd .gpu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
GPU_TEST=$(ls tests/gpu-* | head -1); CALLER=$(ls tests/caller-* | head -1)
bin/decode-attn check --backend cuda > $R/check.log 2>&1; echo "check rc=$?" >> $R/check.log
timeout 60 compute-sanitizer --tool memcheck $GPU_TEST --test-threads 1 batch_rule > $R/memcheck-batch.log 2>&1; echo "rc=$?" >> $R/memcheck-batch.log
LENS=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
for m in llama3-8b llama3-70b-tp8; do
  DECODE_ATTN_CUDA_BATCH_RULE=off bin/decode-attn bench --backend cuda --model $m --lens $LENS --plan-seq-len 65536 --csv $R/graph-off-$m.csv > $R/graph-off-$m.txt 2>&1
  bin/decode-attn bench --backend cuda --model $m --lens $LENS --plan-seq-len 65536 --csv $R/graph-batch-$m.csv > $R/graph-batch-$m.txt 2>&1
done
for m in llama3-8b llama3-70b-tp8; do
  DECODE_ATTN_CUDA_BATCH_RULE=off bin/decode-attn bench --backend cuda --model $m --batch 4,16,64 --seq-len 1024,4096,16384,65536 --csv $R/eq-off-$m.csv > $R/eq-off-$m.txt 2>&1
  bin/decode-attn bench --backend cuda --model $m --batch 4,16,64 --seq-len 1024,4096,16384,65536 --csv $R/eq-batch-$m.csv > $R/eq-batch-$m.txt 2>&1
done
timeout 200 $GPU_TEST --test-threads 1 --skip nvrtc > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log
timeout 60 $CALLER --test-threads 1 > $R/caller.log 2>&1; echo "rc=$?" >> $R/caller.log
tar czf $OUT/r.tgz -C $OUT r

#!/bin/bash
# s31's second GPU call (one call, about 5 minutes), from the repository root,
# carrying .gpu/bin/decode-attn, -e3, -e5, -e6, -e7, -e8, -e9 and this script:
#   bash .gpu/run-s31.sh
# Part 1 splits e3 (the plain grid running the packed prologue, found 8-9%
# slower on long shapes by s31's call 2) into its pieces, each added to
# the plain entry point alone:
#   e7  32 bytes of static shared memory (volatile, thread 0)
#   e8  two __syncthreads()
#   e9  every length read and summed over the warp (no shared memory, no barrier)
# on 70B at TP=8, then ncu's memory sections for each at B=64 s=4096.
# Part 2 repeats s31 call 2's comparison on 8B (off, always, e3, e5, e6, batch).
# Since 466ac83 the staged bin/decode-attn is the aligned build, while e3 and
# e5-e9 were built before it (16-byte aligned dynamic shared memory): part 2's
# always and batch rows are then the aligned kernels' and e3/e5/e6 the old.
cd .gpu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
GRID="--batch 4,16,64 --seq-len 1024,4096,16384"
t0=$(date +%s)
run() {  # run NAME MODEL BINARY [ENV=VALUE...]
  local name=$1 m=$2 bin=$3; shift 3
  env "$@" $bin bench --backend cuda --model $m $GRID --csv $R/$name-$m.csv > $R/$name-$m.txt 2>&1
  echo "$name $m rc=$? t=$(( $(date +%s) - t0 ))" >> $R/progress.txt
}
m=llama3-70b-tp8
for round in 1 2; do
  run off$round $m bin/decode-attn DECODE_ATTN_CUDA_PACKED=off
  for v in e3 e7 e8 e9; do run $v-r$round $m bin/decode-attn-$v DECODE_ATTN_CUDA_PACKED=off; done
done
for v in off e7 e8 e9; do
  B=bin/decode-attn-$v; [ $v = off ] && B=bin/decode-attn
  DECODE_ATTN_CUDA_PACKED=off timeout 60 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    -k regex:decode_mma --launch-count 1 --csv --page details $B bench --backend cuda --model $m --batch 64 --seq-len 4096 > $R/ncu-$v.csv 2> $R/ncu-$v.err
  echo "ncu $v rc=$? t=$(( $(date +%s) - t0 ))" >> $R/progress.txt
done
# The L2 hits by source (the SMs' reads, the other partition through the fabric).
for v in off e3; do
  B=bin/decode-attn-$v; [ $v = off ] && B=bin/decode-attn
  DECODE_ATTN_CUDA_PACKED=off timeout 60 ncu --metrics lts__t_sector_hit_rate.pct,lts__t_sectors.sum,lts__t_sectors_lookup_hit.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_tex_lookup_hit.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_ltcfabric_lookup_hit.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    -k regex:decode_mma --launch-count 1 --csv --page raw $B bench --backend cuda --model $m --batch 64 --seq-len 4096 > $R/ncu-l2-$v.csv 2> $R/ncu-l2-$v.err
  echo "ncu-l2 $v rc=$? t=$(( $(date +%s) - t0 ))" >> $R/progress.txt
done
tar czf $OUT/r-s31-part1.tgz -C $OUT r
m=llama3-8b
run off $m bin/decode-attn DECODE_ATTN_CUDA_PACKED=off
run always $m bin/decode-attn DECODE_ATTN_CUDA_PACKED=always
run e3 $m bin/decode-attn-e3 DECODE_ATTN_CUDA_PACKED=off
run e5 $m bin/decode-attn-e5 DECODE_ATTN_CUDA_PACKED=always
run e6 $m bin/decode-attn-e6 DECODE_ATTN_CUDA_PACKED=always
run batch $m bin/decode-attn DECODE_ATTN_CUDA_BATCH_RULE=auto
run off2 $m bin/decode-attn DECODE_ATTN_CUDA_PACKED=off
tar czf $OUT/r-s31.tgz -C $OUT r
rm -rf $R

#!/bin/bash
# s30: which vector ops take issue slots from the FMAs on this Zen 2 core
# (pipes.c), and whether the two vCPUs share one core's FMA units
# (fma_smt.c, alone on each vCPU, then on both at once); a 70B tile's two
# loops in main's layout and two others, in L1 (loops.c). Run on an idle machine.
set -e
cd "$(dirname "$0")"
gcc -O2 -mavx2 -mfma -o /tmp/s30-pipes pipes.c
gcc -O2 -mavx2 -mfma -o /tmp/s30-fma-smt fma_smt.c
# -O3 -funroll-loops: at -O2 gcc keeps loops.c's arrays of accumulators in memory.
gcc -O3 -funroll-loops -mavx2 -mfma -o /tmp/s30-loops loops.c
/tmp/s30-pipes
echo "vCPU 0 alone: $(taskset -c 0 /tmp/s30-fma-smt)"
echo "vCPU 1 alone: $(taskset -c 1 /tmp/s30-fma-smt)"
taskset -c 0 /tmp/s30-fma-smt > /tmp/s30-both0.txt &
taskset -c 1 /tmp/s30-fma-smt > /tmp/s30-both1.txt
wait
echo "both at once, vCPU 0: $(cat /tmp/s30-both0.txt)"
echo "both at once, vCPU 1: $(cat /tmp/s30-both1.txt)"
taskset -c 1 /tmp/s30-loops

#!/bin/bash
# s29: the CPU tile's inner loops timed alone, in L1 (PERFORMANCE.md, s29).
# TSC ticks per 2048 multiply-adds (one tile's scores or V at 8 query heads,
# d = 128), best of 9 runs of 20000 tiles. Run on an idle machine.
set -e
cd "$(dirname "$0")"
for f in scores_lanes v_lanes heads_on_chunk; do
  gcc -O2 -mavx2 -mfma -o /tmp/s29-$f $f.c
  /tmp/s29-$f
done

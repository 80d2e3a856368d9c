#!/bin/bash
# s40 call 6 (run as one command line on call 5's warm machine; kept here
# as it ran): main + da_log2 with the LSE pointer null against 85c7b88,
# `bench --grid small`, alternated three times. Results: $OUT/c6.
OUT=${OUT:-/tmp/out}; R=$OUT/c6; mkdir -p $R
for r in 1 2 3; do for v in old log2null; do
  b=.gpu/bin/decode-attn-log2; [ $v = old ] && b=.gpu/bin/decode-attn-85c7b88
  $b bench --backend cuda --csv $R/$v-r$r.csv > $R/$v-r$r.txt 2>&1; echo "$v r$r rc=$?"
done; done
for v in old log2null; do
  echo "$v $(for r in 1 2 3; do tail -n +2 $R/$v-r$r.csv | cut -d, -f6 | tr '\n' ' '; echo -n '| '; done)"
done

#!/bin/bash
# s42 call 4: main after s42's reducer edit (5457aee), restaged. On any GPU,
# s36's table-h200.sh: the issue's grid (B 1-64, both models) ours then the
# peers in one call, compare.py with and without SDPA (on an H200, the
# targets' table, last run in s26; on an H100, the grid on main's final
# kernels in one run). Then, with the time left, the staged test binaries
# but `binary` (it runs cargo). Stage main (`gpu-stage --peers --bin
# decode-attn`), copy this file and ../s36/table-h200.sh into .gpu, carry
# .gpu, run `bash .gpu/call4.sh`. Results: $OUT/t.tgz and $OUT/c4.tgz.
cd "$(dirname "$0")"
t0=$(date +%s); CAP=${CAP:-570}
bash table-h200.sh
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c4; mkdir -p $R/tests
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c4.tgz -C $OUT c4; }
for t in $(ls .gpu/tests/* | grep -v '/binary'); do
  left=$(( CAP - $(date +%s) + t0 )); [ $left -lt 20 ] && break
  name=$(basename $t)
  timeout $(( left < 250 ? left : 250 )) $t --test-threads=1 > $R/tests/$name.log 2>&1; step "test $name" $?
  grep -E "^test result|FAILED|panicked" $R/tests/$name.log | head -8
done

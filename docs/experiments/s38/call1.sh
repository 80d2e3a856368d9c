#!/bin/bash
# s38 call 1: on an H200, the issue's whole grid beside the peers (s36's
# table-h200.sh: the targets' GPU, not rerun since s26); on any other GPU,
# every staged test binary (.gpu/run.sh), none of which had run on the
# planning floor of 2222c7c but the `gpu` binary. Copy this and
# ../s36/table-h200.sh into .gpu; run as `bash .gpu/call1.sh`.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash .gpu/table-h200.sh
else
  start=$(date +%s); bash .gpu/run.sh; rc=$?
  echo "tests rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/tests.log"
  exit $rc
fi

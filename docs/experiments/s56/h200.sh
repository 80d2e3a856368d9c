#!/bin/bash
# s56: the issue's table on an H200 only (the session's machines were
# H100s, whose table is s56's first call). Exits at once on any other GPU,
# so a call that lands on an H100 costs only its start. Copy this file,
# ../s50/call2.sh and ../lib.sh into .gpu, carry .gpu, run
# `bash .gpu/h200.sh`. Results: $OUT/c2.tgz.
cd "$(dirname "$0")"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
bash ./call2.sh

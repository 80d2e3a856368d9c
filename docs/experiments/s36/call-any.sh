#!/bin/bash
# s36: what a call does depends on the GPU it gets. On an H200, the issue's
# whole grid beside the peers (table-h200.sh, the targets' GPU); on an H100,
# call3.sh (which bandwidth figure `auto` should plan an H100 with).
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash table-h200.sh; else bash call3.sh; fi

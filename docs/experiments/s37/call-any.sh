#!/bin/bash
# s37: on an H200, the issue's whole grid beside the peers (s36's
# table-h200.sh, the targets' GPU, not rerun since s26); on an H100, the
# held-out check of the lone-CTA share ceiling (heldout.sh). Copy this
# directory and ../s36/table-h200.sh into .gpu; run as `bash .gpu/call-any.sh`.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash table-h200.sh; else bash heldout.sh; fi

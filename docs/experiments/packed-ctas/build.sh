#!/bin/bash
# Builds one `decode-attn` binary per experiment patch into .gpu/bin/
# (decode-attn-e1, -e2, -e3), each from a worktree of HEAD with its patch
# applied. Run after ../shared/tools/gpu-stage (which empties .gpu/), then
# copy run.sh next to them. About 5 minutes a binary on 2 cores.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
here=$root/docs/experiments/packed-ctas
export DECODE_ATTN_NVCC=${DECODE_ATTN_NVCC:-$root/.tools/cuda/nvidia/cu13/bin/nvcc}
export DECODE_ATTN_HIP_AOT=0
mkdir -p "$root/.gpu/bin"
for patch in "$here"/e*.patch; do
  name=$(basename "$patch" .patch | cut -d- -f1)
  tree=/tmp/packed-ctas-$name
  rm -rf "$tree"; git -C "$root" worktree prune
  git -C "$root" worktree add -q --detach "$tree" HEAD
  (cd "$tree" && git apply "$patch")
  # The target dir must lie outside the repository (build.rs watches it).
  CARGO_TARGET_DIR=/tmp/packed-ctas-target-$name cargo build -q --release -p decode-attn-cli --manifest-path "$tree/Cargo.toml"
  cp /tmp/packed-ctas-target-$name/release/decode-attn "$root/.gpu/bin/decode-attn-$name"
  git -C "$root" worktree remove --force "$tree"
  echo "built .gpu/bin/decode-attn-$name"
done

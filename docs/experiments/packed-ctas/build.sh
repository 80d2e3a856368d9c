#!/bin/bash
# Builds one `decode-attn` binary per experiment patch into .gpu/bin/
# (decode-attn-e1 ... -e6). Run after ../shared/tools/gpu-stage (which
# empties .gpu/), then copy run.sh next to them. One worktree of HEAD and
# one target dir serve every patch in turn, so only the CUDA crate's
# kernels and what depends on them are rebuilt between two: about 5
# minutes a binary on 2 cores, the first one more.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
here=$root/docs/experiments/packed-ctas
export DECODE_ATTN_NVCC=${DECODE_ATTN_NVCC:-$root/.tools/cuda/nvidia/cu13/bin/nvcc}
export DECODE_ATTN_HIP_AOT=0
# Outside the repository: build.rs watches the kernels, not the target dir.
export CARGO_TARGET_DIR=/tmp/packed-ctas-target
tree=/tmp/packed-ctas-tree
mkdir -p "$root/.gpu/bin"
git -C "$root" worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
git -C "$root" worktree prune
git -C "$root" worktree add -q --detach "$tree" HEAD
for patch in "$here"/e*.patch; do
  name=$(basename "$patch" .patch | cut -d- -f1)
  (cd "$tree" && git checkout -q -- . && git apply "$patch")
  cargo build -q --release -p decode-attn-cli --manifest-path "$tree/Cargo.toml"
  cp "$CARGO_TARGET_DIR/release/decode-attn" "$root/.gpu/bin/decode-attn-$name"
  echo "built .gpu/bin/decode-attn-$name"
done
git -C "$root" worktree remove --force "$tree"

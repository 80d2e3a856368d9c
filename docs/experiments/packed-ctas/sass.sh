#!/bin/bash
# Resource usage of the bf16 d128 tensor-core entry points at sm_90 for the
# kernels as they are in the working tree (or with PATCH applied to a copy):
#   docs/experiments/packed-ctas/sass.sh [PATCH]   -> registers, stack, code size
# Compiles a copy of kernels/cuda with only the bf16 d128 instantiations kept
# (about 10 s instead of minutes).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
nvcc=${DECODE_ATTN_NVCC:-$root/.tools/cuda/nvidia/cu13/bin/nvcc}
cuobjdump=${CUOBJDUMP:-$(dirname "$nvcc")/cuobjdump}
work=$(mktemp -d)
cp -r "$root/kernels/cuda/." "$work/"
if [ $# -ge 1 ]; then patch_file=$(realpath "$1"); (cd "$work" && patch -s -p3 < "$patch_file"); fi
python3 - "$work/decode.cu" <<'PY'
import re, sys
path = sys.argv[1]
lines = open(path).read().split('\n')
keep = []
for line in lines:
    # Instantiation lines: keep only the tensor-core bf16 ones, at d128.
    if re.match(r'^(DA_ALL_DIMS|DA_DIMS_TO_128|DA_MMA_ENTRY|DA_MERGE_ENTRY)\(', line):
        m = re.match(r'^DA_DIMS_TO_128\((DA_MMA_ENTRY|DA_MMA_PACKED_ENTRY|DA_BATCH_REDUCE_ENTRY|DA_STREAM_ENTRIES), da_bf16, bf16\)', line) \
            or re.match(r'^DA_ALL_DIMS\((DA_STREAM_ENTRIES), da_bf16, bf16\)', line)
        if m:
            keep.append(f'{m.group(1)}(da_bf16, bf16, 128)')
        continue
    keep.append(line)
open(path, 'w').write('\n'.join(keep))
PY
"$nvcc" -std=c++17 -O3 -arch=sm_90 -cubin -I "$work" -o "$work/k.cubin" "$work/decode.cu"
if [ -x "$cuobjdump" ]; then
  "$cuobjdump" -res-usage "$work/k.cubin" | grep -A1 "Function decode_mma_bf16_d128" | grep -v "^--" || true
  for f in decode_mma_bf16_d128 decode_mma_bf16_d128_packed decode_mma_bf16_d128_batch; do
    echo "$f: $("$cuobjdump" -sass -fun "$f" "$work/k.cubin" | grep -c '^ */\*[0-9a-f]*\*/') instructions"
  done
fi
echo "cubin: $work/k.cubin"

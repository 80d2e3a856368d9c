#!/bin/bash
# s37: every uniform batch (11 models, B 1-256, s 512-65536) where `auto`
# plans an H100 (`plan --gbps 3020`) and an H200 (the default) differently.
# Run from the repository root after `cargo build --release -p decode-attn-cli`;
# output: heldout-shapes.txt (234 lines at 5c31afd).
bin=./target/release/decode-attn
for m in llama3-8b llama3-70b-tp8 llama3-70b llama3-405b-tp8 mistral-7b qwen2-7b qwen2-72b gemma2-9b phi3-mini starcoder-15b falcon-7b; do
 for b in 1 2 3 4 6 8 12 16 24 32 48 64 96 128 256; do
  for s in 512 1024 2048 3072 4096 6144 8192 12288 16384 24576 32768 49152 65536; do
   a=$($bin plan --model $m --batch $b --seq-len $s 2>/dev/null | grep -E '^kernel|^longest' | tr '\n' ' ')
   c=$($bin plan --model $m --batch $b --seq-len $s --gbps 3020 2>/dev/null | grep -E '^kernel|^longest' | tr '\n' ' ')
   kv=$($bin plan --model $m --batch $b --seq-len $s 2>/dev/null | grep -E '^kv' | grep -oE '= [0-9]+ B' | tr -dc 0-9)
   [ "$a" != "$c" ] && echo "$m $b $s kv=$kv | h200: $(echo $a | grep -oE 'tiles per split, [0-9]+ active splits of [0-9]+|kernel +[A-Za-z]+' | tr '\n' ' ') | h100: $(echo $c | grep -oE 'tiles per split, [0-9]+ active splits of [0-9]+|kernel +[A-Za-z]+'| tr '\n' ' ')"
  done; done; done

#!/usr/bin/env bash
# Prints a Markdown table of bench_kernels medians for every policy and storage type at one
# geometry (default Qwen3-4B's: 32 query heads, 8 KV heads, head dim 128, budget 4096,
# window 64), with the bare Q.K^T floor measured in the same runs. Extra arguments are passed
# to every bench_kernels call (e.g. --threads 2).
set -euo pipefail
bench=${BENCH:-build/tests/bench_kernels}
policies=(vase-attnv vase-dkv curdkv snapkv rkv streaming random h2o attn-sample range-attn
          range-sample-attn evict-large-range)
dtypes=(f32 f16 bf16)

printf '| policy |'
for d in "${dtypes[@]}"; do printf ' %s ms | %s / floor |' "$d" "$d"; done
printf '\n|---|'
for _ in "${dtypes[@]}"; do printf '%s' '---:|---:|'; done
printf '\n'
for p in "${policies[@]}"; do
    printf '| %s |' "$p"
    for d in "${dtypes[@]}"; do
        out=$("$bench" --policy "$p" --dtype "$d" --gemm-floor "$@")
        med=$(sed -n 's/^median_ms=//p' <<<"$out")
        ratio=$(sed -n 's/^ratio=//p' <<<"$out")
        printf ' %s | %s |' "$med" "$ratio"
    done
    printf '\n'
done

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/bench_service.sh [BENCH_SERVICE OPTIONS]: runs tests/bench_service against a private
# vased (examples/with_vased.sh) on the host arena, sized for its Qwen3-4B-shaped part: 36
# layers x 2 x 8 KV heads x 128 x bf16 = 144 KiB per token, so a budget of 4096 (+ window +
# slack) is about 600 MiB of KV plus a 36 MiB query ring; 2 GiB leaves room for the small
# sequences of the other parts. Pages hold 16 tokens (the default block size), 2.25 MiB of
# that model.
#
# VASED and BENCH name the binaries (build/vased, build/tests/bench_service).

set -u
cd "$(dirname "$0")/.." || exit 1
exec examples/with_vased.sh "${VASED:-build/vased}" --arena-bytes=2G --granule-bytes=2M -- \
    "${BENCH:-build/tests/bench_service}" "$@"

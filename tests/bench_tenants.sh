#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/bench_tenants.sh [VASED SETTING...] [-- BENCH_TENANTS OPTIONS]: runs tests/bench_tenants
# (as root) against a private vased (examples/with_vased.sh) on a 1 GiB host arena with two
# evictor threads, allow_users admitting the victim's uid and the noisy uid (40001, 40002 unless
# --victim-uid/--noisy-uid say otherwise: give them after the --). Extra vased settings come
# first, e.g. tests/bench_tenants.sh --max-sessions-per-uid=64 to let all 32 sessions of the
# noisy uid in and see the planning queue alone.
#
# VASED and BENCH name the binaries (build/vased, build/tests/bench_tenants).

set -u
cd "$(dirname "$0")/.." || exit 1
settings=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    settings+=("$1")
    shift
done
[ $# -gt 0 ] && shift
victim=40001
noisy=40002
for a in "$@"; do
    case $a in
    --victim-uid=*) victim=${a#*=} ;;
    --noisy-uid=*) noisy=${a#*=} ;;
    esac
done
exec examples/with_vased.sh "${VASED:-build/vased}" --arena-bytes=1G --granule-bytes=2M \
    --evictor-threads=2 --allow-users="$victim,$noisy" ${settings[@]+"${settings[@]}"} -- \
    "${BENCH:-build/tests/bench_tenants}" "$@"

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# run.sh [--quick] [--out=DIR] [--arena-bytes=SIZE] [--granule-bytes=SIZE] [-- LOADGEN_OPTION...]
#
# Static against elastic budgets under load: starts a private vased (examples/with_vased.sh: a
# fresh runtime directory, no configuration file, stopped and removed afterwards) with the given
# arena, runs build/examples/loadgen against it (the same seeded arrivals with static budgets,
# then elastic ones), checks with vasectl that the arena is empty afterwards, and plots the
# occupancy (examples/loadgen/plot.py). Writes the CSV files, table.md and occupancy.png to DIR
# (default examples/loadgen/results, the run docs/performance.md shows). --quick is the short run of
# `make check`: 2.5 s of arrivals per mode on a 16 MiB arena, into build/loadgen-quick unless
# --out says otherwise. The exit status is loadgen's (1 when a run was inconsistent: an arrival
# not accounted for, a sequence that failed, an arena not empty afterwards; the files are
# written and plotted all the same), or 1 when vasectl finds the arena in use or the plot fails.
#
# BUILD (default build) is where vased, vasectl and examples/loadgen are; PYTHON (default
# /usr/bin/python3) runs the plot, with matplotlib.

set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$root/build}
python=${PYTHON:-/usr/bin/python3}

quick=0
out=
arena=64M
granule=512K
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --out=*) out=${1#--out=} ;;
    --arena-bytes=*) arena=${1#--arena-bytes=} ;;
    --granule-bytes=*) granule=${1#--granule-bytes=} ;;
    --) shift; break ;;
    -h | --help)
        sed -n '4,18p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "$0: unknown option '$1' (loadgen's options go after --)" >&2
        exit 2
        ;;
    esac
    shift
done

# The measurement of docs/performance.md (examples/loadgen/results): 30 s of arrivals per mode, static
# and elastic with min_budget half and a quarter of the budget.
loadgen_args=(--duration=30 "--min-frac=0.5,0.25")
if [ "$quick" = 1 ]; then
    [ -n "$out" ] || out=$build/loadgen-quick
    arena=16M
    loadgen_args=(--duration=2.5 --calm-rate=10 --burst-rate=40 --step-ms=1 --decode-min=512
        --decode-max=1024)
fi
[ -n "$out" ] || out=$here/results
loadgen_args+=("$@")

for prog in "$build/vased" "$build/vasectl" "$build/examples/loadgen"; do
    if [ ! -x "$prog" ]; then
        echo "$0: $prog is not built (run make)" >&2
        exit 1
    fi
done
mkdir -p "$out" || exit 1
rm -f "$out"/occupancy_*.csv "$out"/seqs_*.csv "$out"/table.md "$out"/occupancy.png

# Runs inside with_vased.sh (VASE_RUNTIME_DIR set): the generator, then vasectl's view of the
# arena, which must hold no sequence and no page any more.
inner() {
    local loadgen=$1 vasectl=$2 status
    shift 2
    "$loadgen" --out="$out" "$@" || return $?
    status=$("$vasectl" status) || return 1
    # "clients 0, sequences 0, ..." and the default arena's IN PAGES column "0 B".
    if ! echo "$status" | grep -q '^clients [0-9]*, sequences 0,' ||
        ! echo "$status" | awk '$1 == "0" && $2 == "default" {seen = 1; ok = $8 == "0" && $9 == "B"}
                                END {exit !(seen && ok)}'; then
        echo "$0: vasectl finds the arena in use after the run:" >&2
        echo "$status" >&2
        return 1
    fi
}
export -f inner
export out

"$root/examples/with_vased.sh" "$build/vased" --arena-bytes="$arena" --granule-bytes="$granule" \
    -- bash -c 'inner "$@"' inner "$build/examples/loadgen" "$build/vasectl" "${loadgen_args[@]}"
status=$?

# A run that found an inconsistency is plotted all the same (what it measured is in the files).
if ls "$out"/occupancy_*.csv >/dev/null 2>&1; then
    duration=$(printf '%s\n' "${loadgen_args[@]}" | sed -n 's/^--duration=//p' | tail -n 1)
    "$python" "$here/plot.py" "$out" ${duration:+--duration="$duration"} || status=1
fi
exit "$status"

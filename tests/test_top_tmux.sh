#!/bin/bash
# SPDX-License-Identifier: MIT
#
# vasectl top in a real terminal: a private vased and a synthetic engine that evicts, then
# `vasectl top` in a detached tmux session of 160x40. The view must show its header and
# sections and a sequence evicting (a non-zero EVICT/S); sort keys must change the order and
# the header; a smaller window must cut every line to its width; with the daemon gone it must
# show the error and come back when a daemon answers again; 'q' and Ctrl-C must end it with
# status 0, the alternate screen left, the cursor shown and the tty's modes back. Also `vasectl
# top` into a pipe: plain text, no escape sequences, two snapshots, the second with rates.
#
# Every wait polls and is bounded (30 s): nothing is asserted about how long anything takes.
# Run from the repository root; BUILD (default build) names the build.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
vased=$BUILD/vased
vasectl=$BUILD/vasectl
engine=$BUILD/examples/synthetic_engine
for p in "$vased" "$vasectl" "$engine"; do
    [ -x "$p" ] || { echo "test_top_tmux: $p is not built" >&2; exit 1; }
done
command -v tmux >/dev/null || { echo "test_top_tmux: tmux is not installed" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/vase-top-XXXXXX") || exit 1
export VASE_RUNTIME_DIR=$dir/run
tmux_sock=vase-top-$$
vpid=
epid=
tm() { tmux -L "$tmux_sock" -f /dev/null "$@"; }
cleanup() {
    tm kill-server 2>/dev/null
    [ -n "$epid" ] && kill "$epid" 2>/dev/null && wait "$epid" 2>/dev/null
    [ -n "$vpid" ] && kill "$vpid" 2>/dev/null && wait "$vpid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

fail() {
    echo "test_top_tmux: $*" >&2
    if tm has-session -t gone 2>/dev/null; then tm capture-pane -p -t gone >&2; fi
    if tm has-session -t top 2>/dev/null; then
        echo "---- the terminal ----" >&2
        tm capture-pane -p -t top >&2
        echo "----" >&2
    fi
    tail -n 20 "$dir/vased.log" >&2 2>/dev/null
    exit 1
}

# wait_for WHAT COMMAND...: runs COMMAND every 0.1 s until it succeeds, for at most 30 s.
wait_for() {
    local what=$1
    shift
    for _ in $(seq 300); do
        "$@" && return 0
        sleep 0.1
    done
    fail "no $what within 30 s"
}

screen() { tm capture-pane -p -t top; }
screen_has() { screen | grep -q -- "$1"; }
screen_lacks() { ! screen | grep -q -- "$1"; }

start_vased() {
    mkdir -p "$VASE_RUNTIME_DIR"
    "$vased" --config=/dev/null --runtime-dir="$VASE_RUNTIME_DIR" --metrics-address=off >>"$dir/vased.log" 2>&1 &
    vpid=$!
    wait_for "answer from vased" "$vasectl" --timeout=1000 ping >/dev/null 2>&1
}

start_vased
"$engine" --seqs=3 --duration=120 --step-ms=2 --name=top-test >"$dir/engine.log" 2>&1 &
epid=$!
seqs_open() { [ "$("$vasectl" seqs 2>/dev/null | grep -c ' vase-attnv ')" = 3 ]; }
wait_for "three sequences of the engine" seqs_open

# ---- into a pipe: plain text ----
"$vasectl" top -n 2 --interval=0.5 | cat >"$dir/plain.out" || fail "vasectl top -n 2 | cat failed"
grep -q $'\x1b' "$dir/plain.out" && fail "escape sequences in the plain output: $(cat -v "$dir/plain.out")"
[ "$(grep -c '^vased ' "$dir/plain.out")" = 2 ] || fail "not two snapshots: $(cat "$dir/plain.out")"
for want in '^sorted by EVICT/S, descending; every 0.5s$' '^ARENA  NAME' '^CLIENT  NAME' \
    '^MODEL ' '^ID  CLIENT  MODEL'; do
    grep -q -- "$want" "$dir/plain.out" || fail "no '$want' in: $(cat "$dir/plain.out")"
done
# The first snapshot has no rates yet, the second has them.
grep -q 'evictions [0-9.kM]* (-/s)' "$dir/plain.out" || fail "first snapshot with a rate"
grep -q 'evictions [0-9.kM]* ([0-9.kM]*/s)' "$dir/plain.out" || fail "no rate in the second snapshot"
"$vasectl" top -n 1 --json | grep -q '^{"status":{"incarnation":' || fail "top --json"
"$vasectl" seqs -n 2 >/dev/null 2>&1 && fail "-n accepted for seqs"
# Without a daemon: a clear message and status 1.
VASE_RUNTIME_DIR=$dir/none "$vasectl" top -n 1 >/dev/null 2>"$dir/none.err"
rc=$?
[ "$rc" = 1 ] || fail "status $rc without a daemon, want 1"
grep -q "^vasectl: cannot reach vased at $dir/none/control.sock: No such file or directory$" \
    "$dir/none.err" || fail "without a daemon: $(cat "$dir/none.err")"
# Usage errors.
"$vasectl" top -n 0 2>/dev/null
[ $? = 2 ] || fail "-n 0 accepted"
"$vasectl" top --interval=0.01 2>/dev/null
[ $? = 2 ] || fail "--interval=0.01 accepted"

# ---- in a terminal ----
tm new-session -d -x 160 -y 40 -s top \
    "$vasectl --timeout=1000 top --interval=0.5; echo \$? >$dir/exit; stty -a >$dir/stty; exec sleep 600" ||
    fail "cannot start tmux"
wait_for "frame of vasectl top" screen_has '^ID  CLIENT  MODEL'
[ "$(tm display -p -t top '#{alternate_on}')" = 1 ] || fail "not on the alternate screen"

# A sequence row (ID CLIENT MODEL POLICY BUDGET LEN/CAP MEMORY... the memory is two words) with
# a non-zero EVICT/S, the ninth field.
evicting() { screen | awk '/^ID  CLIENT/ {t = 1; next} t && $4 == "vase-attnv" && $9 + 0 > 0 {f = 1} END {exit !f}'; }
wait_for "sequence with a non-zero EVICT/S" evicting
for want in '^vased [0-9.]*, up .*, clients 1, seqs 3, opens waiting 0, evictions .*/s)$' \
    '^sorted by EVICT/S, descending; every 0.5s; keys: s/S column' '^ARENA  NAME' \
    '^    0  default  host' '^CLIENT  NAME ' ' top-test ' '^MODEL ' 'synthetic-L4-H8x2-D64-bf16'; do
    screen_has "$want" || fail "no '$want' on the screen"
done

# The sequence ids, top to bottom.
ids() { screen | awk '/^ID  CLIENT/ {t = 1; next} t && NF > 8 {printf "%s ", $1}'; }
tm send-keys -t top i
wait_for "sort by ID" screen_has '^sorted by ID, ascending;'
[ "$(ids)" = "1 2 3 " ] || fail "ascending ids: $(ids)"
tm send-keys -t top r
wait_for "reversed sort" screen_has '^sorted by ID, descending;'
[ "$(ids)" = "3 2 1 " ] || fail "descending ids: $(ids)"
tm send-keys -t top s
wait_for "next column" screen_has '^sorted by CLIENT, ascending;'

# The daemon goes away: the view says so and keeps trying; a new daemon is picked up.
kill "$epid"
wait "$epid" 2>/dev/null
epid=
kill "$vpid"
wait "$vpid" || fail "vased exited with status $? after SIGTERM"
vpid=
wait_for "error for the vanished daemon" screen_has '^error: cannot reach vased at .*control.sock'
start_vased
wait_for "the new daemon" screen_has '^vased .*, clients 0, seqs 0,'
screen_lacks '^error:' || fail "the error stayed after the daemon came back"

tm send-keys -t top q
wait_for "vasectl top's exit" test -s "$dir/exit"
[ "$(cat "$dir/exit")" = 0 ] || fail "vasectl top exited with status $(cat "$dir/exit")"
wait_for "stty's output" test -s "$dir/stty"
[ "$(tm display -p -t top '#{alternate_on}')" = 0 ] || fail "still on the alternate screen after q"
[ "$(tm display -p -t top '#{cursor_flag}')" = 1 ] || fail "the cursor stayed hidden after q"
grep -qw -- '-icanon' "$dir/stty" && fail "the tty stayed non-canonical: $(cat "$dir/stty")"
grep -qw -- '-echo' "$dir/stty" && fail "the tty stayed without echo: $(cat "$dir/stty")"
screen_lacks '^ID  CLIENT' || fail "the view is still on the screen after q"

# A narrow window: every line cut to its width, none wrapped onto the next. Made wider, it must
# be redrawn at once on SIGWINCH (no sample is due for an hour), lines longer than before. Then
# Ctrl-C ends it like 'q'.
tm kill-session -t top
rm -f "$dir/exit"
tm new-session -d -x 50 -y 20 -s top "$vasectl top --interval=3600; echo \$? >$dir/exit; exec sleep 600" ||
    fail "cannot start tmux"
widest() { screen | awk '{ if (length($0) > m) m = length($0) } END {print m + 0}'; }
narrow() { screen | sed -n 2p | grep -q '^sorted by EVICT/S, descending; every 3600s;' && [ "$(widest)" = 50 ]; }
wait_for "frame cut to 50 columns" narrow
tm resize-window -t top -x 160 -y 40
wide() { [ "$(widest)" -gt 50 ] && screen_has '^sorted by EVICT/S, descending; every 3600s; keys: s/S column, r reverse,'; }
wait_for "frame redrawn for 160 columns" wide
tm send-keys -t top C-c
wait_for "vasectl top's exit after Ctrl-C" test -s "$dir/exit"
[ "$(cat "$dir/exit")" = 0 ] || fail "vasectl top exited with status $(cat "$dir/exit") after Ctrl-C"
[ "$(tm display -p -t top '#{alternate_on}')" = 0 ] || fail "still on the alternate screen after Ctrl-C"

# The terminal goes away under a running view (the tmux server ends, the pty hangs up): vasectl
# top must end too, not spin on a dead terminal.
tm new-session -d -x 160 -y 40 -s gone "$vasectl top --interval=3600" || fail "cannot start tmux"
gone_has() { tm capture-pane -p -t gone | grep -q -- "$1"; }
wait_for "frame in the second terminal" gone_has "^sorted by EVICT/S, descending; every 3600s;"
top_pid=$(tm display -p -t gone '#{pane_pid}')
[ -n "$top_pid" ] || fail "no pid for the second terminal's vasectl top"
tm kill-server
gone() { ! kill -0 "$top_pid" 2>/dev/null; }
wait_for "vasectl top's exit once its terminal is gone" gone
echo "test_top_tmux: ok"

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# test_sd_activation.sh: vased under socket activation, without systemd as PID 1: tests/sd_emu.py
# plays vased.socket and vased.service (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES, NOTIFY_SOCKET).
# Run by `make check` with BUILD naming the build directory.
#
#  1. An engine started before the daemon: the emulator only listens on session.sock; the
#     engine's connect starts vased (--on-demand), which takes the socket, answers the hello,
#     and the engine decodes with evictions. vased's log says the socket came from systemd.
#  2. The socket outlives the daemon: after a clean restart (SIGTERM, exit 0, start again with
#     the same socket) session.sock is still the emulator's and a second engine decodes; after
#     the last stop the daemon has not removed it.
#  3. A passed socket that is not the session socket is a clear fatal error: a SOCK_STREAM
#     socket, and a SEQPACKET socket bound elsewhere, each make vased exit 1 with its reason.
#  (Without LISTEN_FDS vased makes its own socket: every other daemon test starts it so.)
#
# Prints PASS or FAIL per case; exits 1 if any failed.

set -u

src=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$src/$BUILD ;; esac
vased=$BUILD/vased
engine=$BUILD/examples/synthetic_engine
emu=$src/tests/sd_emu.py
for f in "$vased" "$engine"; do
    [ -x "$f" ] || { echo "$0: $f is not built" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vase-sdact-XXXXXX") || exit 1
emu_pid=
cleanup() {
    [ -n "$emu_pid" ] && kill -TERM "$emu_pid" 2>/dev/null && wait "$emu_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
failed=0

result() { # name status [file...]
    local name=$1 status=$2
    shift 2
    if [ "$status" = 0 ]; then
        echo "  PASS    $name"
    else
        echo "  FAIL    $name" >&2
        for f in "$@"; do
            echo "          ---- $f" >&2
            tail -n 30 "$f" 2>/dev/null | sed 's/^/          /' >&2
        done
        failed=1
    fi
}

# wait_line FILE REGEX: until a line of FILE matches, for at most 30 s (a bound on a hang,
# not a measurement). 0 when it came.
wait_line() {
    for _ in $(seq 600); do
        grep -Eq "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# The emulator in the background on a fresh runtime directory: start_emu NAME [EMU-ARG...].
start_emu() {
    local name=$1
    shift
    run=$tmp/$name
    mkdir -m 0755 "$run"
    log=$tmp/$name.emu
    vlog=$tmp/$name.vased
    : >"$log"
    "$emu" --runtime-dir "$run" --log "$log" "$@" -- "$vased" --config=/dev/null \
        --runtime-dir="$run" --arena-bytes=64M --log-level=info 2>"$vlog" &
    emu_pid=$!
    for _ in $(seq 600); do
        [ -S "$run/notify.sock" ] && return 0
        sleep 0.05
    done
    return 1
}

# engine OUT: one short decode run against $run; 0 when it decoded and evicted.
engine() {
    "$engine" --runtime-dir "$run" --seqs 1 --steps 400 --budget 128 --window 16 >"$1" 2>&1 &&
        awk '$1 == 1 && $7 > 0 {found = 1} END {exit !found}' "$1"
}

stop_emu() { # the emulator's (the daemon's) exit status
    kill -TERM "$emu_pid" 2>/dev/null
    wait "$emu_pid"
    local s=$?
    emu_pid=
    return $s
}

# 1. An engine first, then the daemon it starts.
status=1
if start_emu first --on-demand && [ -S "$run/session.sock" ] && ! grep -q started "$log"; then
    engine "$tmp/first.out" && grep -q "^activated" "$log" && grep -q "^READY" "$log" &&
        grep -q "passed by systemd (socket activation)" "$vlog" && status=0
fi
result "an engine started before vased connects, starts it and decodes" $status \
    "$tmp/first.out" "$log" "$vlog"

# 2. Restart, the same socket, a second engine; the socket is left at the last stop.
status=1
ino=$(stat -c %i "$run/session.sock" 2>/dev/null)
kill -USR1 "$emu_pid" 2>/dev/null
for _ in $(seq 600); do
    [ "$(grep -c '^READY' "$log")" -ge 2 ] && break
    sleep 0.05
done
restarted=0
grep -q "^exited pid [0-9]* status 0$" "$log" && [ "$(grep -c '^started' "$log")" = 2 ] &&
    restarted=1
if [ $restarted = 1 ] && [ "$(grep -c '^READY' "$log")" -ge 2 ] && engine "$tmp/second.out" &&
    [ "$(stat -c %i "$run/session.sock" 2>/dev/null)" = "$ino" ]; then
    stop_emu && [ -S "$run/session.sock" ] && [ "$(stat -c %i "$run/session.sock")" = "$ino" ] &&
        [ "$(grep -c "^exited pid [0-9]* status 0$" "$log")" = 2 ] && status=0
fi
result "vased restarts on the same socket and leaves it in place when it stops" $status \
    "$tmp/second.out" "$log" "$vlog"
[ -n "$emu_pid" ] && stop_emu

# 3. The wrong socket.
status=1
if start_emu stream --stream; then
    wait "$emu_pid"
    s=$?
    emu_pid=
    [ "$s" = 1 ] && grep -q "is not a listening AF_UNIX SOCK_SEQPACKET socket" "$vlog" && status=0
fi
result "a passed SOCK_STREAM socket is refused: vased exits 1 and says why" $status "$log" "$vlog"

status=1
if start_emu elsewhere --bind "$tmp/other.sock"; then
    wait "$emu_pid"
    s=$?
    emu_pid=
    [ "$s" = 1 ] && grep -q "is not bound to $run/session.sock" "$vlog" && status=0
fi
result "a passed socket bound elsewhere is refused: vased exits 1 and says why" $status "$log" \
    "$vlog"

exit $failed

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# test_sd_emu.sh: vased under socket activation, without systemd as PID 1: tests/sd_emu.py
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
# The fd store, with examples/reopen_engine (it writes K and V, waits for the daemon to go,
# connects again and reopens its sequence with vase_seq_reopen(), or expects -ENOENT):
#  4. A clean restart (SIGTERM, start with the stored fds) keeps the host arena: vasectl status
#     shows the kept sequence until the engine reopens it; the block table and every K and V
#     byte are identical after the reopen, a second reopen is refused, and decoding goes on with
#     evictions.
#  5. A changed arena_bytes discards the kept arena (logged): the reopen fails with -ENOENT. An
#     arena removed from the configuration loses its own sequences, not those of the others.
#  6. A corrupt snapshot is refused with the reason logged: the reopen fails with -ENOENT.
#  7. Sequences nobody reopens are freed after restore_grace (1 s here; the engine reopens only
#     once the daemon logged it): the reopen fails with -ENOENT.
#  8. A kill -9 leaves the arena in the store but no snapshot: vased discards the arena and
#     starts empty; the reopen fails with -ENOENT.
#  9. A snapshot of an earlier stop replayed with the arena as a later stop left it: after one
#     restart the engine reopens its sequence and finishes; at the second restart the emulator
#     hands back the first snapshot. vased discards the arena, its stamp naming another stop
#     (the reason logged), and the first snapshot's sequence is lost, not given back.
# 10. A blank memfd of the arena's size and seals handed back in place of the arena: discarded
#     with the reason, not adopted as intact; the reopen fails with -ENOENT.
#
# Prints PASS or FAIL per case; exits 1 if any failed.

set -u

src=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$src/$BUILD ;; esac
vased=$BUILD/vased
engine=$BUILD/examples/synthetic_engine
emu=$src/tests/sd_emu.py
for f in "$vased" "$engine" "$BUILD/examples/reopen_engine"; do
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

# The emulator in the background on a fresh runtime directory: start_emu NAME [EMU-ARG...];
# vased gets vased_args too.
vased_args=()
start_emu() {
    local name=$1
    shift
    run=$tmp/$name
    mkdir -m 0755 "$run"
    log=$tmp/$name.emu
    vlog=$tmp/$name.vased
    : >"$log"
    "$emu" --runtime-dir "$run" --log "$log" "$@" -- "$vased" --config=/dev/null \
        --runtime-dir="$run" --arena-bytes=64M --log-level=info --metrics-address=off \
        "${vased_args[@]}" 2>"$vlog" &
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

# The fd store. restart_case NAME SIGNAL ENGINE-ARG... [-- EMU-ARG...]: an engine on a fresh
# emulator writes, the emulator gets SIGNAL (USR1: clean restart, USR2: kill -9 and start),
# and the engine must end well (0 when it did).
restart_case() {
    local name=$1 sig=$2
    shift 2
    local eargs=() emu_args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        eargs+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift
    emu_args=("$@")
    start_emu "$name" "${emu_args[@]}" || return 1
    eout=$tmp/$name.out
    "$reopen" --runtime-dir "$run" --ready-file "$tmp/$name.ready" --wait-s 30 "${eargs[@]}" \
        >"$eout" 2>&1 &
    local epid=$!
    wait_file "$tmp/$name.ready" && wait_line "$log" "^FDSTORE arena-0" &&
        { [ -z "${before_restart:-}" ] || $before_restart; } && kill -"$sig" "$emu_pid"
    [ -n "${on_restart:-}" ] && $on_restart
    wait "$epid"
    local s=$?
    stop_emu
    return $s
}
wait_file() {
    for _ in $(seq 600); do
        [ -e "$1" ] && return 0
        sleep 0.05
    done
    return 1
}
reopen=$BUILD/examples/reopen_engine

# 4. Kept. Before the engine reopens, vasectl status shows the kept sequence.
status=1
kept_go() {
    wait_line "$tmp/kept.out" "^connected again" &&
        VASE_RUNTIME_DIR=$run "$BUILD/vasectl" status >"$tmp/kept.status" 2>&1
    : >"$tmp/kept.go"
}
on_restart=kept_go
if restart_case kept USR1 --go-file "$tmp/kept.go" &&
    grep -q "^kept across the restart: 1 sequences" "$tmp/kept.status" &&
    grep -q "^reopened: .*block table identical.*K/V identical" "$eout" &&
    grep -q "^a second reopen is refused" "$eout" && grep -q "^decoded .* more steps" "$eout" &&
    grep -q "^started pid .* fds vased.socket,arena-0,state$" "$log" &&
    grep -q 'Arena 0 "default": kept across the restart' "$vlog" &&
    grep -q "reopened sequence 1 on its kept pages" "$vlog"; then
    status=0
fi
on_restart=
result "a restart keeps the host arena: the reopened sequence has the same pages and K/V" \
    $status "$eout" "$log" "$vlog" "$tmp/kept.status"

# 5. Another arena size.
status=1
echo "--arena-bytes=32M" >"$tmp/next-args"
if restart_case resized USR1 --expect-lost -- --next-args "$tmp/next-args" &&
    grep -q "^reopen refused as expected" "$eout" &&
    grep -q 'Discarding the kept memory of arena 0 "default": its arena_bytes or granule_bytes changed' \
        "$vlog" && grep -q "^FDSTOREREMOVE arena-0" "$log"; then
    status=0
fi
result "a changed arena_bytes discards the kept arena" $status "$eout" "$log" "$vlog"

# 5b. An arena gone from the configuration: its sequences are lost, those of the arenas kept
# are not. A second engine holds a sequence on arena 1 when the daemon stops; the next start
# has no [arena extra].
status=1
printf '[arena extra]\narena = host\narena_bytes = 16M\n' >"$tmp/two-arenas.conf"
vased_args=(--config="$tmp/two-arenas.conf")
echo "--config=/dev/null" >"$tmp/next-args"
other_seq() {
    "$engine" --runtime-dir "$run" --arena=1 --seqs 1 --steps 1000000 --budget 128 --window 16 \
        >"$tmp/other.out" 2>&1 &
    other_pid=$!
    for _ in $(seq 600); do
        VASE_RUNTIME_DIR=$run "$BUILD/vasectl" --json status 2>/dev/null | grep -q '"seqs":2[,}]' &&
            return 0
        sleep 0.05
    done
    return 1
}
before_restart=other_seq
if restart_case shrunk USR1 -- --next-args "$tmp/next-args" &&
    grep -q "^reopened: .*K/V identical" "$eout" &&
    grep -q "Discarding the kept memory of arena 1: the configuration has no such arena" "$vlog" &&
    grep -q "1 sequences of the previous vased were on arenas not kept: lost" "$vlog"; then
    status=0
fi
before_restart=
vased_args=()
kill "$other_pid" 2>/dev/null
wait "$other_pid" 2>/dev/null
result "an arena gone from the configuration loses its sequences, not the others'" $status \
    "$eout" "$log" "$vlog" "$tmp/other.out"

# 6. A corrupt snapshot.
status=1
: >"$tmp/corrupt-flag"
if restart_case corrupt USR1 --expect-lost -- --corrupt-state "$tmp/corrupt-flag" &&
    grep -q "^corrupted state" "$log" && grep -q "^reopen refused as expected" "$eout" &&
    grep -q "Discarding the state snapshot systemd kept: its length or checksum is wrong" \
        "$vlog"; then
    status=0
fi
result "a corrupt state snapshot is refused with its reason" $status "$eout" "$log" "$vlog"

# 7. restore_grace.
status=1
vased_args=(--restore-grace=1)
grace_go() { wait_line "$vlog" "not reopened within restore_grace" && : >"$tmp/go"; }
on_restart=grace_go
if restart_case grace USR1 --expect-lost --go-file "$tmp/go" &&
    grep -q "^reopen refused as expected" "$eout" &&
    grep -q "1 kept sequences were not reopened within restore_grace (1 s): freed" "$vlog"; then
    status=0
fi
on_restart=
vased_args=()
result "sequences not reopened within restore_grace are freed" $status "$eout" "$log" "$vlog"

# 8. kill -9.
status=1
if restart_case crash USR2 --expect-lost && grep -q "^exited pid [0-9]* status 137$" "$log" &&
    grep -q "^reopen refused as expected" "$eout" &&
    grep -q "no state snapshot (the previous vased did not stop cleanly)" "$vlog"; then
    status=0
fi
result "after a kill -9 vased starts empty" $status "$eout" "$log" "$vlog"

# 9. A stale snapshot: the second restart gets the first stop's snapshot back.
status=1
stale_go() {
    wait_line "$tmp/stale.out" "^decoded .* more steps" && : >"$tmp/stale-flag" &&
        kill -USR1 "$emu_pid" && wait_line "$log" "^stale state" &&
        for _ in $(seq 600); do
            [ "$(grep -c '^READY' "$log")" -ge 3 ] && break
            sleep 0.05
        done
}
on_restart=stale_go
if restart_case stale USR1 -- --stale-state "$tmp/stale-flag" &&
    grep -q "^reopened: .*K/V identical" "$eout" && [ "$(grep -c '^READY' "$log")" = 3 ] &&
    grep -q "^stale state" "$log" &&
    grep -q 'Discarding the kept memory of arena 0 "default": the snapshot is of another stop than the one that stamped this memory .*: a stale or foreign pair' \
        "$vlog" && grep -q "1 sequences of the previous vased were on arenas not kept: lost" "$vlog" &&
    [ "$(grep -c '^FDSTOREREMOVE arena-0' "$log")" = 1 ] &&
    [ "$(grep -c 'Arena 0 "default": kept across the restart' "$vlog")" = 1 ]; then
    status=0
fi
on_restart=
result "a snapshot of an earlier stop is discarded with the arena's memory, with its reason" \
    $status "$eout" "$log" "$vlog"

# 10. A blank memfd in the arena's place.
status=1
: >"$tmp/blank-flag"
if restart_case blank USR1 --expect-lost -- --blank-arena "$tmp/blank-flag" &&
    grep -q "^blank arena-0" "$log" && grep -q "^reopen refused as expected" "$eout" &&
    grep -q 'Discarding the kept memory of arena 0 "default": its memfd carries no stamp of a stop' \
        "$vlog" && ! grep -q "kept across the restart" "$vlog"; then
    status=0
fi
result "a blank memfd in the arena's place is discarded, not adopted as intact" $status "$eout" \
    "$log" "$vlog"

exit $failed

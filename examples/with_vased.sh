#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# with_vased.sh VASED [SETTING...] -- COMMAND [ARG...]
#
# Runs COMMAND against a private vased: starts VASED with the given --key=value settings (and
# no configuration file; its drop-in directory is DIR/vased.conf.d) on a fresh temporary
# runtime directory DIR, waits until it answers a Ping
# (from the vasectl beside VASED; without one, until its sockets exist), runs COMMAND with
# VASE_RUNTIME_DIR pointing there, then stops the daemon with SIGTERM and checks that it exits
# cleanly. The exit status is COMMAND's, or 1 if the daemon failed to
# start or to stop cleanly. Whatever happens (a failure, Ctrl-C, SIGTERM: COMMAND then gets
# SIGTERM), neither COMMAND nor the daemon is left running and the directory is removed; the
# daemon's log is shown when something went wrong.
#
# Used by `make demo`, `make check-replay` and tests/bench_service.sh.

set -u

usage() {
    echo "usage: $0 VASED [--key=value...] -- COMMAND [ARG...]" >&2
    exit 2
}

[ $# -ge 3 ] || usage
vased=$1
shift
settings=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    settings+=("$1")
    shift
done
[ $# -ge 2 ] || usage
shift

if [ ! -x "$vased" ]; then
    echo "$0: $vased is not an executable (build it: make $vased)" >&2
    exit 1
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/vase-XXXXXX") || exit 1
pid=
cmd=
show_log=0

# Stops the daemon if it still runs: SIGTERM, up to 30 s (its shutdown_timeout for plans in
# flight is 10 s by default), then SIGKILL. Sets $daemon_status.
stop_daemon() {
    daemon_status=0
    [ -n "$pid" ] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 300); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "$0: vased (pid $pid) ignored SIGTERM for 30 s; killing it" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    wait "$pid"
    daemon_status=$?
    pid=
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$cmd" ]; then
        kill -TERM "$cmd" 2>/dev/null
        wait "$cmd" 2>/dev/null
    fi
    stop_daemon
    if [ "$show_log" = 1 ] || [ "$status" != 0 ]; then
        echo "---- vased log ($dir/vased.log) ----" >&2
        tail -n 40 "$dir/vased.log" >&2 2>/dev/null
        echo "----" >&2
    fi
    rm -rf "$dir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Metrics off unless a setting asks for them: private daemons must not take the operator's port.
# The drop-in directory is private too (`vasectl config set --persist` writes there), and goes
# with the rest.
"$vased" --config=/dev/null --runtime-dir="$dir" --config-dir="$dir/vased.conf.d" \
    --metrics-address=off "${settings[@]}" >"$dir/vased.log" 2>&1 &
pid=$!

# READY=1 goes to systemd only. The socket files appear as the daemon binds them (the session
# socket's a moment before it listens); a Ping is answered only by the main loop, once every
# socket is set up, so vasectl (built beside vased) pings it. Without vasectl the files have to
# do. The bound only turns a daemon that never gets ready into a failure.
vasectl=$(dirname "$vased")/vasectl
ready=0
deadline=$((SECONDS + 30))
while [ "$SECONDS" -lt "$deadline" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        echo "$0: vased exited with status $? during start-up" >&2
        pid=
        exit 1
    fi
    if [ -S "$dir/session.sock" ] && [ -S "$dir/control.sock" ] && [ -S "$dir/events.sock" ] &&
        { [ ! -x "$vasectl" ] ||
            VASE_RUNTIME_DIR=$dir "$vasectl" --timeout=1000 ping >/dev/null 2>&1; }; then
        ready=1
        break
    fi
    sleep 0.05
done
if [ "$ready" != 1 ]; then
    echo "$0: vased did not get ready in $dir within 30 s" >&2
    exit 1
fi

# In the background, so that a signal reaches the trap at once (a foreground command would
# delay it until the command ends) and the trap can pass it on as SIGTERM.
VASE_RUNTIME_DIR=$dir "$@" &
cmd=$!
wait "$cmd"
status=$?
cmd=

stop_daemon
if [ "$daemon_status" != 0 ]; then
    echo "$0: vased exited with status $daemon_status after SIGTERM, want 0" >&2
    show_log=1
    [ "$status" != 0 ] || status=1
fi
exit "$status"

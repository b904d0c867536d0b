#!/bin/bash
# SPDX-License-Identifier: MIT
#
# checks.sh: the checks of `make check-boot`, run by vase-boot-check.service inside a Debian 12
# root booted with systemd-nspawn, where systemd is PID 1 and the vase package was installed
# with dpkg before the boot (tests/check_boot.sh). Each check talks to the real systemd through
# systemctl and journalctl:
#
#  boot-active        vased.service, enabled by the postinst, is active (Type=notify: systemd
#                     saw READY=1 and the STATUS= text) with no restart, running as user vase
#  hardening          the unit's sandbox is in force on the running daemon (no capabilities,
#                     no_new_privs, a seccomp filter) and it still serves vasectl
#  reload             edits of runtime keys of /etc/vase/vased.conf (allow_groups = vase among
#                     them) are applied by `systemctl reload vased` (vasectl config get), same
#                     main pid
#  engine-user        an engine run as a user of the group vase decodes through the daemon's
#                     host arena (with evictions), and one run as a user outside it is refused
#  journal            `journalctl -u vased` keeps the daemon's priorities (a warning-level line
#                     for an edited restart-only key) and who changed what (vasectl config set
#                     as root: uid 0, old -> new)
#  postinst-restart   installing the package again while vased runs restarts it (postinst)
#  persist            `vasectl config set --persist` writes the drop-in under the unit's
#                     hardening, and the value outlives a restart
#  watchdog           the running daemon pings the watchdog; stopped with SIGSTOP, it is killed
#                     and restarted by the watchdog (WatchdogSec shortened by a drop-in for the
#                     check), and systemd logged it
#  socket-activation  with vased.service stopped and vased.socket listening, an engine's first
#                     connect starts vased
#  restart-fdstore    `systemctl restart vased` keeps a host arena through the fd store: an engine
#                     reopens its sequence and finds its K and V bytes intact
#  no-cuda            the root has no CUDA library, and every ELF file of the packages loads
#                     (loads.sh: ldd, import vase)
#  cuda-arena-no-driver  vased with a CUDA arena there is refused, naming libcuda.so.1 and the
#                     package to install
#  cuda-arena-stub    with the toolkit's stub libcuda.so.1, the same vased's CUDA code reaches
#                     the driver (it says it is a stub): the CUDA arena code is in the package
#  dev-examples       libvase-dev's example engines, built by a user with its Makefile and
#                     pkg-config alone (shared and static), decode through the daemon; the
#                     Python package connects
#
# Prints and writes to RESULTS one "PASS|FAIL|SKIP name[: why]" line per check, then "done"; on
# any failure the boot's journal goes to JOURNAL. Bounded: every wait polls with a deadline.

set -u

DIR=/usr/local/lib/vase-boot-check
ENGINE=${ENGINE:-$DIR/synthetic_engine}
OUT=/var/lib/vase-boot-check
RESULTS=$OUT/results
JOURNAL=$OUT/journal.txt
CONF=/etc/vase/vased.conf
# The user who runs engines (group vase) and one who may not.
ENGINE_USER=vase-engine
OTHER_USER=vase-outsider

mkdir -p "$OUT"
: >"$RESULTS"
failed=0
work=$(mktemp -d) || exit 1

result() {
    echo "$*" | tee -a "$RESULTS"
    case $1 in FAIL) failed=1 ;; esac
}

# wait_for SECONDS COMMAND...: runs COMMAND every 0.2 s until it succeeds or SECONDS pass.
wait_for() {
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.2
    done
}

prop() { systemctl show -P "$1" vased.service; }
is_active() { [ "$(systemctl is-active vased.service)" = active ]; }
main_pid_is_not() {
    local p
    p=$(prop MainPID)
    [ "$p" != 0 ] && [ "$p" != "$1" ] && is_active
}
# journal_has PRIORITY PATTERN: a line of vased.service's journal at PRIORITY or more urgent
# matching the extended regular expression PATTERN (journald may take a moment to store it).
journal_has_now() { journalctl -q --no-pager -u vased.service -p "$1" -o cat | grep -Eq -- "$2"; }
journal_has() { wait_for 10 journal_has_now "$@"; }

# engine USER NAME [OPTIONS...]: a short decode run as USER (exit status of the engine; its
# output in $work/NAME.out). Prompt and steps go well beyond budget + window, so sequences evict.
engine() {
    local user=$1 name=$2
    shift 2
    timeout 60 setpriv --reuid="$user" --regid="$user" --init-groups -- "$ENGINE" --name="$name" \
        --seqs=2 --budget=128 --window=32 --prompt=256 --steps=300 --step-ms=0 "$@" \
        >"$work/$name.out" 2>&1
}
# Whether an engine's report shows a sequence with at least one eviction (column "evict").
engine_evicted() {
    grep -q ' decode steps in ' "$work/$1.out" &&
        awk '$1 ~ /^[0-9]+$/ && NF >= 14 && $7 > 0 {found = 1} END {exit !found}' "$work/$1.out"
}

# set_conf KEY VALUE: KEY's line in vased.conf (the shipped file has one per key, set or
# commented out with its default).
set_conf() {
    grep -Eq "^(# ?)?$1 =" "$CONF" || return 1
    sed -Ei "s|^(# ?)?$1 =.*|$1 = $2|" "$CONF"
}

check_boot_active() {
    local state type status restarts user pid
    state=$(systemctl is-active vased.service)
    type=$(prop Type)
    status=$(prop StatusText)
    restarts=$(prop NRestarts)
    pid=$(prop MainPID)
    user=$(ps -o user= -p "$pid" 2>/dev/null)
    if [ "$state" = active ] && [ "$type" = notify ] && [ -n "$status" ] && [ "$restarts" = 0 ] &&
        [ "$user" = vase ] && [ "$(systemctl is-enabled vased.service)" = enabled ]; then
        result PASS boot-active
    else
        result FAIL "boot-active: state '$state', Type '$type', STATUS '$status', NRestarts" \
            "'$restarts', user '$user', enabled '$(systemctl is-enabled vased.service)'"
    fi
}

check_hardening() {
    local pid st cap nnp seccomp
    pid=$(prop MainPID)
    st=/proc/$pid/status
    cap=$(awk '$1 == "CapEff:" {print $2}' "$st" 2>/dev/null)
    nnp=$(awk '$1 == "NoNewPrivs:" {print $2}' "$st" 2>/dev/null)
    seccomp=$(awk '$1 == "Seccomp:" {print $2}' "$st" 2>/dev/null)
    if [ "$cap" = 0000000000000000 ] && [ "$nnp" = 1 ] && [ "$seccomp" = 2 ] &&
        vasectl status >"$work/status.out" 2>&1; then
        result PASS hardening
    else
        result FAIL "hardening: CapEff '$cap', NoNewPrivs '$nnp', Seccomp '$seccomp'," \
            "vasectl status: $(head -c 300 "$work/status.out")"
    fi
}

check_engine_user() {
    engine "$ENGINE_USER" engine-a
    local rc=$?
    engine "$OTHER_USER" engine-refused
    local rc_other=$?
    if [ "$rc" = 0 ] && engine_evicted engine-a && [ "$rc_other" != 0 ] &&
        grep -q 'cannot connect to vased' "$work/engine-refused.out"; then
        result PASS engine-user
    else
        result FAIL "engine-user: exit $rc as $ENGINE_USER (group vase), exit $rc_other as" \
            "$OTHER_USER (expected a refusal)"
        cat "$work/engine-a.out" "$work/engine-refused.out"
    fi
}

# Runtime keys edited in the file are applied by a reload: allow_groups = vase, which the
# engine check needs (the shipped vased.conf admits no one but root and vase, whatever the
# socket's group), and max_seqs_per_client; a restart-only key edited with them is left alone
# with a warning (which check_journal looks for).
check_reload() {
    local pid before after groups
    pid=$(prop MainPID)
    before=$(vasectl config get max_seqs_per_client)
    if ! set_conf allow_groups vase || ! set_conf max_seqs_per_client 999 ||
        ! set_conf evictor_threads 1; then
        result FAIL "reload: $CONF lacks allow_groups, max_seqs_per_client or evictor_threads"
        return
    fi
    systemctl reload vased.service
    local rc=$?
    # The reload is a signal: the daemon applies it from its loop, a moment later.
    wait_for 10 sh -c '[ "$(vasectl config get max_seqs_per_client)" = 999 ]'
    after=$(vasectl config get max_seqs_per_client)
    groups=$(vasectl config get allow_groups)
    if [ "$rc" = 0 ] && [ "$before" = 1024 ] && [ "$after" = 999 ] && [ "$groups" = vase ] &&
        [ "$(prop MainPID)" = "$pid" ] && [ "$(vasectl config get evictor_threads)" = 0 ]; then
        result PASS reload
    else
        result FAIL "reload: systemctl reload exit $rc, max_seqs_per_client '$before' -> '$after'" \
            "(want 1024 -> 999), allow_groups '$groups' (want vase), evictor_threads" \
            "'$(vasectl config get evictor_threads)' (want 0 until a restart), main pid $pid ->" \
            "$(prop MainPID)"
    fi
}

check_journal() {
    local why=
    vasectl config set stats_interval 7 >/dev/null || why="vasectl config set failed; "
    journal_has warning 'evictor_threads changed to "1" in the configuration; restart vased' ||
        why+="no warning-level line for the restart-only key; "
    journal_has notice 'Setting stats_interval changed from "10" to "7" by uid 0 ' ||
        why+="no notice-level line naming uid 0 and 10 -> 7; "
    # ExecReload= runs vasectl reload as the unit's user; the log names systemctl reload.
    journal_has notice "SIGHUP from systemctl reload \\(the unit's ExecReload=, vasectl reload as uid $(id -u vase), " ||
        why+="no notice-level line naming systemctl reload for the reload's SIGHUP; "
    # The info lines are below notice: a filter at notice that shows them would mean the
    # priorities were not parsed at all.
    journal_has info 'Client [0-9]+ "engine-a" \(pid [0-9]+, uid [0-9]+\) connected' ||
        why+="no info line for the engine's connection; "
    if journal_has_now notice 'Client [0-9]+ "engine-a"'; then
        why+="info lines pass a notice filter; "
    fi
    if [ -z "$why" ]; then
        result PASS journal
    else
        result FAIL "journal: $why"
    fi
}

check_postinst_restart() {
    local pid
    pid=$(prop MainPID)
    if dpkg -i "$DIR"/debs/vased_*.deb >"$work/dpkg.out" 2>&1 && wait_for 30 main_pid_is_not "$pid"; then
        result PASS postinst-restart
    else
        result FAIL "postinst-restart: main pid $pid -> $(prop MainPID), $(systemctl is-active vased)"
        cat "$work/dpkg.out"
    fi
}

watchdog_restarts_hung_daemon() {
    local pid restarts ping
    # Ten seconds instead of 30, and a SIGKILL 2 s after the watchdog's SIGABRT if that did not
    # end it, instead of after TimeoutStopSec.
    printf '[Service]\nWatchdogSec=10s\nTimeoutAbortSec=2s\n' >"$1"
    systemctl daemon-reload && systemctl restart vased.service
    if ! is_active || [ "$(prop WatchdogUSec)" != 10s ]; then
        result FAIL "watchdog: vased not active with WatchdogSec=10s after a restart"
        return
    fi
    pid=$(prop MainPID)
    restarts=$(prop NRestarts)
    # systemd stamps each WATCHDOG=1 it receives: the running daemon pings before it is stopped.
    ping=$(prop WatchdogTimestampMonotonic)
    if ! wait_for 30 sh -c '[ "$(systemctl show -P WatchdogTimestampMonotonic vased)" != "$1" ]' \
        sh "$ping"; then
        result FAIL "watchdog: no WATCHDOG=1 from the running vased in 30 s"
        return
    fi
    kill -STOP "$pid"
    if wait_for 60 main_pid_is_not "$pid" && [ "$(prop NRestarts)" -gt "$restarts" ] &&
        journal_has warning 'vased.service: Watchdog timeout'; then
        result PASS watchdog
    else
        kill -CONT "$pid" 2>/dev/null
        result FAIL "watchdog: main pid $pid -> $(prop MainPID), NRestarts $restarts ->" \
            "$(prop NRestarts), state $(systemctl is-active vased.service)"
    fi
}

check_watchdog() {
    local dropin=/etc/systemd/system/vased.service.d/check-boot-watchdog.conf
    mkdir -p "${dropin%/*}"
    watchdog_restarts_hung_daemon "$dropin"
    rm -f "$dropin"
    systemctl daemon-reload
}

check_socket_activation() {
    if [ ! -e /usr/lib/systemd/system/vased.socket ]; then
        result FAIL "socket-activation: the package ships no vased.socket"
        return
    fi
    systemctl stop vased.service
    systemctl start vased.socket
    local svc sock
    svc=$(systemctl is-active vased.service)
    sock=$(systemctl is-active vased.socket)
    if [ "$svc" = active ] || [ "$sock" != active ]; then
        result FAIL "socket-activation: after stop: vased.service $svc, vased.socket $sock"
        return
    fi
    engine "$ENGINE_USER" engine-activated --runtime-dir=/run/vase
    local rc=$?
    if [ "$rc" = 0 ] && engine_evicted engine-activated && is_active; then
        result PASS socket-activation
    else
        result FAIL "socket-activation: engine exit $rc, vased.service" \
            "$(systemctl is-active vased.service)"
        cat "$work/engine-activated.out"
    fi
}

# With examples/reopen_engine in the build (it comes with the fd store): an engine of the group
# vase writes K and V rows that encode their position and waits; `systemctl restart vased`; the
# engine connects again, reopens its sequence and finds its block table and every K and V byte
# as it left them, and the new daemon says it took the arena back.
check_restart_fdstore() {
    local reopen=$DIR/reopen_engine ready=/home/$ENGINE_USER/reopen.ready epid pid rc
    if [ ! -x "$reopen" ]; then
        result FAIL "restart-fdstore: no reopen_engine was copied into the root"
        return
    fi
    systemctl start vased.service
    pid=$(prop MainPID)
    rm -f "$ready"
    timeout 120 setpriv --reuid="$ENGINE_USER" --regid="$ENGINE_USER" --init-groups -- \
        "$reopen" --runtime-dir=/run/vase --ready-file="$ready" --wait-s=60 \
        >"$work/reopen.out" 2>&1 &
    epid=$!
    if ! wait_for 60 test -e "$ready"; then
        kill "$epid" 2>/dev/null
        wait "$epid"
        result FAIL "restart-fdstore: the engine did not write its rows (FileDescriptorStoreMax" \
            "$(prop FileDescriptorStoreMax))"
        cat "$work/reopen.out"
        return
    fi
    systemctl restart vased.service
    wait "$epid"
    rc=$?
    if [ "$rc" = 0 ] && grep -q '^reopened: .*block table identical.*K/V identical' "$work/reopen.out" &&
        main_pid_is_not "$pid" && journal_has info 'Arena 0 "default": kept across the restart' &&
        journal_has info 'reopened sequence [0-9]+ on its kept pages'; then
        result PASS restart-fdstore
    else
        result FAIL "restart-fdstore: engine exit $rc, main pid $pid -> $(prop MainPID)"
        cat "$work/reopen.out"
    fi
}

# `vasectl config set --persist` under the unit's hardening (ProtectSystem=strict; the drop-in
# folder is the one path ReadWritePaths= opens): the daemon writes its drop-in, owned by vase, and
# the value outlives a restart, coming from that file.
check_persist() {
    local dropin=/etc/vase/vased.conf.d/90-vasectl.conf out rc after source
    out=$(vasectl config set --persist max_seqs_per_client 777 2>&1)
    rc=$?
    systemctl restart vased.service
    after=$(vasectl config get max_seqs_per_client 2>&1)
    source=$(vasectl config get 2>&1 | awk '$1 == "max_seqs_per_client"')
    if [ "$rc" = 0 ] && grep -qx 'max_seqs_per_client = 777' "$dropin" &&
        [ "$(stat -c %U "$dropin")" = vase ] && [ "$after" = 777 ] &&
        echo "$source" | grep -q "file $dropin"; then
        result PASS persist
    else
        result FAIL "persist: config set --persist exit $rc ($out), after a restart" \
            "'$after' (want 777), source '$source', drop-in: $(ls -l "$dropin" 2>&1)"
    fi
}

# The root has no CUDA library (check_boot.sh binds nothing in), so that the checks below see a
# host without the NVIDIA driver: every file of the packages loads, and a configured CUDA arena
# is refused with the library to install named, while host arenas serve (the other checks).
check_no_cuda() {
    local libs out rc
    libs=$(ldconfig -p | grep -E 'libcuda(rt)?\.so' | head -n 3)
    "$DIR/loads.sh" >"$work/loads.out" 2>&1
    rc=$?
    if [ -n "$libs" ]; then
        result FAIL "no-cuda: the root has CUDA libraries, so it cannot show their absence: $libs"
    elif [ "$rc" = 0 ]; then
        result PASS "no-cuda: no CUDA library in the root; $(grep -c '^ok' "$work/loads.out") files load, import vase works"
    else
        result FAIL "no-cuda: $(grep '^FAIL' "$work/loads.out" | head -n 5 | tr '\n' ' ')"
    fi
    out=$(timeout 30 vased --config=/dev/null --runtime-dir="$(mktemp -d)" --arena=cuda:0 \
        --metrics-address= 2>&1)
    rc=$?
    if [ "$rc" = 1 ] && echo "$out" | grep -q 'libcuda.so.1 cannot be loaded' &&
        echo "$out" | grep -q 'nvidia-driver'; then
        result PASS "cuda-arena-no-driver: refused, naming libcuda.so.1 and the package"
    else
        result FAIL "cuda-arena-no-driver: exit $rc, $(echo "$out" | head -c 400)"
    fi
    # With the toolkit's stub of the driver's library, the same vased's CUDA code gets as far as
    # the driver, which says it is a stub: the package's CUDA arena code is there.
    if [ ! -f "$DIR/cuda-stub/libcuda.so.1" ]; then
        result SKIP "cuda-arena-stub: no stub libcuda.so.1 (this build machine has no CUDA toolkit)"
        return
    fi
    out=$(LD_LIBRARY_PATH=$DIR/cuda-stub timeout 30 vased --config=/dev/null \
        --runtime-dir="$(mktemp -d)" --arena=cuda:0 --metrics-address= 2>&1)
    rc=$?
    if [ "$rc" = 1 ] && echo "$out" | grep -q 'CUDA driver is a stub library'; then
        result PASS "cuda-arena-stub: the CUDA arena code reaches the driver's stub"
    elif [ "$rc" = 1 ] && echo "$out" | grep -q 'built without CUDA'; then
        result FAIL "cuda-arena-stub: the package's vased was built without CUDA, on a machine with the toolkit"
    else
        result FAIL "cuda-arena-stub: exit $rc, $(echo "$out" | head -c 400)"
    fi
}

# libvase-dev's examples, copied out and built by the engine user with pkg-config alone (the
# Makefile libvase-dev ships), shared and with libvase.a; each decodes through the running
# daemon with evictions. The Python package connects too.
check_dev_examples() {
    local ex=/home/$ENGINE_USER/examples why= mode
    rm -rf "$ex" && cp -r /usr/share/doc/libvase-dev/examples "$ex" && chown -R "$ENGINE_USER:" "$ex"
    for mode in shared static; do
        if ! setpriv --reuid="$ENGINE_USER" --regid="$ENGINE_USER" --init-groups -- \
            make -C "$ex" clean all $([ $mode = static ] && echo STATIC=1) >"$work/ex-$mode.out" 2>&1; then
            why+="make ($mode) failed: $(tail -n 5 "$work/ex-$mode.out" | tr '\n' ' '); "
            continue
        fi
        if [ $mode = shared ] && ! ldd "$ex/synthetic_engine" | grep -Eq 'libvase\.so\.2 => (/usr)?/lib/libvase\.so\.2'; then
            why+="the shared build does not take the installed libvase.so.2: $(ldd "$ex/synthetic_engine" | grep libvase); "
        fi
        if [ $mode = static ] && ldd "$ex/synthetic_engine" | grep -q libvase; then
            why+="the static build still needs libvase.so; "
        fi
        ENGINE=$ex/synthetic_engine engine "$ENGINE_USER" "example-$mode" --runtime-dir=/run/vase
        local rc=$?
        if [ "$rc" != 0 ] || ! engine_evicted "example-$mode"; then
            why+="the $mode example engine: exit $rc, $(tail -n 3 "$work/example-$mode.out" | tr '\n' ' '); "
        fi
    done
    if ! setpriv --reuid="$ENGINE_USER" --regid="$ENGINE_USER" --init-groups -- python3 -I -c \
        'import vase
with vase.connect("/run/vase", name="boot-python") as c:
    m = c.register_model(layers=2, q_heads=4, kv_heads=2, head_dim=64, dtype="bf16")
    print("python ok", m)' >"$work/python.out" 2>&1; then
        why+="python3-vase: $(tail -n 3 "$work/python.out" | tr '\n' ' '); "
    fi
    if [ -z "$why" ]; then
        result PASS "dev-examples: built with pkg-config (shared and static) and decoded; python3-vase connected"
    else
        result FAIL "dev-examples: $why"
    fi
}

# Ordered after vased.service, which is active or failed by now; a slow start gets a moment.
wait_for 30 is_active
check_boot_active
check_hardening
if ! useradd --create-home --groups vase "$ENGINE_USER" || ! useradd --create-home "$OTHER_USER"; then
    result FAIL "useradd: cannot create $ENGINE_USER and $OTHER_USER"
fi
check_reload
check_engine_user
check_no_cuda
check_dev_examples
check_journal
check_postinst_restart
check_persist
check_watchdog
check_socket_activation
check_restart_fdstore
if [ "$failed" != 0 ]; then
    journalctl -b --no-pager >"$JOURNAL" 2>&1
fi
echo done >>"$RESULTS"
rm -rf "$work"
exit "$failed"

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# check.sh VASED: checks the files of systemd/ (run by `make check-systemd`).
#
#  1. systemd-analyze verify on vased.service and vased.socket. It needs the ExecStart and
#     ExecReload binaries to exist, so a copy of the unit whose ExecStart names the built VASED
#     and whose ExecReload names the vasectl beside it is verified. verify exits 0 on
#     directives it cannot parse (it only logs "ignoring"), so any line it prints about the
#     unit is a failure too.
#  2. vase.sysusers parses (systemd-sysusers --dry-run) and vase.tmpfiles applies to an empty
#     root that has the vase user (systemd-tmpfiles --root): /etc/vase, /run/vase 0750, and
#     /etc/vase/vased.conf.d owned by vase.
#  3. vased.conf is exactly what the daemon dumps (`make update-vased-conf` rewrites it).
#
# Prints one line per check and exits 1 if any failed.

set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 VASED" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
vased=$(realpath "$1") || exit 1
[ -x "$vased" ] || { echo "$0: $vased is not executable" >&2; exit 1; }
vasectl=$(dirname "$vased")/vasectl
[ -x "$vasectl" ] || { echo "$0: $vasectl is not executable" >&2; exit 1; }
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is missing (Debian: apt-get install systemd)" >&2
        exit 1
    }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vase-systemd-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failed=0

result() { # name status output-file
    if [ "$2" = 0 ]; then
        echo "  PASS    $1"
    else
        echo "  FAIL    $1" >&2
        sed 's/^/          /' "$3" >&2
        failed=1
    fi
}

# 1. The unit.
mkdir "$tmp/unit"
sed -e "s|^ExecStart=/usr/bin/vased |ExecStart=$vased |" \
    -e "s|^ExecReload=/usr/bin/vasectl |ExecReload=$vasectl |" "$here/vased.service" \
    >"$tmp/unit/vased.service"
if ! grep -q "^ExecStart=$vased " "$tmp/unit/vased.service" ||
    ! grep -q "^ExecReload=$vasectl reload " "$tmp/unit/vased.service"; then
    echo "ExecStart=/usr/bin/vased ... or ExecReload=/usr/bin/vasectl reload ... not found in" \
        "vased.service" >"$tmp/verify.out"
    status=1
else
    cp "$here/vased.socket" "$tmp/unit/vased.socket"
    systemd-analyze verify --man=no "$tmp/unit/vased.service" "$tmp/unit/vased.socket" \
        >"$tmp/verify.out" 2>&1
    status=$?
    # Lines about other units (the host's own) are not ours to judge.
    grep -q 'vased\.s' "$tmp/verify.out" && status=1
fi
result "systemd-analyze verify vased.service vased.socket" "$status" "$tmp/verify.out"

# 2. sysusers and tmpfiles. --dry-run reads the host's user database but writes nothing.
systemd-sysusers --dry-run "$here/vase.sysusers" >"$tmp/sysusers.out" 2>&1
status=$?
grep -qi 'ignoring\|invalid\|unknown\|failed' "$tmp/sysusers.out" && status=1
result "systemd-sysusers --dry-run vase.sysusers" "$status" "$tmp/sysusers.out"

# The root gets the vase user first (as at boot, sysusers runs before tmpfiles): /run/vase is
# its.
mkdir -p "$tmp/root/etc"
systemd-sysusers --root="$tmp/root" "$here/vase.sysusers" >"$tmp/sysusers-root.out" 2>&1 ||
    cat "$tmp/sysusers-root.out" >"$tmp/tmpfiles.out"
systemd-tmpfiles --root="$tmp/root" --create "$here/vase.tmpfiles" >>"$tmp/tmpfiles.out" 2>&1
status=$?
[ -s "$tmp/tmpfiles.out" ] && status=1
[ -d "$tmp/root/etc/vase" ] || { echo "/etc/vase was not created" >>"$tmp/tmpfiles.out"; status=1; }
vase_uid=$(awk -F: '$1 == "vase" {print $3}' "$tmp/root/etc/passwd")
[ -n "$vase_uid" ] && [ "$(stat -c %u "$tmp/root/etc/vase/vased.conf.d" 2>/dev/null)" = "$vase_uid" ] ||
    { echo "/etc/vase/vased.conf.d was not created owned by vase" >>"$tmp/tmpfiles.out"; status=1; }
[ "$(stat -c %a "$tmp/root/run/vase" 2>/dev/null)" = 750 ] ||
    { echo "/run/vase was not created with mode 0750" >>"$tmp/tmpfiles.out"; status=1; }
result "systemd-tmpfiles --create vase.tmpfiles" "$status" "$tmp/tmpfiles.out"

# 3. The default configuration. --config=/dev/null: the host's /etc/vase/vased.conf must not
# leak into the comparison.
if env -u VASE_RUNTIME_DIR -u RUNTIME_DIRECTORY "$vased" --config=/dev/null --dump-config \
    >"$tmp/dump.conf" 2>"$tmp/dump.err"; then
    diff -u "$here/vased.conf" "$tmp/dump.conf" >"$tmp/conf.out" 2>&1
    status=$?
    [ "$status" = 0 ] ||
        echo "(make update-vased-conf rewrites systemd/vased.conf)" >>"$tmp/conf.out"
else
    status=1
    { echo "vased --dump-config failed:"; cat "$tmp/dump.err"; } >"$tmp/conf.out"
fi
result "vased.conf matches vased --dump-config" "$status" "$tmp/conf.out"

exit "$failed"

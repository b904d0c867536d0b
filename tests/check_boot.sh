#!/bin/bash
# SPDX-License-Identifier: MIT
#
# check_boot.sh DEB ENGINE [REOPEN_ENGINE]: `make check-boot`, the vase package under a real systemd. As root:
#
#  1. A Debian 12 root (mmdebstrap, variant minbase, with systemd, systemd-sysv, dbus, procps and
#     the package's dependencies, from this machine's apt sources and Acquire settings), cached as
#     a tarball in CHECK_BOOT_CACHE (/var/cache/vase-check-boot) under a name that hashes the
#     package list and the apt configuration: the next run only unpacks it.
#  2. DEB installed there with dpkg (its postinst creates the user vase and enables
#     vased.service), with ENGINE (an engine linked against the installed libvase.so) and
#     REOPEN_ENGINE (examples/reopen_engine), the checks
#     (tests/boot/checks.sh) and the unit that runs them and powers off
#     (tests/boot/vase-boot-check.service).
#  3. The root booted with systemd-nspawn: systemd is PID 1 there; the checks run inside and
#     write their results, which are printed here, one PASS, FAIL or SKIP line per check.
#     Directories the package's programs name as RUNPATH and the root lacks (the CUDA runtime
#     of a CUDA build, /usr/local/cuda/lib64) are bound read-only from this machine, as on a
#     GPU host with the toolkit installed.
#
# On any failure the container's journal is printed. Bounded in time: the whole run by
# CHECK_BOOT_TIMEOUT seconds (900), the boot by CHECK_BOOT_BOOT_TIMEOUT (480); everything it
# made (container, mounts, temporary root) is removed on every exit, interrupts included.
# Exits 0 when every check passed or was skipped, 1 when one failed, 2 when it could not run.

set -u

src=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CHECK_BOOT_CACHE:-/var/cache/vase-check-boot}
TIMEOUT=${CHECK_BOOT_TIMEOUT:-900}
BOOT_TIMEOUT=${CHECK_BOOT_BOOT_TIMEOUT:-480}
INCLUDE=systemd,systemd-sysv,dbus,procps
DIR=usr/local/lib/vase-boot-check

die() {
    echo "check_boot: $*" >&2
    exit 2
}

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 DEB ENGINE [REOPEN_ENGINE] (run by: make check-boot)" >&2
    exit 2
fi
deb=$(realpath -e "$1") || die "no package $1"
engine=$(realpath -e "$2") || die "no engine $2"
reopen=
if [ $# = 3 ]; then
    reopen=$(realpath -e "$3") || die "no engine $3"
fi
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, systemd-nspawn)"
for c in mmdebstrap systemd-nspawn dpkg-deb readelf timeout; do
    command -v "$c" >/dev/null || die "no $c (make check-boot installs systemd-container and mmdebstrap)"
done

start=$SECONDS
deadline=$((SECONDS + TIMEOUT))
machine=vase-check-boot-$$
tmp=
child=
cache_tmp=

# Stops what is still running (nspawn halts its container on the first SIGTERM), unmounts
# whatever is left below the temporary directory, then removes it.
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null
        for _ in $(seq 100); do
            kill -0 "$child" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    [ -z "$cache_tmp" ] || rm -f "$cache_tmp"
    if [ -n "$tmp" ] && [ -d "$tmp" ]; then
        findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r | while read -r m; do
            umount -l "$m"
        done
        rm -rf --one-file-system "$tmp"
    fi
    rmdir "/run/systemd/nspawn/propagate/$machine" 2>/dev/null
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# bounded SECONDS LOG COMMAND...: COMMAND in the background (so that a signal to this script is
# acted on at once), its output in LOG, killed when SECONDS or the overall deadline pass.
bounded() {
    local limit=$1 log=$2 left=$((deadline - SECONDS))
    shift 2
    [ "$left" -lt "$limit" ] && limit=$left
    [ "$limit" -gt 0 ] || return 124
    timeout -k 20 "$limit" "$@" </dev/null >"$log" 2>&1 &
    child=$!
    wait "$child"
    local rc=$?
    child=
    return "$rc"
}

tmp=$(mktemp -d /var/tmp/vase-check-boot.XXXXXX) || die "cannot make a temporary directory"
root=$tmp/root

# ---- 1. the base root, cached ----

# The package's dependencies (first alternatives, without versions) join the included packages.
packages=$({
    echo "$INCLUDE" | tr ',' '\n'
    dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/[[:space:]]//g'
} | grep -v '^$' | sort -u | paste -sd, -)
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && sources+=("$f")
done
[ ${#sources[@]} -gt 0 ] || die "no apt sources in /etc/apt"
# The host's Acquire settings (proxies, snapshot validity) go in with the sources.
aptopts=()
for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/*; do
    [ -f "$f" ] && grep -q '^[[:space:]]*Acquire' "$f" && aptopts+=(--aptopt="$f")
done
key=$({
    echo "bookworm minbase $packages"
    cat "${sources[@]}" "${aptopts[@]#--aptopt=}" /dev/null
} | sha256sum | cut -c1-16)
base=$CACHE/base-$key.tar
if [ ! -s "$base" ]; then
    echo "  ROOT    mmdebstrap bookworm minbase + $packages"
    mkdir -p "$CACHE" || die "cannot make $CACHE"
    cache_tmp=$CACHE/.base-$key.tar.$$
    if ! bounded 600 "$tmp/mmdebstrap.log" mmdebstrap --variant=minbase --format=tar --include="$packages" \
        "${aptopts[@]}" bookworm "$cache_tmp" "${sources[@]}"; then
        tail -n 30 "$tmp/mmdebstrap.log" >&2
        die "mmdebstrap failed"
    fi
    # One base root is kept: the one this package list and apt configuration make.
    rm -f "$CACHE"/base-*.tar
    mv "$cache_tmp" "$base" && cache_tmp=
else
    echo "  ROOT    $base (cached)"
fi
mkdir "$root" && bounded 300 "$tmp/tar.log" tar -C "$root" --numeric-owner --xattrs \
    --xattrs-include='*' -xpf "$base" || die "cannot unpack $base: $(tail -n 3 "$tmp/tar.log")"

# ---- 2. the package, the engine and the checks ----

mkdir -p "$root/$DIR" "$root/etc/systemd/system/multi-user.target.wants" &&
    install -m 644 "$deb" "$root/$DIR/vase.deb" &&
    install -m 755 "$engine" "$root/$DIR/synthetic_engine" &&
    { [ -z "$reopen" ] || install -m 755 "$reopen" "$root/$DIR/reopen_engine"; } &&
    install -m 755 "$src/tests/boot/checks.sh" "$root/$DIR/checks.sh" &&
    install -m 644 "$src/tests/boot/vase-boot-check.service" "$root/etc/systemd/system/" &&
    ln -s ../vase-boot-check.service \
        "$root/etc/systemd/system/multi-user.target.wants/vase-boot-check.service" ||
    die "cannot copy the package, engine and checks into $root"

nspawn=(systemd-nspawn --quiet --register=no --keep-unit --private-network --machine="$machine"
    -D "$root")
echo "  DPKG    $(basename "$deb") in the root"
if ! bounded 300 "$tmp/dpkg.log" "${nspawn[@]}" --pipe -- dpkg -i "/$DIR/vase.deb"; then
    cat "$tmp/dpkg.log" >&2
    die "dpkg -i $(basename "$deb") failed in the root"
fi

# RUNPATH directories of the package's programs and of the engines that the root lacks.
binds=()
dpkg-deb -x "$deb" "$tmp/deb" || die "cannot unpack $deb"
for d in $(find "$tmp/deb" "$engine" $reopen -type f -exec readelf -d {} + 2>/dev/null |
    sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p' | tr ':' '\n' | sort -u); do
    if [ ! -e "$root$d" ] && [ -d "$d" ]; then
        echo "  BIND    $d (read-only, as RUNPATH names it)"
        binds+=(--bind-ro="$d")
    fi
done

# ---- 3. boot; the checks run inside and power off ----

echo "  BOOT    systemd-nspawn --boot (checks: tests/boot/checks.sh)"
bounded "$BOOT_TIMEOUT" "$tmp/console.log" "${nspawn[@]}" "${binds[@]}" --console=pipe --boot
boot_rc=$?
results=$root/var/lib/vase-boot-check/results
pass=0
fail=0
skip=0
if [ -f "$results" ]; then
    while read -r verdict rest; do
        case $verdict in
        PASS) pass=$((pass + 1)) ;;
        FAIL) fail=$((fail + 1)) ;;
        SKIP) skip=$((skip + 1)) ;;
        *) continue ;;
        esac
        echo "$verdict $rest"
    done <"$results"
fi
if ! grep -qx done "$results" 2>/dev/null || [ "$boot_rc" != 0 ]; then
    echo "FAIL boot: the checks did not finish and power off (systemd-nspawn exit $boot_rc)"
    fail=$((fail + 1))
fi
if [ "$fail" != 0 ]; then
    echo "---- the container's journal ----"
    if [ -s "$root/var/lib/vase-boot-check/journal.txt" ]; then
        cat "$root/var/lib/vase-boot-check/journal.txt"
    else
        journalctl -D "$root/var/log/journal" --no-pager 2>&1 || cat "$tmp/console.log"
    fi
    echo "---- end of the container's journal ----"
fi
echo "check-boot: $pass passed, $fail failed, $skip skipped in $((SECONDS - start)) s"
[ "$fail" = 0 ] || exit 1
exit 0

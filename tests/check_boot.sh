#!/bin/bash
# SPDX-License-Identifier: MIT
#
# check_boot.sh DEB_DIR ENGINE [REOPEN_ENGINE] [-- PLAIN_DEB_DIR]: `make check-boot`, vase's
# packages under a real systemd. As root:
#
#  1. A Debian 12 root (mmdebstrap, variant minbase, with systemd, systemd-sysv, dbus, procps, the
#     packages' dependencies, and gcc, make and pkg-config for the -dev package's examples), from
#     this machine's apt sources and Acquire settings, cached as a tarball in CHECK_BOOT_CACHE
#     (/var/cache/vase-check-boot) under a name that hashes the package list and the apt
#     configuration: the next run only unpacks it. It has no CUDA library: nothing of the
#     toolkit or the NVIDIA driver is bound in, as on a host without a GPU.
#  2. With PLAIN_DEB_DIR (the packages of a build without CUDA): those installed there first with
#     dpkg, not booted, every ELF file of them checked with ldd and `import vase` run
#     (tests/boot/loads.sh), then purged.
#  3. The packages of DEB_DIR (every .deb there: vased, libvase2, libvase-dev, python3-vase, vase)
#     installed with dpkg (vased's postinst creates the user vase and enables vased.service), with
#     ENGINE (an engine linked against the installed libvase.so), REOPEN_ENGINE
#     (examples/reopen_engine), the CUDA toolkit's stub libcuda.so.1 when this machine has one,
#     the checks (tests/boot/checks.sh, tests/boot/loads.sh) and the unit that runs them and
#     powers off (tests/boot/vase-boot-check.service).
#  4. The root booted with systemd-nspawn: systemd is PID 1 there; the checks run inside and
#     write their results, which are printed here, one PASS, FAIL or SKIP line per check.
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
INCLUDE=systemd,systemd-sysv,dbus,procps,gcc,libc6-dev,make,pkg-config
DIR=usr/local/lib/vase-boot-check
# vase's own packages, which are installed from the files, never from apt.
OWN='^(vased|libvase[0-9]+|libvase-dev|python3-vase|vase)$'

die() {
    echo "check_boot: $*" >&2
    exit 2
}

usage() {
    echo "usage: $0 DEB_DIR ENGINE [REOPEN_ENGINE] [-- PLAIN_DEB_DIR] (run by: make check-boot)" >&2
    exit 2
}
plain=
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --)
        [ $# = 2 ] || usage
        plain=$(realpath -e "$2") || die "no directory $2"
        shift 2
        ;;
    *)
        args+=("$1")
        shift
        ;;
    esac
done
{ [ ${#args[@]} -ge 2 ] && [ ${#args[@]} -le 3 ]; } || usage
debdir=$(realpath -e "${args[0]}") || die "no directory ${args[0]}"
engine=$(realpath -e "${args[1]}") || die "no engine ${args[1]}"
reopen=
if [ ${#args[@]} = 3 ]; then
    reopen=$(realpath -e "${args[2]}") || die "no engine ${args[2]}"
fi
debs=("$debdir"/*.deb)
[ -e "${debs[0]}" ] || die "no package in $debdir"
plain_debs=()
if [ -n "$plain" ]; then
    plain_debs=("$plain"/*.deb)
    [ -e "${plain_debs[0]}" ] || die "no package in $plain"
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

# The packages' dependencies (first alternatives, without versions; not vase's own) join the
# included packages.
packages=$({
    echo "$INCLUDE" | tr ',' '\n'
    for d in "${debs[@]}" "${plain_debs[@]}"; do
        dpkg-deb -f "$d" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/[[:space:]]//g'
    done
} | grep -v '^$' | grep -Ev "$OWN" | sort -u | paste -sd, -)
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

nspawn=(systemd-nspawn --quiet --register=no --keep-unit --private-network --machine="$machine"
    -D "$root")

# ---- 2. the packages of a build without CUDA: installed, loaded, purged ----

if [ ${#plain_debs[@]} -gt 0 ]; then
    mkdir -p "$root/$DIR/plain" && cp "${plain_debs[@]}" "$root/$DIR/plain/" &&
        install -m 755 "$src/tests/boot/loads.sh" "$root/$DIR/loads.sh" ||
        die "cannot copy the packages of $plain into $root"
    echo "  DPKG    $(cd "$plain" && echo *.deb) in the root (no CUDA), loaded, purged"
    if ! bounded 300 "$tmp/plain.log" "${nspawn[@]}" --pipe -- /bin/sh -c \
        "dpkg -i /$DIR/plain/*.deb && /$DIR/loads.sh && dpkg --purge \$(for d in /$DIR/plain/*.deb; do dpkg-deb -f \$d Package; done)"; then
        cat "$tmp/plain.log" >&2
        echo "FAIL plain-packages: the packages without CUDA do not install, load or purge (above)"
        exit 1
    fi
    sed 's/^/          /' "$tmp/plain.log"
    echo "PASS plain-packages: installed, every ELF file resolved by ldd, import vase, purged"
    rm -rf "${root:?}/$DIR/plain"
fi

# ---- 3. the packages, the engines and the checks ----

stub=
for f in "${CUDA_HOME:-/usr/local/cuda}/lib64/stubs/libcuda.so" /usr/local/cuda/lib64/stubs/libcuda.so; do
    [ -f "$f" ] && stub=$f && break
done
mkdir -p "$root/$DIR/debs" "$root/etc/systemd/system/multi-user.target.wants" &&
    cp "${debs[@]}" "$root/$DIR/debs/" &&
    install -m 755 "$engine" "$root/$DIR/synthetic_engine" &&
    { [ -z "$reopen" ] || install -m 755 "$reopen" "$root/$DIR/reopen_engine"; } &&
    { [ -z "$stub" ] || install -D -m 644 "$stub" "$root/$DIR/cuda-stub/libcuda.so.1"; } &&
    install -m 755 "$src/tests/boot/checks.sh" "$src/tests/boot/loads.sh" "$root/$DIR/" &&
    install -m 644 "$src/tests/boot/vase-boot-check.service" "$root/etc/systemd/system/" &&
    ln -s ../vase-boot-check.service \
        "$root/etc/systemd/system/multi-user.target.wants/vase-boot-check.service" ||
    die "cannot copy the packages, engines and checks into $root"

echo "  DPKG    $(cd "$debdir" && echo *.deb) in the root"
if ! bounded 300 "$tmp/dpkg.log" "${nspawn[@]}" --pipe -- /bin/sh -c "dpkg -i /$DIR/debs/*.deb"; then
    cat "$tmp/dpkg.log" >&2
    die "dpkg -i failed in the root"
fi

# ---- 4. boot; the checks run inside and power off ----

echo "  BOOT    systemd-nspawn --boot (checks: tests/boot/checks.sh)"
bounded "$BOOT_TIMEOUT" "$tmp/console.log" "${nspawn[@]}" --console=pipe --boot
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

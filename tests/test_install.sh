#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# test_install.sh: make install, make uninstall and make deb (run by `make check`, after the
# build; MAKE and BUILD name the make and build directory to use). Nothing is written outside a
# temporary directory and BUILD; the package is built and listed, never installed.
#
#  1. `make install DESTDIR=$tmp/root PREFIX=/usr` writes every file of the list below; the
#     library's SONAME link and dev link resolve to the versioned file, whose SONAME is the link's
#     name; the unit's ExecStart names the installed /usr/bin/vased.
#  2. A program built with `pkg-config --cflags --libs vase` against the staged tree alone
#     (PKG_CONFIG_SYSROOT_DIR, PKG_CONFIG_PATH) runs against the staged libvase.so: it names
#     an error code and fails to connect to a directory without a daemon with -ENOENT.
#  3. `man -l` renders each installed man page (SKIP when scdoc or man is missing).
#  4. A second install keeps an edited /etc/vase/vased.conf; uninstall keeps it too, and
#     removes every other file: after uninstall with the default conf, nothing of ours is left,
#     the empty drop-in directory /etc/vase/vased.conf.d included; one with an operator's
#     drop-in in it stays.
#  5. `make deb` builds a package whose contents (dpkg-deb -c) hold the files of case 1, with
#     /etc/vase/vased.conf as its conffile.
#
# Prints PASS, FAIL or SKIP per case; exits 1 if any failed.

set -u

src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src" || exit 1
MAKE=${MAKE:-make}
BUILD=${BUILD:-build}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vase-install-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
failed=0

result() { # name status [output-file]
    if [ "$2" = 0 ]; then
        echo "  PASS    $1"
    else
        echo "  FAIL    $1" >&2
        [ -n "${3:-}" ] && sed 's/^/          /' "$3" >&2
        failed=1
    fi
}

version=$(sed -n 's/^#define VASED_VERSION "\(.*\)"$/\1/p' daemon/state.h)
[ -n "$version" ] || { echo "$0: no VASED_VERSION in daemon/state.h" >&2; exit 1; }
have_man=0
command -v scdoc >/dev/null && command -v man >/dev/null && have_man=1

# What PREFIX=/usr installs (man pages when scdoc is installed).
expected() {
    printf '%s\n' /usr/bin/vased /usr/bin/vasectl "/usr/lib/libvase.so.$version" \
        /usr/lib/libvase.so.0 /usr/lib/libvase.so /usr/lib/libvase.a /usr/lib/pkgconfig/vase.pc \
        /usr/include/vase/vase.h /usr/include/vase/vase_admin.h /usr/include/vase/vase_types.h \
        /usr/include/vase/vase_errors.h /usr/include/vase/vase.pb-c.h \
        /usr/lib/systemd/system/vased.service /usr/lib/systemd/system/vased.socket \
        /usr/lib/sysusers.d/vase.conf \
        /usr/lib/tmpfiles.d/vase.conf /etc/vase/vased.conf /usr/share/doc/vase/README.md \
        /usr/lib/python3/dist-packages/vase/__init__.py
    if [ "$have_man" = 1 ]; then
        printf '%s\n' /usr/share/man/man8/vased.8 /usr/share/man/man1/vasectl.1 \
            /usr/share/man/man3/libvase.3 /usr/share/man/man5/vased.conf.5
    fi
}

# 1. The installed files.
out=$tmp/install.out
$MAKE --no-print-directory install DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >"$out" 2>&1
status=$?
while read -r f; do
    [ -e "$root$f" ] || { echo "missing: $f" >>"$out"; status=1; }
done < <(expected)
lib=$root/usr/lib
[ "$(readlink "$lib/libvase.so.0")" = "libvase.so.$version" ] ||
    { echo "libvase.so.0 does not link to libvase.so.$version" >>"$out"; status=1; }
[ "$(readlink "$lib/libvase.so")" = libvase.so.0 ] ||
    { echo "libvase.so does not link to libvase.so.0" >>"$out"; status=1; }
readelf -d "$lib/libvase.so.$version" | grep -q 'SONAME.*\[libvase\.so\.0\]' ||
    { echo "the SONAME of libvase.so.$version is not libvase.so.0" >>"$out"; status=1; }
grep -q '^ExecStart=/usr/bin/vased ' "$root/usr/lib/systemd/system/vased.service" ||
    { echo "vased.service: ExecStart does not name /usr/bin/vased" >>"$out"; status=1; }
cmp -s systemd/vased.conf "$root/etc/vase/vased.conf" ||
    { echo "/etc/vase/vased.conf is not systemd/vased.conf" >>"$out"; status=1; }
[ -d "$root/etc/vase/vased.conf.d" ] ||
    { echo "no drop-in directory /etc/vase/vased.conf.d" >>"$out"; status=1; }
result "make install DESTDIR PREFIX=/usr: $(expected | wc -l) files, the drop-in directory" "$status" "$out"

# 2. A program built against the staged tree through pkg-config.
out=$tmp/pkgconfig.out
cat >"$tmp/engine.c" <<'PROG'
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <vase.h>

int main(int argc, char **argv) {
    struct vase_connect_options o = {.runtime_dir = argc > 1 ? argv[1] : NULL, .timeout_ms = 500};
    struct vase_client *c = NULL;
    int r = vase_connect(&o, &c);
    printf("%s / %s\n", vase_strerror(-ENOENT), vase_strerror(r));
    return r == -ENOENT && !c && strcmp(vase_strerror(r), vase_strerror(-ENOENT)) == 0 ? 0 : 1;
}
PROG
mkdir "$tmp/nodaemon"
status=1
flags=$(PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_PATH=$root/usr/lib/pkgconfig \
    pkg-config --cflags --libs vase 2>>"$out") &&
    echo "pkg-config --cflags --libs vase: $flags" >>"$out" &&
    case "$flags" in *"-I$root/usr/include/vase"*"-L$root/usr/lib"*) ;; *) false ;; esac &&
    cc -o "$tmp/engine" "$tmp/engine.c" $flags >>"$out" 2>&1 &&
    LD_LIBRARY_PATH=$lib "$tmp/engine" "$tmp/nodaemon" >>"$out" 2>&1 &&
    LD_LIBRARY_PATH=$lib ldd "$tmp/engine" | grep -q "libvase\.so\.0 => $lib/libvase\.so\.0" &&
    status=0
result "a program built with pkg-config against the staged tree runs" "$status" "$out"

# 3. The man pages.
if [ "$have_man" = 1 ]; then
    out=$tmp/man.out
    status=0
    for p in man8/vased.8 man1/vasectl.1 man3/libvase.3 man5/vased.conf.5; do
        MANWIDTH=80 man -l "$root/usr/share/man/$p" >"$tmp/page" 2>>"$out" || status=1
        # A page that renders has its NAME section and no scdoc or roff markup left over.
        grep -q '^NAME' "$tmp/page" || { echo "$p: no NAME section" >>"$out"; status=1; }
        grep -q '^\.\|\\f' "$tmp/page" && { echo "$p: markup left" >>"$out"; status=1; }
    done
    grep -q 'max_seqs_per_client' <(man -l "$root/usr/share/man/man5/vased.conf.5" 2>/dev/null) ||
        { echo "vased.conf.5 lacks a setting of the table" >>"$out"; status=1; }
    result "man -l renders vased(8), vasectl(1), libvase(3), vased.conf(5)" "$status" "$out"
else
    echo "  SKIP    man pages: no scdoc or no man (make deps installs scdoc and man-db)"
fi

# 4. An edited vased.conf survives install and uninstall; nothing else does.
out=$tmp/conf.out
echo "arena_bytes = 2G # edited" >>"$root/etc/vase/vased.conf"
cp "$root/etc/vase/vased.conf" "$tmp/edited.conf"
status=0
$MAKE --no-print-directory install DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >>"$out" 2>&1 ||
    status=1
cmp -s "$tmp/edited.conf" "$root/etc/vase/vased.conf" ||
    { echo "install overwrote the edited vased.conf" >>"$out"; status=1; }
$MAKE --no-print-directory uninstall DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >>"$out" 2>&1 ||
    status=1
left=$(cd "$root" && find . -type f -o -type l)
[ "$left" = ./etc/vase/vased.conf ] ||
    { printf 'left after uninstall (want only the edited conf):\n%s\n' "$left" >>"$out"; status=1; }
result "an edited vased.conf survives install and uninstall" "$status" "$out"

out=$tmp/uninstall.out
rm -rf "$root"
$MAKE --no-print-directory install DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >"$out" 2>&1 &&
    $MAKE --no-print-directory uninstall DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >>"$out" 2>&1
status=$?
left=$(cd "$root" && find . -type f -o -type l)
[ -z "$left" ] || { printf 'left after uninstall:\n%s\n' "$left" >>"$out"; status=1; }
[ -e "$root/etc/vase/vased.conf.d" ] &&
    { echo "the empty drop-in directory is left after uninstall" >>"$out"; status=1; }
result "make uninstall leaves no file of ours" "$status" "$out"

# An operator's drop-in keeps its directory.
out=$tmp/dropin.out
$MAKE --no-print-directory install DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >"$out" 2>&1 &&
    echo "[vased]" >"$root/etc/vase/vased.conf.d/50-local.conf" &&
    $MAKE --no-print-directory uninstall DESTDIR="$root" PREFIX=/usr BUILD="$BUILD" >>"$out" 2>&1
status=$?
[ -f "$root/etc/vase/vased.conf.d/50-local.conf" ] ||
    { echo "uninstall removed an operator's drop-in" >>"$out"; status=1; }
result "make uninstall keeps a drop-in directory that is not empty" "$status" "$out"

# 5. The package.
out=$tmp/deb.out
deb=$BUILD/vase_${version}_$(dpkg --print-architecture).deb
rm -f "$deb"
$MAKE --no-print-directory deb BUILD="$BUILD" >"$out" 2>&1
status=$?
if [ "$status" = 0 ]; then
    dpkg-deb -c "$deb" | awk '{print substr($6, 2)}' | sed 's| -> .*||' >"$tmp/deb.list"
    while read -r f; do
        case $f in /usr/share/man/*) f=$f.gz ;; esac
        grep -qx "$f" "$tmp/deb.list" || { echo "not in the package: $f" >>"$out"; status=1; }
    done < <(expected)
    [ "$(dpkg-deb -f "$deb" Version)" = "$version" ] ||
        { echo "the package's version is not $version" >>"$out"; status=1; }
    [ "$(dpkg-deb -I "$deb" conffiles)" = /etc/vase/vased.conf ] ||
        { echo "conffiles is not /etc/vase/vased.conf" >>"$out"; status=1; }
    dpkg-deb -c "$deb" | awk '$2 != "root/root" {bad = 1; print "not root-owned: " $0} END {exit bad}' \
        >>"$out" || status=1
fi
result "make deb: dpkg-deb -c lists the installed files, conffile vased.conf" "$status" "$out"

exit "$failed"

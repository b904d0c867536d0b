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
#  5. `make deb` builds the packages (vased, libvase2, libvase-dev, python3-vase, vase) whose
#     contents (dpkg-deb -c) hold the files of case 1, each file in its package, vased's conffile
#     /etc/vase/vased.conf; every library an ELF file needs is held by a package its Depends
#     name, and none is the CUDA runtime; the units' Documentation= files are in vased's package.
#  6. With CUDA: the packaged vased's CUDA arena reaches the toolkit's stub of the driver.
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
        /usr/lib/libvase.so.2 /usr/lib/libvase.so /usr/lib/libvase.a /usr/lib/pkgconfig/vase.pc \
        /usr/include/vase/vase.h /usr/include/vase/vase_admin.h /usr/include/vase/vase_types.h \
        /usr/include/vase/vase_errors.h /usr/include/vase/vase.pb-c.h \
        /usr/lib/systemd/system/vased.service /usr/lib/systemd/system/vased.socket \
        /usr/lib/sysusers.d/vase.conf \
        /usr/lib/tmpfiles.d/vase.conf /etc/vase/vased.conf /usr/share/doc/vase/README.md \
        /usr/lib/python3/dist-packages/vase/__init__.py \
        /usr/lib/python3/dist-packages/vase/_vase.abi3.so
    # The documentation beside the README, every file of the tree's docs/.
    printf '/usr/share/doc/vase/%s\n' docs/*.md
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
[ "$(readlink "$lib/libvase.so.2")" = "libvase.so.$version" ] ||
    { echo "libvase.so.2 does not link to libvase.so.$version" >>"$out"; status=1; }
[ "$(readlink "$lib/libvase.so")" = libvase.so.2 ] ||
    { echo "libvase.so does not link to libvase.so.2" >>"$out"; status=1; }
readelf -d "$lib/libvase.so.$version" | grep -q 'SONAME.*\[libvase\.so\.2\]' ||
    { echo "the SONAME of libvase.so.$version is not libvase.so.2" >>"$out"; status=1; }
grep -q '^ExecStart=/usr/bin/vased ' "$root/usr/lib/systemd/system/vased.service" ||
    { echo "vased.service: ExecStart does not name /usr/bin/vased" >>"$out"; status=1; }
grep -q '^ExecReload=/usr/bin/vasectl reload ' "$root/usr/lib/systemd/system/vased.service" ||
    { echo "vased.service: ExecReload does not name /usr/bin/vasectl" >>"$out"; status=1; }
cmp -s systemd/vased.conf "$root/etc/vase/vased.conf" ||
    { echo "/etc/vase/vased.conf is not systemd/vased.conf" >>"$out"; status=1; }
[ -d "$root/etc/vase/vased.conf.d" ] ||
    { echo "no drop-in directory /etc/vase/vased.conf.d" >>"$out"; status=1; }
[ -f docs/ARCHITECTURE.md ] && [ -f docs/metrics.md ] ||
    { echo "the tree has no docs/ARCHITECTURE.md or docs/metrics.md" >>"$out"; status=1; }
for f in README.md docs/*.md; do
    cmp -s "$f" "$root/usr/share/doc/vase/$f" ||
        { echo "/usr/share/doc/vase/$f is not the tree's $f" >>"$out"; status=1; }
done
[ "$(cd "$root/usr/share/doc/vase" && find . -type f | sort)" = \
    "$( (echo ./README.md; printf './%s\n' docs/*.md) | sort)" ] ||
    { echo "/usr/share/doc/vase holds other files than README.md and docs/*.md" >>"$out"; status=1; }
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
    LD_LIBRARY_PATH=$lib ldd "$tmp/engine" | grep -q "libvase\.so\.2 => $lib/libvase\.so\.2" &&
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

# 5. The packages: make deb builds what it packages (the Python extension from this build), split
# as Debian splits a library (vased, libvase2, libvase-dev, python3-vase, and vase depending on
# them); every installed file is in one of them, each in the package it belongs to; and every
# library that an ELF file of a package needs comes from a Debian package that its Depends names
# (or from vase's own package it names), and none is the CUDA runtime or driver.
out=$tmp/deb.out
debdir=$BUILD/debs
arch=$(dpkg --print-architecture)
rm -rf "$debdir"
$MAKE --no-print-directory deb BUILD="$BUILD" >"$out" 2>&1
status=$?
# owner PATH PACKAGE: PATH (as make install writes it) is in PACKAGE's file list.
owner() {
    grep -qx "$1" "$tmp/deb-$2.list" || { echo "$1 is not in $2" >>"$out"; status=1; }
}
if [ "$status" = 0 ]; then
    : >"$tmp/deb.list"
    for p in vased libvase2 libvase-dev python3-vase vase; do
        d=$debdir/${p}_${version}_$arch.deb
        if [ ! -f "$d" ]; then
            echo "no package $d" >>"$out"
            status=1
            : >"$tmp/deb-$p.list"
            continue
        fi
        dpkg-deb -c "$d" | awk '{print substr($6, 2)}' | sed 's| -> .*||' >"$tmp/deb-$p.list"
        cat "$tmp/deb-$p.list" >>"$tmp/deb.list"
        [ "$(dpkg-deb -f "$d" Version)" = "$version" ] ||
            { echo "$p's version is not $version" >>"$out"; status=1; }
        dpkg-deb -c "$d" | awk '$2 != "root/root" {bad = 1; print "not root-owned: " $0} END {exit bad}' \
            >>"$out" || status=1
        grep -qx "/usr/share/doc/$p/copyright" "$tmp/deb-$p.list" ||
            { echo "$p has no copyright file" >>"$out"; status=1; }
    done
    while read -r f; do
        case $f in
        /usr/share/man/*) f=$f.gz ;;
        /usr/share/doc/vase/*) f=/usr/share/doc/vased/${f#/usr/share/doc/vase/} ;;
        esac
        grep -qx "$f" "$tmp/deb.list" || { echo "not in the packages: $f" >>"$out"; status=1; }
    done < <(expected)
    owner /usr/bin/vased vased
    owner /usr/bin/vasectl vased
    owner /usr/lib/systemd/system/vased.service vased
    owner "/usr/lib/libvase.so.$version" libvase2
    owner /usr/lib/libvase.so.2 libvase2
    owner /usr/lib/libvase.so libvase-dev
    owner /usr/lib/libvase.a libvase-dev
    owner /usr/lib/pkgconfig/vase.pc libvase-dev
    owner /usr/include/vase/vase.h libvase-dev
    owner /usr/share/doc/libvase-dev/examples/Makefile libvase-dev
    owner /usr/share/doc/libvase-dev/examples/synthetic_engine.c libvase-dev
    owner /usr/lib/python3/dist-packages/vase/_vase.abi3.so python3-vase
    [ "$(dpkg-deb -I "$debdir/vased_${version}_$arch.deb" conffiles 2>&1)" = /etc/vase/vased.conf ] ||
        { echo "vased's conffiles is not /etc/vase/vased.conf" >>"$out"; status=1; }
    deps=$(dpkg-deb -f "$debdir/libvase-dev_${version}_$arch.deb" Depends)
    for want in "libvase2 (= $version)" libzmq3-dev libprotobuf-c-dev; do
        case ", $deps," in *", $want,"*) ;; *)
            echo "libvase-dev's Depends ($deps) lack $want (vase.pc requires it)" >>"$out"
            status=1
            ;;
        esac
    done
    # Every NEEDED library of every ELF file, resolved on this machine to the Debian package
    # that holds it, against the package's Depends.
    for p in vased libvase2 python3-vase; do
        x=$tmp/x-$p
        mkdir -p "$x" && dpkg-deb -x "$debdir/${p}_${version}_$arch.deb" "$x" || { status=1; continue; }
        # The units' Documentation= files are in the package.
        for u in "$x"/usr/lib/systemd/system/*; do
            [ -f "$u" ] || continue
            for doc in $(sed -n 's/^Documentation=//p' "$u" | tr ' ' '\n' | sed -n 's|^file:||p'); do
                [ -f "$x$doc" ] || { echo "${u#"$x"}: Documentation=$doc is not in $p" >>"$out"; status=1; }
            done
        done
        depends=" $(dpkg-deb -f "$debdir/${p}_${version}_$arch.deb" Depends | tr ',|' '\n\n' |
            sed 's/(.*)//; s/[[:space:]]//g' | grep -v '^$' | tr '\n' ' ')"
        while read -r f; do
            head -c 4 "$f" | grep -q '^.ELF' || continue
            for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
                case $so in libcuda*.so* | libcudart*)
                    echo "${f#"$x"} needs $so: the CUDA runtime is not a dependency" >>"$out"
                    status=1
                    continue
                    ;;
                esac
                path=$(ldconfig -p | awk -v so="$so" '$1 == so && /x86-64|64bit/ {print $NF; exit}')
                [ -n "$path" ] || path=$(ldconfig -p | awk -v so="$so" '$1 == so {print $NF; exit}')
                pkg=
                for q in "$path" "$(realpath -e "$path" 2>/dev/null)" "/usr$path" "${path#/usr}"; do
                    [ -n "$q" ] || continue
                    pkg=$(dpkg -S "$q" 2>/dev/null | head -n 1 | cut -d: -f1) && [ -n "$pkg" ] && break
                done
                if [ -z "$pkg" ]; then
                    echo "${f#"$x"} ($p) needs $so, which no installed Debian package holds" >>"$out"
                    status=1
                elif [[ "$depends" != *" $pkg "* ]]; then
                    echo "${f#"$x"} ($p) needs $so of $pkg, which $p's Depends ($depends) do not name" >>"$out"
                    status=1
                fi
            done
        done < <(find "$x" -type f)
    done
fi
result "make deb: vased, libvase2, libvase-dev, python3-vase and vase hold the installed files; every library an ELF file needs is in its package's Depends" "$status" "$out"

# 6. With CUDA built in: the packaged vased's CUDA arena code runs where the toolkit's stub
# libcuda.so.1 stands in for the driver (it says the driver is a stub), and needs no CUDA runtime
# library to start.
out=$tmp/cuda.out
stub=${CUDA_HOME:-/usr/local/cuda}/lib64/stubs/libcuda.so
x=$tmp/x-vased/usr/bin/vased
if [ ! -x "$x" ]; then
    result "the packaged vased's CUDA arena" 1 "$out"
else
    "$x" --config=/dev/null --runtime-dir="$tmp" --arena=cuda:0 --metrics-address= >"$out" 2>&1
    if grep -q 'built without CUDA' "$out"; then
        echo "  SKIP    the packaged vased's CUDA arena: this build has no CUDA (USE_CUDA=0, or no nvcc)"
    elif [ ! -f "$stub" ]; then
        echo "  SKIP    the packaged vased's CUDA arena: no stub libcuda.so at $stub"
    else
        mkdir -p "$tmp/stub" && cp "$stub" "$tmp/stub/libcuda.so.1"
        LD_LIBRARY_PATH=$tmp/stub "$x" --config=/dev/null --runtime-dir="$tmp" --arena=cuda:0 \
            --metrics-address= >>"$out" 2>&1
        rc=$?
        status=0
        [ "$rc" = 1 ] && grep -q 'CUDA driver is a stub library' "$out" || status=1
        result "the packaged vased's CUDA arena reaches the driver's stub, with no CUDA runtime library" "$status" "$out"
    fi
fi

exit "$failed"

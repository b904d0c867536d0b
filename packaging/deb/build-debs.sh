#!/bin/bash
# SPDX-License-Identifier: MIT
#
# build-debs.sh STAGE OUT: splits the tree that `make install PREFIX=/usr DESTDIR=STAGE` wrote into
# vase's Debian packages and builds them into OUT, as `make deb` does (the Makefile passes the
# environment below). The packages, as Debian splits a library and its daemon:
#
#   vased         vased and vasectl, the units, the sysusers and tmpfiles files, /etc/vase/vased.conf
#                 (a conffile), vased(8), vasectl(1), vased.conf(5), the README and docs/
#   libvaseN      the shared library libvase.so.N (N: SOVERSION), with its shlibs file
#   libvase-dev   the headers, libvase.so, libvase.a, vase.pc, libvase(3), and the example engines'
#                 sources with a Makefile that builds them with pkg-config alone; its Depends bring
#                 the -dev packages that vase.pc requires
#   python3-vase  the Python package vase (its extension has libvase linked in)
#   vase          depends on the four, so that an upgrade of the single package of earlier
#                 releases installs them; each of them Replaces and Breaks that package
#
# Every package's library dependencies come from dpkg-shlibdeps on its ELF files, so that each
# shared object's libraries are named by its package's Depends (tests/test_install.sh checks that
# against what the files need). Files are owned by root. A file of STAGE that no package claims is
# an error, as is a package left empty.
#
# Environment: VERSION, ARCH, MAINTAINER, DATE (seconds since the epoch, for the changelogs),
# SOVERSION, EXAMPLES (the example engines' sources), EXAMPLES_MK (their Makefile), LICENSE,
# PACKAGING (packaging/deb), DEV_DEPENDS (more Depends of libvase-dev).

set -euo pipefail

if [ $# != 2 ]; then
    echo "usage: $0 STAGE OUT (run by: make deb)" >&2
    exit 2
fi
stage=$(realpath -e "$1")
out=$2
for v in VERSION ARCH MAINTAINER DATE SOVERSION EXAMPLES EXAMPLES_MK LICENSE PACKAGING; do
    [ -n "${!v:-}" ] || { echo "$0: $v is not set" >&2; exit 2; }
done
DEV_DEPENDS=${DEV_DEPENDS:-}
lib=libvase$SOVERSION
work=$(mktemp -d "${TMPDIR:-/tmp}/vase-deb-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

die() {
    echo "build-debs: $*" >&2
    exit 1
}

# take PKG PATH...: moves each PATH (relative to STAGE; a directory with its contents) into PKG's
# root. A path that is not in STAGE is an error.
take() {
    local pkg=$1 p
    shift
    for p in "$@"; do
        [ -e "$stage/$p" ] || [ -L "$stage/$p" ] || die "$p is not in the staged tree"
        mkdir -p "$work/$pkg/$(dirname "$p")"
        mv "$stage/$p" "$work/$pkg/$p"
    done
}

# The copyright file and changelog that Debian's policy wants in every package's doc directory.
docs() {
    local pkg=$1 d=$work/$1/usr/share/doc/$1
    mkdir -p "$d"
    install -m 644 "$LICENSE" "$d/copyright"
    printf '%s (%s) unstable; urgency=medium\n\n  * Release %s.\n\n -- %s  %s\n' \
        "$pkg" "$VERSION" "$VERSION" "$MAINTAINER" "$(date -R -u -d "@$DATE")" | gzip -9n >"$d/changelog.gz"
}

# shlibdeps PKG: the library packages that PKG's ELF files need, as dpkg-shlibdeps words them
shlibdeps() {
    local pkg=$1 files
    mapfile -t files < <(find "$work/$pkg" -type f \( -perm -u+x -o -name '*.so*' \) \
        -exec sh -c 'head -c 4 "$1" | grep -q "^.ELF"' _ {} \; -print | sort)
    [ ${#files[@]} -gt 0 ] || return 0
    mkdir -p "$work/shl/debian"
    printf 'Source: vase\n\nPackage: %s\nArchitecture: any\n' "$pkg" >"$work/shl/debian/control"
    if ! (cd "$work/shl" && dpkg-shlibdeps -O "${files[@]}") >"$work/shl/out" 2>"$work/shl/err"; then
        cat "$work/shl/err" >&2
        die "dpkg-shlibdeps failed for $pkg"
    fi
    sed -n 's/^shlibs:Depends=//p' "$work/shl/out"
}

# build PKG SECTION DEPENDS SUMMARY DESCRIPTION [FIELD: VALUE]...: writes PKG's control file,
# its md5sums, and builds OUT/PKG_VERSION_ARCH.deb.
build() {
    local pkg=$1 section=$2 depends=$3 summary=$4 description=$5 root=$work/$1
    shift 5
    mkdir -p "$root/DEBIAN"
    {
        echo "Package: $pkg"
        echo "Version: $VERSION"
        echo "Architecture: $ARCH"
        echo "Maintainer: $MAINTAINER"
        echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
        [ -z "$depends" ] || echo "Depends: $depends"
        [ "$pkg" = vase ] || echo "Replaces: vase (<< $VERSION)"
        [ "$pkg" = vase ] || echo "Breaks: vase (<< $VERSION)"
        for f in "$@"; do echo "$f"; done
        echo "Section: $section"
        echo "Priority: optional"
        echo "Description: $summary"
        echo "$description" | fold -s -w 72 | sed 's/ *$//; s/^/ /'
    } >"$root/DEBIAN/control"
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | sort | xargs -r md5sum) \
        >"$root/DEBIAN/md5sums"
    dpkg-deb --build --root-owner-group "$root" "$out/${pkg}_${VERSION}_${ARCH}.deb" >/dev/null
    echo "  DPKG    $out/${pkg}_${VERSION}_${ARCH}.deb"
}

# ---- the files, by package ----

take "$lib" "usr/lib/libvase.so.$VERSION" "usr/lib/libvase.so.$SOVERSION"
take libvase-dev usr/include/vase usr/lib/libvase.so usr/lib/libvase.a usr/lib/pkgconfig/vase.pc
[ -d "$stage/usr/share/man/man3" ] && take libvase-dev usr/share/man/man3
take python3-vase usr/lib/python3
take vased usr/bin usr/lib/systemd usr/lib/sysusers.d usr/lib/tmpfiles.d etc/vase
for s in 1 5 8; do
    [ -d "$stage/usr/share/man/man$s" ] && take vased "usr/share/man/man$s"
done
# The README and docs/ as make install staged them, in vased's documents.
[ -f "$stage/usr/share/doc/vase/README.md" ] || die "usr/share/doc/vase/README.md is not in the staged tree"
mkdir -p "$work/vased/usr/share/doc/vased"
mv "$stage"/usr/share/doc/vase/* "$work/vased/usr/share/doc/vased/"
# The units name the README where make install puts it; in the package it is vased's.
sed -i 's|file:/usr/share/doc/vase/|file:/usr/share/doc/vased/|' \
    "$work"/vased/usr/lib/systemd/system/vased.service "$work"/vased/usr/lib/systemd/system/vased.socket
find "$stage" -depth -type d -empty -delete
left=$(cd "$stage" 2>/dev/null && find . ! -type d | sort) || left=
[ -z "$left" ] || die "files of the staged tree no package claims: $left"

if [ -d "$work/vased/usr/share/man" ]; then gzip -9n "$work"/vased/usr/share/man/man*/*; fi
if [ -d "$work/libvase-dev/usr/share/man" ]; then gzip -9n "$work"/libvase-dev/usr/share/man/man*/*; fi
strip --remove-section=.comment --remove-section=.note "$work"/vased/usr/bin/*
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
    "$work/$lib/usr/lib/libvase.so.$VERSION" "$work"/python3-vase/usr/lib/python3/dist-packages/vase/*.so

for p in vased "$lib" libvase-dev python3-vase vase; do docs "$p"; done
ex=$work/libvase-dev/usr/share/doc/libvase-dev/examples
mkdir -p "$ex"
# shellcheck disable=SC2086
install -m 644 $EXAMPLES "$ex/"
install -m 644 "$EXAMPLES_MK" "$ex/Makefile"

# vased: the daemon's user, units and conffile.
install -d "$work/vased/DEBIAN"
install -m 755 "$PACKAGING/postinst" "$PACKAGING/prerm" "$PACKAGING/postrm" "$work/vased/DEBIAN/"
echo /etc/vase/vased.conf >"$work/vased/DEBIAN/conffiles"
# libvaseN: ldconfig, and what programs linked against it depend on.
install -d "$work/$lib/DEBIAN"
echo 'activate-noawait ldconfig' >"$work/$lib/DEBIAN/triggers"
echo "libvase $SOVERSION $lib (>= $VERSION)" >"$work/$lib/DEBIAN/shlibs"

# vased's BLAS is the pthread OpenBLAS by RPATH (the Makefile's BLAS_LIB), which dpkg-shlibdeps
# names only through the libopenblas0 alternatives; systemd runs it.
vased_libs=$(shlibdeps vased)
lib_libs=$(shlibdeps "$lib")
python_libs=$(shlibdeps python3-vase)
build vased admin "$vased_libs, libopenblas0-pthread, systemd" \
    "KV-cache eviction daemon for LLM inference engines" \
    "vased owns the KV-cache arenas of the inference engines of a host (host memory or GPU memory) and computes which tokens each sequence keeps within its budget (VaSE and baseline policies). This package holds vased with its systemd units and the vase user, the tool vasectl and the manual pages. CUDA arenas need the NVIDIA driver; host arenas need nothing more."
build "$lib" libs "$lib_libs" "client library of the vase KV-cache daemon" \
    "libvase is the library inference engines link to use the KV-cache arenas of vased: it maps the arenas, opens sequences within a budget, sends their attention statistics and applies the daemon's eviction plans. This package holds the shared library."
build libvase-dev libdevel "$lib (= $VERSION), libzmq3-dev, libprotobuf-c-dev${DEV_DEPENDS:+, $DEV_DEPENDS}" \
    "client library of the vase KV-cache daemon (development files)" \
    "libvase is the library inference engines link to use the KV-cache arenas of vased. This package holds the headers, the static library, the pkg-config file vase.pc, libvase(3), and the example engines' sources with a Makefile that builds them with pkg-config alone." \
    "Recommends: pkg-config"
build python3-vase python "$python_libs, python3 (>= 3.11)" \
    "Python binding of the vase KV-cache client library" \
    "The Python package vase: a client of vased with the arenas' pages as DLPack tensors (torch.from_dlpack), sequences, statistics and eviction plans. libvase is linked into its extension, on CPython's limited API."
build vase metapackages "vased (= $VERSION), $lib (= $VERSION), libvase-dev (= $VERSION), python3-vase (= $VERSION)" \
    "KV-cache eviction daemon for LLM inference engines (all of it)" \
    "This package depends on vased, $lib, libvase-dev and python3-vase: everything the single vase package of earlier releases held."

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# test_setup.sh: what the Makefile does before it compiles anything (run by `make check`). Each
# case runs make on a copy of the Makefile in a temporary directory, with a PATH that holds only
# the tools the Makefile calls and fakes of dpkg-query, apt-get and (case 2) sudo, so nothing is
# installed for real:
#
#  1. A user who is not root and has no sudo, on a machine that lacks two packages: make stops
#     with one line that can be pasted into a root shell and names both packages, says nothing
#     about installing, and runs no apt-get. Run as nobody when the test itself runs as root.
#  2. The first build on a machine without a compiler (the compiler is one of the packages the
#     Makefile installs): the compile that follows the installation includes the pthread
#     OpenBLAS of the compiler's multiarch directory, not a path computed before it existed.
#  3. A compiler whose multiarch directories hold no pthread OpenBLAS: make stops with an error
#     that says so, and writes no configuration.
#
# Prints PASS or FAIL per case, with make's output on failure; exits 1 if any failed.

set -u

src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vase-setup-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
failed=0

real_cc=$(type -P cc) || { echo "$0: no cc on PATH" >&2; exit 1; }
real_as=$(type -P as) || { echo "$0: no as on PATH" >&2; exit 1; }
multiarch=$("$real_cc" -print-multiarch)
# What make, its recipes and the fakes below run.
tools="make sh true cksum cut find mkdir grep id env touch mv rm cat sed ln"

# new_case NAME: a directory with a copy of the Makefile (src/), a state directory for the fakes
# (state/: `missing` lists the packages dpkg-query says are not installed; the fakes log their
# calls there) and a bin/ of the tools and fakes. Everything is writable by anyone, so that
# nobody can run in it.
new_case() {
    c=$tmp/$1
    mkdir -p "$c/src/kernels" "$c/state" "$c/bin" "$c/build"
    cp "$src/Makefile" "$c/src/"
    : >"$c/state/missing"
    for t in $tools; do
        p=$(type -P "$t") || { echo "$0: $t not found" >&2; exit 1; }
        ln -s "$p" "$c/bin/$t"
    done
    cat >"$c/bin/dpkg-query" <<EOF
#!/bin/sh
# dpkg-query -W -f=FORMAT PACKAGE
for pkg; do :; done
echo "\$(id -u) \$pkg" >>"$c/state/dpkg-query.log"
if grep -qx "\$pkg" "$c/state/missing"; then
    echo "dpkg-query: no packages found matching \$pkg" >&2
    exit 1
fi
echo "install ok installed"
EOF
    # Installing gcc puts the real compiler, and the assembler it runs, on the PATH.
    cat >"$c/bin/apt-get" <<EOF
#!/bin/sh
echo "apt-get \$*" >>"$c/state/apt-get.log"
[ "\$1" = install ] || exit 0
for a; do
    case \$a in
    -* | install) ;;
    *)
        sed -i "/^\$a\\\$/d" "$c/state/missing"
        [ "\$a" = gcc ] && ln -sf "$real_cc" "$c/bin/cc" && ln -sf "$real_as" "$c/bin/as"
        ;;
    esac
done
exit 0
EOF
    chmod 755 "$c/bin/dpkg-query" "$c/bin/apt-get"
    chmod -R a+rwX "$c"
}

# run_make USER ARG...: make in the case's src/ with nothing but its bin/ on the PATH; output
# in $c/out. USER is "self", or "unprivileged" (nobody when root, else self).
run_make() {
    local who=$1
    shift
    local env=(env -i PATH="$c/bin" LANG=C)
    if [ "$who" = unprivileged ] && [ "$(id -u)" = 0 ]; then
        (cd "$c/src" && setpriv --reuid=65534 --regid=65534 --clear-groups -- \
            "${env[@]}" make "$@") >"$c/out" 2>&1
    else
        (cd "$c/src" && "${env[@]}" make "$@") >"$c/out" 2>&1
    fi
}

result() { # name status
    if [ "$2" = 0 ]; then
        echo "  PASS    $1"
    else
        echo "  FAIL    $1" >&2
        sed 's/^/          /' "$c/out" >&2
        failed=1
    fi
}

# ---- 1. Not root, no sudo, two packages missing.
new_case nonroot
printf 'libcmocka-dev\nvalgrind\n' >"$c/state/missing"
run_make unprivileged BUILD="$c/build" USE_CUDA=0 deps
status=$?
ok=0
want="apt-get install -y libcmocka-dev valgrind"
{
    [ "$status" != 0 ] || { echo "(make exited 0)"; ok=1; }
    if grep -qi 'installing' "$c/out"; then echo "(says it is installing)"; ok=1; fi
    if [ "$(grep -c 'libcmocka-dev\|valgrind' "$c/out")" != 1 ]; then
        echo "(the packages are not named on exactly one line)"
        ok=1
    fi
    line=$(grep 'apt-get install' "$c/out")
    if [ "${line#error: missing Debian packages; as root run: }" != "$want" ]; then
        echo "(want the line: error: missing Debian packages; as root run: $want)"
        ok=1
    fi
    if [ -e "$c/state/apt-get.log" ]; then echo "(apt-get ran)"; ok=1; fi
    if ! [ -s "$c/state/dpkg-query.log" ] || grep -q '^0 ' "$c/state/dpkg-query.log"; then
        echo "(dpkg-query was not asked by an unprivileged user)"
        ok=1
    fi
} >>"$c/out"
result "not root, no sudo: one line to paste, nothing installed" "$ok"

# ---- 2. No compiler yet: it comes with the packages, and the paths are its.
new_case fresh
echo gcc >"$c/state/missing"
printf '#!/bin/sh\nexec "$@"\n' >"$c/bin/sudo"
chmod 755 "$c/bin/sudo"
cat >"$c/src/kernels/probe.c" <<'EOF'
#include <cblas.h>
int vase_probe(void);
int vase_probe(void) { return CblasRowMajor; }
EOF
run_make self V=1 BUILD="$c/build" USE_CUDA=0 "$c/build/kernels/probe.o"
status=$?
ok=0
{
    [ "$status" = 0 ] || { echo "(make failed)"; ok=1; }
    grep -q '^  APT     installing: gcc$' "$c/out" || { echo "(gcc was not installed)"; ok=1; }
    inc="-I/usr/include/$multiarch/openblas-pthread"
    if ! grep -- ' -c -o .*probe\.o' "$c/out" | grep -q -- "$inc "; then
        echo "(the compile does not include $inc)"
        ok=1
    fi
} >>"$c/out"
result "first build without a compiler: the pthread OpenBLAS of $multiarch" "$ok"

# ---- 3. No pthread OpenBLAS where the compiler's multiarch says.
new_case noblas
printf '#!/bin/sh\n[ "$1" = -print-multiarch ] && echo vase-none-linux-gnu\nexit 0\n' \
    >"$c/bin/cc-none"
chmod 755 "$c/bin/cc-none"
run_make self BUILD="$c/build" USE_CUDA=0 CC=cc-none
status=$?
ok=0
{
    [ "$status" != 0 ] || { echo "(make exited 0)"; ok=1; }
    grep -q '^error: no pthread OpenBLAS .*/usr/include/vase-none-linux-gnu/openblas-pthread' \
        "$c/out" || { echo "(no error naming the missing pthread OpenBLAS)"; ok=1; }
    if [ -e "$c/build/config.mk" ]; then echo "(config.mk was written)"; ok=1; fi
} >>"$c/out"
result "no pthread OpenBLAS: refused" "$ok"

exit "$failed"

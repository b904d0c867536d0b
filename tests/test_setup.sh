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
#  4. The build's dependencies found by the compiler while dpkg says packages are missing (a
#     machine whose libraries did not come from apt): nothing is installed, dpkg is not asked.
#  5. DEPS_PREFIX=DIR, packages unpacked into DIR (fakes: empty headers and archives, a protoc-c
#     that only answers --version) on a machine where dpkg says everything is missing: nothing is
#     installed, dpkg is not asked, and the compile takes the headers and the pthread OpenBLAS of
#     DIR before the machine's own.
#  6. DEPS_PREFIX naming an empty folder: make stops with an error that names it, and installs
#     nothing.
#  7. A build flag changed in an existing build (OPT, KERNEL_OPT, SANITIZE with BUILD given): the
#     object is compiled again, and not when the flags are the same as last time.
#  8. The README's package tables (Set-up) list exactly the packages of DEB_PACKAGES and of
#     BOOT_DEB_PACKAGES, as `make print-deb-packages` prints them, which installs nothing.
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
tools="make sh true cksum cut find mkdir grep id env touch mv rm cat sed ln tr tail printf"

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

# with_compiler: the real compiler, assembler and linker on the case's PATH, and a kernel source
# that includes the pthread OpenBLAS header and one of the libraries' headers.
with_compiler() {
    local t
    for t in cc as ld; do
        ln -sf "$(type -P $t)" "$c/bin/$t" || { echo "$0: no $t on PATH" >&2; exit 1; }
    done
    printf '%s\n' '#include <cblas.h>' '#include <zmq.h>' 'int vase_probe(void);' \
        'int vase_probe(void) { return CblasRowMajor; }' >"$c/src/kernels/probe.c"
}

# no_packaging: appended to $c/out, 1 if dpkg-query or apt-get ran.
no_packaging() {
    local bad=0
    if [ -e "$c/state/apt-get.log" ]; then echo "(apt-get ran)"; bad=1; fi
    if [ -e "$c/state/dpkg-query.log" ]; then echo "(dpkg-query was asked)"; bad=1; fi
    return $bad
}

# ---- 4. Dependencies found by the compiler, though dpkg says two packages are missing.
new_case found
printf 'libcmocka-dev\nvalgrind\n' >"$c/state/missing"
with_compiler
ln -sf "$(type -P protoc-c)" "$c/bin/protoc-c" || { echo "$0: no protoc-c on PATH" >&2; exit 1; }
run_make self BUILD="$c/build" USE_CUDA=0 "$c/build/kernels/probe.o"
status=$?
ok=0
{
    [ "$status" = 0 ] || { echo "(make failed)"; ok=1; }
    grep -q '^  DEPS    found: nothing to install$' "$c/out" || { echo "(no DEPS found line)"; ok=1; }
    no_packaging || ok=1
} >>"$c/out"
result "dependencies found by the compiler: nothing installed, dpkg not asked" "$ok"

# ---- 5. DEPS_PREFIX: the unpacked packages, and nothing installed.
new_case prefix
prefix=$c/deps
printf 'gcc\nlibzmq3-dev\nlibcmocka-dev\nlibopenblas-pthread-dev\nprotobuf-c-compiler\n' \
    >"$c/state/missing"
with_compiler
mkdir -p "$prefix/usr/include/protobuf-c" "$prefix/usr/include/systemd" "$prefix/usr/bin" \
    "$prefix/usr/include/$multiarch/openblas-pthread" "$prefix/usr/lib/$multiarch/openblas-pthread"
for h in zmq.h cmocka.h ini.h protobuf-c/protobuf-c.h systemd/sd-daemon.h; do
    : >"$prefix/usr/include/$h"
done
for l in zmq cmocka protobuf-c systemd inih; do
    printf '!<arch>\n' >"$prefix/usr/lib/$multiarch/lib$l.a"
done
echo 'enum { CblasRowMajor = 101 };' >"$prefix/usr/include/$multiarch/openblas-pthread/cblas.h"
: >"$prefix/usr/lib/$multiarch/openblas-pthread/libopenblas.so"
printf '#!/bin/sh\n[ "$1" = --version ] && echo "protobuf-c (fake)"\n' >"$prefix/usr/bin/protoc-c"
chmod -R a+rwX "$prefix"
chmod 755 "$prefix/usr/bin/protoc-c"
run_make self V=1 BUILD="$c/build" USE_CUDA=0 DEPS_PREFIX="$prefix" "$c/build/kernels/probe.o"
status=$?
ok=0
{
    [ "$status" = 0 ] || { echo "(make failed)"; ok=1; }
    grep -q "^  DEPS    found in $prefix: nothing to install\$" "$c/out" ||
        { echo "(no DEPS found line naming $prefix)"; ok=1; }
    no_packaging || ok=1
    compile=$(grep -- ' -c -o .*probe\.o' "$c/out")
    for want in "-I$prefix/usr/include " "-I$prefix/usr/include/$multiarch/openblas-pthread "; do
        case "$compile " in *" $want"*) ;; *) echo "(the compile does not include $want)"; ok=1 ;; esac
    done
    grep -qx "BLAS_LIB := $prefix/usr/lib/$multiarch/openblas-pthread" "$c/build/config.mk" ||
        { echo "(config.mk does not take the prefix's OpenBLAS)"; ok=1; }
} >>"$c/out"
result "DEPS_PREFIX: the unpacked packages first, nothing installed" "$ok"

# ---- 6. DEPS_PREFIX without the packages.
new_case emptyprefix
echo libzmq3-dev >"$c/state/missing"
with_compiler
mkdir -p "$c/deps" && chmod a+rwx "$c/deps"
run_make self BUILD="$c/build" USE_CUDA=0 DEPS_PREFIX="$c/deps" "$c/build/kernels/probe.o"
status=$?
ok=0
{
    [ "$status" != 0 ] || { echo "(make exited 0)"; ok=1; }
    grep -q "^error: DEPS_PREFIX=$c/deps lacks the build's headers" "$c/out" ||
        { echo "(no error naming DEPS_PREFIX)"; ok=1; }
    no_packaging || ok=1
} >>"$c/out"
result "DEPS_PREFIX without the packages: refused, nothing installed" "$ok"

# ---- 7. A build flag changed in an existing build: what it affects is compiled again.
new_case flags
printf 'libcmocka-dev\nvalgrind\n' >"$c/state/missing"
with_compiler
ln -sf "$(type -P protoc-c)" "$c/bin/protoc-c" || { echo "$0: no protoc-c on PATH" >&2; exit 1; }
obj=$c/build/kernels/probe.o
: >"$c/log"
# step WANT ARG...: make the probe's object with ARG...; WANT is 1 if it must be compiled.
step() {
    local want=$1 got=0
    shift
    run_make self BUILD="$c/build" USE_CUDA=0 "$@" "$obj" || { echo "(make $* failed)" >>"$c/log"; return; }
    grep -q "^  CC      $obj\$" "$c/out" && got=1
    [ "$got" = "$want" ] ||
        echo "(make $*: compiled $got, want $want)" >>"$c/log"
}
step 1
step 0
step 1 OPT=-O0
step 0 OPT=-O0
step 1
step 1 SANITIZE=undefined
step 1 KERNEL_OPT=-O1 SANITIZE=undefined
step 1
step 0
mv "$c/log" "$c/out"
[ -s "$c/out" ]
status=$((1 - $?))
result "a changed OPT, KERNEL_OPT or SANITIZE compiles again; the same flags do not" "$status"

# ---- 8. The README's package tables and the Makefile's lists.
new_case readme
# readme_packages HEADER: the packages named in the first column of the README table whose
# header row starts with `| HEADER |`, sorted, one a line.
readme_packages() {
    awk -v head="| $1 |" '
        index($0, head) == 1 { on = 1; next }
        on && !/^\|/ { exit }
        on && !/^\|---/ {
            split($0, cell, "|")
            s = cell[2]
            while (match(s, /`[^`]*`/)) {
                print substr(s, RSTART + 1, RLENGTH - 2)
                s = substr(s, RSTART + RLENGTH)
            }
        }' "$src/README.md" | sort
}
# make_packages GOAL: the packages `make print-deb-packages` prints for GOAL, sorted.
make_packages() {
    sed -n "s/^$1: //p" "$c/printed" | tr ' ' '\n' | sed '/^$/d' | sort
}
ok=0
{
    (cd "$src" && env -i PATH="$c/bin" LANG=C make -s BUILD="$c/build" print-deb-packages) \
        >"$c/printed" 2>&1 || { echo "(make print-deb-packages failed)"; cat "$c/printed"; ok=1; }
    if [ -e "$c/state/apt-get.log" ] || [ -e "$c/state/dpkg-query.log" ] ||
        [ -n "$(ls -A "$c/build")" ]; then
        echo "(make print-deb-packages asked dpkg, ran apt-get or wrote into the build)"
        ok=1
    fi
    for t in "make:package (make)" "check-boot:package (make check-boot)"; do
        goal=${t%%:*} head=${t#*:}
        make_packages "$goal" >"$c/make.$goal"
        readme_packages "$head" >"$c/readme.$goal"
        if ! [ -s "$c/make.$goal" ]; then
            echo "(make print-deb-packages printed no $goal packages)"
            ok=1
        elif ! diff -u --label "Makefile ($goal)" --label "README.md ($head)" \
            "$c/make.$goal" "$c/readme.$goal"; then
            echo "(the README's table \"$head\" is not the Makefile's list)"
            ok=1
        fi
    done
} >>"$c/out" 2>&1
result "the README's package tables are the Makefile's DEB_PACKAGES and BOOT_DEB_PACKAGES" "$ok"

exit "$failed"

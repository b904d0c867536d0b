#!/bin/bash
# SPDX-License-Identifier: MIT
#
# loads.sh: whether the vase packages installed in this root load here (tests/check_boot.sh runs
# it in a root that has only the packages' Depends, and no CUDA library): every ELF file of
# them is resolved by ldd with no library "not found", and `import vase` works outside any
# source tree. Prints one line per file; exits 1 if any failed.

set -u

failed=0
packages=$(dpkg-query -W -f='${Package}\n' vased 'libvase[0-9]*' libvase-dev python3-vase 2>/dev/null)
[ -n "$packages" ] || { echo "loads: no vase package is installed" >&2; exit 1; }
for f in $(dpkg -L $packages | sort -u); do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    case $f in *.a | *.o) continue ;; esac
    missing=$(ldd "$f" 2>&1 | grep -E 'not found|not a dynamic' | grep -v 'not a dynamic executable')
    if [ -n "$missing" ]; then
        echo "FAIL $f: $missing"
        failed=1
    else
        echo "ok   $f: $(ldd "$f" | wc -l) libraries resolved"
    fi
done
if out=$(cd / && python3 -I -c 'import vase; print(vase.__file__)' 2>&1); then
    echo "ok   import vase: $out"
else
    echo "FAIL import vase: $out"
    failed=1
fi
exit "$failed"

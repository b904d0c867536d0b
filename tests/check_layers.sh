#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The layers of vased, as its folders draw them, checked on every include of daemon/ (run by
# `make check`; `tests/check_layers.sh DIR` checks another tree). From the top:
#
#   daemon/           main, the loop, start-up and teardown, state.h (struct vased)
#   daemon/control/   the frames, the replies, one file per protocol section
#   daemon/serve/     what takes struct vased below the protocol
#   daemon/plan/      the evictor threads, their queue, the planners      (beside config/)
#   daemon/config/    the settings table and its readers                  (beside plan/)
#   daemon/core/      objects that never see struct vased
#
# A file may include headers of its own folder and of the folders below it, never one above
# nor one beside it. state.h, struct vased, is data and no loop: control/ and serve/ include it,
# core/, plan/ and config/ never. And no plan/ file includes core/registry.h: the planners read copies
# (struct vase_plan_run), never the registry the main thread owns. A header of another folder is
# named with its folder ("core/registry.h"); a bare name is a header of the file's own folder,
# else of daemon/ itself. Every offending include is printed as FILE:LINE with the reason; the
# exit status is 1 when there is one.
set -u

root=${1:-.}
cd "$root" || exit 2
[ -d daemon/core ] || { echo "$0: no daemon/core in $root" >&2; exit 2; }

# The rank of a folder; plan and config share one, and so may not include each other.
rank() {
    case $1 in
    daemon) echo 5 ;; control) echo 4 ;; serve) echo 3 ;; plan | config) echo 2 ;; core) echo 1 ;;
    *) echo 0 ;;
    esac
}

bad=0
checked=0
for f in daemon/*.[ch] daemon/*/*.[ch]; do
    dir=${f%/*}
    layer=${dir#daemon/}
    [ "$dir" = daemon ] && layer=daemon
    my=$(rank "$layer")
    if [ "$my" = 0 ]; then
        echo "$f: daemon/$layer/ is not one of vased's layers (daemon, control, serve, plan, config, core)"
        bad=1
        continue
    fi
    checked=$((checked + 1))
    # Each quoted include: LINE NAME.
    while read -r line name; do
        case $name in
        */*) to=${name%%/*} ;;
        *)
            if [ -e "$dir/$name" ]; then to=$layer
            elif [ -e "daemon/$name" ]; then to=daemon
            else continue  # kernels/, proto/, lib/ or generated: not a layer of vased
            fi ;;
        esac
        [ "$(rank "$to")" = 0 ] && continue
        [ -e "daemon/${name}" ] || [ -e "$dir/$name" ] || {
            echo "$f:$line: includes \"$name\", which is not in the tree"
            bad=1
            continue
        }
        why=
        if [ "$to" = "$layer" ]; then
            :
        elif [ "$(rank "$to")" -gt "$my" ]; then
            why="$layer/ is below $to/"
        elif [ "$(rank "$to")" = "$my" ]; then
            why="$layer/ and $to/ are beside each other"
        fi
        # struct vased is data, not the loop: control/ and serve/ take it, the layers below never.
        if [ "$name" = state.h ]; then
            case $layer in
            control | serve) why= ;;
            core | plan | config) why="$layer/ never sees struct vased (state.h)" ;;
            esac
        fi
        if [ "$layer" = plan ] && [ "$name" = core/registry.h ]; then
            why="plan/ never reads the registry (the planners take a struct vase_plan_run)"
        fi
        if [ -n "$why" ]; then
            echo "$f:$line: includes \"$name\": $why"
            bad=1
        fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
             sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1 \2/')
done

if [ $bad = 0 ]; then
    echo "check_layers: the includes of $checked files of daemon/ follow its layers"
fi
exit $bad

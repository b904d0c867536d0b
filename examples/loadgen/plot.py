#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plots what build/examples/loadgen wrote: the arena's occupancy over time for each mode.

Reads DIR/occupancy_<mode>.csv (static first, then the elastic runs) and writes DIR/occupancy.png
with three panels sharing the time axis: the arena's bytes in pages of sequences (percent of the
arena), the sequences running and the opens waiting, and the mean budget of the decoding
sequences as a fraction of the budget they opened with. The dotted line marks the end of the
arrivals.

usage: plot.py DIR [--duration SECONDS]
"""

import argparse
import csv
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no samples")
    return {k: [float(r[k]) for r in rows] for k in rows[0]}


def modes(directory):
    found = sorted(glob.glob(os.path.join(directory, "occupancy_*.csv")))
    names = [os.path.basename(p)[len("occupancy_"):-len(".csv")] for p in found]
    # static first, then the elastic runs in decreasing min_budget (elastic, elastic-0.5, ...).
    def order(name):
        frac = float(name.split("-", 1)[1]) if "-" in name else 1.0
        return (name != "static", -frac)

    return sorted(names, key=order)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--duration", type=float, default=None, help="seconds of arrivals (a line)")
    args = ap.parse_args()

    names = modes(args.dir)
    if not names:
        sys.exit(f"{args.dir}: no occupancy_*.csv")
    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True,
                             gridspec_kw={"height_ratios": [3, 2, 2]})
    colors = {"static": "tab:gray"}
    palette = iter(["tab:blue", "tab:orange", "tab:green"])
    for name in names:
        d = read(os.path.join(args.dir, f"occupancy_{name}.csv"))
        c = colors.get(name) or next(palette)
        occ = [100.0 * p / t if t else 0.0 for p, t in zip(d["bytes_pages"], d["bytes_total"])]
        axes[0].plot(d["t"], occ, color=c, label=name, lw=1.2)
        axes[1].plot(d["t"], d["running"], color=c, label=f"{name}: running", lw=1.2)
        axes[1].plot(d["t"], d["waiting"], color=c, ls="--", lw=1.0, label=f"{name}: opens waiting")
        axes[2].plot(d["t"], d["budget_frac"], color=c, label=name, lw=1.2)
    axes[0].set_ylabel("arena in pages of\nsequences (%)")
    axes[0].set_ylim(0, 105)
    axes[0].legend(loc="lower right", fontsize=8)
    axes[0].set_title("One arena under the same bursty arrivals: static and elastic budgets")
    axes[1].set_ylabel("sequences")
    axes[1].legend(loc="upper right", fontsize=7, ncol=len(names))
    axes[2].set_ylabel("mean budget of decoding\nsequences / opened budget")
    axes[2].set_ylim(0, 1.05)
    axes[2].set_xlabel("seconds since the mode started")
    for ax in axes:
        ax.grid(alpha=0.3)
        if args.duration:
            ax.axvline(args.duration, color="k", ls=":", lw=0.8)
    fig.tight_layout()
    out = os.path.join(args.dir, "occupancy.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

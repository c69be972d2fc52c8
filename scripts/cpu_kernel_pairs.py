#!/usr/bin/env python3
"""Two builds of `miner` against each other, CPU kernel by kernel, in alternating whole processes.

    scripts/cpu_kernel_pairs.py BEFORE_MINER AFTER_MINER [--kernels avx2,amx] [--sizes 1024,2048]
                                [--pairs 8] [--seconds 2]

Each pair runs `miner bench --backend cpu --cpu-kernel K --sizes ... --memory-mib 0` once with
each build, the order swapped from pair to pair (before-after, after-before, ...), after one
warm-up run of each. A guest's speed drifts by more than 2x between neighbouring runs, so the
figure to quote is the median of the pairs' ratios (after / before), each taken from two runs
side by side, with their spread; the medians of each build's own TOPS and of its share of the
register-only ceiling (which each run measures for itself) are printed beside it.

Build the two with `cargo build --release -p gpu-attest-miner` in a checkout of each commit.
Exit status 1 when a run cannot start or fails, 2 when it prints no figure for a kernel and size
asked for.
"""

import argparse
import re
import statistics
import subprocess
import sys

# One `miner bench` row for the CPU: backend, kernel, n, (k block, hints,) ms/step, TOPS, % ceiling.
ROW = re.compile(r"^cpu\s+(\S+)\s+(\d+)\s.*?\s([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+cpu:")


def bench(miner, kernel, sizes, seconds):
    """{n: (TOPS, share of the ceiling in %)} from one whole-process run."""
    command = [
        miner, "bench", "--backend", "cpu", "--cpu-kernel", kernel,
        "--sizes", ",".join(map(str, sizes)), "--seconds", str(seconds), "--memory-mib", "0",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"cannot run {miner}: {e}")
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr.strip()}")
    figures = {}
    for line in done.stdout.splitlines():
        match = ROW.match(line)
        if match and match.group(1) == kernel:
            figures[int(match.group(2))] = (float(match.group(4)), float(match.group(5)))
    missing = [n for n in sizes if n not in figures]
    if missing:
        print(f"{miner}: no figure for {kernel} at n = {missing}:\n{done.stdout}", file=sys.stderr)
        sys.exit(2)
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--kernels", default="avx2")
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    sizes = [int(s) for s in args.sizes.split(",")]
    builds = {"before": args.before, "after": args.after}

    print("| kernel | n | before, median TOPS (% ceiling) | after, median TOPS (% ceiling) "
          "| after / before, median of pairs | spread of pairs |")
    print("|---|---|---|---|---|---|")
    for kernel in args.kernels.split(","):
        for miner in builds.values():
            bench(miner, kernel, sizes, args.seconds)  # warm-up, not counted
        runs = {"before": [], "after": []}
        for pair in range(args.pairs):
            order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
            for which in order:
                runs[which].append(bench(builds[which], kernel, sizes, args.seconds))
        for n in sizes:
            tops = {w: [run[n][0] for run in runs[w]] for w in runs}
            share = {w: [run[n][1] for run in runs[w]] for w in runs}
            ratios = [a / b for a, b in zip(tops["after"], tops["before"])]
            cell = {w: f"{statistics.median(tops[w]):.3f} ({statistics.median(share[w]):.0f}%)" for w in runs}
            print(f"| {kernel} | {n} | {cell['before']} | {cell['after']} | "
                  f"{statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |", flush=True)


if __name__ == "__main__":
    main()

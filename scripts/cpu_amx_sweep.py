"""The AMX kernel's k block and cache hints, swept on this CPU: `miner bench --json` per setting,
the settings interleaved round by round so that each sees the same machine, and a table of each
setting's median speed over the rounds beside the default's.

    python3 scripts/cpu_amx_sweep.py --miner target/release/miner [--rounds 3] [--threads 2,0]
        [--sizes 1024,2048,4096] [--settings 512/auto,1024/auto,...] [--seconds 0.7]

A setting is `BLOCK/HINTS`: BLOCK a multiple of 64 (GPU_ATTEST_CPU_K_BLOCK; one larger than n
is one pass), HINTS `auto` (on) or `off` (GPU_ATTEST_CPU_CACHE_HINTS). Threads 0 is every core.
Every setting computes the same exact product; only the speed differs. Exits 2 on a CPU or OS
without a usable AMX kernel.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

DEFAULT_SETTINGS = "512/auto,1024/auto,2048/auto,8192/auto,1024/off,8192/off"


def bench(miner, setting, threads, sizes, seconds):
    block, hints = setting.split("/")
    env = dict(os.environ, GPU_ATTEST_CPU_K_BLOCK=block, GPU_ATTEST_CPU_CACHE_HINTS=hints)
    cmd = [
        miner, "bench", "--backend", "cpu", "--cpu-kernel", "amx", "--cpu-threads", str(threads),
        "--sizes", sizes, "--seconds", str(seconds), "--memory-mib", "0", "--json",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        # The miner's own words, so that a failed setting says why; the sweep goes on.
        print(f"setting {setting}, threads {threads}: miner bench exited {done.returncode}:\n{done.stderr.strip()}",
              file=sys.stderr)
        return None
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--miner", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="2,0")
    parser.add_argument("--sizes", default="1024,2048,4096")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS)
    parser.add_argument("--seconds", type=float, default=0.7)
    args = parser.parse_args()

    env = dict(os.environ, GPU_ATTEST_CPU_KERNEL="amx")
    if subprocess.run([args.miner, "info", "--backend", "cpu"], env=env, capture_output=True).returncode != 0:
        print("this CPU or OS has no usable AMX kernel: nothing to sweep", file=sys.stderr)
        return 2
    threads_list = [int(t) for t in args.threads.split(",")]
    settings = args.settings.split(",")
    sizes = [int(n) for n in args.sizes.split(",")]
    # (threads, setting, n) -> TOPS per round; threads -> ceilings seen.
    tops, ceilings, used = {}, {}, {}
    failed = 0
    for round_ in range(1, args.rounds + 1):
        for threads in threads_list:
            for setting in settings:
                report = bench(args.miner, setting, threads, args.sizes, args.seconds)
                if report is None:
                    failed += 1
                    continue
                for row in report["rows"]:
                    tops.setdefault((threads, setting, row["n"]), []).append(row["tops"])
                    used[(threads, setting, row["n"])] = (row["threads"], row["k_block"], row["cache_hints"])
                for c in report["ceilings"]:
                    if c["kernel"] == "amx":
                        ceilings.setdefault(threads, []).append(c["tops"])
        # After every round, so that a run cut short by a time limit still leaves its figures.
        print(f"\nafter round {round_} of {args.rounds}:")
        print_tables(threads_list, settings, sizes, tops, ceilings, used, round_)
        sys.stdout.flush()
    if failed:
        print(f"{failed} bench runs failed (their errors are above)", file=sys.stderr)
        return 1
    return 0


def print_tables(threads_list, settings, sizes, tops, ceilings, used, rounds):
    for threads in threads_list:
        ceiling = max(ceilings.get(threads, [0.0])) or None
        engine_threads = next((u[0] for k, u in used.items() if k[0] == threads), threads)
        print(f"\nAMX, {engine_threads} threads: median TOPS over up to {rounds} rounds (min-max), "
              f"share of the register-only ceiling ({ceiling or 0:.2f} TOPS, best of the rounds). "
              f"Where a task is one strip of rows it takes k in one pass whatever the block.")
        print("| setting | " + " | ".join(f"n = {n}" for n in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for setting in settings:
            cells = []
            for n in sizes:
                values = tops.get((threads, setting, n))
                if not values:
                    cells.append("failed")
                    continue
                median = statistics.median(values)
                share = f", {median / ceiling:.0%}" if ceiling else ""
                _, k_block, hints = used[(threads, setting, n)]
                label = "one pass" if k_block >= n else f"k block {k_block}"
                cells.append(f"{median:.2f} ({min(values):.2f}-{max(values):.2f}{share}; {label}"
                             f"{', hints' if hints else ''})")
            print(f"| {setting} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())

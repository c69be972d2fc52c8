#!/usr/bin/env python3
"""Instruction counts of each GEMM kernel's main loop, and of the memory walk's step, from
nvdisasm's SASS.

    sass_main_loop.py NVDISASM CUBIN_DIR

For every `<kernel>-<arch>.cubin` in CUBIN_DIR (written by the kernel compile test), this
disassembles the GEMM function and finds its main loop: of the loops (a label and a branch back
to it), the one holding the most MMA instructions (IMMA, IGMMA/HGMMA; IDP.4A for the tiled
kernel), the innermost of such loops nested in each other (the TMA kernels' tile loops hold their
k loops). It prints, per kernel and architecture, the loop's instructions per iteration, split
into MMA and the rest (shared-memory loads, async copies, barriers and waits, and everything
else: address arithmetic, predicates, loop control). The "other" column is the overhead to cut.

For `walk-<arch>.cubin` (kernels/cuda/walk.cu) it prints the step loop instead: one iteration is one
walker's step, 64 KiB read by the block's 128 threads. Per thread, the global loads (16 bytes
each: 32 make a thread's 512 bytes), dp4a, shuffles and barriers of a step; and the BLAKE3 loop
nested in it, one iteration a 64-byte block (five a step), which only the hashing lanes run. And
the locality walk's step (kernels/cuda/locality.cu, in the same cubin): a warp's lanes each load 8
bytes of one line, then mix, fold by shuffles and chain; a step costs one memory latency plus this
loop's dependent instructions.
"""
import pathlib
import re
import subprocess
import sys

GEMM_FN = {
    "tiled": "gemm_mix_tiled",
    "tensor": "gemm_mix_tensor",
    "wgmma": "gemm_mix_wgmma",
    "tma": "gemm_mix_tma",
    "pingpong": "gemm_mix_pingpong",
    "multicast": "gemm_mix_multicast",
}
# Bytes of k one iteration of the main loop covers (the kernels' BK): one k-tile per iteration.
K_PER_ITERATION = {"tiled": 32, "tensor": 64, "wgmma": 128, "tma": 128, "pingpong": 128, "multicast": 128}
INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def classify(op):
    base = op.split(".")[0]
    if base in ("IMMA", "HMMA", "IGMMA", "HGMMA", "QGMMA") or op.startswith("IDP.4A"):
        return "mma"
    if base in ("LDS", "LDSM"):
        return "smem load"
    if base in ("LDGSTS", "LDG", "UTMALDG", "UBLKCP"):
        return "global/async copy"
    if base in ("BAR", "DEPBAR", "WARPGROUP", "WARPSYNC", "ARRIVES", "SYNCS"):
        return "barrier/wait"
    return "other"


def function_lines(sass, name):
    lines, inside = [], False
    for line in sass.splitlines():
        if line.lstrip().startswith(".section") and ".text." in line:
            inside = f".text.{name}," in line
            continue
        if inside:
            lines.append(line)
    return lines


def main_loop(lines):
    """(instructions of the loop body, as opcodes) of the loop with the most MMAs; of several
    (a persistent kernel's tile loop holds its k loop), the innermost, the shortest."""
    bodies, _ = loops(lines)
    return max(bodies, key=lambda loop: (sum(classify(o) == "mma" for o in loop), -len(loop)), default=[])


def loops(lines):
    """Every loop (a label and a branch back to it): the opcodes of its bodies, and their spans."""
    labels, body, found = {}, [], []
    for line in lines:
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = len(body)
            continue
        m = INSTR.search(line)
        if not m or "@!PT" in line:
            continue
        body.append(m.group(1))
        if m.group(1).startswith("BRA"):
            t = TARGET.search(line)
            if t and t.group(1) in labels:
                found.append((labels[t.group(1)], len(body)))
    return [body[a:b] for a, b in found], found


def walk_report(cubins, nvdisasm):
    walks = sorted(cubins.glob("walk-*.cubin"))
    if not walks:
        return
    print()
    print("walk: per thread, per step (one iteration of the step loop; 128 threads read 64 KiB):")
    print(f"{'arch':<8} {'loop':>5} {'LDG.128':>8} {'IDP.4A':>7} {'SHFL':>5} {'BAR':>4} {'other':>6}  {'hash loop':>9}")
    for cubin in walks:
        arch = cubin.stem.split("-", 1)[1]
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        bodies, spans = loops(function_lines(sass, "walk_steps"))
        if not bodies:
            print(f"sm_{arch:<5} no loop found")
            continue
        step = max(range(len(bodies)), key=lambda i: sum(o.startswith("IDP.4A") for o in bodies[i]))
        (a, b), ops = spans[step], bodies[step]
        # Loops nested in the step with no dp4a: the BLAKE3 block loop of the hashing lanes.
        nested = [len(bodies[i]) for i, (c, d) in enumerate(spans) if a <= c and d <= b and i != step
                  and not any(o.startswith("IDP") for o in bodies[i])]
        hashing = max(nested) if nested else 0
        count = lambda prefix: sum(o.startswith(prefix) for o in ops)
        ldg = sum(o.startswith("LDG") and ".128" in o for o in ops)
        known = ldg + count("IDP.4A") + count("SHFL") + count("BAR")
        print(f"sm_{arch:<5} {len(ops):>5} {ldg:>8} {count('IDP.4A'):>7} {count('SHFL'):>5} {count('BAR'):>4} "
              f"{len(ops) - known - hashing:>6}  {hashing:>9}")
    print("(loop: static instructions of the step; other: all but the columns before it and the hash")
    print(" loop, which runs once per 64-byte BLAKE3 block, five a step, in the hashing lanes only)")


def locality_report(cubins, nvdisasm):
    walks = sorted(cubins.glob("walk-*.cubin"))
    if not walks:
        return
    print()
    print("locality walk: per lane, per step (one iteration of locality_walk's loop; a warp reads one 256-byte line):")
    print(f"{'arch':<8} {'loop':>5} {'steps':>6} {'SHFL':>5} {'CALL':>5} {'other':>6}")
    for cubin in walks:
        arch = cubin.stem.split("-", 1)[1]
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        bodies, _ = loops(function_lines(sass, "locality_walk"))
        # The step loop: the one that loads (the 64-bit remainder's own loop, where it is inlined,
        # loads nothing).
        steps = [b for b in bodies if any(o.startswith("LDG") for o in b)]
        if not steps:
            print(f"sm_{arch:<5} no loop found")
            continue
        ops = min(steps, key=len)
        # A lane loads once a step, so the loads count the steps the compiler unrolled into one
        # iteration; the other columns are per step.
        count = lambda prefix: sum(o.startswith(prefix) for o in ops)
        per = count("LDG")
        known = count("LDG") + count("SHFL") + count("CALL")
        print(f"sm_{arch:<5} {len(ops):>5} {per:>6} {count('SHFL') / per:>5.0f} {count('CALL') / per:>5.0f} "
              f"{(len(ops) - known) / per:>6.0f}")
    print("(loop: static instructions of one iteration, `steps` steps unrolled; the rest per step. CALL:")
    print(" the 64-bit remainder naming the slice, which ptxas calls rather than inlines; a step's")
    print(" instructions wait on its load and each on the one before, so they add to the memory latency)")


def main():
    nvdisasm, cubins = sys.argv[1], pathlib.Path(sys.argv[2])
    columns = ["mma", "smem load", "global/async copy", "barrier/wait", "other"]
    print("per thread, per iteration of the main loop (one k-tile of the bytes of k shown):")
    print(f"{'kernel':<8} {'arch':<8} {'k':>4} {'loop':>5} " + " ".join(f"{c:>17}" for c in columns) + "  other/mma")
    for cubin in sorted(cubins.glob("*.cubin")):
        kernel, arch = cubin.stem.split("-", 1)
        if kernel not in GEMM_FN:
            continue
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        loop = main_loop(function_lines(sass, GEMM_FN[kernel]))
        counts = {c: sum(classify(o) == c for o in loop) for c in columns}
        ratio = counts["other"] / counts["mma"] if counts["mma"] else float("nan")
        print(f"{kernel:<8} sm_{arch:<5} {K_PER_ITERATION[kernel]:>4} {len(loop):>5} " + " ".join(f"{counts[c]:>17}" for c in columns) + f"  {ratio:9.2f}")
    walk_report(cubins, nvdisasm)
    locality_report(cubins, nvdisasm)


if __name__ == "__main__":
    main()

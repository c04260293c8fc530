"""Benchmark: the log parser of another commit against this tree's, side by side in one run.

The parser of ``--old`` (a git ref; its ``autotune/`` package is taken with ``git archive``) and
the parser of this tree parse the same logs, in alternating order round by round, each in a fresh
subprocess, so that the machine's load of the moment weighs on both alike:

  * the synthetic log of ``make bench`` (the real boot logs of tests/fixtures/logs, whole,
    repeated to ``--size-mb``) with ``parse_file``: wall and CPU time of the parse;
  * the same real logs each parsed alone (``parse_file`` per log, the CPU time of the fastest of
    ``--passes`` passes over all of them): what a user's ``autotune parse`` of one log costs.

CPU time (``time.process_time`` of the subprocess) moves less with the machine's load than wall
time; both are reported for the synthetic log.

Reported: the medians over ``--rounds`` rounds, and old/new as a speed ratio (above 1: the new
parser is faster), round by round too. Results on stdout (``--json`` for JSON), progress on
stderr. Run: python bench/parse_compare.py --old main
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_bench import build_synthetic_log, log  # noqa: E402

# Run with PYTHONPATH set to the tree under test; prints one JSON object.
_SNIPPET = r"""
import json, sys, time
from autotune.vllm.log import parse_file
mode, paths, passes = sys.argv[1], sys.argv[2:-1], int(sys.argv[-1])
if mode == "whole":
    wall, cpu = time.perf_counter(), time.process_time()
    parser = parse_file(paths[0])
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                      "lines": parser.line_count, "boots": parser.boots_in_log}))
else:
    best = None
    for _ in range(passes):
        cpu = time.process_time()
        for path in paths:
            parse_file(path)
        best = min(best or 1e9, time.process_time() - cpu)
    print(json.dumps({"cpu": best}))
"""


def old_tree(ref: str, work: Path) -> Path:
    """The ``autotune`` package of ``ref``, unpacked under ``work``."""
    out = work / "old"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "autotune"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def run(tree: Path, python: str, mode: str, paths: list[Path], passes: int) -> dict:
    proc = subprocess.run([python, "-c", _SNIPPET, mode, *map(str, paths), str(passes)], capture_output=True,
                          text=True, cwd=str(tree), env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"parsing with {tree} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(old: Path, new: Path, python: str, logs: list[Path], synthetic: Path, rounds: int, passes: int) -> dict:
    trees = {"old": old, "new": new}
    got: dict[str, dict[str, list[float]]] = {side: {"wall": [], "cpu": [], "alone": []} for side in trees}
    facts: dict[str, dict] = {}
    for number in range(rounds):
        order = ("old", "new") if number % 2 == 0 else ("new", "old")
        for side in order:
            whole = run(trees[side], python, "whole", [synthetic], 1)
            alone = run(trees[side], python, "alone", logs, passes)
            got[side]["wall"].append(whole["wall"])
            got[side]["cpu"].append(whole["cpu"])
            got[side]["alone"].append(alone["cpu"])
            facts[side] = {"lines": whole["lines"], "boots": whole["boots"]}
        log(f"round {number + 1}/{rounds}: " + ", ".join(
            f"{side} {got[side]['wall'][-1]:.2f} s" for side in trees))
    out = {"rounds": rounds, "passes": passes, "logs": len(logs), "synthetic_bytes": synthetic.stat().st_size,
           "facts": facts}
    for measure in ("wall", "cpu", "alone"):
        old_s, new_s = got["old"][measure], got["new"][measure]
        out[measure] = {"old_median_s": round(statistics.median(old_s), 3),
                        "new_median_s": round(statistics.median(new_s), 3),
                        "speed_ratio": round(statistics.median(old_s) / statistics.median(new_s), 3),
                        "round_ratios": [round(o / n, 3) for o, n in zip(old_s, new_s)]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the git ref whose parser is the baseline (main, a commit)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--size-mb", type=int, default=10, help="the synthetic log's size")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--passes", type=int, default=5, help="passes over the logs parsed alone; the fastest counts")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    logs = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
    with tempfile.TemporaryDirectory(prefix="autotune-parse-compare-") as tmp:
        work = Path(tmp)
        old = old_tree(args.old, work)
        synthetic = work / "synthetic.log"
        build_synthetic_log(synthetic, args.size_mb * 1_000_000, logs)
        log(f"old: {args.old}; new: {ROOT}; {synthetic.stat().st_size:,} bytes, {len(logs)} logs")
        out = compare(old, ROOT, args.python, logs, synthetic, args.rounds, args.passes)
    out["old"] = args.old
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"old {args.old} against this tree, {args.rounds} alternating rounds (medians; ratio = old/new time)")
    for measure, label in (("wall", f"{args.size_mb} MB log, wall"), ("cpu", f"{args.size_mb} MB log, CPU"),
                           ("alone", f"{len(logs)} logs each parsed alone, CPU (fastest of {args.passes})")):
        row = out[measure]
        print(f"  {label}: old {row['old_median_s']} s, new {row['new_median_s']} s, speed ratio "
              f"{row['speed_ratio']} (rounds: {', '.join(map(str, row['round_ratios']))})")
    print(f"  boots in the {args.size_mb} MB log: old {out['facts']['old']['boots']}, new {out['facts']['new']['boots']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fleet against one tune after another: 8 leaves of the replaying vLLM on 4 slots
(`autotune fleet run --on local --slots 4`) side by side with the same 8 tunes run serially
(`autotune tune`, one after the other), alternating, medians. Target: fleet wall <= 0.5 x serial.

Run: python bench/fleet_bench.py [--reps 3] [--time-scale 0.05] (or `make bench-fleet`); writes
the "Fleet" section of bench/RESULTS.md (between its markers; `make bench` keeps it).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.fleet import plan as plan_mod  # noqa: E402
from autotune.fleet.leaf import tune_argv  # noqa: E402

BEGIN, END = "<!-- fleet-bench -->", "<!-- /fleet-bench -->"
PROFILES = ("seed-3090-qwen3.6-27b", "v1-0.21.0", "v1-0.33.0", "v1-0.17.0-auto-probe")


def plan_text(scale: float) -> str:
    return (f"name: bench-fleet\ncommand: {sys.executable} -m autotune.testing.fake_vllm --profile {{model}} "
            f"--time-scale {scale}\nmodels: [{', '.join(PROFILES)}]\ntarget: 64K\nstrategy: refusal\nprobe: quick\n"
            "grid:\n  --gpu-memory-utilization: [0.9, 0.95]\n")


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def one_round(work: Path, plan_path: Path, n: int) -> tuple[float, float]:
    fleet = timed([sys.executable, "-m", "autotune", "fleet", "run", str(plan_path), "--on", "local", "--slots", "4",
                   "--fresh", "--quiet", "--runs-dir", str(work / f"fleet-{n}")])
    plan = plan_mod.load(plan_path)
    serial = 0.0
    for leaf in plan.leaves:
        serial += timed([*tune_argv(leaf, work / f"serial-{n}")[:-len(leaf.argv) - 1], "--quiet", "--", *leaf.argv])
    return fleet, serial


def write_section(out: Path, section: str) -> None:
    text = out.read_text() if out.exists() else "# Benchmark results\n"
    block = f"{BEGIN}\n{section.rstrip()}\n{END}\n"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block
    out.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = Path(tmp)
        plan_path = work / "plan.yaml"
        plan_path.write_text(plan_text(args.time_scale))
        rounds = [one_round(work, plan_path, n) for n in range(args.reps)]
    fleet = statistics.median(r[0] for r in rounds)
    serial = statistics.median(r[1] for r in rounds)
    ratios = [r[0] / r[1] for r in rounds]
    ratio = statistics.median(ratios)
    section = f"""## Fleet: 8 leaves on 4 slots against the same 8 tunes one after another

Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} logical CPUs; load average before / after:
{' '.join(f'{x:.2f}' for x in load_before)} / {' '.join(f'{x:.2f}' for x in os.getloadavg())}.
The replaying vLLM (`--time-scale {args.time_scale}`), profiles {', '.join(PROFILES)} x gmu 0.9, 0.95; target 65,536,
`--strategy refusal --probe quick` (2 boots and a probe per leaf). The fleet: `autotune fleet run --on local --slots 4`;
serial: each leaf's own `autotune tune` command, one after another. {args.reps} rounds, alternating, medians.

| method | wall (s) | ratio to serial |
|---|---:|---:|
| serial: 8 x `autotune tune` | {serial:.1f} | 1.00 |
| fleet: `--on local --slots 4` | {fleet:.1f} | {ratio:.2f} |

Target fleet / serial <= 0.5: {ratio:.2f} (round by round: {', '.join(f'{r:.2f}' for r in ratios)}) -> {'met' if ratio <= 0.5 else 'NOT met'}.
(`python bench/fleet_bench.py` or `make bench-fleet`; about {sum(r[0] + r[1] for r in rounds) / 60:.0f} minutes.)
"""
    write_section(args.out, section)
    print(section)


if __name__ == "__main__":
    main()

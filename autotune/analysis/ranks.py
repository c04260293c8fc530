"""Per-rank and total KV figures of a tensor- or pipeline-parallel server (pure).

With --tensor-parallel-size T and --pipeline-parallel-size P, vLLM runs T x P workers (ranks).
Each sizes its own KV pool from its own device, and the figure the log prints, "Available KV
cache memory: X GiB", is one rank's (every worker prints its own; they agree when the devices
do). The KV token count ("KV cache size: N tokens") is the model's: each rank keeps its share
of every token (its heads with TP, its layers with PP), so N tokens of context fit in all of
them together, and N is not multiplied. The memory the KV cache takes on the whole machine
is X x T x P.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.store.record import BootFacts
from autotune.vllm import servecmd


def parallel_sizes(argv: Sequence[str], non_default_args: dict | None = None) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes: the serve command's flags, else vLLM's non-default args."""
    args = non_default_args or {}
    options = servecmd.long_options(argv)  # reads -tp / -pp too

    def size(flag: str, arg: str) -> int:
        value: Any = options.get(flag[2:])
        if value is None:
            value = args.get(arg)
        try:
            return max(1, int(value)) if value is not None else 1
        except (TypeError, ValueError):
            return 1

    return size("--tensor-parallel-size", "tensor_parallel_size"), size("--pipeline-parallel-size",
                                                                          "pipeline_parallel_size")


def kv_by_rank(argv: Sequence[str], facts: BootFacts) -> dict | None:
    """The KV figures per rank and in total, and which is which; None for a single rank."""
    tp, pp = parallel_sizes(argv, facts.non_default_args)
    ranks = tp * pp
    if ranks == 1:
        return None
    per_rank = facts.available_kv_gib
    total = round(per_rank * ranks, 2) if isinstance(per_rank, (int, float)) else None
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "ranks": ranks,
            "available_kv_gib_per_rank": per_rank, "available_kv_gib_total": total,
            "kv_cache_tokens": facts.kv_cache_tokens,
            "note": (f"available KV is per rank as vLLM prints it; the total is {ranks} ranks x that. KV tokens "
                     f"are the model's: each rank holds its share of every token, so they are not multiplied")}


def describe(ranks: dict) -> str:
    """One line for the summary: per rank, ranks, total."""
    layout = " x ".join(f"{name} {n}" for name, n in (("TP", ranks["tensor_parallel_size"]),
                                                     ("PP", ranks["pipeline_parallel_size"])) if n > 1)
    per, total = ranks.get("available_kv_gib_per_rank"), ranks.get("available_kv_gib_total")
    return (f"{per} GiB available per rank x {ranks['ranks']} ranks ({layout}) = {total} GiB in all"
            if per is not None else f"{ranks['ranks']} ranks ({layout}); no per-rank figure in the log")

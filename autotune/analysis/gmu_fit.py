"""The least-squares line of available KV against gmu (or device memory x gmu) in one group (pure)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from autotune.analysis.run_row import Row


def least_squares(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """(a, b) of y = a*x - b minimising the squared residuals; None with fewer than 2 distinct x."""
    n = len(xs)
    if n < 2 or n != len(ys):
        return None
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 1e-12:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, slope * mean_x - mean_y


@dataclass
class Fit:
    a_gib: float  # GiB of KV per unit of gmu: ~ the usable device memory
    b_gib: float  # GiB that gmu never reaches the KV cache with: ~ weights + fixed overhead
    runs: int
    gmu_min: float
    gmu_max: float
    exact: bool  # two runs: the line passes through both, residuals say nothing
    residuals_gib: dict[str, float]  # run id -> observed - fitted
    residual_std_gib: float | None  # sqrt(SSR / (n - 2)), from 3 runs on
    device_memory_gib: list[float]  # the memory vLLM saw, lowest and highest (empty: unknown)
    a_vs_device: str | None  # "a is 95% of the device memory (24.0 GiB)"
    # The lines predictions use, against x = "budget" (device memory x gmu, which follows a
    # device memory that moved between runs) where every run has its device memory, else "gmu":
    # available KV GiB = kv_a x x - kv_b, and KV tokens (exact counts, no rounding) = tokens_a x x - tokens_b.
    x: str = "gmu"
    kv_a: float = 0.0
    kv_b: float = 0.0
    residuals_x_gib: dict[str, float] = field(default_factory=dict)  # observed - that line's value
    tokens_a: float | None = None
    tokens_b: float | None = None
    tokens_residual_std: float | None = None  # from 3 runs on


def fit_group(rows: list[Row]) -> Fit | None:
    points = [r for r in rows if r.gmu is not None and r.available_kv_gib is not None]
    solved = least_squares([r.gmu for r in points], [r.available_kv_gib for r in points])
    if solved is None:
        return None
    a, b = solved
    residuals = {r.run_id: r.available_kv_gib - (a * r.gmu - b) for r in points}
    n = len(points)
    std = math.sqrt(sum(v * v for v in residuals.values()) / (n - 2)) if n > 2 else None
    memories = [r.device_memory_gib for r in points]
    known = None not in memories
    span = [min(memories), max(memories)] if known else []
    a_vs = None
    if known:
        shown = f"{span[0]} GiB" if span[0] == span[1] else f"{span[0]}-{span[1]} GiB as vLLM saw it"
        a_vs = f"a is {a / statistics.median(memories):.0%} of the device memory ({shown})"
    x_kind = "budget" if known else "gmu"
    xs = [_x(r, x_kind) for r in points]
    kv_line = least_squares(xs, [r.available_kv_gib for r in points]) or (a, b)
    residuals_x = {r.run_id: r.available_kv_gib - (kv_line[0] * x - kv_line[1]) for r, x in zip(points, xs, strict=True)}
    tok, tok_std = None, None
    if all(r.kv_cache_tokens is not None for r in points):
        tok = least_squares(xs, [float(r.kv_cache_tokens) for r in points])
        if tok is not None and n > 2:
            tok_std = math.sqrt(sum((r.kv_cache_tokens - (tok[0] * x - tok[1])) ** 2
                                    for r, x in zip(points, xs, strict=True)) / (n - 2))
    return Fit(a_gib=a, b_gib=b, runs=n, gmu_min=min(r.gmu for r in points), gmu_max=max(r.gmu for r in points),
               exact=n == 2, residuals_gib=residuals, residual_std_gib=std, device_memory_gib=span,
               a_vs_device=a_vs, x=x_kind, kv_a=kv_line[0], kv_b=kv_line[1], residuals_x_gib=residuals_x,
               tokens_a=tok[0] if tok else None,
               tokens_b=tok[1] if tok else None, tokens_residual_std=tok_std)


def _x(row: Row, kind: str) -> float:
    return row.budget_gib if kind == "budget" else row.gmu


def _common(values):
    distinct = {v for v in values}
    return distinct.pop() if len(distinct) == 1 else None

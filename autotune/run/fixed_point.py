"""The longest length that boots, where the KV pool shrinks as --max-model-len grows (pure).

vLLM measures the pool after memory that grows with --max-model-len is allocated (the CPU runner's
max_num_seqs x max_model_len token buffers) or profiled (the profile batch with chunked prefill
off). So an estimate made at a long length (the refusal at the target; `auto`, which profiles at
the model's full length and never re-profiles) lands below what boots: the longest length that
boots is the fixed point, the largest L on vLLM's block grid whose own pool holds it.

Every boot gives a point (the length its pool was measured at, the longest length that pool
holds): a refusal its estimate; a verified boot its "KV cache size" less the null block; `auto`
its fit, at the length it profiled. Two points give the slope, and the next boot is where the
line through them meets need = length (a secant step, kept inside what is known: above the
longest length that booted, below the shortest refused). It stops where vLLM says the next step
up does not fit: a refusal one step above, or the verified boot's own pool (it only shrinks as
the length grows, so what does not fit at this length fits at no longer one).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.analysis.pool_slope import pool_fits
from autotune.store.outcomes import ERROR, EXITED, REFUSED, VERIFIED

AUTO = "auto"
KV_CACHE = "kv_cache"


@dataclass(frozen=True)
class Bracket:
    """What the boots so far say: the longest length that booted, the pool it showed (in lengths it
    holds), the shortest refused, and the points (length the pool was measured at, length it holds)."""

    verified: int | None
    verified_fits: int | None  # the verified boot's own pool, as the longest length it holds (None: auto's)
    refused: int | None
    points: tuple[tuple[int, int], ...]
    estimate: int | None  # vLLM's own figure: the first refusal's estimate, or auto's fit
    grid: int


def bracket(attempts, grid: int) -> Bracket:
    verified = verified_fits = refused = estimate = None
    points: list[tuple[int, int]] = []
    for a in attempts:
        if a.limit != KV_CACHE:
            continue
        if a.outcome == VERIFIED and a.max_model_len == AUTO and isinstance(a.ceiling, int):
            if a.pool_at is not None:
                points.append((a.pool_at, a.ceiling))
            estimate = a.ceiling if estimate is None else estimate
            if verified is None or a.ceiling > verified:
                verified, verified_fits = a.ceiling, None
        elif a.outcome == VERIFIED and isinstance(a.max_model_len, int):
            fits = pool_fits(a.kv_cache_tokens, a.max_model_len, grid, a.holds_null) if a.kv_cache_tokens else None
            if fits is not None:
                points.append((a.max_model_len, fits))
            if verified is None or a.max_model_len > verified:
                verified, verified_fits = a.max_model_len, fits
        elif a.outcome == REFUSED and isinstance(a.ceiling, int) and a.ceiling_source == "estimate":
            points.append((int(a.max_model_len), a.ceiling))
            estimate = a.ceiling if estimate is None else estimate
            refused = int(a.max_model_len) if refused is None else min(refused, int(a.max_model_len))
        elif overran(a) and isinstance(a.pool_at, int):
            refused = a.pool_at if refused is None else min(refused, a.pool_at)
    return Bracket(verified, verified_fits, refused, tuple(points), estimate, grid)


def moving(attempts) -> bool:
    """Does this run's pool move with the length? Where a boot's log names a cause (the CPU
    backend's pool is what gmu reserves less the process's memory) or its command does (on a GPU:
    chunked prefill off without --max-num-batched-tokens, n-gram speculative decoding:
    vllm/length_memory.py), or where two boots' pools, read at different lengths, differ. A boot
    at vLLM's own estimate whose "KV cache size" shows more is not enough alone: a sliding-window
    model's is not its pool in lengths (its concurrency says so, and it is not counted then)."""
    return any(a.pool_moves for a in attempts) or pools_differ(attempts)


POOLS_DIFFER = 0.01  # of the pool: more than the few MiB re-profiling moves it between boots


def pools_differ(attempts) -> bool:
    """Do two boots' pools, each read as the longest length it holds at the length it was measured
    at, differ by more than two steps and POOLS_DIFFER? A refusal's estimate, auto's reduced fit,
    and a verified boot's "KV cache size" where its concurrency is that pool over the length (every
    layer full attention: a sliding-window model's concurrency is far above it)."""
    grid = max(a.grid for a in attempts)
    seen: dict[int, int] = {}
    for a in attempts:
        point = _pool_point(a, grid)
        if point is not None:
            seen.setdefault(*point)
    if len(seen) < 2:
        return False
    top, low = max(seen.values()), min(seen.values())
    return top - low > max(2 * grid, POOLS_DIFFER * top)


def _pool_point(a, grid: int) -> tuple[int, int] | None:
    if a.limit != KV_CACHE:
        return None
    if a.outcome == REFUSED and isinstance(a.ceiling, int) and a.ceiling_source == "estimate":
        return int(a.max_model_len), a.ceiling
    if a.outcome != VERIFIED:
        return None
    if a.max_model_len == AUTO:
        reduced = isinstance(a.pool_at, int) and isinstance(a.ceiling, int) and a.ceiling < a.pool_at
        return (a.pool_at, a.ceiling) if reduced else None
    if not a.kv_cache_tokens or not a.concurrency or not isinstance(a.max_model_len, int):
        return None
    blocks_per_request = -(-a.max_model_len // grid)
    if abs(a.concurrency * blocks_per_request * grid - a.kv_cache_tokens) > max(2 * grid, 0.01 * a.kv_cache_tokens):
        return None  # not the pool in lengths (a sliding-window model), or another step than thought
    return a.max_model_len, pool_fits(a.kv_cache_tokens, a.max_model_len, grid, a.holds_null)


def _secant(points: tuple[tuple[int, int], ...], grid: int) -> float | None:
    """Where the line through the two latest points of distinct lengths meets fits = length. A point's
    length is the longest on the grid its pool holds: its pool ends somewhere in the step above, half
    a step up on average (the line through the floors would aim a step short half the time)."""
    latest: list[tuple[int, int]] = []
    for length, fits in reversed(points):
        if all(length != seen for seen, _ in latest):
            latest.append((length, fits))
        if len(latest) == 2:
            break
    if len(latest) < 2:
        return None
    (l1, f1), (l2, f2) = ((length, fits + grid / 2) for length, fits in latest)
    slope = (f2 - f1) / (l2 - l1)  # tokens of pool per token of length: negative where the pool shrinks
    if slope >= 1:
        return None
    return (f1 - slope * l1) / (1 - slope)


@dataclass(frozen=True)
class Step:
    """The next boot (stop False: at `length`) or the end (stop True: `length` is the verified ceiling)."""

    stop: bool
    length: int
    reason: str


# A boot whose profile run took more than the budget (chunked prefill off: a batch of max_model_len
# tokens): vLLM prints a negative "Available KV cache memory" and stops, or the GPU runs out of memory.
OVERRUN_KINDS = ("negative_available_kv", "cuda_oom")
PROFILE_BATCH = "profile_batch_is_length"  # vllm/length_memory.py's cause


def overran(a) -> bool:
    """Did this boot fail because memory that grows with the length overran the budget?"""
    return a.outcome in (ERROR, EXITED) and a.error_kind in OVERRUN_KINDS and a.pool_moves == PROFILE_BATCH


def _after_overrun(target: int, attempts, n: int, max_boots: int) -> Step | None:
    """The profile batch at this length overran the budget, and is shorter at a shorter length:
    halfway down to the longest length that booted (no figure says more)."""
    b = bracket(attempts, max(a.grid for a in attempts))
    if b.refused is None or n >= max_boots:
        return None
    low = b.verified or 0
    length = (low + min(b.refused, target)) // 2 // b.grid * b.grid
    if length <= low:
        return None
    return Step(False, length, f"the profile batch of max_model_len tokens overran the memory at {b.refused:,}: "
                               "halfway down (it shrinks with the length)")


def next_step(target: int, attempts, n: int, max_boots: int) -> Step | None:
    """The next boot or the end; None: not this module's case (the pool does not move, or the last
    boot ended on something else than the KV pool)."""
    if not attempts or not moving(attempts):
        return None
    last = attempts[-1]
    if overran(last):
        return _after_overrun(target, attempts, n, max_boots)
    if last.limit != KV_CACHE or last.outcome not in (VERIFIED, REFUSED):
        return None
    grid = max(a.grid for a in attempts)  # a refused boot's log may not name the device
    b = bracket(attempts, grid)
    # A limit vLLM named that is not memory (the model's maximum, batched tokens, a draft model) caps
    # what any pool can serve.
    target = min([target, *(a.ceiling for a in attempts if a.limit != KV_CACHE and isinstance(a.ceiling, int))])
    if b.verified is None or b.verified >= target:
        return None
    top, said = b.verified, _said(b)
    if b.refused is not None and b.refused <= top + grid:
        return Step(True, top, f"{top:,} boots and {b.refused:,} (one step of {grid} above) is refused: "
                                           f"the longest length this command boots{said}")
    if b.verified_fits is not None and b.verified_fits < top + grid:
        return Step(True, top, f"{top:,} boots and its own KV pool holds no step more (it only shrinks "
                                           f"as the length grows): the longest length this command boots{said}")
    if n >= max_boots:
        return Step(True, top, f"{top:,} boots; a longer length may too, but --max-boots is reached{said}")
    aim = _secant(b.points, grid)
    if aim is None:  # one point: vLLM's estimate, or auto's fit (then a step above it shows the slope)
        aim = max(f for _, f in b.points) if b.points else top + grid
    if b.refused is not None and (aim >= b.refused or aim <= top):
        aim = (top + b.refused) / 2  # the line says nothing new inside what is known: bisect
    length = max(top + grid, int(aim) // grid * grid)
    if b.verified_fits is not None:
        length = min(length, max(top + grid, b.verified_fits))
    if b.refused is not None:
        length = min(length, top + (b.refused - 1 - top) // grid * grid)
    length = min(length, target)
    return Step(False, length, f"the fixed point of the pool's line (it shrinks as the length grows): {top:,} boots"
                          + (f", {b.refused:,} does not" if b.refused is not None else ""))


def _said(b: Bracket) -> str:
    if b.estimate is None or b.estimate >= b.verified:
        return ""
    return f"; vLLM's own figure was {b.estimate:,} ({(b.verified - b.estimate) / b.estimate:+.1%})"

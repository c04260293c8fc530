"""Groups of comparable runs (pure): their expectation, tolerance, pair verdicts and vLLM version changes."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

from autotune.analysis.gmu_fit import Fit, fit_group
from autotune.analysis.run_row import COMPILE_CACHE_KEY, Row, version_tuple

# Tolerance for "the same" available KV. The figures are printed with two decimals, so two of
# them differ by up to 0.01 GiB from rounding alone: the absolute floor is twice that. And two
# identical boots of one vLLM are not always granted the same KV cache: vllm#54383 reports about
# 5% less on the first boot of a new (max-num-batched-tokens, max-num-seqs) shape, so a change
# below 5% of the figure is not evidence of anything from one boot each.
TOLERANCE_FLOOR_GIB = 0.02
TOLERANCE_FRACTION = 0.05
# Where enough runs exist (3 or more with a KV figure), the spread of the runs around their own
# line widens the tolerance: 3 robust standard deviations (1.4826 x median absolute deviation,
# which one bad run cannot inflate the way it inflates a plain standard deviation).
MIN_RUNS_FOR_SPREAD = 3
SPREAD_SIGMAS = 3.0
MAD_TO_SIGMA = 1.4826


# ---- groups, tolerance and verdicts -----------------------------------------------------------

@dataclass
class Expectation:
    """What a change of settings should do to available KV, and why.

    mode "budget": vLLM grants itself device memory x gmu and the KV cache gets that minus a
    fixed amount, so the expected change is the change of that budget (it also follows a
    device memory that moved between runs, as a CPU node's does in a VM with hot-plugged
    memory). "fitted": the least-squares slope, where the device memory is unknown. "fixed":
    gmu does not size the KV cache. "none": nothing to expect from.
    """
    mode: str
    gib_per_gmu: float | None  # budget with one device memory, fitted a, or 0
    source: str


@dataclass
class Tolerance:
    gib: float
    source: str  # "floor" or "data"
    text: str


@dataclass
class PairVerdict:
    older: str
    newer: str
    gmu_older: float | None
    gmu_newer: float | None
    expected_delta_gib: float | None
    observed_delta_gib: float
    unexplained_gib: float | None
    tolerance: Tolerance | None
    verdict: str  # explained | consistent | unexplained | no_verdict
    text: str


@dataclass
class Group:
    group_id: str
    key: dict
    run_ids: list[str]
    gmu_sets_kv: bool
    fit: Fit | None
    expectation: Expectation
    spread: dict | None  # the data's own spread: {"sigma_gib", "runs"} from 3 runs on
    pairs: list[PairVerdict]
    tokens_per_gib: float | None
    tokens_per_gib_source: str | None
    ceiling_slack_tokens: int | None  # KV tokens minus the verified ceiling, where KV was the limit
    model_maximum: int | None = None  # the model's own maximum, where a run's vLLM named it
    length_slope: float | None = None  # pool tokens per token of --max-model-len, as the group's runs showed


def expectation_for(rows: list[Row], fit: Fit | None) -> Expectation:
    """How the verdicts expect available KV to move with gmu in one group.

    The budget vLLM computes (device memory x gmu) is what physics predicts, and no bad run
    can bend it the way it bends a fitted slope. Without the device memory, the fitted slope,
    but only where the fit is over-determined (3 runs or more): through two runs a line
    fits perfectly and proves nothing.
    """
    if not all(r.gmu_sets_kv for r in rows):
        notes = sorted({r.gmu_note for r in rows if r.gmu_note})
        return Expectation("fixed", 0.0, f"none: gmu does not size the KV cache here ({'; '.join(notes)})")
    memories = [r.device_memory_gib for r in rows]
    if memories and None not in memories:
        low, high = min(memories), max(memories)
        if low == high:
            return Expectation("budget", low, f"the device memory, {low} GiB ({rows[0].device_memory_source}) "
                                              "per unit of gmu: vLLM budgets memory x gmu")
        return Expectation("budget", None, f"each run's budget, device memory x gmu: vLLM saw {low}-{high} GiB "
                                           f"({rows[0].device_memory_source}), so the memory's change counts too")
    if fit is not None and not fit.exact:
        return Expectation("fitted", fit.a_gib, f"the fitted slope a = {fit.a_gib:.2f} GiB (device memory unknown)")
    return Expectation("none", None, "device memory unknown (give it: compare --device-memory 24GiB) and too few "
                                     "runs for a fitted slope to mean anything")


def expected_delta(older: Row, newer: Row, expectation: Expectation) -> float | None:
    """The change in available KV from `older` to `newer` that their settings explain."""
    if expectation.mode == "fixed":
        return 0.0
    if expectation.mode == "budget":
        return newer.budget_gib - older.budget_gib
    if older.gmu is None or newer.gmu is None:
        return None
    if abs(newer.gmu - older.gmu) < 1e-9:
        return 0.0
    if expectation.gib_per_gmu is None:
        return None
    return expectation.gib_per_gmu * (newer.gmu - older.gmu)


def data_spread(rows: list[Row], expectation: Expectation) -> dict | None:
    """Robust spread of the runs around the expected line (3 runs or more)."""
    points = [r for r in rows if r.available_kv_gib is not None and r.gmu is not None]
    if expectation.mode == "none" or len(points) < MIN_RUNS_FOR_SPREAD:
        return None
    # What each run lost to the fixed amount: with no noise they would all be equal.
    if expectation.mode == "budget":
        overheads = [r.budget_gib - r.available_kv_gib for r in points]
    else:
        overheads = [expectation.gib_per_gmu * r.gmu - r.available_kv_gib for r in points]
    centre = statistics.median(overheads)
    mad = statistics.median(abs(v - centre) for v in overheads)
    return {"sigma_gib": MAD_TO_SIGMA * mad, "runs": len(points)}


def tolerance_for(value_a: float, value_b: float, spread: dict | None) -> Tolerance:
    floor = max(TOLERANCE_FLOOR_GIB, TOLERANCE_FRACTION * max(abs(value_a), abs(value_b)))
    data = SPREAD_SIGMAS * spread["sigma_gib"] if spread else None
    floor_text = (f"floor: the larger of {TOLERANCE_FLOOR_GIB} GiB (two-decimal figures) and "
                  f"{TOLERANCE_FRACTION:.0%} of the figure (boot-to-boot, vllm#54383)")
    if data is not None and data > floor:
        return Tolerance(data, "data", f"data: {SPREAD_SIGMAS:g} x the robust spread of {spread['runs']} runs "
                                       f"around the line (above the {floor:.2f} GiB floor)")
    return Tolerance(floor, "floor", floor_text)


def judge_pair(older: Row, newer: Row, expectation: Expectation, spread: dict | None) -> PairVerdict:
    observed = newer.available_kv_gib - older.available_kv_gib
    base = dict(older=older.run_id, newer=newer.run_id, gmu_older=older.gmu, gmu_newer=newer.gmu,
                observed_delta_gib=observed)
    expected = expected_delta(older, newer, expectation)
    if expected is None:
        why = "gmu unknown" if older.gmu is None or newer.gmu is None else expectation.source
        return PairVerdict(**base, expected_delta_gib=None, unexplained_gib=None, tolerance=None,
                           verdict="no_verdict", text=f"no verdict: {why} (observed Δ {observed:+.2f} GiB)")
    same_gmu = older.gmu is not None and newer.gmu is not None and abs(newer.gmu - older.gmu) < 1e-9
    memory_moved = expectation.mode == "budget" and older.device_memory_gib != newer.device_memory_gib
    cause = "gmu" if not same_gmu and expectation.mode != "fixed" else ""
    if memory_moved:
        moved = f"the memory vLLM saw ({older.device_memory_gib} -> {newer.device_memory_gib} GiB)"
        cause = f"{cause} and {moved}" if cause else moved
    unexplained = observed - expected
    tol = tolerance_for(older.available_kv_gib, newer.available_kv_gib, spread)
    if abs(unexplained) > tol.gib:
        verdict = "unexplained"
        text = (f"unexplained Δ {unexplained:+.2f} GiB (expected Δ {expected:+.2f} GiB from {cause or 'the same gmu'}, "
                f"observed Δ {observed:+.2f} GiB; tolerance {tol.gib:.2f} GiB)")
    elif cause:
        verdict = "explained"
        text = f"explained by {cause} (expected Δ {expected:+.2f} GiB, observed Δ {observed:+.2f} GiB)"
    else:
        verdict = "consistent"
        why = "gmu does not size the KV cache" if expectation.mode == "fixed" else "same gmu"
        text = f"consistent: {why} (expected Δ +0.00 GiB, observed Δ {observed:+.2f} GiB)"
    return PairVerdict(**base, expected_delta_gib=expected, unexplained_gib=unexplained, tolerance=tol,
                       verdict=verdict, text=text)


def _pooled_tokens_per_gib(rows: list[Row]) -> tuple[float | None, str | None]:
    from_refusal = [r for r in rows if r.tokens_per_gib and (r.tokens_per_gib_source or "").startswith("a refusal")]
    chosen = from_refusal or [r for r in rows if r.tokens_per_gib]
    if not chosen:
        return None, None
    if from_refusal:
        return statistics.median(r.tokens_per_gib for r in chosen), chosen[0].tokens_per_gib_source
    tokens = sum(r.kv_cache_tokens for r in chosen)
    gib = sum(r.available_kv_gib for r in chosen)
    return tokens / gib, f"{tokens:,} KV tokens in {gib:.2f} GiB over {len(chosen)} run(s)"


def _ceiling_slack(rows: list[Row]) -> int | None:
    """How far below the KV pool's token count the ceiling sits, where KV was the limit.

    vLLM's estimate for one request is a little under the pool (a block or so), and the boot
    that verifies it may be granted a few MiB more than the boot that refused. Only ceilings
    that are vLLM's own number count: a sweep's accepted prediction sits lower by choice.
    """
    slacks = [r.kv_cache_tokens - r.ceiling for r in rows
              if r.kv_limited and r.kv_cache_tokens is not None and r.ceiling_from_vllm and r.one_memory]
    return int(statistics.median(slacks)) if slacks else None


def _length_slope(rows: list[Row]) -> float | None:
    """The group's slope: the median of its runs' (each read from boots that saw one memory)."""
    slopes = [r.length_slope for r in rows if r.length_slope is not None]
    return statistics.median(slopes) if slopes else None


def pairs_to_judge(rows: list[Row]) -> list[tuple[Row, Row]]:
    """Each run with the previous run of its group, and a reproduce with its original (rows in time order).

    Every other pair follows from these: its change is the sum of the steps between, and a
    step that gmu does not explain is named where it happened. All pairs of n runs would be
    n(n-1)/2 verdicts (4.5 million for 3,000 runs), none of which a reader needs.
    """
    pairs = list(itertools.pairwise(rows))
    index = {r.run_id: i for i, r in enumerate(rows)}
    for i, row in enumerate(rows):
        original = index.get(row.links.get("reproduces"))
        if original is not None and original != i - 1 and original < i:
            pairs.append((rows[original], row))
    return pairs


def build_group(group_id: str, rows: list[Row]) -> Group:
    fit = fit_group(rows) if all(r.gmu_sets_kv for r in rows) else None
    expectation = expectation_for(rows, fit)
    spread = data_spread(rows, expectation)
    measured = [r for r in rows if r.available_kv_gib is not None]
    pairs = [judge_pair(a, b, expectation, spread) for a, b in pairs_to_judge(measured)]
    tpg, tpg_source = _pooled_tokens_per_gib(rows)
    return Group(group_id=group_id, key=rows[0].key(), run_ids=[r.run_id for r in rows],
                 gmu_sets_kv=all(r.gmu_sets_kv for r in rows), fit=fit, expectation=expectation, spread=spread,
                 pairs=pairs, tokens_per_gib=tpg, tokens_per_gib_source=tpg_source,
                 ceiling_slack_tokens=_ceiling_slack(rows),
                 model_maximum=min((r.model_maximum for r in rows if r.model_maximum), default=None),
                 length_slope=_length_slope(rows))


def _hashable(key: dict) -> tuple:
    return tuple(sorted(key.items(), key=lambda kv: kv[0]))


def group_rows(rows: list[Row]) -> list[Group]:
    """Comparable groups, in order of each group's first run (rows are sorted by start time)."""
    buckets: dict[tuple, list[Row]] = {}
    for row in rows:
        buckets.setdefault(_hashable(row.key()), []).append(row)
    return [build_group(f"G{i + 1}", members) for i, members in enumerate(buckets.values())]


def differing_keys(key_a: dict, key_b: dict) -> dict[str, list]:
    """The keys two groups differ in, each with its two values (None: not set)."""
    names = sorted(set(key_a) | set(key_b), key=lambda k: (k.startswith("setting"), k))
    return {k: [key_a.get(k), key_b.get(k)] for k in names if key_a.get(k) != key_b.get(k)}


@dataclass
class VersionChange:
    older_group: str
    newer_group: str
    versions: list[str | None]  # [before, after]
    older: str  # run ids
    newer: str
    gmu: list[float | None]
    available_kv_gib: list[float | None]
    kv_cache_tokens: list[int | None]
    ceiling: list[int | None]
    delta_available_kv_gib: float | None
    delta_kv_cache_tokens: int | None
    delta_ceiling: int | None
    expected_from_gmu_gib: float  # when the default gmu itself changed with the version
    vllm_change_gib: float | None  # the part of the KV change that is vLLM's
    text: str
    reproduces: bool = False  # the newer run is `autotune reproduce` of the older
    compile_cache: list[str | None] | None = None  # [before, after] where the two boots' caches differ


def version_changes(groups: list[Group], rows_by_id: dict[str, Row]) -> list[VersionChange]:
    """Pairs of runs with the same command on two vLLM versions, and each reproduce with its original.

    Groups that differ only in the version are taken in version order, each with the next;
    their runs are matched by the gmu the command asks for (a flag value, or "the default"):
    when the command leaves gmu to vLLM and the default moved (0.9 -> 0.92 in 0.20), the part
    of the change that the new default explains is separated from the rest. A reproduce is
    matched with the run it reproduces wherever the two sit.
    """
    group_of = {rid: g for g in groups for rid in g.run_ids}
    families: dict[tuple, list[Group]] = {}
    for g in groups:
        # A new vLLM compiles afresh (its cache is cold where the old one's was warm): the cache
        # state does not keep the two versions apart; the change names it (_version_change).
        family = {k: v for k, v in g.key.items() if k not in ("vllm_version", COMPILE_CACHE_KEY)}
        families.setdefault(_hashable(family), []).append(g)
    out = []
    paired: set[tuple[str, str]] = set()
    for family in families.values():
        ordered = sorted(family, key=lambda g: version_tuple(rows_by_id[g.run_ids[0]].vllm_version) or ())
        for old_g, new_g in itertools.pairwise(ordered):
            old_last = {_asked_gmu(rows_by_id[i]): rows_by_id[i] for i in old_g.run_ids}
            new_last = {_asked_gmu(rows_by_id[i]): rows_by_id[i] for i in new_g.run_ids}
            for asked in sorted(set(old_last) & set(new_last), key=str):
                out.append(_version_change(old_g, new_g, old_last[asked], new_last[asked]))
                paired.add((old_last[asked].run_id, new_last[asked].run_id))
    for row in rows_by_id.values():
        original = rows_by_id.get(row.links.get("reproduces"))
        if original is None or group_of[original.run_id] is group_of[row.run_id]:
            continue  # a reproduce in its original's group is one of that group's pairs
        if (original.run_id, row.run_id) in paired:
            next(vc for vc in out if (vc.older, vc.newer) == (original.run_id, row.run_id)).reproduces = True
            continue
        change = _version_change(group_of[original.run_id], group_of[row.run_id], original, row)
        change.reproduces = True
        out.append(change)
    return out


def _asked_gmu(row: Row) -> str:
    return f"{row.gmu}" if row.gmu_source == "flag" else "default"


def _delta(a, b):
    return None if a is None or b is None else b - a


def _version_change(old_g: Group, new_g: Group, before: Row, after: Row) -> VersionChange:
    d_kv = _delta(before.available_kv_gib, after.available_kv_gib)
    d_tok = _delta(before.kv_cache_tokens, after.kv_cache_tokens)
    d_ceil = _delta(before.ceiling, after.ceiling)
    expected = 0.0
    if before.budget_gib is not None and after.budget_gib is not None and before.gmu != after.gmu:
        expected = after.budget_gib - before.budget_gib
    vllm_part = None if d_kv is None else d_kv - expected
    parts = [f"vLLM change {before.vllm_version} -> {after.vllm_version}:"]
    if d_kv is not None:
        parts.append(f"available KV {d_kv:+.2f} GiB ({before.available_kv_gib} -> {after.available_kv_gib})")
    if expected:
        parts.append(f"of which {expected:+.2f} GiB is the default gmu moving {before.gmu} -> {after.gmu}, "
                     f"{vllm_part:+.2f} GiB is vLLM's own")
    if d_tok is not None:
        parts.append(f"KV tokens {d_tok:+,}")
    if d_ceil is not None:
        parts.append(f"ceiling {d_ceil:+,}")
    caches = None
    if before.compile_cache != after.compile_cache:
        caches = [before.compile_cache, after.compile_cache]
        parts.append(f"the torch.compile cache was {_cache_text(before.compile_cache)} then "
                     f"{_cache_text(after.compile_cache)} (a cold cache has been reported to cost ~14% of KV tokens)")
    return VersionChange(
        older_group=old_g.group_id, newer_group=new_g.group_id, versions=[before.vllm_version, after.vllm_version],
        older=before.run_id, newer=after.run_id, gmu=[before.gmu, after.gmu],
        available_kv_gib=[before.available_kv_gib, after.available_kv_gib],
        kv_cache_tokens=[before.kv_cache_tokens, after.kv_cache_tokens], ceiling=[before.ceiling, after.ceiling],
        delta_available_kv_gib=d_kv, delta_kv_cache_tokens=d_tok, delta_ceiling=d_ceil,
        expected_from_gmu_gib=expected, vllm_change_gib=vllm_part, text=parts[0] + " " + "; ".join(parts[1:]),
        compile_cache=caches)


def _cache_text(state: str | None) -> str:
    return state or "not used"

"""Comparing runs honestly (pure): run records in, table rows, groups, fits and verdicts out.

A difference in available KV cache between two runs means something only once the settings
that move it are accounted for. The biggest one is --gpu-memory-utilization (gmu): vLLM
budgets `device memory x gmu` and gives the KV cache what is left after the weights and the
fixed overhead, so

    available KV GiB = a x gmu - b      (a ~ usable device memory, b ~ weights + fixed overhead)

Runs are grouped by everything else that moves the figure (model, device, vLLM version,
every other setting). Inside a group the line is fitted by least squares (a sweep's points
with the fit: each run's residual) and each run is judged against the previous run of its
group, and a reproduce against its original: the change that gmu explains, or the part it
does not. A group is "not comparable" with the group before it (of the same model where
there is one), with the keys that differ named; when the only difference is the vLLM
version, the change is labelled a vLLM change. Every step is linear in the runs, so
10,000 runs compare in seconds (bench/compare_scale.py).

Nothing here reads files or starts processes: records are the dicts artifact.load_run returns.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field

from autotune.host import gpus as gpus_mod
from autotune.vllm import servecmd, versions

GMU_FLAG = "--gpu-memory-utilization"

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

# Options that do not change how memory is shared out: where the server listens, what it
# logs, how it answers. Everything else in the serve command is part of "the settings".
NEUTRAL_OPTIONS = frozenset({
    "model", "port", "host", "max-model-len", "gpu-memory-utilization", "served-model-name", "api-key",
    "uvicorn-log-level", "disable-log-requests", "enable-log-requests", "disable-log-stats",
    "disable-uvicorn-access-log", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "root-path",
    "allowed-origins", "allowed-methods", "allowed-headers", "allow-credentials", "chat-template",
    "response-role", "tool-call-parser", "enable-auto-tool-choice", "reasoning-parser", "download-dir",
    "middleware", "log-config-file", "trust-remote-code",
})
# Environment variables that can change the memory split. Logging switches are left out.
MEMORY_ENV_PREFIXES = ("VLLM_", "PYTORCH_CUDA_ALLOC_CONF")
NEUTRAL_ENV = frozenset({"VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH",
                         "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "VLLM_API_KEY", "VLLM_LOG_STATS_INTERVAL"})


# ---- one run as compare sees it -------------------------------------------------------------

@dataclass
class Row:
    run_id: str
    started_at: str | None
    kind: str
    vllm_version: str | None
    device: str  # "NVIDIA GeForce RTX 3090 24.0 GiB", "2x NVIDIA H100 80GB HBM3 79.2 GiB", "cpu 23.5 GiB RAM"
    device_memory_gib: float | None  # what vLLM multiplies gmu by (one GPU's memory; the CPU node's)
    device_memory_source: str
    model: str | None
    gmu: float | None
    gmu_source: str  # "flag", "vLLM 0.32.0 default", or why it is unknown
    gmu_sets_kv: bool  # False when the KV pool is fixed another way (--kv-cache-memory-bytes, ...)
    gmu_note: str | None
    max_num_seqs: str | None
    max_num_batched_tokens: str | None
    kv_cache_dtype: str | None
    settings: dict[str, str]  # every setting but gmu that can move the KV figure (options and env)
    weights_gib: float | None
    available_kv_gib: float | None
    kv_cache_tokens: int | None
    ceiling: int | None  # the verified ceiling
    target: int | None
    verdict: str | None
    tokens_per_gib: float | None  # KV tokens per GiB, from this run's own figures
    tokens_per_gib_source: str | None
    ceiling_from_vllm: bool = True  # False when the ceiling is a sweep's accepted prediction
    links: dict = field(default_factory=dict)

    @property
    def budget_gib(self) -> float | None:
        """The memory vLLM grants itself: device memory x gmu (None where unknown or moot)."""
        if self.device_memory_gib is None or self.gmu is None or not self.gmu_sets_kv:
            return None
        return self.device_memory_gib * self.gmu

    @property
    def kv_limited(self) -> bool:
        """The ceiling is where the KV cache ran out (not the target, which fitted)."""
        return self.ceiling is not None and self.target is not None and self.ceiling < self.target

    def key(self) -> dict:
        """What must be equal for two runs to be compared (gmu is allowed to differ)."""
        return {"model": self.model, "device": self.device, "vllm_version": self.vllm_version,
                **{f"setting {k}": v for k, v in self.settings.items()}}


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    parts = re.findall(r"\d+", version.split("+")[0])[:3]
    return tuple(int(p) for p in parts) if parts else None


def default_gmu(vllm_version: str | None) -> tuple[float | None, str]:
    """vLLM's default gmu for a version, and how it was decided."""
    gmu = versions.default_gmu(vllm_version)  # the one rule (0.9, 0.92 from 0.20)
    if gmu is None:
        return None, "no --gpu-memory-utilization and the vLLM version is unknown, so its default is too"
    other = "0.9 before 0.20" if gmu == versions.HIGHEST_DEFAULT_GMU else "0.92 from 0.20"
    return gmu, f"vLLM {vllm_version} default ({gmu}; {other})"


def used_gpus(record: dict) -> list[dict]:
    """The GPUs the run's vLLM saw: the NVML indices tune recorded, else what the recorded
    environment's CUDA_VISIBLE_DEVICES names (gpus.visible_gpus), else all of them."""
    machine = record.get("machine") or {}
    inventory = list(machine.get("gpus") or [])
    if not inventory:
        return []
    indices = (record.get("gpus") or {}).get("indices")
    if indices:
        chosen = [g for i in indices for g in inventory if g.get("index") == i]
        if chosen:
            return chosen
    env = dict(record.get("environment") or {})
    if "CUDA_VISIBLE_DEVICES" not in env and machine.get("cuda_visible_devices") is not None:
        env["CUDA_VISIBLE_DEVICES"] = machine["cuda_visible_devices"]
    seen = gpus_mod.visible_gpus(env, inventory)
    return list(seen.gpus) if seen is not None and seen.gpus else inventory


def device_of(machine: dict, gpus: list[dict], facts: dict) -> tuple[str, float | None, str]:
    """(device label, the memory vLLM multiplies gmu by, where that figure came from)."""
    if gpus:
        names = sorted({(g.get("name") or "GPU", g.get("memory_total_gib")) for g in gpus},
                       key=lambda t: (str(t[0]), t[1] or 0))
        label = ", ".join(f"{name} {mem} GiB" if mem is not None else name for name, mem in names)
        if len(gpus) > 1 and len(names) == 1:
            label = f"{len(gpus)}x {label}"
        mems = {g.get("memory_total_gib") for g in gpus}
        if len(mems) == 1 and None not in mems:
            return label, float(mems.pop()), "the GPU's total memory (NVML)"
        return label, None, "GPUs of different sizes"
    ram = ((machine or {}).get("host") or {}).get("ram_total_gib")
    label = f"cpu {ram} GiB RAM" if ram is not None else "cpu"
    node = facts.get("cpu_node_total_gib")
    if node is not None:
        return label, float(node), "the NUMA node's memory as vLLM printed it"
    return label, None, "not in the log (the CPU backend prints it from vLLM 0.20)"


def settings_of(argv: list[str], environment: dict) -> dict[str, str]:
    options = servecmd.long_options(argv)
    settings = {f"--{k}": _text(v) for k, v in options.items() if k not in NEUTRAL_OPTIONS}
    for name, value in (environment or {}).items():
        if name.startswith(MEMORY_ENV_PREFIXES) and name not in NEUTRAL_ENV:
            settings[f"env {name}"] = str(value)
    return dict(sorted(settings.items()))


def _text(value) -> str:
    return "true" if value is True else str(value)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def tokens_per_gib_of(record: dict, facts: dict) -> tuple[float | None, str | None]:
    """KV tokens per GiB for this model and settings, as precisely as the run shows it.

    A refusal prints the GiB needed for the requested length (8.0 GiB for 1,048,576 tokens):
    a large number, so its two-decimal rounding costs little. Failing that, the KV pool's
    token count over its GiB figure (a small GiB number: rounding can cost a few percent).
    """
    best = None
    for attempt in record.get("attempts") or []:
        f = attempt.get("facts") or {}
        need, length = f.get("kv_needed_gib"), f.get("max_model_len_requested")
        if need and length and (best is None or need > best[0]):
            best = (need, length)
    if best is not None:
        return best[1] / best[0], f"a refusal: {best[1]:,} tokens need {best[0]} GiB"
    tokens, gib = facts.get("kv_cache_tokens"), facts.get("available_kv_gib")
    if tokens and gib:
        return tokens / gib, f"{tokens:,} KV tokens in {gib} GiB"
    return None, None


def run_row(record: dict) -> Row:
    """One run record (as artifact.load_run returns it) as a comparison row."""
    command = record.get("command") or {}
    argv = servecmd.with_config(list(command.get("argv") or []), command.get("cwd"))  # --config's values count
    result = record.get("result") or {}
    attempts = record.get("attempts") or []
    facts = dict((attempts[-1].get("facts") or {}) if attempts else {})
    for key in ("available_kv_gib", "kv_cache_tokens", "weights_gib"):
        if facts.get(key) is None and result.get(key) is not None:
            facts[key] = result[key]
    version = record.get("vllm_version") or facts.get("vllm_version")
    environment = record.get("environment") or {}
    device, memory, memory_source = device_of(record.get("machine") or {}, used_gpus(record), facts)

    flag = servecmd.flag_value(argv, GMU_FLAG)
    if flag is not None:
        gmu = _float(flag)
        gmu_source = "flag" if gmu is not None else f"unreadable {GMU_FLAG} {flag!r}"
    else:
        gmu, gmu_source = default_gmu(version)
    gmu_sets_kv, gmu_note = True, None
    on_cpu = device.startswith("cpu")
    known = versions.profile(version)
    if servecmd.has_flag(argv, "--kv-cache-memory-bytes"):
        gmu_sets_kv, gmu_note = False, "the KV pool is fixed by --kv-cache-memory-bytes"
    elif on_cpu and environment.get("VLLM_CPU_KVCACHE_SPACE"):
        gmu_sets_kv, gmu_note = False, "the KV pool is fixed by VLLM_CPU_KVCACHE_SPACE"
    elif on_cpu and known is not None and not known.cpu_gmu_sizes_kv:
        gmu_sets_kv, gmu_note = False, "before vLLM 0.20 the CPU backend ignores gmu (VLLM_CPU_KVCACHE_SPACE sizes KV)"

    tpg, tpg_source = tokens_per_gib_of(record, facts)
    verified = bool(result.get("verified"))
    final_basis = attempts[-1].get("basis") if attempts else None
    return Row(
        run_id=record.get("run_id") or "?",
        started_at=record.get("started_at"),
        kind=record.get("kind") or "tune",
        vllm_version=version,
        device=device,
        device_memory_gib=memory,
        device_memory_source=memory_source,
        model=record.get("model"),
        gmu=gmu,
        gmu_source=gmu_source,
        gmu_sets_kv=gmu_sets_kv,
        gmu_note=gmu_note,
        max_num_seqs=servecmd.flag_value(argv, "--max-num-seqs"),
        max_num_batched_tokens=servecmd.flag_value(argv, "--max-num-batched-tokens"),
        kv_cache_dtype=servecmd.flag_value(argv, "--kv-cache-dtype"),
        settings=settings_of(argv, environment),
        weights_gib=facts.get("weights_gib"),
        available_kv_gib=facts.get("available_kv_gib"),
        kv_cache_tokens=facts.get("kv_cache_tokens"),
        ceiling=result.get("ceiling") if verified else None,
        target=record.get("target"),
        verdict=result.get("verdict"),
        tokens_per_gib=tpg,
        tokens_per_gib_source=tpg_source,
        ceiling_from_vllm=final_basis not in ("start_at", "room"),
        links=dict(record.get("links") or {}),
    )


# ---- fitting ---------------------------------------------------------------------------------

def least_squares(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """(a, b) of y = a*x - b minimising the squared residuals; None with fewer than 2 distinct x."""
    n = len(xs)
    if n < 2 or n != len(ys):
        return None
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 1e-12:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
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
    residuals_x = {r.run_id: r.available_kv_gib - (kv_line[0] * x - kv_line[1]) for r, x in zip(points, xs)}
    tok, tok_std = None, None
    if all(r.kv_cache_tokens is not None for r in points):
        tok = least_squares(xs, [float(r.kv_cache_tokens) for r in points])
        if tok is not None and n > 2:
            tok_std = math.sqrt(sum((r.kv_cache_tokens - (tok[0] * x - tok[1])) ** 2
                                    for r, x in zip(points, xs)) / (n - 2))
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
    return Expectation("none", None, "device memory unknown and too few runs for a fitted slope to mean anything")


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
              if r.kv_limited and r.kv_cache_tokens is not None and r.ceiling_from_vllm]
    return int(statistics.median(slacks)) if slacks else None


def pairs_to_judge(rows: list[Row]) -> list[tuple[Row, Row]]:
    """Each run with the previous run of its group, and a reproduce with its original (rows in time order).

    Every other pair follows from these: its change is the sum of the steps between, and a
    step that gmu does not explain is named where it happened. All pairs of n runs would be
    n(n-1)/2 verdicts (4.5 million for 3,000 runs), none of which a reader needs.
    """
    pairs = [(a, b) for a, b in zip(rows, rows[1:])]
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
                 ceiling_slack_tokens=_ceiling_slack(rows))


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
        families.setdefault(_hashable({k: v for k, v in g.key.items() if k != "vllm_version"}), []).append(g)
    out = []
    paired: set[tuple[str, str]] = set()
    for family in families.values():
        ordered = sorted(family, key=lambda g: version_tuple(rows_by_id[g.run_ids[0]].vllm_version) or ())
        for old_g, new_g in zip(ordered, ordered[1:]):
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
    return VersionChange(
        older_group=old_g.group_id, newer_group=new_g.group_id, versions=[before.vllm_version, after.vllm_version],
        older=before.run_id, newer=after.run_id, gmu=[before.gmu, after.gmu],
        available_kv_gib=[before.available_kv_gib, after.available_kv_gib],
        kv_cache_tokens=[before.kv_cache_tokens, after.kv_cache_tokens], ceiling=[before.ceiling, after.ceiling],
        delta_available_kv_gib=d_kv, delta_kv_cache_tokens=d_tok, delta_ceiling=d_ceil,
        expected_from_gmu_gib=expected, vllm_change_gib=vllm_part, text=parts[0] + " " + "; ".join(parts[1:]))


@dataclass
class Report:
    runs: list[Row]
    groups: list[Group]
    not_comparable: list[dict]  # {"groups": [G1, G2], "differing": {key: [a, b]}, "vllm_change_only": bool}
    version_changes: list[VersionChange]

    def to_json(self) -> dict:
        return asdict(self)


def compare(records: list[dict]) -> Report:
    """The whole comparison of some run records."""
    rows = sorted((run_row(r) for r in records), key=lambda r: (r.started_at or "", r.run_id))
    seen, unique = set(), []
    for row in rows:  # the same run named twice (by id and by folder) counts once
        if row.run_id not in seen:
            seen.add(row.run_id)
            unique.append(row)
    groups = group_rows(unique)
    rows_by_id = {r.run_id: r for r in unique}
    return Report(runs=unique, groups=groups, not_comparable=not_comparable_of(groups),
                  version_changes=version_changes(groups, rows_by_id))


NEAREST_GROUPS = 8  # how many earlier groups of a model a group is held against, for the nearest


def not_comparable_of(groups: list[Group]) -> list[dict]:
    """Each group against its nearest earlier group: of the same model, the one (of the last
    NEAREST_GROUPS) that differs in the fewest keys; for a model's first group, the group before it.

    What a reader asks is why these runs are apart from those; every pair of groups would be
    quadratic in the groups and say the same differences again and again.
    """
    out = []
    recent: dict = {}
    for i, group in enumerate(groups):
        model = group.key.get("model")
        candidates = recent.setdefault(model, [])
        if candidates:
            before, differing = min(((g, differing_keys(g.key, group.key)) for g in reversed(candidates)),
                                    key=lambda found: len(found[1]))
        elif i:
            before, differing = groups[i - 1], differing_keys(groups[i - 1].key, group.key)
        else:
            before = None
        candidates.append(group)
        del candidates[:-NEAREST_GROUPS]
        if before is not None:
            out.append({"groups": [before.group_id, group.group_id], "differing": differing,
                        "vllm_change_only": set(differing) == {"vllm_version"}})
    return out


# ---- prediction --------------------------------------------------------------------------------

@dataclass
class Prediction:
    group_id: str
    gmu: float
    available_kv_gib: float
    kv_cache_tokens: int | None
    ceiling: int | None  # the longest --max-model-len expected to boot
    ceiling_is_upper_bound: bool  # no measured run was KV-limited: the ceiling is at most the KV tokens
    basis: str  # the fit or slope the prediction comes from
    warnings: list[str]
    error_tokens: float | None = None  # the token line's residual spread (3 runs or more)
    device: str = ""  # the group's device label ("cpu ..." or a GPU)
    slack_tokens: int | None = None  # what vLLM keeps between its pool and its ceiling, as the group showed


def predict(group: Group, rows: list[Row], gmu: float) -> Prediction | None:
    """Available KV, KV tokens and the ceiling at `gmu`, from a group's measured runs.

    Two or more gmu values: the least-squares lines. One gmu value: the budget's change
    (device memory x gmu) from the runs measured there. Where the device memory is known the
    lines run against the budget, at the newest run's device memory. None when neither works.
    """
    points = [r for r in rows if r.gmu is not None and r.available_kv_gib is not None]
    if not points or not group.gmu_sets_kv:
        return None
    warnings: list[str] = []
    fit = group.fit
    tpg = group.tokens_per_gib
    memory_now = next((r.device_memory_gib for r in reversed(points) if r.device_memory_gib is not None), None)
    if fit is not None:
        x = memory_now * gmu if fit.x == "budget" else gmu
        kv = fit.kv_a * x - fit.kv_b
        basis = (f"least squares over {fit.runs} runs at gmu {fit.gmu_min:g}-{fit.gmu_max:g}: "
                 f"available KV = {fit.a_gib:.2f} x gmu - {fit.b_gib:.2f} GiB")
        if fit.tokens_a is not None:
            tokens = fit.tokens_a * x - fit.tokens_b
            per = "GiB of budget (device memory x gmu)" if fit.x == "budget" else "unit of gmu"
            basis += f"; KV tokens: {fit.tokens_a:,.0f} per {per}"
        else:
            tokens = kv * tpg if tpg else None
        low, high = fit.gmu_min, fit.gmu_max
    elif group.expectation.mode == "budget":
        budget = memory_now * gmu
        kv = statistics.mean(r.available_kv_gib + budget - r.budget_gib for r in points)
        with_tokens = [r for r in points if r.kv_cache_tokens is not None]
        tokens = (statistics.mean(r.kv_cache_tokens + (budget - r.budget_gib) * tpg for r in with_tokens)
                  if with_tokens and tpg else None)
        basis = f"one gmu value measured ({points[0].gmu:g}), moved by the budget: device memory x gmu"
        if tpg:
            basis += f"; {tpg:,.0f} tokens per GiB ({group.tokens_per_gib_source})"
        low = high = points[0].gmu
    else:
        return None
    if fit is None or fit.x == "budget":
        memories = {r.device_memory_gib for r in points}
        basis += (f"; device memory {memory_now} GiB" if len(memories) == 1 else
                  f"; device memory taken as {memory_now} GiB, the newest run's (the runs saw "
                  f"{min(memories)}-{max(memories)} GiB)")
    if gmu < low - 1e-9 or gmu > high + 1e-9:
        measured = f"{low:g}" if low == high else f"{low:g}-{high:g}"
        warnings.append(f"gmu {gmu:g} is outside the measured range ({measured}): this is an extrapolation")
    if kv <= 0:
        warnings.append(f"the line gives {kv:.2f} GiB at gmu {gmu:g}: nothing would be left for the KV cache")
    ceiling = None
    upper = False
    if tokens is not None:
        tokens = max(0, int(tokens))
        if group.ceiling_slack_tokens is not None:
            ceiling = max(0, tokens - group.ceiling_slack_tokens)
        else:
            ceiling, upper = tokens, True
            warnings.append("no measured run was limited by KV (each reached its target): "
                            "the ceiling is at most the KV token count")
    return Prediction(group_id=group.group_id, gmu=gmu, available_kv_gib=kv, kv_cache_tokens=tokens,
                      ceiling=ceiling, ceiling_is_upper_bound=upper, basis=basis, warnings=warnings,
                      error_tokens=fit.tokens_residual_std if fit is not None else None, device=points[0].device,
                      slack_tokens=None if upper else group.ceiling_slack_tokens)


# ---- sweep planning -----------------------------------------------------------------------------

# How a boot at a predicted length L ends (strategy.next_step, given the group's slack s, what vLLM
# keeps between its KV pool and its ceiling): above vLLM's ceiling C, vLLM refuses it and its
# estimate verifies next (2 boots, as without a prediction); when L verifies, the boot's own pool K
# says where the ceiling is, K - s, and L is accepted when within ROOM_TOLERANCE of it; further
# below, the next boot is at K - s (2 boots). One boot is saved inside the window
# [C / (1 + ROOM_TOLERANCE), C], whatever the size of the pool; both misses cost one boot more.
#
# So the aim is never above the prediction (a good prediction is vLLM's ceiling, and a boot just
# above it is a refusal): it sits d tokens under the predicted ceiling, where d = min(W/2, 2 sigma)
# for a window W wide and a prediction error sigma: a precise prediction is booted almost as is
# (refused with ~2% chance), a vague one at the middle of the window.
#
# The error of a prediction is the token line's residual spread where 3 or more runs show it;
# from fewer runs it is not known, and a prior is used, as a fraction of the pool. On vLLM's CPU
# backend our sweeps' predictions from one or two points were off by 10-400 tokens in pools of
# 25,000-178,000 (up to 0.4%, when the memory the node reports moved); the prior is 0.2%. On GPUs
# the profiling of activation memory varies between boots (vllm#54383 reports up to ~5%): 1%.
SWEEP_PRIOR_ERROR_FRACTION = {"cpu": 0.002, "gpu": 0.01}
AIM_SIGMAS = 2.0  # how far under the predicted ceiling a boot aims, in prediction errors (at most W/2)


@dataclass(frozen=True)
class SweepAim:
    start_at: int | None  # the first boot's length; None: the target
    reason: str
    slack_tokens: int | None = None  # for the tune: the ceiling a verified boot's pool shows is pool - slack


def _phi_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def sweep_aim(prediction: Prediction | None, target: int, room_tolerance: float) -> SweepAim:
    """The length a sweep point boots first (None: the target), why, and the slack to read its pool with."""
    if prediction is None or prediction.ceiling is None or prediction.kv_cache_tokens is None:
        return SweepAim(None, "no prediction: booting the target")
    if prediction.ceiling_is_upper_bound:
        return SweepAim(None, "no measured run was limited by KV, so the ceiling is not predicted: booting the target")
    if prediction.ceiling >= target:
        return SweepAim(None, f"the target {target:,} is predicted to fit: booting it")
    slack = prediction.slack_tokens if prediction.slack_tokens is not None else \
        prediction.kv_cache_tokens - prediction.ceiling
    window = prediction.ceiling * room_tolerance / (1 + room_tolerance)
    prior = SWEEP_PRIOR_ERROR_FRACTION["cpu" if prediction.device.startswith("cpu") else "gpu"]
    sigma = prediction.error_tokens or prior * prediction.kv_cache_tokens
    below = min(window / 2, AIM_SIGMAS * sigma)
    aim = int(prediction.ceiling - below)
    if aim <= 0:
        return SweepAim(None, f"the aim {aim:,} is not a length: booting the target")
    p_one = _phi_cdf((window - below) / sigma) - _phi_cdf(-below / sigma) if sigma > 0 else 1.0
    p_refused = _phi_cdf(-below / sigma) if sigma > 0 else 0.0
    return SweepAim(aim, (f"{below:,.0f} tokens under the predicted ceiling {prediction.ceiling:,}: a boot within "
                          f"{room_tolerance:.0%} under vLLM's ceiling is accepted at once (~{p_one:.0%} with a "
                          f"prediction error of {sigma:,.0f} tokens); above it vLLM refuses (~{p_refused:.0%}), "
                          f"further below its pool less the {slack:,}-token slack is booted next"), slack)


def sweep_start_at(prediction: Prediction | None, target: int, room_tolerance: float) -> tuple[int | None, str]:
    """The length a sweep point boots first (None: the target), and why (see sweep_aim)."""
    aim = sweep_aim(prediction, target, room_tolerance)
    return aim.start_at, aim.reason


def sweep_point_outcome(record: dict, start_at: int | None) -> dict:
    """Boots a sweep point used, against the two of the refusal path, and which one was saved."""
    everything = record.get("attempts") or []
    # A boot cut short by an interruption (the sweep was resumed) cost time but decided nothing:
    # it counts as used, not against the predictions.
    attempts = [a for a in everything if a.get("outcome") != "interrupted"]
    cut_short = len(everything) - len(attempts)
    result = record.get("result") or {}
    boots = len(attempts)
    ceiling = result.get("ceiling") if result.get("verified") else None
    target = record.get("target")
    first = attempts[0] if attempts else {}
    # Without a prediction a point costs 2 boots when the target is refused (the target, then
    # vLLM's ceiling) and 1 when the target fits.
    baseline = 1 if ceiling is not None and target is not None and ceiling >= target else 2
    if record.get("plan") in ("auto", "auto_probe"):
        baseline = boots  # vLLM fits the length itself: predictions have nothing to save
        note = f"vLLM's --max-model-len auto fitted it ({boots} boot{'s' if boots != 1 else ''}; no prediction used)"
    elif start_at is None:
        note = "no prediction yet: booted the target first"
    elif first.get("outcome") == "verified" and boots == 1:
        note = (f"saved the boot at the target: the first boot, at {start_at:,} (aimed from the prediction), "
                f"verified and was accepted as the ceiling")
    elif first.get("outcome") == "refused":
        est = first.get("ceiling")
        note = (f"the first boot, at {start_at:,} (aimed from the prediction), was too high: vLLM refused it"
                + (f" (its estimate: {est:,}, {start_at - est:+,} tokens off)" if est else "")
                + "; no boot saved")
    elif first.get("outcome") == "verified":
        note = (f"the first boot, at {start_at:,} (aimed from the prediction), verified but sat more than 1% "
                f"under the ceiling its KV pool shows: booted again higher; no boot saved")
    else:
        note = f"the first boot, at {start_at:,} (aimed from the prediction), ended {first.get('outcome')}"
    outcome = {"boots": boots + cut_short, "boots_without_prediction": baseline, "saved": baseline - boots,
               "note": note}
    if cut_short:
        outcome["boots_interrupted"] = cut_short
        outcome["note"] += f"; plus {cut_short} boot{'s' if cut_short != 1 else ''} cut short by an interruption"
    return outcome


# ---- reproduce ------------------------------------------------------------------------------------

# The verdict of `autotune reproduce` (analysis/reproduce.py) as exit codes.
EXIT_SAME_OR_BETTER = 0
EXIT_ERROR = 3
EXIT_REGRESSION = 7

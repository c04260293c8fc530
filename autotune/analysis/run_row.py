"""One run record as compare sees it (pure): the Row, its device, gmu, settings and KV figures.

The settings that move the KV figure (every serve option and memory environment variable but
the neutral ones) are the group key of analysis/run_groups.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autotune.analysis import longest, pool_slope
from autotune.host import gpus as gpus_mod
from autotune.store import outcomes
from autotune.store.record import Attempt, BootFacts, Command, GpuPlan, Machine, Result, RunRecord
from autotune.vllm import servecmd, versions

GMU_FLAG = "--gpu-memory-utilization"
COMPILE_CACHE_KEY = "compile_cache"  # the group key's name for a boot's torch.compile cache state

# Options that do not change how memory is shared out: where the server listens, what it
# logs, how it answers. Everything else in the serve command is part of "the settings".
NEUTRAL_OPTIONS = frozenset({
    "model", "port", "host", "max-model-len", "gpu-memory-utilization", "served-model-name", "api-key",
    "uvicorn-log-level", "disable-log-requests", "enable-log-requests", "disable-log-stats",
    "disable-uvicorn-access-log", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "root-path",
    "allowed-origins", "allowed-methods", "allowed-headers", "allow-credentials", "chat-template",
    "response-role", "tool-call-parser", "enable-auto-tool-choice", "reasoning-parser", "download-dir",
    "middleware", "log-config-file", "trust-remote-code",
    "time-scale",  # the replaying vLLM's own: how fast it plays a boot's seconds, not what memory it shares out
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
    # The ceiling and the pool were read from one memory: an auto-fit boot, or a refusal whose available
    # KV the verified boot saw again. Only then does pool - ceiling say what vLLM keeps back (a node whose
    # memory grew between the two boots taught a 'slack' of 12,160 tokens).
    one_memory: bool = True
    links: dict = field(default_factory=dict)
    # The torch.compile cache of the boot whose figures these are: "cold" (it compiled), "warm"
    # (it loaded every graph), None (nothing compiled, as with --enforce-eager, or not in the log).
    # A cold cache has been reported to cost ~14% of KV tokens, so it counts as a setting.
    compile_cache: str | None = None
    # The KV cache's block size (tokens per page): the second witness's /metrics, else --block-size;
    # vLLM's ceilings are whole blocks, so a predicted one is too.
    block_size: int | None = None
    # What set the verified ceiling (store/outcomes.py LIMITS): only a ceiling the KV cache set says
    # where the pool ends; one at the model's maximum, batched tokens or a draft model does not.
    limit: str | None = None
    model_maximum: int | None = None  # the model's own maximum, where vLLM named it
    # The batch flags the command leaves out, at vLLM's default for the run's version and device
    # ({"max_num_seqs": 1024, "max_num_batched_tokens": 8192} on an H100, 256 / 2048 on a 3090):
    # one command is not the same settings on both (versions.batch_defaults). {} where unknown.
    batch_defaults: dict = field(default_factory=dict)
    # How many tokens of pool a token of --max-model-len costs, with its cause (analysis/pool_slope.py):
    # where the pool shrinks as the length grows (vLLM's CPU backend sized by gmu). None: none shown.
    length_slope: float | None = None
    length_slope_cause: str | None = None
    # Where the pool moved: vLLM's own figure (its refusal's estimate, or auto's fit) beside the verified
    # maximum, the gap in %, how the top was proved, and every cause of the slope (run.json result.longest).
    vllm_figure: int | None = None
    vllm_figure_from: str | None = None
    gap_pct: float | None = None
    longest_proved_by: str | None = None
    longest_boots: int | None = None
    length_slope_causes: list = field(default_factory=list)

    @property
    def budget_gib(self) -> float | None:
        """The memory vLLM grants itself: device memory x gmu (None where unknown or moot)."""
        if self.device_memory_gib is None or self.gmu is None or not self.gmu_sets_kv:
            return None
        return self.device_memory_gib * self.gmu

    @property
    def kv_limited(self) -> bool:
        """The ceiling is where the KV cache ran out (not the target, which fitted, nor a limit that is
        not memory: the model's maximum, batched tokens, a draft model)."""
        return (self.ceiling is not None and self.target is not None and self.ceiling < self.target
                and self.limit in (None, outcomes.KV_CACHE))

    def key(self) -> dict:
        """What must be equal for two runs to be compared (gmu is allowed to differ).

        The compile cache is in it only where the log shows one: runs that compile nothing
        keep the key they always had."""
        key = {"model": self.model, "device": self.device, "vllm_version": self.vllm_version}
        if self.compile_cache is not None:
            key[COMPILE_CACHE_KEY] = self.compile_cache
        key.update({f"vLLM default {k}": v for k, v in self.batch_defaults.items()})
        return {**key, **{f"setting {k}": v for k, v in self.settings.items()}}


def batch_defaults_of(argv: list[str], version: str | None, gpus: list[dict], on_cpu: bool) -> dict:
    """The max_num_seqs / max_num_batched_tokens the command leaves to vLLM, at vLLM's defaults for
    this version and device (versions.batch_defaults; one GPU model only); {} where unknown."""
    options = servecmd.long_options(argv)
    tp, pp = options.get("tensor-parallel-size", 1), options.get("pipeline-parallel-size", 1)
    if not isinstance(tp, int) or not isinstance(pp, int):
        return {}
    world = tp * pp
    kinds = {(g.get("name") or "", g.get("memory_total_gib"), g.get("compute_capability")) for g in gpus}
    if on_cpu:
        found = versions.batch_defaults(version, "cpu", None, world_size=world, platform="cpu")
    elif len(kinds) == 1:
        name, memory, capability = kinds.pop()
        found = versions.batch_defaults(version, name, memory, world_size=world, compute_capability=capability)
    else:
        found = None
    if found is None:
        return {}
    out = {}
    if "max-num-batched-tokens" not in options:
        out["max_num_batched_tokens"] = found.max_num_batched_tokens
    if "max-num-seqs" not in options:
        batched = options.get("max-num-batched-tokens")
        capped = isinstance(batched, int) and versions.seqs_capped_by_batched(version)
        out["max_num_seqs"] = min(found.max_num_seqs, batched) if capped and isinstance(batched, int) \
            else found.max_num_seqs
    return out


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    parts = re.findall(r"\d+", version.split("+")[0])[:3]
    return tuple(int(p) for p in parts) if parts else None


def default_gmu(vllm_version: str | None, extensible: bool | None = None) -> tuple[float | None, str]:
    """vLLM's default gmu for a version, and how it was decided (0.34+: unset, resolved by the extensible
    KV cache's state, `extensible`: the run's, None when unknown, then on as on CUDA and ROCm)."""
    gmu = versions.default_gmu(vllm_version, extensible)  # the one rule (0.9, 0.92 from 0.20, unset from 0.34)
    if gmu is None:
        return None, "no --gpu-memory-utilization and the vLLM version is unknown, so its default is too"
    if versions.gmu_is_unset_by_default(vllm_version):
        how = "with the extensible KV cache" if gmu == versions.EXTENSIBLE_GMU else "without the extensible KV cache"
        return gmu, f"vLLM {vllm_version} default (unset: {gmu:g} {how})"
    other = "0.9 before 0.20" if gmu == versions.HIGHEST_DEFAULT_GMU else "0.92 from 0.20"
    return gmu, f"vLLM {vllm_version} default ({gmu}; {other})"


def used_gpus(record: RunRecord) -> list[dict]:
    """The GPUs the run's vLLM saw: the NVML indices tune recorded, else what the recorded
    environment's CUDA_VISIBLE_DEVICES names (gpus.visible_gpus), else all of them."""
    machine = record.machine or Machine()
    inventory = list(machine.gpus or [])
    if not inventory:
        return []
    indices = (record.gpus or GpuPlan()).indices
    if indices:
        chosen = [g for i in indices for g in inventory if g.get("index") == i]
        if chosen:
            return chosen
    env = dict(record.environment or {})
    if "CUDA_VISIBLE_DEVICES" not in env and machine.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = machine.cuda_visible_devices
    seen = gpus_mod.visible_gpus(env, inventory)
    return [dict(g) for g in seen.gpus] if seen is not None and seen.gpus else inventory


def device_of(machine: Machine, gpus: list[dict], facts: BootFacts) -> tuple[str, float | None, str]:
    """(device label, the memory vLLM multiplies gmu by, where that figure came from)."""
    if gpus:
        names = sorted({(g.get("name") or "GPU", g.get("memory_total_gib")) for g in gpus},
                       key=lambda t: (str(t[0]), t[1] or 0))
        label = ", ".join(f"{name} {mem} GiB" if mem is not None else name for name, mem in names)
        if len(gpus) > 1 and len(names) == 1:
            label = f"{len(gpus)}x {label}"
        mems = {g.get("memory_total_gib") for g in gpus}
        if len(mems) == 1 and None not in mems:
            memory = mems.pop()
            return label, float(memory) if memory is not None else None, "the GPU's total memory (NVML)"
        return label, None, "GPUs of different sizes"
    ram = ((machine or Machine()).host or {}).get("ram_total_gib")
    label = f"cpu {ram} GiB RAM" if ram is not None else "cpu"
    node = facts.cpu_node_total_gib
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


def _text(value: object) -> str:
    return "true" if value is True else str(value)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def tokens_per_gib_of(record: RunRecord, facts: BootFacts) -> tuple[float | None, str | None]:
    """KV tokens per GiB for this model and settings, as precisely as the run shows it.

    A refusal prints the GiB needed for the requested length (8.0 GiB for 1,048,576 tokens):
    a large number, so its two-decimal rounding costs little. Failing that, the KV pool's
    token count over its GiB figure (a small GiB number: rounding can cost a few percent).
    """
    best = None
    for attempt in record.attempts or []:
        f = attempt.facts or BootFacts()
        need, length = f.kv_needed_gib, f.max_model_len_requested
        if need and length and (best is None or need > best[0]):
            best = (need, length)
    if best is not None:
        return best[1] / best[0], f"a refusal: {best[1]:,} tokens need {best[0]} GiB"
    tokens, gib = facts.kv_cache_tokens, facts.available_kv_gib
    if tokens and gib:
        return tokens / gib, f"{tokens:,} KV tokens in {gib} GiB"
    return None, None


def run_row(record: RunRecord) -> Row:
    """One run record (as artifact.load returns it) as a comparison row."""
    command = record.command or Command()
    result = record.result or Result()
    # The settings of the command that was verified: a recovery (Mamba blocks lowering --max-num-seqs,
    # --margin's gmu) changed the user's, and the figures are that command's.
    verified_argv = result.final_argv if result.verified else None
    argv = servecmd.with_config(list(verified_argv or command.argv or []), command.cwd)
    kept_free = record.margin
    if not verified_argv and kept_free is not None and kept_free.gmu is not None:
        argv = servecmd.with_flag(argv, GMU_FLAG, f"{kept_free.gmu:g}")  # command.argv is the user's; --margin's gmu booted
    attempts = record.attempts or []
    facts = BootFacts.from_dict(attempts[-1].facts.to_dict() if attempts and attempts[-1].facts else {})  # a copy
    for key in ("available_kv_gib", "kv_cache_tokens", "weights_gib"):  # the result's figures fill what it lacks
        if getattr(facts, key) is None and getattr(result, key) is not None:
            setattr(facts, key, getattr(result, key))
    version = record.vllm_version or facts.vllm_version
    environment = record.environment or {}
    device, memory, memory_source = device_of(record.machine or Machine(), used_gpus(record), facts)

    flag = servecmd.flag_value(argv, GMU_FLAG)
    if flag is not None:
        gmu = _float(flag)
        gmu_source = "flag" if gmu is not None else f"unreadable {GMU_FLAG} {flag!r}"
    else:
        said = facts.extensible_kv_cache  # 0.34+: what the boot log said of it
        gmu, gmu_source = default_gmu(version, None if said is None else said == "on")
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
    verified = bool(result.verified)
    final_basis = attempts[-1].basis if attempts else None
    return Row(
        run_id=record.run_id or "?",
        started_at=record.started_at,
        kind=record.kind or "tune",
        vllm_version=version,
        device=device,
        device_memory_gib=memory,
        device_memory_source=memory_source,
        model=record.model,
        gmu=gmu,
        gmu_source=gmu_source,
        gmu_sets_kv=gmu_sets_kv,
        gmu_note=gmu_note,
        max_num_seqs=servecmd.flag_value(argv, "--max-num-seqs"),
        max_num_batched_tokens=servecmd.flag_value(argv, "--max-num-batched-tokens"),
        kv_cache_dtype=servecmd.flag_value(argv, "--kv-cache-dtype"),
        settings=settings_of(argv, environment),
        weights_gib=facts.weights_gib,
        available_kv_gib=facts.available_kv_gib,
        kv_cache_tokens=facts.kv_cache_tokens,
        ceiling=result.ceiling if verified else None,
        target=record.target,
        verdict=result.verdict,
        tokens_per_gib=tpg,
        tokens_per_gib_source=tpg_source,
        ceiling_from_vllm=final_basis not in outcomes.PREDICTED,
        one_memory=_one_memory(attempts),
        links=dict(record.links or {}),
        compile_cache=facts.compile_cache,
        block_size=_block_size(attempts, argv),
        limit=result.limit if verified else None,
        model_maximum=_model_maximum(attempts, result if verified else Result()) or (record.preflight or {}).get(
            "model_maximum"),
        batch_defaults=batch_defaults_of(argv, version, used_gpus(record), on_cpu),
        **_slope(attempts),
        **_longest(record),
    )


def _slope(attempts: list) -> dict:
    found = pool_slope.slope_of_run(attempts)
    return {"length_slope": found[0], "length_slope_cause": found[1]} if found else {}


def _longest(record: RunRecord) -> dict:
    found = longest.of_record(record)
    if found is None:
        return {}
    return {"vllm_figure": found.vllm_figure, "vllm_figure_from": found.vllm_figure_from, "gap_pct": found.gap_pct,
                        "longest_proved_by": found.proved_by, "longest_boots": found.boots,
            "length_slope_causes": list(found.slope_causes or [])}


GIB_PRINTED = 0.02  # two-decimal GiB figures, and the few MiB re-profiling moves between boots


def _one_memory(attempts: list[Attempt]) -> bool:
    """Do the verified boot's pool and the ceiling it booted come from the same available memory?"""
    if not attempts or attempts[-1].basis != "ceiling" or len(attempts) < 2:
        return True  # auto-fit, the target itself, a prediction: one boot
    before, last = (a.facts or BootFacts() for a in attempts[-2:])
    seen = before.refusal_available_kv_gib or before.available_kv_gib
    now = last.available_kv_gib
    return seen is None or now is None or abs(seen - now) <= GIB_PRINTED


def _model_maximum(attempts: list[Attempt], result: Result) -> int | None:
    """The model's own maximum as vLLM named it (a refusal above it, auto-fit's 'reduced from'), or
    the verified ceiling it set."""
    for attempt in attempts:
        facts = attempt.facts or BootFacts()
        for length in (facts.derived_max_model_len, facts.autofit_from):  # auto-fit starts from the model's maximum
            if isinstance(length, int) and length > 0:
                return length
    return result.ceiling if result.limit == "model_maximum" else None


def _block_size(attempts: list[Attempt], argv: list[str]) -> int | None:
    seen = ((attempts[-1].metrics or {}).get("cache_config") or {}) if attempts else {}
    block: object = seen.get("block_size")
    if isinstance(block, int):
        return block
    flag = servecmd.flag_value(argv, "--block-size")
    return int(flag) if flag and flag.isdigit() else None

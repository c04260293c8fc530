"""The sizing report (Markdown): how much of the device each part of vLLM took, what margin was
kept, how many requests fit at the verified length and at shorter ones, what the probe measured,
and where the predictions met vLLM's own figures (pure; vllm#53216 asks for such a method).

Every figure is vLLM's own, with the log line it came from, or says how it was derived. The
memory figures are one rank's (with TP/PP each rank sizes its own pool, analysis/ranks.py).
"""

from __future__ import annotations

import math

from autotune.analysis import longest
from autotune.export import settings
from autotune.export.settings import Deployment, Sources
from autotune.export.verified import NotEmittable, fmt_int
from autotune.store.record import AimPrediction, Attempt, BootFacts, BootPrediction, Margin, RunRecord
from autotune.vllm import kv_pool, versions

# vLLM's docs: set --max-num-seqs at 80-90% of the concurrency the boot reports.
MAX_NUM_SEQS_SHARE = (0.8, 0.9)
SHORTER_LENGTHS = (262144, 131072, 65536, 32768, 16384, 8192, 4096, 2048)


def verified_attempt(record: RunRecord) -> Attempt | None:
    return next((a for a in reversed(record.attempts or []) if a.outcome == "verified"), None)


def _gib(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def _line(source: RunRecord, attempt: Attempt, key: str, dep: Deployment) -> str:
    """Where a figure was read: the log line (and the run, when it is the lever run's)."""
    where = (attempt.provenance or {}).get(key) or {}
    if not where.get("line"):
        return ""
    run = f" of run {source.run_id}" if source.run_id != dep.run_id else ""
    return f"{attempt.log or 'attempt log'} line {where['line']}{run}"


def memory_rows(dep: Deployment, record: RunRecord, source: RunRecord, attempt: Attempt) -> list[tuple[str, str, str]]:
    """(component, GiB, where it comes from), one rank. source: the run whose boot verified the
    command (the record itself, or its lever run)."""
    facts = attempt.facts or BootFacts()
    device, device_from = _device(dep, record, facts)
    gmu_text = dep.option("gpu-memory-utilization")
    gmu = float(gmu_text) if gmu_text else versions.default_gmu(dep.vllm_version)
    kv_bytes = dep.option("kv-cache-memory-bytes")
    rows = [("device memory", _gib(device), device_from)]
    budget = device * gmu if device and gmu and not kv_bytes else None
    if budget is not None:
        gmu_from = "--gpu-memory-utilization" if gmu_text else f"vLLM {dep.vllm_version}'s default gmu"
        rows.append((f"vLLM's budget ({gmu:g} x device)", _gib(budget), gmu_from))
    weights = facts.weights_gib
    rows.append(("weights", _gib(weights), _line(source, attempt, "weights_gib", dep) or "not printed by this boot"))
    estimate, actual = facts.cuda_graph_estimated_gib, facts.cuda_graph_gib
    rows.append(("CUDA graphs: estimate (subtracted from KV)", _gib(estimate),
                 _line(source, attempt, "cuda_graph_estimated_gib", dep) or "not printed (no graphs, or before 0.18)"))
    rows.append(("CUDA graphs: actual (captured)", _gib(actual),
                 _line(source, attempt, "cuda_graph_gib", dep) or "not printed"))
    kv = facts.available_kv_gib
    rows.append(("KV cache", _gib(kv), f"--kv-cache-memory-bytes {kv_bytes}" if kv_bytes else
                 _line(source, attempt, "available_kv_gib", dep) or "not printed"))
    if budget is not None and isinstance(weights, (int, float)) and isinstance(kv, (int, float)):
        rest = budget - weights - kv - (estimate or 0.0)
        rows.append(("activation peak + non-torch memory", _gib(rest),
                     "derived: budget - weights - KV - graph estimate (vLLM prints no activation figure at INFO)"))
    if budget is not None:
        rows.append(("margin kept outside vLLM's budget", _gib(device - budget), "device - budget"))
    asked = record.margin or Margin()
    if asked.summary:
        rows.append(("margin asked (--margin)", _gib(asked.asked_gib), asked.summary))
    return rows


def _device(dep: Deployment, record: RunRecord, facts: BootFacts) -> tuple[float | None, str]:
    if dep.cpu:
        node = facts.cpu_node_total_gib
        return node, "the NUMA node's memory, as vLLM's CPU backend read it" if node else "not printed"
    for gpu in (record.machine.gpus if record.machine else None) or []:
        if gpu.get("name") == dep.gpu_name and gpu.get("memory_total_gib"):
            return gpu["memory_total_gib"], f"{dep.gpu_name}, NVML"
    return None, "not recorded"


def block_size(dep: Deployment) -> int:
    given = dep.option("block-size")
    if given:
        return int(given)
    return kv_pool.CPU_BLOCK_SIZE if dep.cpu else kv_pool.GPU_BLOCK_SIZE


def null_blocks(dep: Deployment) -> int:
    """The block vLLM's BlockPool keeps back (its null block), where the version counts it (0.29+)."""
    return 1 if versions.check_holds_back_null_block(dep.vllm_version) else 0


def concurrency_rows(dep: Deployment, kv_tokens: int) -> list[tuple[int, int, str]]:
    """(length, full-length requests the pool holds at once, --max-num-seqs at 80-90% of that)."""
    block = block_size(dep)
    blocks = kv_tokens // block - null_blocks(dep)
    lengths = [dep.ceiling] + [n for n in SHORTER_LENGTHS if n < dep.ceiling]
    rows = []
    for length in lengths:
        fits = blocks // math.ceil(length / block)
        low, high = (max(1, math.floor(fits * share)) for share in MAX_NUM_SEQS_SHARE)
        rows.append((length, fits, f"{low}" if low == high else f"{low}-{high}"))
    return rows


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def concurrency_section(dep: Deployment, source: RunRecord, attempt: Attempt) -> list[str]:
    facts = attempt.facts or BootFacts()
    tokens = facts.kv_cache_tokens
    if not isinstance(tokens, int) or not isinstance(dep.ceiling, int):
        return ["## Concurrency", "", "vLLM printed no KV cache size for this boot."]
    kinds = (attempt.prediction.kinds if attempt.prediction else None) or []
    out = ["## Concurrency", "",
           f"The pool holds {fmt_int(tokens)} tokens ({_line(source, attempt, 'kv_cache_tokens', dep)}) in blocks of "
           f"{block_size(dep)}; a request of L tokens takes ceil(L / {block_size(dep)}) blocks"
           + (f" of the {fmt_int(tokens // block_size(dep) - 1)} it schedules from (vLLM {dep.vllm_version} keeps one "
              "block back, its null block)" if null_blocks(dep) else "") + ". vLLM's own figure at "
           f"{fmt_int(facts.max_concurrency_tokens)} tokens: {facts.max_concurrency}x "
           f"({_line(source, attempt, 'max_concurrency', dep)}).", ""]
    out += _table(("length", "full-length requests at once", "--max-num-seqs (80-90%)"),
                  [(fmt_int(n), fmt_int(c), s) for n, c, s in concurrency_rows(dep, tokens)])
    out.append("")
    seqs = dep.option("max-num-seqs")
    if seqs:
        out.append(f"The run was verified with --max-num-seqs {seqs}: it schedules at most {seqs} at once, "
                   "whatever the pool holds.")
    if kinds != ["full"]:
        out.append("For a model with sliding-window or linear-attention (hybrid) layers vLLM's token figure is "
                   "concurrency x length and each sequence also keeps its own state: read these as upper bounds.")
    out.append("--max-num-seqs itself takes memory (and a hybrid model's state per sequence): after changing it, "
               f"verify again (`autotune --target {dep.ceiling} -- <the command with it>`).")
    return out


def probe_section(record: RunRecord) -> list[str]:
    probe = record.result.probe if record.result is not None else None
    if not probe:
        return ["## Probe", "", "No probe ran (--probe none): the length was verified by /v1/models only."]
    hol = probe.head_of_line or {}
    memory = probe.memory or {}
    rows = [("mode", probe.mode), ("passed", "yes" if probe.ok else f"no: {probe.reason}"),
            ("prompt tokens", fmt_int(probe.prompt_tokens)),
            ("time to first token", f"{probe.ttft_s} s"),
            ("prefill", f"{fmt_int(round(probe.prefill_tokens_per_s))} tokens/s"
             if probe.prefill_tokens_per_s else "-")]
    if hol:
        rows.append(("head-of-line wait (a short request sent during the long prefill)",
                     f"{hol.get('short_wait_s')} s" + (" (it waited for the prefill)" if hol.get("waited_for_long_prefill")
                                                      else "")))
    if probe.repeat_ttft_ratio is not None:
        rows.append(("repeat / first time to first token", probe.repeat_ttft_ratio))
    growth = memory.get("growth_gib")
    rows.append(("memory growth during the probe", f"{growth} GiB" if growth is not None else
                 memory.get("unavailable_reason") or "-"))
    return ["## Probe (measured)", "", *_table(("figure", "value"), rows)]


def predictions_section(dep: Deployment, record: RunRecord, source: RunRecord, attempt: Attempt) -> list[str]:
    """source: the run whose boot verified the command (record itself, or its lever run)."""
    facts = attempt.facts or BootFacts()
    rows = []
    check = attempt.prediction or BootPrediction()
    if check.checked:
        tokens = check.kv_cache_tokens or {}
        rows.append(("KV tokens from the model's files", fmt_int(tokens.get("predicted")), fmt_int(tokens.get("vllm")),
                     "matches" if check.matches else "differs"))
    aimed = source.prediction or AimPrediction()
    if aimed.ceiling:
        rows.append(("ceiling from this machine's earlier runs", fmt_int(aimed.ceiling), fmt_int(dep.ceiling),
                     aimed.basis or ""))
    if facts.cuda_graph_estimated_gib is not None and facts.cuda_graph_gib is not None:
        rows.append(("CUDA graph memory (GiB)", facts.cuda_graph_estimated_gib, facts.cuda_graph_gib,
                     "vLLM's estimate vs what capture took"))
    out = ["## Predicted vs measured", ""]
    out += _table(("figure", "predicted", "measured", "note"), rows) if rows else ["No prediction was made for this run."]
    levers = (record.reach.explanation if record.reach else None) or []
    if levers:
        out += ["", "The lever search (--reach), predicted then measured:", ""] + [f"- {line}" for line in levers]
    return out


def longest_section(record: RunRecord, argv: list[str]) -> list[str]:
    """Where the pool shrank as the length grew: vLLM's own figure beside the verified maximum, the
    proof, the slope, and the levers that act on it (run.json result.longest; analysis/longest.py)."""
    found = longest.of_record(record)
    if found is None:
        return []
    out = ["## The longest length that boots", ""]
    if found.vllm_figure is not None:
        said = "auto fits" if found.vllm_figure_from == "auto" else "refusal estimated"
        out.append(f"vLLM's {said} {fmt_int(found.vllm_figure)}; this command serves {fmt_int(found.verified)}"
                   + (f" ({found.gap_pct:+.1f} %)" if found.gap_pct is not None else "") + ".")
    proof = found.proof or {}
    if found.proved_by == "refused_above":
        out.append(f"Proved: {fmt_int(proof.get('max_model_len'))}, one step above, was refused "
                   f"(attempt {proof.get('attempt')}: `{proof.get('text', '').strip()}`).")
    elif found.proved_by == "own_pool":
        out.append(f"Proved: the verified boot's own pool holds no step more (attempt {proof.get('attempt')}: "
                   f"`{proof.get('text', '').strip()}`), and it only shrinks as the length grows.")
    if found.slope is not None:
        out.append(f"The pool loses {found.slope:.3f} tokens per token of --max-model-len: "
                   f"{longest.describe_causes(found.slope_causes)}.")
    named = longest.slope_levers(found.slope_causes, argv)
    if named:
        out += ["", "Levers that act on the slope (`--reach` boots and verifies them):", ""]
        out += [f"- {text}" for _, text in named]
    return out + [""]


def render_report(record: RunRecord, found: Sources | None = None) -> str:
    found = found or Sources()
    dep = settings.from_record(record, found)
    source, plot = found.verifier or record, found.plot
    attempt = verified_attempt(source)
    if attempt is None:
        raise NotEmittable(f"run {source.run_id} has no verified boot to report on")
    out = [f"# Sizing report: {dep.served_name}, --max-model-len {fmt_int(dep.ceiling)}", "",
           f"{dep.stamp}.", "", f"Machine: {settings.describe_gpus(dep)}. vLLM {dep.vllm_version}."]
    if dep.stood_in_by:
        out.append(f"Replayed by {dep.stood_in_by}: the figures are the "
                   "profile's memory model, not a measured GPU.")
    out += ["", "## Settings that sized the KV pool", ""]
    out += _table(("option", "value"), [(f"--{n}", "(flag)" if v is True else v) for n, v in settings.pool_settings(dep)])
    out += ["", "## Memory (one rank)", ""] + _table(("component", "GiB", "from"), memory_rows(dep, record, source, attempt))
    if plot:
        out += ["", f"![the runs of this sweep]({plot})"]
    out += ["", *longest_section(record, list(attempt.argv or []))]
    out += [*concurrency_section(dep, source, attempt), "", *probe_section(record), "",
            *predictions_section(dep, record, source, attempt), "", "## Reproduce", "",
            f"`autotune reproduce {dep.run_id}` boots it again and compares; once deployed, "
            f"`autotune verify URL --run {dep.run_id}` checks what the endpoint serves."]
    return "\n".join(out) + "\n"

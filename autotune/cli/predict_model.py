"""`autotune predict --model DIR` / `--command '...'`: the prediction from the model's files, with no boot.

Wiring and rendering only: the figures come from model/files.py (the files),
vllm/kv_pool.py (vLLM's accounting) and analysis/estimate.py (calibration, bands, labels).
The machine's memory is read by analysis/device_memory.py unless --device-memory names it.
"""

from __future__ import annotations

import json
import os
import shlex

import click

from autotune.analysis import device_memory, estimate
from autotune.cli.formats import json_rounded
from autotune.host import launcher
from autotune.model import files as mf
from autotune.store.record import RunRecord
from autotune.vllm import kv_pool, versions

GIB = 2**30


def serve_argv(model: str | None, command: str | None, dashed: list[str] | None = None) -> list[str]:
    """The serve command to predict for: `-- vllm serve ...` (as tune and sweep take it), --command
    '...', or --model DIR's `vllm serve DIR`; one of them."""
    if sum(map(bool, (model, command, dashed))) != 1:
        raise click.UsageError("give the serve command after `--` (-- vllm serve MODEL ...), --command '...', "
                               "or the model folder (--model DIR): one of them")
    if dashed:
        return list(dashed)
    if command:
        try:
            return shlex.split(command)
        except ValueError as exc:
            raise click.UsageError(f"--command: {exc}") from None
    return ["vllm", "serve", model]


def default_gmu(argv: list[str]) -> tuple[float, str]:
    """(gmu, why) for a command that gives none: the default of the vLLM it runs (versions.py)."""

    version = launcher.detect_version(argv, dict(os.environ))
    gmu = versions.default_gmu(version)
    if gmu is None:
        raise click.ClickException("no gmu: give --gmu (the command has no --gpu-memory-utilization, and which vLLM "
                                   "it runs, so its default, could not be found)")
    return gmu, (f"gmu {gmu:g}: the default of vLLM {version}, which the command runs (it gives no "
                 "--gpu-memory-utilization; --gmu predicts another)")


def replayed_gpus(argv: list[str]) -> list[dict] | None:
    """The GPUs a command's program stands for where they are not this machine's (the replaying vLLM's),
    as tune asks the launcher: such a command is predicted on the machine it stands for, not on this
    one. None for any other command (NVML's, here)."""
    inventory = launcher.gpus_for(argv, dict(os.environ))
    if inventory.elsewhere is None:
        return None
    if inventory.absent_reason:
        raise click.ClickException(f"{inventory.absent_reason}; or give the device with --device and --device-memory")
    return inventory.gpus


def run(records: list[RunRecord], argv: list[str], gmu: float | None, target: int | None, concurrency_at: int | None,
        device_kind: str | None, device_memory_gib: float | None) -> tuple[estimate.FilesPrediction, float | None]:
    """Every figure for the serve command, calibrated on the matching runs among records; and the gmu
    predicted for (--gmu, the command's, else its vLLM's default)."""
    from autotune.analysis import run_row
    from autotune.model.files import local_model_dir

    try:
        serve = estimate.serve_settings(argv)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    folder = local_model_dir(serve.model, None, None)
    if folder is None:
        raise click.ClickException(f"{serve.model}: not a model folder on this machine (nor in the Hugging Face "
                                   f"cache); the prediction reads config.json and the safetensors headers")
    try:
        device = device_memory.detect(device_kind, device_memory_gib, replayed_gpus(argv))
    except device_memory.NoDevice as exc:
        raise click.ClickException(str(exc)) from None
    try:
        config = mf.read_config(folder)
        ssm = kv_pool.CPU_SSM_CACHE_DTYPE if device.kind == "cpu" else None
        shape = mf.kv_shape(config, serve.kv_cache_dtype, serve.dtype, serve.tp, serve.pp, ssm)
        weights = mf.weights(folder)
    except mf.ModelFilesError as exc:
        raise click.ClickException(str(exc)) from None
    limit = int(config.get("max_position_embeddings") or 0) or None
    settings = kv_pool.Settings(
        block_size=serve.block_size or kv_pool.block_size_for(shape, device.kind),
        max_model_len=serve.max_model_len or limit or 4096,
        in_flight_tokens=serve.max_num_batched_tokens or kv_pool.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        state_blocks=2 if serve.prefix_caching and not (device.kind == "cpu" and "mla" in shape.attention_kinds) else 1)
    chosen, skipped = estimate.calibration_set(records, serve.model, device, run_row.settings_of(argv, dict(os.environ)))
    version = next((r.vllm_version for r in reversed(chosen) if r.vllm_version), None)
    settings.null_block = versions.check_holds_back_null_block(version)
    calibration = estimate.calibrate(chosen, shape, settings) or estimate.prior(device, weights)
    use_gmu, why = (gmu, None) if gmu is not None else (serve.gmu, None)
    if use_gmu is None and serve.kv_cache_memory_bytes is None:
        use_gmu, why = default_gmu(argv)
    measured = next((r for r in chosen if use_gmu is not None and r.gmu == use_gmu), None)
    prediction = estimate.predict(str(folder), shape, weights, device, settings, calibration, use_gmu,
                                  serve.kv_cache_memory_bytes, target, concurrency_at, limit, measured,
                                  length_buffers(argv, device, serve, chosen if calibration.runs else []))
    prediction.notes.extend(skipped_notes(skipped))
    if why:
        prediction.notes.insert(0, why)
    return prediction, use_gmu


def length_buffers(argv: list[str], device, serve, runs: list) -> tuple[int, int] | None:
    """(pool bytes per token of --max-model-len, the length the calibration measured the pool at)
    where the command's settings make the pool shrink as the length grows: vLLM's CPU backend sized
    by gmu (its runner's max_num_seqs x max_model_len buffers); None where nothing moves it."""
    from autotune.vllm import servecmd

    if device.kind != "cpu" or serve.kv_cache_memory_bytes is not None or "VLLM_CPU_KVCACHE_SPACE" in os.environ:
        return None
    seqs = servecmd.flag_value(argv, "--max-num-seqs")
    count = int(seqs) if seqs and seqs.isdigit() else 128 * serve.tp  # the CPU backend's default (versions.py)
    lengths = [r.max_model_len for r in runs if isinstance(r.max_model_len, int)]
    return count * kv_pool.CPU_LENGTH_BUFFER_BYTES, (round(sum(lengths) / len(lengths)) if lengths else 0)


# Why a run is left out that says it never could calibrate this command: counted, not listed one a line.
UNRELATED = ("another model", "another device", "not a verified run")


def skipped_notes(skipped: list[str]) -> list[str]:
    """The notes for the runs a calibration left out ("RUN: why" lines): one a run where it might
    have counted (other settings, an older vLLM, a compile cache), one a reason with its count for
    runs of another model or device or without a verified KV figure (a runs folder holds hundreds)."""
    notes, unrelated = [], {}
    for line in skipped:
        run_id, _, why = line.partition(": ")
        if line.startswith("calibrated on") or not why:
            notes.append(line)
        elif why.startswith(UNRELATED):
            unrelated.setdefault(why, []).append(run_id)
        else:
            notes.append(f"not calibrated on {line}")
    for why, run_ids in unrelated.items():
        notes.append(f"not calibrated on {run_ids[0] if len(run_ids) == 1 else f'{len(run_ids)} runs'}: {why}")
    return notes


LABELS = {"weights": "weights", "kv_bytes_per_token": "KV per token", "state_bytes_per_sequence": "state per sequence",
          "available_kv": "available KV", "kv_bytes_per_token_at_length": "KV per token at length",
          "kv_cache_tokens": "KV cache tokens", "pool_tokens": "pool tokens", "ceiling": "ceiling", "gmu_for_target": "gmu for target"}


def value_text(f: estimate.Figure, v) -> str:
    if v is None:
        return "-"
    if f.name in ("weights", "available_kv"):
        return f"{v / GIB:.3f} GiB" if v >= GIB / 100 else f"{v / 2**20:.2f} MiB"
    if f.unit == "bytes":
        return f"{v:,.0f} B" if float(v).is_integer() else f"{v:,.1f} B"
    if f.unit == "x":
        return f"{v:.2f}x"
    if f.name == "gmu_for_target":
        return f"{v:.4f}"
    return f"{v:,}"


def render(p: estimate.FilesPrediction, gmu: float | None, target: int | None) -> str:
    shape = p.shape
    kinds = ", ".join(f"{g['layers']} {g['kind']}" for g in shape["groups"])
    lines = [f"{p.model}: {shape['model_type']} ({kinds} layers; KV dtype {shape['kv_dtype']}"
             + (f"; TP {shape['tp']}" if shape["tp"] > 1 else "") + (f"; PP {shape['pp']}" if shape["pp"] > 1 else "")
             + ")",
             f"  device: {p.device.kind}, {p.device.memory_bytes / GIB:.2f} GiB ({p.device.source})"
             + (f"; gmu {gmu:g}" if gmu is not None else ""),
             (f"  overhead: {p.calibration.overhead_bytes / GIB:.3f} GiB +/- {p.calibration.half_band_bytes / GIB:.3f} "
              f"({p.calibration.source})"), ""]
    rows = []
    for f in p.figures:
        name = LABELS.get(f.name) or f"concurrency at {int(f.name.rsplit('_', 1)[1]):,}"
        if f.name == "gmu_for_target" and target is not None:
            name = f"gmu for {target:,}"
        band = f"{value_text(f, f.low)} .. {value_text(f, f.high)}" if f.low is not None and f.low != f.high else ""
        rows.append([name, value_text(f, f.value), band, f.label, f.source])
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append("  " + "  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]),
                                       r[3].ljust(widths[3]), r[4]]).rstrip())
    for note in p.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def echo_prediction(p: estimate.FilesPrediction, json_: bool, gmu: float | None, target: int | None) -> None:
    if json_:
        click.echo(json.dumps(json_rounded(p.to_dict()), indent=2, ensure_ascii=False))
    else:
        click.echo(render(p, gmu, target))


def predict_from_files(runs, runs_dir, model_dir, serve_command, gmu, target, concurrency_at, device_kind,
                       device_memory, json_, dashed: list[str] | None = None) -> None:
    """The `-- vllm serve ...` / --command / --model path of `autotune predict`."""
    from autotune.cli.records import load_records, warn_unreadable
    from autotune.store import walk

    argv = serve_argv(model_dir, serve_command, dashed)
    records = load_records(runs, runs_dir) if runs else walk.records(runs_dir, warn_unreadable, oldest_first=True,
                                                                     booted_only=True)
    p, used_gmu = run(records, argv, gmu, target, concurrency_at, device_kind, device_memory)
    echo_prediction(p, json_, used_gmu, target)

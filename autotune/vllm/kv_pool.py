"""How vLLM's V1 KV cache manager turns bytes into blocks, tokens and a ceiling (pure arithmetic).

Read from vLLM 0.32.0 (vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py,
vllm/platforms/cpu.py); the same scheme since the hybrid allocator (~0.10):

- Every layer's page holds `block_size` tokens (CPU backend 128, its MLA kernel 16; GPU 16 for
  most attention backends). A layer's page is block_size x bytes per token per layer; a
  linear-attention (Mamba / gated delta net) layer's page is its whole per-sequence state.
- Layers are put in groups of equal size (the "1" of an n:1 pattern, or the largest count when
  the kinds are within 1.5x of each other); a group is padded with empty slots to that size.
  One block of the pool is a page for each slot of the largest group:
  bytes_per_block = group size x page. num_blocks = available bytes // bytes_per_block.
- Pages are unified when kinds differ: attention pages grow (a larger block size) to reach the
  linear-attention state's page, and that state is padded up to the attention page.
- A request at max_model_len takes, per group: full attention cdiv(L, block_size) blocks; a
  sliding window min(window - 1 + in-flight tokens, L) tokens, cdiv'd, + 1; a linear-attention
  group 2 blocks ("align" mamba cache mode, the default with prefix caching; 1 without). vLLM prints "KV cache size: int(num_blocks / blocks per request x L) tokens", so
  for sliding-window and hybrid models that figure is concurrency x length, not the pool.
- A length is accepted while its blocks fit in available - one block (the null block; from 0.29, both
  in the check and in auto-fit: versions.check_holds_back_null_block); the refusal's "estimated
  maximum model length" is the largest such length.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from autotune.model.files import KVShape, LayerGroup

CPU_BLOCK_SIZE = 128
# The CPU runner's input batch holds max_num_seqs x max_model_len token buffers (int32 token ids + a
# bool mask, zero-filled) before vLLM measures the pool: 5 B per sequence per token of length come out
# of a gmu-sized pool (vLLM 0.32 cpu worker; ~645 B per token of length at 128 sequences, measured).
CPU_LENGTH_BUFFER_BYTES = 5
CPU_MLA_BLOCK_SIZE = 16
GPU_BLOCK_SIZE = 16
# vLLM's default --max-num-batched-tokens (scheduler config) when chunked prefill is on.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# What vLLM 0.32's CPU platform sets the recurrent (SSM) state to without AVX-512 BF16 / AMX.
CPU_SSM_CACHE_DTYPE = "float32"


@dataclass
class Settings:
    """The serve settings that shape the pool (beyond the model's files)."""
    block_size: int
    max_model_len: int
    in_flight_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # max_num_batched_tokens x concurrent batches
    # Blocks a linear-attention group holds per request: 2 in vLLM's "align" mamba cache mode (its
    # default for hybrid models when prefix caching is on, as it is by default), 1 without prefix caching.
    state_blocks: int = 2
    # vLLM 0.29+ keeps one block back (the null block) when it checks a length against the pool; the
    # seed machine's vLLM 0.20.2 figures and public logs of ~0.11 do not: versions.check_holds_back_null_block.
    null_block: bool = True


@dataclass
class PoolGroup:
    kind: str
    layers: int  # real layers in this group (the rest of group_size are padding)
    blocks_per_request: int


@dataclass
class Pool:
    available_bytes: int
    block_size: int  # tokens per attention page after unification
    page_bytes: int  # one layer's page
    group_size: int
    bytes_per_block: int
    num_blocks: int
    groups: list[PoolGroup]
    blocks_per_request: int
    concurrency: float
    kv_cache_tokens: int  # what vLLM prints as "KV cache size: N tokens"
    pool_tokens: int  # tokens the full-attention layers can hold: num_blocks x block_size
    bytes_per_token_at_length: float  # available / kv_cache_tokens, what a boot's figures give
    max_model_len_fits: bool
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def block_size_for(shape: KVShape, device: str) -> int:
    """vLLM's default block size for a model on a device ("cpu" or "gpu")."""
    if device == "cpu":
        return CPU_MLA_BLOCK_SIZE if "mla" in shape.attention_kinds else CPU_BLOCK_SIZE
    return GPU_BLOCK_SIZE


def _layer_list(shape: KVShape) -> list[LayerGroup]:
    return [g for g in shape.groups if g.layers > 0]


def _group_size(counts: list[int]) -> int:
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * 1.5 else smallest


def _unified(shape: KVShape, block_size: int) -> tuple[int, int, list[str]]:
    """(attention block size, page bytes) once pages are unified; notes on what changed."""
    notes: list[str] = []
    attention = [g for g in shape.groups if g.kind != "linear"]
    states = [g.state_bytes for g in shape.groups if g.kind == "linear"]
    per_token = max((g.bytes_per_token for g in attention), default=0)
    if not states:
        return block_size, block_size * per_token, notes
    state = max(states)
    if not attention:
        return block_size, state, notes
    if block_size * per_token < state:
        # vLLM raises the attention block size to a multiple of the kernel's alignment until its
        # page reaches the state's (vllm/model_executor/models/config.py, HybridAttentionMambaModelConfig).
        grown = math.ceil(state / (per_token * block_size)) * block_size
        notes.append(f"attention block size raised from {block_size} to {grown} tokens so its page "
                     f"({grown * per_token:,} B) holds the linear-attention state ({state:,} B)")
        block_size = grown
    page = block_size * per_token
    if page > state:
        notes.append(f"linear-attention state padded from {state:,} B to the attention page ({page:,} B)")
    return block_size, page, notes


def _blocks_for(group: LayerGroup, settings: Settings, block_size: int, length: int) -> int:
    if group.kind == "linear":
        return settings.state_blocks
    if group.kind == "sliding" and group.window:
        tokens = min(group.window - 1 + settings.in_flight_tokens, length)
        return math.ceil(tokens / block_size) + 1
    return math.ceil(length / block_size)


def layout(shape: KVShape, settings: Settings) -> tuple[int, int, int, list[tuple[LayerGroup, int]], list[str]]:
    """(block size, page bytes, group size, [(kind group, number of vLLM groups)], notes)."""
    kinds = _layer_list(shape)
    if not kinds:
        raise ValueError("the model has no KV cache layers")
    block_size, page, notes = _unified(shape, settings.block_size)
    # Layers of one kind and shape share a group type; full-attention and MLA never mix with others.
    size = _group_size([g.layers for g in kinds])
    split = [(g, math.ceil(g.layers / size)) for g in kinds]
    padding = sum(n * size - g.layers for g, n in split)
    if padding:
        notes.append(f"{padding} empty layer slot(s) pad the groups to {size} layers each")
    return block_size, page, size, split, notes


def blocks_per_request(shape: KVShape, settings: Settings, length: int) -> int:
    block_size, _, _, split, _ = layout(shape, settings)
    return sum(n * _blocks_for(g, settings, block_size, length) for g, n in split)


def pool(shape: KVShape, settings: Settings, available_bytes: int) -> Pool:
    """The pool vLLM builds from available_bytes, and what it prints about it."""
    block_size, page, size, split, notes = layout(shape, settings)
    bytes_per_block = size * page
    num_blocks = available_bytes // bytes_per_block
    length = settings.max_model_len
    groups = [PoolGroup(g.kind, g.layers, n * _blocks_for(g, settings, block_size, length)) for g, n in split]
    per_request = sum(g.blocks_per_request for g in groups)
    concurrency = num_blocks / per_request
    tokens = int(concurrency * length)
    fits = per_request * bytes_per_block <= available_bytes - bytes_per_block * settings.null_block
    return Pool(available_bytes=available_bytes, block_size=block_size, page_bytes=page, group_size=size,
                bytes_per_block=bytes_per_block, num_blocks=num_blocks, groups=groups,
                blocks_per_request=per_request, concurrency=concurrency, kv_cache_tokens=tokens,
                pool_tokens=num_blocks * block_size,
                bytes_per_token_at_length=available_bytes / tokens if tokens else math.inf,
                max_model_len_fits=fits, notes=notes)


def max_model_len(shape: KVShape, settings: Settings, available_bytes: int, limit: int) -> int:
    """The longest length vLLM accepts with available_bytes (its refusal's estimate), up to limit."""
    block_size, page, size, split, _ = layout(shape, settings)
    budget_blocks = (available_bytes - size * page * settings.null_block) // (size * page)

    def fits(length: int) -> bool:
        return sum(n * _blocks_for(g, settings, block_size, length) for g, n in split) <= budget_blocks

    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def available_for_length(shape: KVShape, settings: Settings, length: int) -> int:
    """The fewest available bytes with which vLLM accepts `length` (one null block included)."""
    block_size, page, size, split, _ = layout(shape, settings)
    blocks = sum(n * _blocks_for(g, settings, block_size, length) for g, n in split)
    return (blocks + settings.null_block) * size * page

"""What a model's own files say about its memory, exactly, without loading a tensor.

Two figures come straight from the files and need no boot:

- weight bytes: the safetensors headers (each file starts with an 8-byte length and a JSON
  header listing every tensor's dtype, shape and byte range), or an index's
  `metadata.total_size`. Nothing past the headers is read.
- the KV cache's shape, layer by layer, from `config.json`, by attention kind:
    full       MHA / GQA / MQA: 2 (K and V) x KV heads x head dim x bytes per element, per token
    sliding    the same per token, but a layer never holds more than its window
    mla        multi-head latent attention: (kv_lora_rank + qk_rope_head_dim) x bytes, one latent
               per token shared by all heads (so tensor parallelism does not split it)
    linear     linear attention / Mamba (Qwen3-Next and Qwen3.5 gated delta net, Mamba-2):
               a fixed state per sequence (conv state + recurrent state), none per token
  with --kv-cache-dtype (fp8 halves bf16) and the tensor- and pipeline-parallel split applied:
  the figures are per GPU (per worker).

How vLLM turns these layers into blocks, groups and a token count is a fact about vLLM and
lives in vllm/kv_pool.py. This module only reads files (config.json, tokenizer_config.json,
*.safetensors headers), and finds a model's folder on this machine (a path, or a snapshot already
in the Hugging Face cache): it never downloads.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.errors import AutotuneError

# Bytes per element of the dtype names used in safetensors headers, config.json and vLLM flags.
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I64": 8, "I32": 4,
    "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5, "U32": 4, "U16": 2,
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
    "fp8_inc": 1, "fp8_ds_mla": 1, "int8": 1, "auto": None,
}
SAFETENSORS_INDEX = "model.safetensors.index.json"
HEADER_LIMIT = 100 * 1024 * 1024  # safetensors itself refuses headers above 100 MB


class ModelFilesError(AutotuneError, ValueError):
    """The model's files cannot answer (missing, unreadable, or a config this module does not know)."""


@dataclass
class Weights:
    bytes: int
    tensors: int | None
    files: int
    source: str  # "safetensors headers (N tensors in M files)" / "index metadata.total_size"
    by_dtype: dict[str, int] = field(default_factory=dict)

    @property
    def gib(self) -> float:
        return self.bytes / 2**30


@dataclass
class LayerGroup:
    """Layers of one attention kind with the same per-layer figures (per GPU)."""
    kind: str  # full | sliding | mla | linear
    layers: int
    bytes_per_token: int  # per layer; 0 for linear
    window: int | None = None  # sliding: tokens a layer holds at most
    state_bytes: int = 0  # linear: per sequence, per layer
    state_parts: dict[str, int] = field(default_factory=dict)  # linear: conv / recurrent state bytes
    detail: str = ""


@dataclass
class KVShape:
    model_type: str
    architectures: list[str]
    groups: list[LayerGroup]
    kv_dtype: str  # what the KV elements are stored as
    kv_dtype_bytes: float
    tp: int
    pp: int
    notes: list[str] = field(default_factory=list)

    @property
    def full_bytes_per_token(self) -> int:
        """Bytes per token of the layers that keep every token (full attention and MLA)."""
        return sum(g.layers * g.bytes_per_token for g in self.groups if g.kind in ("full", "mla"))

    @property
    def all_bytes_per_token(self) -> int:
        """Bytes per token if every attention layer kept every token (a window not yet reached)."""
        return sum(g.layers * g.bytes_per_token for g in self.groups)

    @property
    def state_bytes_per_sequence(self) -> int:
        return sum(g.layers * g.state_bytes for g in self.groups)

    @property
    def attention_kinds(self) -> list[str]:
        return sorted({g.kind for g in self.groups})

    def to_dict(self) -> dict:
        return {**asdict(self), "full_bytes_per_token": self.full_bytes_per_token,
                "all_bytes_per_token": self.all_bytes_per_token,
                "state_bytes_per_sequence": self.state_bytes_per_sequence}


# ---- reading files ------------------------------------------------------------------------------

def read_json(path: Path) -> dict:
    """One of the model's JSON files (config.json, tokenizer_config.json) as a dict: their one reader."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ModelFilesError(f"{path}: not found (give a local model folder with {path.name})") from None
    except (OSError, ValueError) as exc:
        raise ModelFilesError(f"{path}: cannot read it: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFilesError(f"{path}: not a JSON object")
    return data


def read_config(model_dir: str | Path) -> dict:
    """config.json as a dict; a multimodal wrapper's text_config is merged over it (it holds the LM)."""
    config = read_json(Path(model_dir) / "config.json")
    text = config.get("text_config") or config.get("llm_config")
    if isinstance(text, dict):
        merged = {**config, **text}
        merged.setdefault("architectures", config.get("architectures"))
        return merged
    return config


def safetensors_header(path: Path) -> dict:
    """The JSON header of one .safetensors file (8-byte little-endian length, then the JSON)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ModelFilesError(f"{path}: too short for a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > HEADER_LIMIT:
            raise ModelFilesError(f"{path}: header of {length:,} bytes: not a safetensors file")
        try:
            return json.loads(fh.read(length))
        except ValueError as exc:
            raise ModelFilesError(f"{path}: unreadable safetensors header: {exc}") from exc


def weights(model_dir: str | Path) -> Weights:
    """Weight bytes from the safetensors headers (every file), else the index's total_size."""
    folder = Path(model_dir)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        total, count, by_dtype = 0, 0, {}
        for f in files:
            for name, info in safetensors_header(f).items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                total += end - start
                count += 1
                by_dtype[info["dtype"]] = by_dtype.get(info["dtype"], 0) + end - start
        return Weights(bytes=total, tensors=count, files=len(files),
                       source=f"safetensors headers ({count:,} tensors in {len(files)} file{'s' * (len(files) > 1)})",
                       by_dtype=by_dtype)
    index = folder / SAFETENSORS_INDEX
    if index.exists():
        try:
            data = json.loads(index.read_text())
            total = int(data["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelFilesError(f"{index}: no metadata.total_size ({exc}) and no shards beside it") from exc
        shards = len(set((data.get("weight_map") or {}).values()))
        return Weights(bytes=total, tensors=len(data.get("weight_map") or {}), files=shards,
                       source=f"{SAFETENSORS_INDEX} metadata.total_size (shards not present)")
    raise ModelFilesError(f"{folder}: no *.safetensors files and no {SAFETENSORS_INDEX}")


# ---- the KV cache's shape from config.json ------------------------------------------------------

def element_bytes(kv_cache_dtype: str | None, model_dtype: str | None) -> tuple[str, float]:
    """(dtype name, bytes) of one KV element: --kv-cache-dtype, or the model's dtype for auto."""
    chosen = (kv_cache_dtype or "auto").lower()
    if chosen == "auto":
        name = (model_dtype or "bfloat16").replace("torch.", "")
        if name not in DTYPE_BYTES or DTYPE_BYTES[name] is None:
            raise ModelFilesError(f"unknown model dtype {model_dtype!r}")
        return name, DTYPE_BYTES[name]
    if chosen.startswith("fp8") or chosen == "int8":
        return chosen, 1
    if DTYPE_BYTES.get(chosen):
        return chosen, DTYPE_BYTES[chosen]
    raise ModelFilesError(f"unknown --kv-cache-dtype {kv_cache_dtype!r} (auto, bfloat16, float16, fp8, fp8_e4m3, "
                          f"fp8_e5m2, ...)")


def model_dtype_of(config: dict, dtype_flag: str | None = None) -> str:
    """The dtype vLLM runs the model in: --dtype, else config.json's (torch_)dtype; float32 checkpoints
    run in bfloat16/float16 under --dtype auto, which this reads as bfloat16."""
    if dtype_flag and dtype_flag != "auto":
        return {"half": "float16", "float": "float32"}.get(dtype_flag, dtype_flag)
    stated = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return "bfloat16" if stated == "float32" else str(stated)


def layer_kinds(config: dict) -> list[str]:
    """One entry per decoder layer: full | sliding | mla | linear."""
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0:
        raise ModelFilesError("config.json has no num_hidden_layers")
    if config.get("kv_lora_rank"):
        return ["mla"] * n
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        mapping = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding",
                   "chunked_attention": "sliding", "linear_attention": "linear", "mamba": "linear",
                   "mamba2": "linear", "conv": "linear"}
        unknown = sorted({t for t in types if t not in mapping})
        if unknown:
            raise ModelFilesError(f"config.json layer_types has kinds this predictor does not know: {unknown}")
        return [mapping[t] for t in types]
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        return ["sliding"] * n
    return ["full"] * n


def kv_shape(config: dict, kv_cache_dtype: str | None = None, dtype: str | None = None,
             tp: int = 1, pp: int = 1, mamba_ssm_cache_dtype: str | None = None) -> KVShape:
    """The KV cache's layers, per GPU, for a config, KV dtype and TP/PP split."""
    if tp < 1 or pp < 1:
        raise ModelFilesError("tensor and pipeline parallel sizes must be at least 1")
    model_dtype = model_dtype_of(config, dtype)
    kv_name, kv_bytes = element_bytes(kv_cache_dtype, model_dtype)
    kinds = layer_kinds(config)
    notes: list[str] = []
    if pp > 1:
        # vLLM splits the decoder layers into pp contiguous stages; the first stage takes the remainder
        # last, so the largest stage holds ceil(n / pp) layers and sets the per-GPU figure.
        per_stage = math.ceil(len(kinds) / pp)
        kinds = kinds[:per_stage]
        notes.append(f"pipeline parallel {pp}: the largest stage's {per_stage} layers (of "
                     f"{config['num_hidden_layers']}) are counted per GPU")
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else None)
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    groups = []
    for kind, count in counts.items():
        if kind == "mla":
            latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
            groups.append(LayerGroup("mla", count, int(latent * kv_bytes),
                                     detail=f"(kv_lora_rank {config['kv_lora_rank']} + qk_rope_head_dim "
                                            f"{config.get('qk_rope_head_dim') or 0}) x {kv_bytes:g} B"))
        elif kind in ("full", "sliding"):
            if not kv_heads or not head_dim:
                raise ModelFilesError("config.json lacks num_key_value_heads / head_dim for attention layers")
            per_rank = max(1, kv_heads // tp)
            if tp > kv_heads:
                notes.append(f"tensor parallel {tp} > {kv_heads} KV heads: each GPU holds a replica of one head")
            per_token = int(2 * per_rank * head_dim * kv_bytes)
            detail = f"2 x {per_rank} KV heads{'/GPU' if tp > 1 else ''} x head dim {head_dim} x {kv_bytes:g} B"
            window = int(config["sliding_window"]) if kind == "sliding" else None
            groups.append(LayerGroup(kind, count, per_token, window=window,
                                     detail=detail + (f"; window {window:,}" if window else "")))
        else:
            groups.append(_linear_group(config, count, tp, model_dtype, mamba_ssm_cache_dtype, notes))
    return KVShape(model_type=str(config.get("model_type") or "?"),
                   architectures=list(config.get("architectures") or []), groups=groups,
                   kv_dtype=kv_name, kv_dtype_bytes=kv_bytes, tp=tp, pp=pp, notes=notes)


def _linear_group(config: dict, count: int, tp: int, model_dtype: str, ssm_dtype: str | None,
                  notes: list[str]) -> LayerGroup:
    """Gated delta net (Qwen3-Next, Qwen3.5) state per sequence per layer, per GPU.

    conv state: (2 x key heads x key dim + value heads x value dim) / tp x (conv kernel - 1), model dtype;
    recurrent state: value heads / tp x value dim x key dim, in the SSM cache dtype (the config's
    mamba_ssm_dtype, else the model dtype; vLLM's CPU backend without AVX-512 BF16 forces float32).
    """
    needed = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel_dim")
    missing = [k for k in needed if not config.get(k)]
    if missing:
        raise ModelFilesError(f"linear-attention layers without {', '.join(missing)} in config.json: only "
                              f"gated-delta-net configs (Qwen3-Next, Qwen3.5) are known")
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    k_dim, v_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    conv_dim = (2 * k_heads * k_dim + v_heads * v_dim) // tp
    conv_bytes = int(conv_dim * (config["linear_conv_kernel_dim"] - 1) * DTYPE_BYTES[model_dtype])
    ssm = ssm_dtype or config.get("mamba_ssm_dtype") or model_dtype
    if ssm not in DTYPE_BYTES or not DTYPE_BYTES[ssm]:
        raise ModelFilesError(f"unknown SSM cache dtype {ssm!r}")
    recurrent_bytes = int(v_heads // tp * v_dim * k_dim * DTYPE_BYTES[ssm])
    return LayerGroup("linear", count, 0, state_bytes=conv_bytes + recurrent_bytes,
                      state_parts={"conv": conv_bytes, "recurrent": recurrent_bytes},
                      detail=f"conv {conv_dim} x {config['linear_conv_kernel_dim'] - 1} x {DTYPE_BYTES[model_dtype]:g} B"
                             f" + recurrent {v_heads // tp} x {v_dim} x {k_dim} x {DTYPE_BYTES[ssm]:g} B ({ssm})")


# ---- finding the model's folder: local files only, never downloaded ----------------------------

_REPO_ID_RE = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")


def hub_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def local_model_dir(model: str, env: Mapping[str, str] | None, revision: str | None) -> Path | None:
    env = os.environ if env is None else env
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if not _REPO_ID_RE.fullmatch(model) or path.exists():
        return None
    repo = hub_cache(env) / f"models--{model.replace('/', '--')}"
    ref = revision or "main"
    try:
        snapshot = (repo / "refs" / ref).read_text().strip() if (repo / "refs" / ref).is_file() else ref
    except OSError:
        return None
    folder = repo / "snapshots" / snapshot
    return folder if folder.is_dir() else None


def missing_model_folder(model: str | None, cwd: str | Path) -> Path | None:
    """The folder `model` names, when it can only be a path on this machine (absolute, ./, ../, ~,
    or more slashes than a Hugging Face id has) and nothing is there; else None. vLLM would import
    itself (tens of seconds) before saying so; a bare name or ORG/NAME may be a hub id, a URI
    (s3://...) is the loader's, and neither is judged here."""
    if not model or "://" in model:
        return None
    looks_local = model.startswith(("/", "./", "../", "~", ".")) or (
        "/" in model.rstrip("/") and not _REPO_ID_RE.fullmatch(model.rstrip("/")))
    if not looks_local:
        return None
    path = Path(model).expanduser()
    path = path if path.is_absolute() else Path(cwd) / path
    return None if path.exists() else path


def _json_if_there(path: Path) -> dict | None:
    try:
        return read_json(path)
    except ModelFilesError:
        return None


def read_model_config(model: str | None, env: Mapping[str, str] | None = None,
                      revision: str | None = None) -> dict | None:
    """config.json of ``model`` when it is on this machine (a model folder, or a snapshot in
    the Hugging Face cache); None otherwise. Never touches the network."""
    if not model:
        return None
    folder = local_model_dir(model, env, revision)
    return _json_if_there(folder / "config.json") if folder is not None else None


def read_tokenizer_config(model: str | None, env: Mapping[str, str] | None = None,
                          revision: str | None = None) -> dict | None:
    """tokenizer_config.json beside config.json, when on this machine (its model_max_length
    also caps the length vLLM accepts)."""
    if not model:
        return None
    folder = local_model_dir(model, env, revision)
    return _json_if_there(folder / "tokenizer_config.json") if folder is not None else None

"""Model folders on disk, as vLLM and autotune read them: config.json and safetensors headers."""
import json
import math
import struct

from autotune.model import files as mf


def write_safetensors(path, tensors: dict[str, tuple[str, list[int]]]):
    """A real safetensors file: header + zero bytes for each tensor."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = int(mf.DTYPE_BYTES[dtype] * math.prod(shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return offset


def gqa_folder(root):
    """The tiny GQA model the recorded boot served (4 layers, 8 heads sharing 2 KV heads of 64: 2 KiB
    per token), as config.json and a small safetensors file (only the headers are read)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "torch_dtype": "bfloat16",
        "max_position_embeddings": 1048576}))
    write_safetensors(root / "model.safetensors", {"embed": ("BF16", [441, 512])})
    return root

"""The records the paste-ready files are built from: real run.json files (tests/fixtures/progress)
and a variation of one on a pinned GPU, with secrets and the options GPU users pass."""
import json
from pathlib import Path

RECORDS = Path(__file__).resolve().parent.parent / "fixtures" / "progress"


def real(name: str = "cpu-0.32.0-refused-then-verified.run.json") -> dict:
    return json.loads((RECORDS / name).read_text())


def gpu_record() -> dict:
    """A real record moved to a pinned GPU, with secrets and the options GPU users pass."""
    rec = real()
    argv = ["vllm", "serve", "Qwen/Qwen3.6-27B-AWQ", "--quantization", "awq_marlin",
            "--gpu-memory-utilization", "0.95", "--max-num-seqs", "1", "--enable-prefix-caching",
            "--no-enable-log-requests", "-tp", "1", "--kv-cache-dtype", "auto", "--revision", "1.10",
            "--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 32}',
            "--api-key", "key-one", "key-two", "--served-model-name", "qwen 27b",
            "--max_num_batched_tokens=2048", "--port", "8011", "--max-model-len", "61152"]
    rec["result"]["final_argv"] = argv
    rec["result"]["ceiling"] = 61152
    rec["model"] = "Qwen/Qwen3.6-27B-AWQ"
    rec["command"]["argv"] = argv[:-2]
    rec["command"]["port_chosen_by_autotune"] = False
    rec["command"]["cwd"] = "/home/me/llm"
    rec["environment"] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "***",
                          "VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "OMP_NUM_THREADS": "8",
                          "VLLM_CACHE_ROOT": "/data/vllm 100%$cache"}
    rec["machine"]["gpus"] = [
        {"index": 0, "uuid": "GPU-1660aaaa", "name": "NVIDIA GeForce GTX 1660 SUPER"},
        {"index": 1, "uuid": "GPU-3090bbbb", "name": "NVIDIA GeForce RTX 3090"}]
    return rec

"""parse_file streams: peak memory does not grow with the log's size (bench/ measures 100 MB)."""
import tracemalloc
from pathlib import Path

from autotune.vllm.log import parse_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _write_log(path: Path, size: int) -> int:
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(FIXTURES.glob("*.log")))
    written = 0
    with open(path, "wb") as fh:
        while written < size:
            fh.write(blob)
            written += len(blob)
    return written


def _peak(path: Path) -> tuple[int, object]:
    tracemalloc.start()
    try:
        parser = parse_file(path)
        return tracemalloc.get_traced_memory()[1], parser
    finally:
        tracemalloc.stop()


def test_peak_memory_is_bounded_not_proportional(tmp_path):
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    _write_log(small, 1 << 20)
    size = _write_log(big, 6 << 20)
    peak_small, _ = _peak(small)
    peak_big, parser = _peak(big)
    assert parser.line_count > 40_000
    assert peak_big < 4 << 20  # a few MiB at most for a 6 MiB log (never the file itself)
    assert peak_big < peak_small * 2 + (1 << 20)  # 6x the input, not 6x the memory
    assert size > 6 << 20


def test_a_line_longer_than_a_mebibyte_is_cut_not_held(tmp_path):
    path = tmp_path / "long.log"
    path.write_bytes(b"x" * (16 << 20) + b"\nGPU KV cache size: 1,024 tokens\n")
    peak, parser = _peak(path)
    assert parser.result()["kv_cache_tokens"] == 1024
    # bounded by a few copies of the 1 MiB cut (bytes, text, cleaned text), not by the 16 MiB line
    assert peak < 8 << 20


# A serve command whose refusal line is longer than the 1 MiB a line is read to: the cut falls in the
# middle of the estimate's digits ("... model length is 181" of 18176), as on a real log with a huge prefix.
_LONG_REFUSAL = r'''
import sys
message = open(sys.argv[1]).read().strip()
message = message[message.index("ValueError"):]
prefix = "(EngineCore pid=1) ERROR 11-29 10:08:27 [core.py:1510] "
spaces = (1 << 20) - len(prefix) - (message.index("18176") + 3)  # the first 1 MiB ends with "... is 181"
print("INFO 11-29 10:08:09 [api_utils.py:347] vLLM API server version 0.32.0", flush=True)
print(prefix + " " * spaces + message, flush=True)
sys.exit(1)
'''


def test_a_refusal_line_cut_by_the_tunes_line_limit_gives_no_shortened_estimate(tmp_path):
    """The tune reads its server's output in chunks of at most 1 MiB: the chunk that ends inside the
    estimate's digits is a cut line (no estimate of 181), and the rest of the line is skipped."""
    import sys

    from autotune.run import tune as tune_mod

    line = next(x for x in (FIXTURES / "cpu-0.32.0-refused-gmu-0.10.log").read_text().split("\n") if "is 18176." in x)
    (tmp_path / "refusal.txt").write_text(line)
    script = tmp_path / "serve.py"
    script.write_text(_LONG_REFUSAL)
    opts = tune_mod.TuneOptions(target=1048576, runs_dir=tmp_path / "runs", strategy="refusal", max_boots=1,
                                probe="none",
                                serve_argv=[sys.executable, str(script), str(tmp_path / "refusal.txt")])
    events = []
    record = tune_mod.tune(opts, lambda kind, **data: events.append((kind, data))).to_dict()
    facts = record["attempts"][0]["facts"]
    assert facts["max_model_len_requested"] == 1048576 and facts["line_cut"] == 2
    assert facts.get("estimated_max_model_len") != 181
    shown = [d["value"] for kind, d in events if kind == "fact" and d["key"] == "estimated_max_model_len"]
    refused = [d["result"] for kind, d in events if kind == "refused"]
    assert 181 not in shown and refused and refused[0].get("estimated_max_model_len") != 181
    assert record["attempts"][0]["provenance"]["max_model_len_requested"]["line"] == 2

"""parse_file streams: peak memory does not grow with the log's size (bench/ measures 100 MB)."""
import tracemalloc
from pathlib import Path

from autotune.vllm.logparse import parse_file

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


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

"""Reading a log's bytes as lines, in bounded memory: plain or gzip files, stdin, pipes.

Lines end at ``\\n`` (a ``\\r\\n`` or a lone ``\\r`` inside such a line is left to the
parser, which keeps ``\\n`` line numbers as an editor counts them). A log written with
``\\r`` alone as its line ending (no ``\\n`` in its first block) is read line by ``\\r``.
A line longer than MAX_LINE_BYTES is cut there and the rest of it skipped. Stdlib only.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

__all__ = ["MAX_LINE_BYTES", "open_log", "read_lines"]

MAX_LINE_BYTES = 1 << 20  # longer lines are cut (read_lines and BootLogParser.feed)
_BLOCK = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"


def open_log(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a log for reading in binary; a gzip file (by its magic bytes, whatever its name)
    is decompressed on the fly."""
    handle = open(path, "rb")
    try:
        magic = handle.peek(2)[:2] if hasattr(handle, "peek") else b""
    except OSError:
        magic = b""
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    return handle


def read_lines(handle: BinaryIO) -> Iterator[tuple[bytes, bool]]:
    """The lines of a binary stream, each with its line ending, and whether it was cut: an
    over-long line is yielded cut at MAX_LINE_BYTES (no line ending; the rest is skipped)."""
    buffer = handle.read(_BLOCK)
    if not buffer:
        return
    if buffer[:2] == _GZIP_MAGIC and not isinstance(handle, gzip.GzipFile):
        # A compressed stream that open_log did not open (stdin): decompress it on the fly.
        yield from read_lines(gzip.GzipFile(fileobj=_Prepended(buffer, handle), mode="rb"))  # type: ignore[arg-type]
        return
    separator = b"\n" if b"\n" in buffer or b"\r" not in buffer else b"\r"
    skipping = False
    while True:
        pos = 0
        at = buffer.find(separator)
        while at >= 0:
            if not skipping:
                yield buffer[pos : at + 1], False
            skipping = False
            pos = at + 1
            at = buffer.find(separator, pos)
        rest = buffer[pos:]
        if len(rest) >= MAX_LINE_BYTES:
            if not skipping:
                yield rest[:MAX_LINE_BYTES], True
            skipping = True
            rest = b""
        block = handle.read(_BLOCK)
        if not block:
            break
        buffer = rest + block
    if rest and not skipping:
        yield rest, False


class _Prepended(io.RawIOBase):
    """A stream whose first bytes were already read: those bytes, then the rest of the stream."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:  # io.RawIOBase's buffer: a writable bytes-like object
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

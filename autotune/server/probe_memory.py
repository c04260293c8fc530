"""The probe's memory reading (thin: NVML or psutil, tolerant of absence).

On a GPU the NVML used memory of the pinned GPUs, on the CPU backend the resident memory (RSS)
summed over the server's whole process tree; sampled in a thread while the requests run.
"""

from __future__ import annotations

import threading

from autotune.host import processes

# Growth of used memory across the probe above which it is flagged.
# GPU: vLLM preallocates the KV pool and the activation budget at boot, so a served request
# should add nothing (a reference user saw 0 bytes on a 58.5K request); 256 MiB is beyond
# allocator noise and far below a real leak or an unplanned allocation.
GPU_GROWTH_THRESHOLD_GIB = 0.25
# CPU: the server tree's RSS grows on the first long request as pages it touches for the
# first time become resident (measured on vLLM 0.32 CPU, tiny model, 16,240-token prompt:
# +0.06 to +0.08 GiB on the first request, ~0 on the next ones: see docs/probe.md).
# 0.5 GiB leaves room for that and catches a real runaway.
CPU_GROWTH_THRESHOLD_GIB = 0.5
MEMORY_SAMPLE_S = 0.25

GIB = 2**30


# ---------------------------------------------------------------------------
# Memory (thin: NVML or psutil, tolerant of absence)
# ---------------------------------------------------------------------------


class MemoryReader:
    """Used memory of the pinned GPUs (NVML), or the RSS of the server's process tree."""

    def __init__(self, server_pid: int | None, gpu_indices: list[int] | None):
        self.server_pid = server_pid
        self.gpu_indices = list(gpu_indices or [])
        self.device = "gpu" if self.gpu_indices else "cpu"
        # No pid: a server autotune verify reached at a URL that is not a process here.
        self.unavailable: str | None = None if server_pid is not None else "the server is not a process on this machine"
        self._nvml = None
        self._handles = []
        if self.device == "gpu":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpu_indices]
            except ImportError:
                self.unavailable = "nvidia-ml-py is not installed"
            except Exception as exc:  # pynvml.NVMLError and its many subclasses
                self.unavailable = f"NVML: {exc}"

    @property
    def source(self) -> str:
        if self.device == "gpu":
            return f"NVML used memory of GPU {', '.join(map(str, self.gpu_indices))}"
        return "RSS summed over the server's process tree (psutil)"

    @property
    def threshold_gib(self) -> float:
        return GPU_GROWTH_THRESHOLD_GIB if self.device == "gpu" else CPU_GROWTH_THRESHOLD_GIB

    def read_bytes(self) -> int | None:
        if self.unavailable:
            return None
        if self.device == "gpu":
            try:
                return sum(self._nvml.nvmlDeviceGetMemoryInfo(h).used for h in self._handles)
            except Exception as exc:  # NVMLError
                self.unavailable = f"NVML: {exc}"
                return None
        total = 0
        procs = processes.process_tree(self.server_pid)
        if not procs:
            return None
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except Exception:  # psutil.Error: a process that just ended holds nothing
                continue
        return total

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


class PeakSampler:
    """Samples the reader in a thread while requests run; keeps the maximum."""

    def __init__(self, reader: MemoryReader, every_s: float = MEMORY_SAMPLE_S):
        self.reader = reader
        self.every_s = every_s
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-memory", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.reader.read_bytes()
            if value is not None and (self.peak is None or value > self.peak):
                self.peak = value
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)


def memory_record(reader: MemoryReader, before: int | None, after: int | None, peak: int | None) -> dict:
    """The memory part of the probe record (pure apart from the reader's description)."""
    rec = {"device": reader.device, "source": reader.source, "threshold_gib": reader.threshold_gib}
    if reader.device == "gpu":
        rec["gpu_indices"] = reader.gpu_indices
    if reader.unavailable:
        rec["unavailable_reason"] = reader.unavailable
    rec.update(growth_summary(before, after, peak, reader.threshold_gib))
    return rec


def growth_summary(before: int | None, after: int | None, peak: int | None, threshold_gib: float) -> dict:
    def gib(value):
        return None if value is None else round(value / GIB, 3)

    # growth_flagged is None (not False) when memory could not be read: unknown is not fine.
    out = {"before_gib": gib(before), "after_gib": gib(after), "peak_gib": gib(peak),
           "growth_gib": None, "peak_growth_gib": None, "growth_flagged": None}
    if before is not None and after is not None:
        out["growth_gib"] = round((after - before) / GIB, 3)
        out["growth_flagged"] = (after - before) / GIB > threshold_gib
    if before is not None and peak is not None:
        out["peak_growth_gib"] = round((max(peak, after or 0) - before) / GIB, 3)
    return out

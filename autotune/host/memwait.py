"""Wait until a stopped server's device memory is really released, before the next boot.

A process tree can be gone from the process table while the driver still holds its GPU
memory for a moment; booting then fails with "Free memory on device ... on startup is less
than desired GPU memory utilization". Polling is bounded, with tenacity's policy rather
than a hand-written loop. Without NVIDIA GPUs there is nothing to wait for: the CPU
backend's memory is gone with its processes, which stop_tree already waited for.
"""

from __future__ import annotations

from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_exponential


def gpu_used_gib(indices: list[int] | None = None) -> dict[int, float] | None:
    """NVML used memory per GPU (all, or the given indices); None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: nothing to measure
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        wanted = range(count) if indices is None else [i for i in indices if i < count]
        return {i: pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used / 2**30
                for i in wanted}
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def released(baseline: dict[int, float] | None, now: dict[int, float] | None, slack_gib: float = 0.5) -> bool:
    """Pure: is every GPU back within slack of what it used before the boot?"""
    if not baseline or now is None:
        return True
    return all(now.get(i, 0.0) <= used + slack_gib for i, used in baseline.items())


def wait_for_release(baseline: dict[int, float] | None, timeout_s: float = 60.0, slack_gib: float = 0.5,
                     read=gpu_used_gib) -> tuple[bool, dict[int, float] | None]:
    """Poll until released (True) or timeout (False); returns the last reading too."""
    if not baseline:
        return True, None
    last: dict = {}

    @retry(retry=retry_if_result(lambda ok: not ok), stop=stop_after_delay(timeout_s),
           wait=wait_exponential(multiplier=0.2, max=2.0))
    def poll() -> bool:
        last["now"] = read(list(baseline))
        return released(baseline, last["now"], slack_gib)

    try:
        return poll(), last.get("now")
    except RetryError:
        return False, last.get("now")

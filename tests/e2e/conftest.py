"""What every real boot of tests/e2e/ shares."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def vllm_computes_on_a_core_of_its_own():
    """Under pytest-xdist (`make test` runs two e2e modules at a time), each worker's vLLM binds its
    compute threads to a core of its own. Left to itself (`auto`), every vLLM CPU worker binds to core 0
    and keeps core 1 for the processes around it, so two boots at once queued on core 0: 99% busy
    against 89% for core 1 over one e2e run. A VLLM_CPU_OMP_THREADS_BIND already set is left alone, and
    a test may set its own (test_tensor_parallel.py binds two ranks)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        yield
        return
    cores = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])
    yield
    del os.environ["VLLM_CPU_OMP_THREADS_BIND"]

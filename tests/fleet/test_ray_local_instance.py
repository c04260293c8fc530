"""`fleet run --on ray` without --address starts a Ray instance of its own: on 127.0.0.1 only
(issue 37: its GCS, raylet and agents listened on every interface). The instance is real, as a
user gets it (~20 s to start here); the leaf is the replaying vLLM, a real server process tree."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.helpers.fleet_plans import fakes, grid_plan, run_fleet

pytestmark = [pytest.mark.long(90)]

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listening(root: psutil.Process) -> dict[str, set[str]]:
    """{process name: addresses it listens on} over `root`'s process tree (what `ss -ltnp` shows)."""
    found: dict[str, set[str]] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            addresses = {c.laddr.ip for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
            if addresses:
                found.setdefault(proc.name(), set()).update(addresses)
        except psutil.Error:  # ended meanwhile
            continue
    return found


def test_the_local_ray_instance_listens_on_loopback_only(tmp_path):
    pytest.importorskip("ray")
    runs = tmp_path / "runs"
    plan = grid_plan(tmp_path, "fleet-ray-37", scale=0.2, profiles=("seed-3090-qwen3.6-27b",), gmus=(0.9,))
    driver = run_fleet(plan, runs, "--on", "ray", "--slots", "1", wait=False)
    try:
        deadline = time.monotonic() + 180
        while not fakes("fleet-ray-37") and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.5)
        assert fakes("fleet-ray-37"), "the leaf never booted"
        seen = listening(psutil.Process(driver.pid))
        driver.send_signal(signal.SIGINT)  # looked at: the fleet may stop (its leaf marked interrupted)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert {"gcs_server", "raylet"} <= set(seen), seen  # the instance is the driver's own, and was looked at
    assert {name: a - LOOPBACK for name, a in seen.items() if a - LOOPBACK} == {}
    assert driver.returncode == 130, err
    assert "a local Ray instance (on 127.0.0.1 only)" in err
    assert fakes("fleet-ray-37") == []

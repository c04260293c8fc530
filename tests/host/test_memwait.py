from autotune.host import memwait


def test_released_compares_each_gpu_with_its_baseline():
    base = {0: 1.0, 1: 2.0}
    assert memwait.released(base, {0: 1.2, 1: 2.4})
    assert not memwait.released(base, {0: 1.2, 1: 20.0})
    assert memwait.released(None, {0: 50.0})  # nothing measured before: nothing to wait for
    assert memwait.released(base, None)


def test_wait_polls_until_memory_drops():
    readings = iter([{0: 20.0}, {0: 12.0}, {0: 1.1}])
    ok, last = memwait.wait_for_release({0: 1.0}, timeout_s=10, read=lambda idx: next(readings))
    assert ok and last == {0: 1.1}


def test_wait_gives_up_after_the_timeout():
    ok, last = memwait.wait_for_release({0: 1.0}, timeout_s=0.5, read=lambda idx: {0: 20.0})
    assert not ok and last == {0: 20.0}


def test_without_a_baseline_there_is_nothing_to_wait_for():
    # No NVIDIA driver (as on the CPU backend): the reading is None and waiting returns at once.
    assert memwait.wait_for_release(None) == (True, None)
    reading = memwait.gpu_used_gib()
    assert reading is None or all(v >= 0 for v in reading.values())

import pytest

from autotune.strategy import (ERROR, EXITED, HUNG, NOT_VERIFIED, REFUSED, VERIFIED, AttemptSummary, Launch,
                               Stop, next_step)

T = 65536


def A(length, outcome, ceiling=None, source="estimate", kind=None):
    return AttemptSummary(length, outcome, ceiling, source if ceiling else "none", kind)


@pytest.mark.parametrize("attempts,expected", [
    ([], Launch(T, "the target")),
    ([A(T, VERIFIED)], ("verified", T)),
    ([A(T, REFUSED, 61152)], ("launch", 61152)),
    ([A(T, REFUSED, 61152), A(61152, VERIFIED)], ("verified", 61152)),
    # the estimate was a few MiB optimistic: refused again with a lower one
    ([A(T, REFUSED, 61152), A(61152, REFUSED, 61136)], ("launch", 61136)),
    ([A(T, REFUSED, None)], ("refused_no_ceiling", None)),
    ([A(T, REFUSED, 0)], ("nothing_fits", None)),
    # an estimate not below the asked length still moves down
    ([A(T, REFUSED, T)], ("launch", T - 1)),
    ([A(T, ERROR, kind="cuda_oom")], ("error", None)),
    ([A(T, EXITED)], ("error", None)),
    ([A(T, HUNG)], ("hung", None)),
    ([A(T, NOT_VERIFIED)], ("not_verified", None)),
])
def test_next_step(attempts, expected):
    step = next_step(T, attempts)
    if isinstance(expected, Launch):
        assert step == expected
    elif expected[0] == "launch":
        assert isinstance(step, Launch) and step.max_model_len == expected[1]
    else:
        assert isinstance(step, Stop)
        assert (step.verdict, step.ceiling) == expected


def test_max_boots_bounds_the_loop():
    attempts = [A(T - i, REFUSED, T - i - 1) for i in range(3)]
    assert isinstance(next_step(T, attempts, max_boots=4), Launch)
    assert next_step(T, attempts, max_boots=3).verdict == "max_boots"


def test_reason_names_where_the_ceiling_came_from():
    step = next_step(T, [A(T, REFUSED, 42832, "computed_from_gib")])
    assert "computed from the GiB figures" in step.reason

"""The one renderer protocol of the event stream (autotune/events.py Renderer), as the three
renderers of cli/ follow it, and the probe's requests worded once for a tune and for `verify`.
(tests/test_structure.py checks that every event sent is declared and drawn or carries a message.)"""

from __future__ import annotations

import io

from autotune import events
from autotune.cli.fleet import FleetProgress
from autotune.cli.progress import Progress
from autotune.cli.verify import ProbeProgress


def test_the_protocol_sends_an_undrawn_event_with_a_message_to_on_message_and_ignores_the_rest():
    seen = []

    class Lines(events.Renderer):
        def on_hung(self, index, idle_s):
            seen.append(("hung", index, idle_s))

        def on_message(self, event, message, level):
            seen.append((event, message, level))

    lines = Lines()
    lines("hung", index=2, idle_s=600)
    lines("margin", message="kept 2 GiB free")
    lines("leaf_warned", message="odd")
    lines("fact", index=1, key="k", value=1, line_no=3)  # neither drawn nor a message: not its business
    assert seen == [("hung", 2, 600), ("margin", "kept 2 GiB free", "info"), ("leaf_warned", "odd", "warning")]


def test_the_three_renderers_are_renderers():
    assert all(issubclass(r, events.Renderer) for r in (Progress, FleetProgress, ProbeProgress))


def test_the_probe_is_worded_once_for_a_tune_and_for_verify():
    said = []
    ProbeProgress(said.append)("probe_request_done", role="near_ceiling", ok=False, ttft_s=None, reason="reset")
    ProbeProgress(said.append)("probe_request", role="near_ceiling", prompt_tokens=16200)
    ProbeProgress(said.append)("probe_request_done", role="long", ok=True, ttft_s=2.31, reason=None)
    out = io.StringIO()
    progress = Progress(out, live=False)
    progress("probe_request_done", role="near_ceiling", ok=False, ttft_s=None, reason="reset")
    progress("probe_request", role="near_ceiling", prompt_tokens=16200)
    progress("probe_request_done", role="long", ok=True, ttft_s=2.31, reason=None)
    assert said == ["probe: the near ceiling request failed: reset",
                    "probe: sending the near ceiling request (16,200 prompt tokens)",
                    "probe: long request served, first token after 2.3 s"]
    printed = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]  # after the [HH:MM:SS] stamp
    assert printed == ["Warning: " + said[0], *said[1:]]

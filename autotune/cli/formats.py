"""The CLI's number and duration formats (pure)."""

from __future__ import annotations


def fmt_number(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


JSON_DECIMALS = 6  # a GiB to the KiB, a gmu to a millionth: more is float noise (4.1399999999999935)


def json_rounded(value):
    """value with every float rounded to JSON_DECIMALS places (dicts and lists walked)."""
    if isinstance(value, float):
        return round(value, JSON_DECIMALS)
    if isinstance(value, dict):
        return {k: json_rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_rounded(v) for v in value]
    return value

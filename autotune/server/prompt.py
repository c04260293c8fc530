"""The probe's prompt (pure): filler text sized to a token budget with the server's own tokenizer.

The server's /tokenize counts every try (count_tokens); the first try only sets the scale,
each next length comes from the counts (see size_prompt). probe.py sends what this builds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# How far below the budget (max_model_len - MAX_TOKENS) the prompt may land: 32 tokens, or
# 0.2% of the length above 16K (a 1M-token context gets a 2K margin). Tokenizers are
# near-linear on the filler text, so two to four /tokenize calls land inside it.
MIN_MARGIN_TOKENS = 32


def default_margin(max_model_len: int) -> int:
    return max(MIN_MARGIN_TOKENS, max_model_len // 500)


MAX_TOKENIZE_CALLS = 6

# The filler: varied words and a running number, so that no tokenizer collapses it into a
# few tokens per repetition, and (with the salt at the start) two prompts never share a
# prefix-cache block, so the second near-ceiling request really prefills again.
_FILLER_SENTENCES = (
    "The probe fills the context with ordinary text to prove the server serves it.",
    "Memory is shared between weights, activations and the KV cache of every request.",
    "A long prompt is read once in prefill, and then each new token is decoded in turn.",
    "Numbers like 3.14159, 2718 and 1,048,576 appear in documents as often as words.",
)


class ProbeFailure(Exception):
    """A request the probe needed did not succeed; its message is the probe's reason."""


# ---------------------------------------------------------------------------
# Prompt sizing (pure)
# ---------------------------------------------------------------------------


def filler_text(n_chars: int, salt: str = "") -> str:
    """Exactly n_chars characters of filler, starting with the salt (deterministic)."""
    if n_chars <= 0:
        return ""
    parts = [f"[{salt}] " if salt else ""]
    size = len(parts[0])
    i = 0
    while size < n_chars:
        piece = f"{i}. {_FILLER_SENTENCES[i % len(_FILLER_SENTENCES)]} "
        parts.append(piece)
        size += len(piece)
        i += 1
    return "".join(parts)[:n_chars]


def prompt_budget(max_model_len: int, max_tokens: int) -> int:
    """The most prompt tokens a request with max_tokens output may have."""
    return max_model_len - max_tokens


def within_margin(tokens: int, budget: int, margin: int) -> bool:
    return budget - margin <= tokens <= budget


def next_char_count(chars: int, tokens: int, goal_tokens: int) -> int:
    """Characters to try next, scaling the last try by the ratio of tokens wanted to tokens got.

    Rounded down: overshooting costs a whole extra tokenize call, undershooting by a few
    tokens is what the margin is for.
    """
    if tokens <= 0:
        return max(1, chars * 2)
    return max(1, math.floor(chars * goal_tokens / tokens))


def secant_char_count(p1: tuple[int, int], p2: tuple[int, int], goal_tokens: int) -> int | None:
    """Characters for goal_tokens on the line through two (chars, tokens) tries: a fixed
    part (BOS, a template) plus tokens per character. None when the two do not define a line."""
    (c1, t1), (c2, t2) = p1, p2
    if c1 == c2 or t1 == t2:
        return None
    return max(1, math.floor(c1 + (goal_tokens - t1) * (c2 - c1) / (t2 - t1)))


def next_try(tries: list[tuple[int, int]], goal_tokens: int, short_chars: int, long_chars: int | None) -> int | None:
    """The next length to tokenize after `tries` ((chars, tokens), oldest first), kept strictly
    between the longest try known to fit (short_chars) and the shortest known to be too long
    (long_chars); None when no length is left between them.

    From two or more tries the line through the last one and the one farthest from it in
    length (exact for a tokenizer that is linear plus a fixed part; the far one, because
    token boundaries make the slope between two close lengths noisy), from one try the
    ratio; where that would leave the interval (a tokenizer that is not linear there) the
    midpoint.
    """
    chars, tokens = tries[-1]
    proposal = None
    if len(tries) >= 2:
        far = max(tries[:-1], key=lambda t: abs(t[0] - chars))
        proposal = secant_char_count(far, tries[-1], goal_tokens)
    if proposal is None:
        proposal = next_char_count(chars, tokens, goal_tokens)
    upper = long_chars if long_chars is not None else math.inf
    if short_chars < proposal < upper:
        return proposal
    if long_chars is None:
        return max(short_chars + 1, chars * 2)
    middle = (short_chars + long_chars) // 2
    return middle if short_chars < middle < long_chars else None


@dataclass
class SizedPrompt:
    text: str
    tokens: int  # as the server's tokenizer counts them
    budget: int
    margin: int
    tokenize_calls: int

    @property
    def within_margin(self) -> bool:
        return within_margin(self.tokens, self.budget, self.margin)


def size_prompt(budget: int, margin: int, count_tokens: Callable[[str], int], salt: str = "",
                max_calls: int = MAX_TOKENIZE_CALLS, first_chars: int | None = None) -> SizedPrompt:
    """The longest filler text whose token count lies in [budget - margin, budget].

    count_tokens is the server's tokenizer (one /tokenize call each). The first try guesses
    4 characters per token (or first_chars) only to get a scale; every later length comes
    from the counts. It aims at the middle of the margin so a rounding wobble stays inside.
    If the calls run out, it returns the best try at or below the budget (never above: that
    request would be refused), which the caller sees as not within_margin.
    """
    if budget < 1:
        raise ValueError(f"no room for a prompt: budget {budget} tokens")
    margin = max(0, min(margin, budget - 1))
    goal = budget - margin // 2
    chars = first_chars or max(1, goal * 4)
    best: tuple[int, str] | None = None  # (tokens, text) of the longest try within budget
    short_chars, long_chars = 0, None
    tries: list[tuple[int, int]] = []
    calls = 0
    while calls < max_calls:
        text = filler_text(chars, salt)
        tokens = count_tokens(text)
        calls += 1
        tries.append((chars, tokens))
        if tokens <= budget:
            short_chars = max(short_chars, chars)
            if best is None or tokens > best[0]:
                best = (tokens, text)
            if tokens >= budget - margin:
                break
        else:
            long_chars = chars if long_chars is None else min(long_chars, chars)
        following = next_try(tries, goal, short_chars, long_chars)
        if following is None:
            break
        chars = following
    if best is None:
        raise ProbeFailure(f"could not build a prompt of at most {budget} tokens in {calls} /tokenize calls")
    return SizedPrompt(text=best[1], tokens=best[0], budget=budget, margin=margin, tokenize_calls=calls)

"""Bounded, jittered waits between retries: one rule for clients resending and buses reconnecting."""

from __future__ import annotations

import random


def equal_jitter(attempt: int, initial: float, cap: float) -> float:
    """Wait before retry `attempt` (from 0): random in [d/2, d], d = min(cap, initial * 2**attempt).

    "Equal jitter": parties that failed together do not come back together, and none waits
    less than half its share.
    """
    ceiling: float = min(cap, initial * 2 ** min(attempt, 30))  # int ** int is typed Any
    return ceiling / 2 + random.uniform(0, ceiling / 2)


__all__ = [
    "equal_jitter",
]

"""Doubling waits between the tries of one thing that keeps failing, bounded by a deadline.

The one backoff of every retry loop: an episode the collection runs again (``collection/episodes.py``), an
agent step retried from its boundary (``agents/common/participant.py``), a generation continued after its
upstream failed (``models/policy_model/generations.py``), the operator's setup reads and status writes
(``operator/gym_operator/controllers/transaction.py``, ``writer.py``). A loop asks :meth:`Backoff.failed` after
each failure (False: give up), sleeps :meth:`Backoff.wait_s`, and calls :meth:`Backoff.reset` once a try succeeds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Backoff:
    """Waits of ``first_s``, then twice the last, ... up to ``max_s``; ``deadline_s`` after the first failure in a row
    :meth:`failed` says to give up, and no wait ends later than that deadline. ``clock`` is in seconds."""

    def __init__(
        self,
        first_s: float,
        max_s: float,
        deadline_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if first_s <= 0 or max_s <= 0 or deadline_s <= 0:
            raise ValueError(f"backoff waits and deadline must be positive, got {first_s}, {max_s}, {deadline_s}")
        self.first_s = first_s
        self.max_s = max_s
        self.deadline_s = deadline_s
        self.clock = clock
        self._next_s = first_s
        self._failing_since: float | None = None

    @property
    def failing_s(self) -> float:
        """Seconds since the first failure in a row (0 when the last try succeeded)."""
        return 0.0 if self._failing_since is None else self.clock() - self._failing_since

    def failed(self) -> bool:
        """A try failed: True while there is time left to try again, False once the deadline has passed."""
        if self._failing_since is None:
            self._failing_since = self.clock()
        return self.failing_s < self.deadline_s

    def wait_s(self) -> float:
        """The wait before the next try (never past the deadline); the next one is twice as long, up to ``max_s``."""
        wait = min(self._next_s, max(0.0, self.deadline_s - self.failing_s))
        self._next_s = min(self._next_s * 2, self.max_s)
        return wait

    def reset(self) -> None:
        """A try succeeded (or made progress): the next failure starts over from ``first_s`` and a fresh deadline."""
        self._next_s = self.first_s
        self._failing_since = None

"""How a local stack checkpoints itself: how often, how many of those checkpoints it keeps, and how long its servers
hold their state on a termination signal.

The stack YAML's ``checkpoint:`` section (``checkpoint: {every: 30s, keep: 5}``) and ``gymckpt up
--checkpoint-every 30s --keep 5 --termination-grace 30s`` make one :class:`CheckpointSettings`; the launcher
(:mod:`gym_services.stack.launcher`) gives the grace to every server and the settings to the stack's supervisor
(:mod:`gym_services.stack.supervisor`), which runs the schedule and takes the final checkpoint on a termination
(``docs/preemption.md``).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the shortest interval between scheduled checkpoints: a checkpoint pauses the rollouts for tens to hundreds of
#: milliseconds and writes for longer; a shorter interval would keep the stack checkpointing back to back
MIN_INTERVAL_S = 1.0
#: the shortest termination grace: the final checkpoint of even a small stack takes a second or so
MIN_GRACE_S = 2.0
#: the grace when none is given: Kubernetes' default terminationGracePeriodSeconds, GKE's spot notice
DEFAULT_GRACE_S = 30.0
DEFAULT_KEEP = 5

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> float:
    """Seconds from ``30s``, ``500ms``, ``2m``, ``1h``, ``1.5`` (seconds) or a number; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (e.g. 30s, 500ms, 2m, 1h)")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return seconds


def describe_duration(seconds: float) -> str:
    """``30s``, ``2m``, ``1.5s``, ``250ms``: how a duration is written back to the user."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:g}s"


class CheckpointSettings(BaseModel):
    """The stack YAML's ``checkpoint:`` section."""

    model_config = ConfigDict(extra="forbid")

    every: float | None = Field(
        default=None,
        description="take a checkpoint this often (30s, 5m); none: only on a termination and when asked",
    )
    keep: int = Field(default=DEFAULT_KEEP, description="scheduled and final checkpoints kept; older ones are deleted")
    termination_grace: float = Field(
        default=DEFAULT_GRACE_S,
        description="on SIGTERM the servers hold their state this long, for the final checkpoint",
    )

    @field_validator("every", mode="before")
    @classmethod
    def _every(cls, value: object) -> float | None:
        if value is None:
            return None
        seconds = parse_duration(value)
        if seconds < MIN_INTERVAL_S:
            raise ValueError(
                f"every {describe_duration(seconds)} is shorter than a checkpoint takes (its pause alone is tens to "
                f"hundreds of milliseconds, its upload longer): the stack would checkpoint back to back; give at "
                f"least {describe_duration(MIN_INTERVAL_S)}"
            )
        return seconds

    @field_validator("keep", mode="before")
    @classmethod
    def _keep(cls, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"keep must be a whole number, got {value!r}")
        if value < 1:
            raise ValueError(
                f"keep {value} would delete every checkpoint the schedule takes, the final one too; keep at least 1"
            )
        return value

    @field_validator("termination_grace", mode="before")
    @classmethod
    def _grace(cls, value: object) -> float:
        seconds = parse_duration(value)
        if seconds < MIN_GRACE_S:
            raise ValueError(
                f"termination_grace {describe_duration(seconds)} leaves no time for the final checkpoint; give at "
                f"least {describe_duration(MIN_GRACE_S)} (on Kubernetes, GKE gives spot pods 30s)"
            )
        return seconds

    def describe(self) -> str:
        every = f"every {describe_duration(self.every)}, " if self.every is not None else "no schedule, "
        return f"{every}keep {self.keep}, termination grace {describe_duration(self.termination_grace)}"

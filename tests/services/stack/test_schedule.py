"""The stack's checkpoint settings (stack/schedule.py): durations, and the refusals of settings that cannot work - an
interval shorter than a checkpoint, keep 0, a grace that leaves no time, and (history.py) a grace or an interval
shorter than this stack's own checkpoints took."""

from __future__ import annotations

import pytest

from gym_services.base.config import ConfigError
from gym_services.stack.config import load_stack
from gym_services.stack.history import StackHistory, TakenCheckpoint, Termination, refuse_settings
from gym_services.stack.schedule import CheckpointSettings, parse_duration


@pytest.mark.parametrize(
    "text, seconds", [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), ("1.5", 1.5), (7, 7.0)]
)
def test_durations(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "10 minutes", "-3s", True, None])
def test_not_durations(text) -> None:
    with pytest.raises(ValueError, match=r"duration|negative"):
        parse_duration(text)


@pytest.mark.parametrize(
    "section, message",
    [
        ("{every: 200ms}", "shorter than a checkpoint takes"),
        ("{every: 30s, keep: 0}", "keep 0 would delete every checkpoint"),
        ("{termination_grace: 1s}", "leaves no time for the final checkpoint"),
        ("{every: often}", "not a duration"),
        ("{every: 30s, kept: 3}", "kept"),
    ],
)
def test_bad_checkpoint_sections_are_refused(tmp_path, section, message) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(f"name: s\ncheckpoint: {section}\nservers: {{a: {{server: counter}}}}\n")
    with pytest.raises(ConfigError, match=message):
        load_stack(path)


def test_checkpoint_section_of_the_stack_yaml(tmp_path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text("name: s\ncheckpoint: {every: 30s, keep: 3}\nservers: {a: {server: counter}}\n")
    stack, _ = load_stack(path)
    assert (stack.checkpoint.every, stack.checkpoint.keep, stack.checkpoint.termination_grace) == (30.0, 3, 30.0)
    assert stack.checkpoint.describe() == "every 30s, keep 3, termination grace 30s"


def _history(final_s: float | None, scheduled_s: float | None) -> StackHistory:
    kept = []
    if scheduled_s is not None:
        kept.append(
            TakenCheckpoint(
                checkpoint_id="sched-1", kind="scheduled", started_at=0.0, status="completed", seconds=scheduled_s
            )
        )
    termination = None
    if final_s is not None:
        termination = Termination(signalled_at=0.0, deadline_at=30.0, signalled=["a"], signal_to_published_s=final_s)
    return StackHistory(kept=kept, termination=termination)


def test_a_grace_shorter_than_this_stacks_final_checkpoint_took_is_refused() -> None:
    settings = CheckpointSettings.model_validate({"termination_grace": "4s"})
    refuse_settings(settings, None)  # nothing measured yet: the floor alone
    refuse_settings(settings, _history(final_s=3.2, scheduled_s=None))
    with pytest.raises(ConfigError, match=r"shorter than its final checkpoint took .* 5\.5s.*give at least 7s"):
        refuse_settings(settings, _history(final_s=5.5, scheduled_s=None))


def test_an_interval_shorter_than_this_stacks_checkpoints_take_is_refused() -> None:
    settings = CheckpointSettings.model_validate({"every": "2s"})
    refuse_settings(settings, _history(final_s=None, scheduled_s=1.5))
    with pytest.raises(ConfigError, match=r"every 2s is shorter than a checkpoint of this stack takes \(2\.5s"):
        refuse_settings(settings, _history(final_s=None, scheduled_s=2.5))

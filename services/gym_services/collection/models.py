"""Wire formats and checkpointed state of rollout collection."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gym_services.base.downstream import DownstreamFailure
from gym_services.control.models import RECORD_KEY_PATTERN

#: the most episodes a job runs at once
MAX_CONCURRENCY = 4096


class JobSpec(BaseModel):
    """``POST /jobs``: what to collect."""

    model_config = ConfigDict(extra="forbid")

    tasks_path: str = Field(description="JSONL of tasks, readable by the collection server")
    output_path: str = Field(description="JSONL the results are appended to as they finish")
    repeats: int = Field(default=1, ge=1, le=10_000)
    concurrency: int = Field(default=8, ge=1, le=MAX_CONCURRENCY)
    limit: int | None = Field(default=None, ge=1, description="only the first N tasks")
    agent: str | None = Field(default=None, description="agent for tasks that name none")
    rollout_prefix: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]*$",
        description="rollout ids are <prefix><task>-<repeat>; unset: none for a server's first job, j<n>- for its "
        "n-th (the servers remember rollout ids - finished results, attempts - so a job never reuses an earlier "
        "job's); a prefix an earlier job of the server used is refused",
    )
    resume: bool = Field(
        default=False,
        description="keep the results output_path holds from an earlier run of the same tasks and repeats, and run "
        "only the (task, repeat) pairs it lacks (refused for a file written from other tasks or repeats)",
    )


class EpisodeState(BaseModel):
    """One live rollout: which task, which repeat, which attempt."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=RECORD_KEY_PATTERN)
    index: int = Field(ge=0, description="position in the flat (task, repeat) order")
    task_index: int = Field(ge=0)
    rollout_index: int = Field(ge=0)
    attempt: int = Field(default=0, ge=0)
    agent: str


class JobState(BaseModel):
    """Everything but the live episodes: the cursor, what finished, where the output ends."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    spec: JobSpec
    total: int = Field(ge=0)
    cursor: int = Field(default=0, ge=0, description="next flat index to dispatch")
    finished: list[str] = Field(default_factory=list, description="rollout ids with a result written")
    dropped: list[str] = Field(default_factory=list, description="rollout ids retired without a result")
    output_offset: int = Field(default=0, ge=0, description="bytes of output that belong to finished results")
    output_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the output's first output_offset bytes: a restore truncates the file only if they match "
        "(none: a checkpoint written before this check)",
    )
    reward_sum: float = 0.0
    errors: int = 0
    reruns: int = Field(
        default=0, ge=0, description="episodes run again as attempt + 1 after an infrastructure failure"
    )
    done_before: list[int] = Field(
        default_factory=list,
        description="flat indices whose results the output held when the job was resumed from it (never dispatched)",
    )
    checkpoint_id: str | None = Field(
        default=None, description="the checkpoint this state was captured in (in a checkpoint's record only)"
    )


class JobStatus(BaseModel):
    state: Literal["idle", "running", "paused", "completed"]
    total: int = 0
    dispatched: int = 0
    finished: int = 0
    live: int = 0
    errors: int = 0
    reruns: int = 0
    retrying: int = Field(default=0, description="live episodes waiting to run again after an infrastructure failure")
    last_failure: str | None = Field(
        default=None,
        description="why the job waits now: the servers the agents' episodes are retrying (see failing), then the "
        "latest infrastructure failure of an episode the collection runs again; none once they answer again",
    )
    failing: dict[str, list[DownstreamFailure]] = Field(
        default_factory=dict,
        description="agent -> the servers and routes its episodes are retrying now (its GET /health/downstream)",
    )
    idle_s: float | None = Field(default=None, description="seconds since the last result (or the start) while running")
    dropped: int = Field(
        default=0, description="rollouts retired without a result (a newer attempt took over elsewhere)"
    )
    mean_reward: float | None = None
    output_path: str | None = None
    rollout_prefix: str | None = Field(
        default=None, description="the job's rollout ids are <rollout_prefix><task>-<repeat>"
    )
    kept: int = Field(default=0, description="results kept from an earlier run of the job (collect --resume)")
    resumed_from: str | None = Field(
        default=None, description="the checkpoint the job was restored from, when it was (the latest)"
    )
    resumed_episodes: int = Field(default=0, description="episodes in flight that the restore continued")

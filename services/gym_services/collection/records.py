"""The controller's checkpoint records: the job (cursor, finished results, the results file's length and digest) and
one record per live episode in the checkpoint's scope, and reading them back at restore.

A restored episode takes the attempt the restore gives it (attempt + 1 of the captured one), which fences whatever
the older attempt left on every server.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from gym_services.collection.models import EpisodeState, JobState
from gym_services.control.participant import InvalidState, Record, RestoredRecord, Scope

JOB_KEY = "job"


def job_records(job: JobState, running: Iterable[EpisodeState], scope: Scope) -> list[Record]:
    """The records of a captured job and of its live episodes that ``scope`` includes."""
    records = [Record(JOB_KEY, job.model_dump_json().encode())]
    for episode in running:
        if scope.includes(episode.rollout_id):
            records.append(
                Record(
                    f"episode-{episode.rollout_id}",
                    episode.model_dump_json().encode(),
                    episode.rollout_id,
                    episode.attempt,
                )
            )
    return records


def read_job_records(records: list[RestoredRecord]) -> tuple[JobState, list[EpisodeState]]:
    """The job and its live episodes (each at its new attempt) from restored records; :class:`InvalidState` for
    records that are missing, malformed or disagree with each other."""
    by_key = {r.key: r for r in records}
    if JOB_KEY not in by_key:
        raise InvalidState("controller records have no job record")
    try:
        job = JobState.model_validate_json(by_key[JOB_KEY].data)
        episodes = [
            EpisodeState.model_validate_json(r.data).model_copy(update={"attempt": r.new_attempt or 0})
            for key, r in by_key.items()
            if key != JOB_KEY
        ]
    except ValidationError as exc:
        raise InvalidState(f"controller record is malformed: {exc.errors(include_url=False)[:3]}") from None
    finished = set(job.finished)
    for episode in episodes:
        if episode.rollout_id in finished:
            raise InvalidState(f"episode {episode.rollout_id} is both live and finished")
        if episode.index >= job.cursor:
            raise InvalidState(f"episode {episode.rollout_id} is past the cursor")
    return job, episodes

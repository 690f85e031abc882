"""The demo's example tasks: all of them, or the first N of each environment (``gymckpt demo --tasks N``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gym_services.cli import build_parser
from gym_services.demo.stack import ENVIRONMENTS, write_tasks


def agents_of(path: Path) -> Counter[str]:
    return Counter(json.loads(line)["agent"] for line in path.read_text().splitlines())


def test_every_example_task_by_default_and_the_first_n_of_each_environment_on_request(tmp_path: Path) -> None:
    write_tasks(tmp_path / "all.jsonl")
    every = agents_of(tmp_path / "all.jsonl")
    assert set(every) == {agent for _, agent in ENVIRONMENTS.values()} and all(n > 2 for n in every.values())

    write_tasks(tmp_path / "two.jsonl", per_environment=2, max_output_tokens=24)
    two = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert agents_of(tmp_path / "two.jsonl") == dict.fromkeys(every, 2)
    assert all(row["responses_create_params"]["max_output_tokens"] == 24 for row in two)
    # the first two of each environment, in file order
    all_rows = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    for agent in every:
        firsts = [row for row in all_rows if row["agent"] == agent][:2]
        assert [row for row in two if row["agent"] == agent] == [
            {**row, "responses_create_params": {**row.get("responses_create_params", {}), "max_output_tokens": 24}}
            for row in firsts
        ]


def test_a_task_count_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        write_tasks(tmp_path / "none.jsonl", per_environment=0)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["demo", "--tasks", "0"])
    assert exit_info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert build_parser().parse_args(["demo", "--tasks", "3"]).tasks == 3

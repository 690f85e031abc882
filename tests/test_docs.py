"""The contributor documents stay true to the vocabulary in code, and code cites only what is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

from gym_services.base.errors import ErrorCode
from gym_services.control.protocol import Phase, Role, Verb
from gym_services.coordination.transaction import TransactionPhase

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = (ROOT / "docs" / "protocol.md").read_text()
#: documents that are not in the repository, cited the way they used to be
OUTSIDE = re.compile(r"DESIGN §|DESIGN\)|REFERENCE [A-D]\.|REFERENCE, |seeds/\d")


def test_the_protocol_document_names_every_code_phase_verb_and_role() -> None:
    for term in [*ErrorCode, *TransactionPhase, *Verb, *Phase, *Role]:
        assert f"`{term.value}`" in PROTOCOL or f" {term.value} " in PROTOCOL, term
    for code in ErrorCode:  # with its status
        assert re.search(rf"`{code.value}` \| {code.status} ", PROTOCOL), code


def test_code_cites_nothing_outside_the_repository() -> None:
    cited = []
    for folder in ("services", "operator", "tests", "benchmarks", "charts", "docs", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in {".py", ".md", ".yaml", ".txt", ".tpl", ".json"} or path == Path(__file__):
                continue
            if ".cache" in path.parts or "data" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not cited, "\n".join(cited)


# --- the operator-facing documents (README, docs/operations) against the protocol's vocabulary ---

README = (ROOT / "README.md").read_text()
OPERATIONS = [ROOT / "README.md", ROOT / "docs/operations/guide.md", ROOT / "docs/operations/troubleshooting.md"]
ARROW = re.compile(r"\s*(?:->|→)\s*")


def _vocabulary() -> set[str]:
    """Every name a document may put in a chain of steps or phases, read from the code: the control verbs and
    participant phases of control/protocol.py, the transaction phases, and each transaction phase's verb
    (Publishing: publish)."""
    names = {v.value for v in Verb} | {p.value for p in Phase} | {t.value for t in TransactionPhase}
    for phase in TransactionPhase:
        word = phase.value.lower()
        if word.endswith("ing"):
            names |= {word[:-3], word[:-3] + "e"}
    return names


_TOKEN = r"`?[A-Za-z_]+`?(?: \(or `?[A-Za-z_]+`?\))?"
CHAIN = re.compile(rf"{_TOKEN}(?:\s*(?:->|→)\s*{_TOKEN}){{2,}}")


def _chains(text: str) -> list[list[str]]:
    """The names in every chain of three or more names joined by arrows (``prepare -> capture -> resume``), one
    list per chain; ``prepared (or blocked)`` names both."""
    return [[w for w in re.findall(r"[A-Za-z_]+", m.group(0)) if w != "or"] for m in CHAIN.finditer(text)]


def _cli_help() -> str:
    from gym_services.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "checkpoint" in a.choices)
    return "\n".join((sub.choices[name].description or "") for name in sub.choices)


def test_step_and_phase_chains_in_the_documents_and_the_cli_use_the_codes_names() -> None:
    known = _vocabulary()
    sources = {str(path.relative_to(ROOT)): path.read_text() for path in OPERATIONS}
    sources["gymckpt --help texts"] = _cli_help()
    unknown = [
        f"{where}: {word} (in {' -> '.join(chain)})"
        for where, text in sources.items()
        for chain in _chains(text)
        for word in chain
        if word not in known
    ]
    assert not unknown, "\n".join(unknown)
    assert ["prepare", "capture", "resume", "persist", "publish"] in _chains(README)
    assert ["Pending", "Preparing", "Capturing", "Resuming", "Persisting", "Publishing", "Completed"] in _chains(
        sources["docs/operations/guide.md"]
    )


def test_the_readme_route_table_and_phases_match_the_protocol() -> None:
    routes = set(re.findall(r"^\| `(?:GET|POST) (\w+)`(?: / `(\w+)`)?", README, flags=re.M))
    documented = {name for row in routes for name in row if name}
    verbs = {v.value for v in Verb}
    assert documented <= verbs, documented - verbs
    assert verbs <= documented, verbs - documented
    phases_line = README[README.index("Phases of one participant:") :]
    phases_line = phases_line[: phases_line.index(". ")]
    named = {word for chain in _chains(phases_line) for word in chain}
    phases = {p.value for p in Phase}
    assert named <= phases, named - phases
    assert phases <= named, phases - named


def test_the_readme_first_screen_has_the_two_commands_a_picture_and_its_words_defined_before_use() -> None:
    first_screen = "\n".join(README.splitlines()[:60])
    blocks = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
    commands = [line.split("#")[0].strip() for line in blocks[0][1].splitlines()]
    assert commands == ["python3 dev.py demo", "python3 dev.py test"]  # the first commands, exactly
    assert blocks[0][1] in first_screen
    picture = blocks[1][1]
    assert picture in first_screen and "+--" in picture and "-->" in picture.replace("->", "-->")
    for term in ("participant", "boundary", "attempt + 1"):
        first = README.lower().index(term)
        assert README[first - 4 : first] == "- **", f"{term!r} is used before it is defined"
    assert "## Changes\n\nWhat changed, release by release: [CHANGELOG.md](CHANGELOG.md)." in README
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changes")
    assert ".gymckpt/stack/logs/" in README and "python3 dev.py test -n 0 tests/test_docs.py" in README
    assert "export GYMCKPT_JOB_TOKEN=" in README


# --- the records kept beside the code: decisions, measurements, changes ---

DECISIONS = (ROOT / "docs" / "decisions.md").read_text()
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?[0-9]+")
STATUS = re.compile(
    r"^\*(\d{4}-\d{2}-\d{2})(?: \(recorded \d{4}-\d{2}-\d{2}\))? · (accepted|superseded|deprecated)(.*)\*$"
)


def _sections(text: str, level: str = "## ") -> dict[str, str]:
    parts = re.split(rf"^{level}", text, flags=re.M)[1:]
    return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[1] for part in parts}


def test_decisions_are_short_dated_records_oldest_first() -> None:
    assert "**oldest first**" in DECISIONS.split("\n## ", 1)[0]
    records = _sections(DECISIONS)
    dates = []
    for title, body in records.items():
        lines = [line for line in body.strip().splitlines() if line]
        status = re.match(STATUS, lines[0] if lines[0].endswith("*") else f"{lines[0]} {lines[1]}")
        assert status, f"{title!r}: no '*date · status*' line under its heading"
        for named in re.findall(r'"([^"]+)"', status.group(3)):  # amended or superseded by another record
            assert named in records, f"{title!r} names a record that is not there: {named!r}"
        for part in ("**Context.**", "**Decision.**", "**Consequences.**"):
            assert part in body, f"{title!r} has no {part}"
        assert "|---" not in body, f"{title!r} holds a table: measurements go to benchmarks/RESULTS.md"
        assert len(body.strip().splitlines()) <= 45, f"{title!r} is not short"
        dates.append(status.group(1))
    assert dates == sorted(dates), "decisions.md says oldest first"


def test_every_decision_a_file_cites_by_title_is_there() -> None:
    titles = {" ".join(t.split()) for t in _sections(DECISIONS)}
    cited = []
    for folder in ("services", "operator", "docs", "charts", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".yaml", ".tpl"} and ".cache" not in path.parts:
                text = path.read_text(errors="replace")
                for name in re.findall(r'decisions\.md`?\)?[,:]? "([^"]+)"', text):
                    name = " ".join(re.sub(r"\s*(#|//)\s*", " ", name).split())
                    if not any(title.startswith(name) for title in titles):
                        cited.append(f"{path.relative_to(ROOT)}: {name!r}")
    assert not cited, "\n".join(cited)


def test_every_measurement_is_under_the_script_that_produced_it_with_its_command_and_date() -> None:
    for title, body in _sections(RESULTS).items():
        if title.startswith("One-off"):
            assert all(re.search(r"\d{4}-\d{2}-\d{2}", item) for item in body.split("\n- ")[1:]), title
            continue
        script = re.match(r"`(\w+\.py)`", title)
        assert script and (ROOT / "benchmarks" / script.group(1)).is_file(), f"no such script: {title!r}"
        assert f"benchmarks/{script.group(1)}" in body, f"{title!r}: no command"
        runs = _sections(body, "### ")
        for run in runs or {title: body}:
            assert re.search(r"— \d{4}-\d{2}-\d{2}", run), f"{title!r} / {run!r}: no date"


def test_the_changelog_has_versions_and_dates_newest_first() -> None:
    headings = re.findall(r"^## (.+)$", CHANGELOG, flags=re.M)
    assert headings[0] == "Unreleased"
    versions = [re.fullmatch(r"(\d+)\.(\d+)\.(\d+) — (\d{4}-\d{2}-\d{2})", h) for h in headings[1:]]
    assert all(versions), headings
    numbers = [tuple(int(v.group(i)) for i in (1, 2, 3)) for v in versions if v]
    dates = [v.group(4) for v in versions if v]
    assert numbers == sorted(numbers, reverse=True) and dates == sorted(dates, reverse=True)


def test_nothing_cites_an_issue_number() -> None:
    """Code and documents cite the doc or the test that holds a reason, never an issue number (issues are not in
    the repository)."""
    cited = []
    paths = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder in ("services", "operator", "tests", "benchmarks", "charts", "docs", "examples", "docker"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.is_file() and ".cache" not in p.parts]
    for path in paths:
        if path.suffix not in {".py", ".md", ".yaml", ".txt", ".tpl", ".json", ".toml", ".cfg", ".sh", ""}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ISSUE_NUMBER.search(line):
                cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not cited, "\n".join(cited)


def test_the_readme_demo_output_is_the_demos_own_words() -> None:
    """The README's demo output block is a pasted run (to be refreshed by running the demo again): every label and
    column it shows is one the demo's report still prints, so a renamed or dropped figure shows here."""
    block = README[README.index("<!-- demo output:") : README.index("<!-- end of demo output -->")]
    output = block[block.index("```\n") + 4 : block.rindex("```")]
    lines = output.splitlines()
    assert lines[0].startswith("gymckpt demo: ") and lines[-1].startswith("OK: "), "not the demo's whole stdout"
    report = "".join(path.read_text() for path in (ROOT / "services/gym_services/demo").glob("*.py"))
    tables = output[output.index("rewards per environment:") :].split("\n\n")[1:]  # the tables of value per label
    labels = [
        re.split(r"\s{2,}", line)[0]
        for table in tables
        for line in table.splitlines()[3:]
        if line.strip() and not line.startswith("OK: ")
    ]
    header = output[output.index("rewards per environment:") :].splitlines()[1]
    columns = re.split(r"\s{2,}", header.strip())
    missing = [name for name in [*labels, *columns] if f'"{name}"' not in report]
    assert len(labels) >= 10 and not missing, missing

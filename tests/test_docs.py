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


# --- the operator-facing documents (README, docs/operations) against the protocol's vocabulary (issue 27) ---

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

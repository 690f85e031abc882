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

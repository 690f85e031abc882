"""The glossary of ``docs/protocol.md`` stays true: each word has one meaning in ``services/``, ``operator/``,
``docs/`` and ``charts/``.

For every word of the glossary, :data:`WORDS` holds the ways of writing it with *another* meaning (regular
expressions over one line), the few places another project's vocabulary or a deprecated input keeps the old word
(each with its reason), and what must be found in the code for the word to be in use at all. The test fails when a
line uses a word the other way, when a glossary word is used nowhere in ``services/`` or ``operator/``, and when the
glossary and :data:`WORDS` list different words. Two meanings that no single line shows have checks of their own:
the training triple in a type other than ``Tokens``, and our ``Scope`` imported beside ASGI's.

The glossary's own rows, which name the other meanings on purpose, and the records in ``docs/decisions.md`` that
tell of a rename (:data:`HISTORY`) are not scanned.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("services", "operator", "docs", "charts")
CODE = ("services", "operator")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".json", ".txt", ".tmpl", ".toml"}
PROTOCOL = ROOT / "docs" / "protocol.md"
#: records of docs/decisions.md that tell of a rename, and so name the old meaning
HISTORY = ("One word per meaning", "The checkpoint methods are `background` and `sync`")


@dataclass(frozen=True)
class Word:
    """One glossary word: how it would be used with another meaning, where that is somebody else's word, and what
    the code must hold for the word to be in use."""

    misuse: tuple[str, ...]
    used: str
    #: (path regex, line regex, why): a line that may keep the other meaning
    allowed: tuple[tuple[str, str, str], ...] = ()
    #: paths where the word must not appear at all
    nowhere_in: tuple[str, ...] = ()
    case_sensitive: bool = False


WORDS: dict[str, Word] = {
    "attempt": Word(
        misuse=(
            r"\b(retry|retries|max|delete|deletion|connect|connection)[ _-]attempts?\b",
            r"\battempts\s*:\s*int\b",
            r"\brange\(\s*attempts\s*\)",
            r"\bfailed \{?attempts\}? times\b",
            r"\(attempt \{",
        ),
        used=r"attempt \+ 1",
        allowed=(
            (r"^services/gym_services/agents/proof_refinement_agent/", ".", "NeMo Gym's proof attempts: its turns"),
            (r".", r"\bmax_attempts\b", "botocore's retry setting"),
            (r".", r"\bGYMCKPT_DELETE_ATTEMPTS\b", "the operator's setting, named before the glossary (tries)"),
        ),
    ),
    "boundary": Word(
        misuse=(r"\b(byte|pack|page|chunk|word|character|utf-?8|record|line)s? boundar(y|ies)\b",),
        used=r"\bclass Boundary\b",
    ),
    "capture": Word(
        misuse=(
            r"\bcaptur\w* (the |its |their |every |each )?(training )?tokens?\b",
            r"\bcapture[ _-]?ledgers?\b",
            r"\btoken[ _-]capture\b",
            r"\bcapture_tokens\b",
        ),
        used=r"\bdef capture\b",
        allowed=(
            (
                r"^(services/gym_services/models/policy_model/app\.py|docs/protocol\.md|docs/operations/servers\.md)$",
                r"capture_tokens\b.*(old|before|deprecated)|(old|before|deprecated).*capture_tokens\b"
                r"|OLD_RECORD_TOKENS_KEY",
                "the deprecated config key, still read as record_tokens",
            ),
        ),
    ),
    "checkpoint": Word(
        misuse=(r"\b(model|weights?|training|torch|pytorch) checkpoints?\b",),
        used=r"\bclass CheckpointTransaction\b",
    ),
    "ENGINES": Word(
        misuse=(r"\bENGINES\b",),
        used=r"^ENGINES\b",
        allowed=(
            (r"^services/gym_services/models/policy_model/", ".", "the wire adapters' own package"),
            (r"^docs/", r"wire adapters|engines/|policy model", "the documents name it as the wire adapters"),
            (r"^services/gym_services/demo/workers\.py$", r"wire adapters", "the worker kinds' docstring: not them"),
        ),
        case_sensitive=True,
    ),
    "frozen record": Word(
        misuse=(r"\bfrozen records?\b.{0,40}\bFrozenRollout\b", r"\bFrozenRollout\b.{0,40}\bfrozen records?\b"),
        used=r"\bclass FrozenRecord\b",
    ),
    "Kubernetes Lease": Word(
        misuse=(
            r"\b(leader|leadership|election|Kubernetes)\b[^.\n]{0,40}\blease\b",
            r"\blease (holder|lock)\b",
            r"\b(leader_lease|LeaderLease|lease_lock|Elector|ElectionSettings)\b",
            r"\bleader\.py\b",
        ),
        used=r"\bclass Leadership\b",
        allowed=(
            (r".", r"kubectl get lease", "kubectl's name of the resource"),
            (r"^docs/decisions\.md$", r"LeaseLock|leaderelection", "the client library's names: why not used"),
        ),
        case_sensitive=True,
    ),
    "lease": Word(
        misuse=(r"\b(pod|operator|leader)'?s? lease\b",),
        used=r"\blease_s\b",
        case_sensitive=True,
    ),
    "manifest": Word(
        misuse=(r"\b(kubernetes|k8s|yaml|helm|rendered|chart'?s?) manifests?\b",),
        used=r"\bclass GlobalManifest\b",
        allowed=((r".", r"helm get manifest", "Helm's command"),),
    ),
    "method": Word(
        misuse=(
            r"\b(snapshot|background|sync)`*\s+method'?s?\s+(manifest|packs?|format)\b",
            r"\b(manifest|packs?|format)\b[^.\n]{0,30}\bof the `*(snapshot|background|sync)`* method\b",
        ),
        used=r"\bclass CheckpointMethod\b",
    ),
    "pack": Word(misuse=(r"\b(python|wheel|pip) packs?\b",), used=r"\bclass PackedManifest\b"),
    "participant": Word(
        misuse=(
            r"\b(inference[ _-]workers?|trainers?)\b (is|are) (a |one )?participants?\b",
            r"\binference worker'?s? participant\b",
        ),
        used=r"\bclass Participant\b",
    ),
    "record": Word(
        misuse=(
            r"\brecord(s|ed|ing)? (its |the |their )?(state|sessions?)\b[^.\n]{0,30}\bunder the pause\b",
            r"(?<!the )(?<!a )\brecord(s|ed|ing)? (a|the) checkpoint\b",
        ),
        used=r"\bclass Record\b",
    ),
    "restore": Word(
        misuse=(r"\brestor(e|es|ed|ing) (the )?(admission|connection)s?\b",),
        used=r"\bclass RestoreTransaction\b",
    ),
    "scope": Word(
        misuse=(r"\bout of (the )?scope (for|of) (this|the) (project|issue|document)\b",),
        used=r"\bclass Scope\b",
    ),
    "snapshot": Word(
        misuse=(r"snapshot",),
        used=r"\bsnapshot_id\b",
        allowed=(
            (r".", r"\bsnapshot_id\b|\bTokenCaptureSnapshot\b", "NeMo Gym's wire words"),
            (r".", r"deprecated|alias", "the deprecated method name, still read as background"),
        ),
    ),
    "token ledger": Word(
        misuse=(
            r"\bcapture[ _-]?ledgers?\b",
            r"\bledgers?\b[^.\n]{0,40}\btombstones?\b",
            r"\btombstones?\b[^.\n]{0,40}\bledgers?\b",
        ),
        used=r"\bclass TokenLedger\b",
    ),
    "Tokens": Word(misuse=(r"\b(TokenPrefix|CallTokens)\b",), used=r"\bclass Tokens\b", case_sensitive=True),
    "tombstone": Word(
        misuse=(
            r"\btombstones?\b[^.\n]{0,40}\b(ledger|rollout|drop|dropped|drops)\b",
            r"\b(ledger|rollout|dropped|drops)\b[^.\n]{0,40}\btombstones?\b",
        ),
        used=r"\btombstone\b",
        nowhere_in=(r"^services/gym_services/(models|agents)/",),
    ),
    "transaction": Word(
        misuse=(r"\b(database|db|sql) transactions?\b",),
        used=r"\bclass RestoreTransaction\b",
    ),
    "WORKER_KINDS": Word(
        misuse=(r"\bWORKER_KINDS\b",),
        used=r"^WORKER_KINDS\b",
        allowed=(
            (r"^services/gym_services/(demo/|commands/demo\.py$)", ".", "the demo's own modules"),
            (r"^docs/", r"demo|worker", "the documents name it as the demo's worker kinds"),
        ),
        case_sensitive=True,
    ),
}


def glossary_words() -> list[str]:
    """The words of the glossary table, as its first column names them (``**snapshot**, **snapshot_id**`` is one
    word, ``snapshot``)."""
    text = PROTOCOL.read_text()
    table = text[text.index("## Glossary") :]
    table = table[: table.index("\n## ")]
    rows = re.findall(r"^\| \*\*.*$", table, re.M)
    return [re.findall(r"\*\*`?([^*`]+)`?\*\*", row.split("|")[1])[0] for row in rows]


def _files(folders: tuple[str, ...]) -> Iterator[Path]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and not {".cache", "__pycache__", "data"} & set(path.parts):
                yield path


@cache
def _lines() -> list[tuple[str, int, str]]:
    """(path, line number, text) of every scanned line, without the glossary's rows and the history records."""
    out = []
    for path in _files(SCANNED):
        rel = str(path.relative_to(ROOT))
        skipping = False
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if rel == "docs/decisions.md" and line.startswith("## "):
                skipping = line[3:].strip() in HISTORY
            if skipping or (path == PROTOCOL and line.startswith("| **")):
                continue
            out.append((rel, number, line))
    return out


def misuses(name: str, word: Word) -> list[str]:
    flags = 0 if word.case_sensitive else re.I
    misuse = [re.compile(p, flags) for p in word.misuse]
    found = []
    for rel, number, line in _lines():
        if any(re.search(p, rel) for p in word.nowhere_in) and re.search(name.split()[0], line, re.I):
            found.append(f"{rel}:{number}: {line.strip()[:120]}")
            continue
        if not any(p.search(line) for p in misuse):
            continue
        if any(re.search(path, rel) and re.search(text, line, flags) for path, text, _ in word.allowed):
            continue
        found.append(f"{rel}:{number}: {line.strip()[:120]}")
    return found


def test_the_glossary_and_the_checks_list_the_same_words() -> None:
    assert sorted(glossary_words()) == sorted(WORDS)


@pytest.mark.parametrize("name", WORDS)
def test_each_word_is_used_with_its_one_meaning(name: str) -> None:
    found = misuses(name, WORDS[name])
    assert not found, f"{name!r} used with another meaning (docs/protocol.md, 'Glossary'):\n" + "\n".join(found)


@pytest.mark.parametrize("name", WORDS)
def test_each_word_is_in_use(name: str) -> None:
    used = re.compile(WORDS[name].used, re.M)
    assert any(used.search(path.read_text(errors="replace")) for path in _files(CODE)), (
        f"the glossary's {name!r} is used nowhere in services/ or operator/ ({WORDS[name].used}): drop it or use it"
    )


#: the types that may hold the training triple besides Tokens: formats at an edge, read into Tokens there
TRIPLE_HOLDERS = {
    "Tokens": "the one value type",
    "LedgerEntry": "NeMo Gym's TokenEntry on the token ledger's wire",
    "PrefixRecord": "the stored prefix record (schema 2)",
    "Delta": "one streamed step of an engine, its pieces as they arrive",
}


def _fields(node: ast.ClassDef) -> set[str]:
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def test_the_training_triple_is_one_type() -> None:
    holders = []
    for path in _files(CODE):
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = _fields(node)
                if (
                    "prompt_token_ids" in names
                    and names & {"generation_token_ids", "token_ids"}
                    and names & {"generation_log_probs", "log_probs"}
                ):
                    holders.append(node.name)
    assert set(holders) <= set(TRIPLE_HOLDERS), f"{set(holders) - set(TRIPLE_HOLDERS)} hold the triple: use Tokens"
    assert "Tokens" in holders


def test_our_scope_is_never_imported_beside_asgis() -> None:
    both = []
    for path in _files(CODE):
        if path.suffix == ".py":
            text = path.read_text()
            ours = re.search(r"from gym_services\.control\.participant import[^\n]*\bScope\b", text)
            theirs = re.search(r"from starlette\.types import[^\n]*\bScope\b", text)
            if ours and theirs:
                both.append(str(path.relative_to(ROOT)))
    assert not both, f"both Scopes imported in {both}"

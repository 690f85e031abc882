"""A deterministic stand-in tokenizer: words (with one leading space), single punctuation, whitespace runs.

Real tokenizers are not needed to exercise checkpointing; what matters is that

- joining the tokens of a text gives the text back, and
- tokenizing a prefix that ends on a token boundary gives exactly the first tokens of the whole
  (each match depends only on the text from its own start onwards),

so "continue from the prefix" and "the tokens not yet emitted" are the same thing.
"""

from __future__ import annotations

import re

_PIECE = re.compile(r" ?\w+| ?[^\w\s]|\s+")


def tokenize(text: str) -> list[str]:
    return _PIECE.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in _PIECE.finditer(text))


def split_at(text: str, prefix: str) -> list[str]:
    """The tokens of ``text`` that follow ``prefix`` (which ``text`` must start with).

    On a token boundary this is the tail of :func:`tokenize`; a prefix that ends inside a token
    yields the rest of that token as the first piece, so ``prefix + "".join(result) == text``.
    """
    if not text.startswith(prefix):
        raise ValueError("text does not start with the prefix")
    tokens = tokenize(text)
    consumed = 0
    for index, token in enumerate(tokens):
        if consumed == len(prefix):
            return tokens[index:]
        if consumed + len(token) > len(prefix):
            return [text[len(prefix) : consumed + len(token)], *tokens[index + 1 :]]
        consumed += len(token)
    return []

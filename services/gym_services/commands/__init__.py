"""Sub-commands of ``gymckpt`` beyond ``serve``; each module adds its parsers."""

from __future__ import annotations

REGISTRARS: list = []

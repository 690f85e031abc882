"""What every toolkit shares: a tool object bound to one session's tables, and the paging arithmetic.

The tools are specified by NeMo Gym 0.7.0's workplace_assistant toolkits: the same answers, the same
table changes and, for arguments of unexpected types, the same Python and pandas errors (the route
returns their text to the model). Each toolkit is therefore a class whose method names, parameter
names and defaults are the reference's, so even a bad call (an unknown keyword, a ``self`` keyword)
fails with the reference's text; its tables live in the session's :class:`WorkplaceEnvironment`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pandas as pd

from ..environment import TableKey, WorkplaceEnvironment

#: The tools' "now" (the tasks' system prompt fixes today to Thursday 2023-11-30 23:59), as written into rows.
NOW = str(pd.to_datetime("2023-11-30T23:59:00"))


class SessionTable:
    """A tool attribute that reads and replaces one of the session's tables."""

    def __init__(self, key: TableKey) -> None:
        self.key = key

    def __get__(self, tool: Toolkit | None, owner: type) -> Any:
        if tool is None:
            return self
        return tool.env.get(self.key)

    def __set__(self, tool: Toolkit, df: pd.DataFrame) -> None:
        tool.env.put(self.key, df)


class Toolkit:
    """Base of the toolkit classes: holds the session environment the tables come from."""

    #: tool name -> method name, filled in by each toolkit
    TOOLS: ClassVar[dict[str, str]] = {}

    def __init__(self, env: WorkplaceEnvironment) -> None:
        self.env = env


def page_of(total: int, page: Any, page_size: Any) -> dict[str, Any]:
    """The pagination of ``total`` rows: a page out of range is clamped to the last (or first) page.

    Sizes and pages of other types fail exactly where Python fails on this arithmetic (a size of 0
    divides by zero); the caller slices ``rows[info["start"]:info["stop"]]`` only when it has rows.
    """
    pages = (total + page_size - 1) // page_size
    page = max(1, min(page, pages)) if pages > 0 else 1
    start = (page - 1) * page_size
    stop = min(start + page_size, total)
    return {"total": total, "page": page, "page_size": page_size, "total_pages": pages, "start": start, "stop": stop}


def paginated(noun: str, rows: list, info: dict[str, Any]) -> dict[str, Any]:
    """``{noun: <the page's rows>, "pagination": {...}}`` as the search tools answer."""
    return {
        noun: rows[info["start"] : info["stop"]],
        "pagination": {
            f"total_{noun}": info["total"],
            "page": info["page"],
            "page_size": info["page_size"],
            "total_pages": info["total_pages"],
        },
    }

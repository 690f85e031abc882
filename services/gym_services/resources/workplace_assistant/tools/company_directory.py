"""Company directory toolkit (read-only): look up employee email addresses by name."""

from __future__ import annotations

from ..environment import DIRECTORY, WorkplaceEnvironment
from ._common import contains_ci


def company_directory_find_email_address(env: WorkplaceEnvironment, name: str = "") -> object:
    """All addresses containing ``name`` (case-insensitive), in directory order."""
    if not name:
        return "Name not provided."
    directory = env.get(DIRECTORY)
    hits = directory["email_address"][contains_ci(directory["email_address"], name)]
    return [str(v) for v in hits.to_numpy()]


TOOLS = {"company_directory_find_email_address": company_directory_find_email_address}

"""Company directory toolkit (read-only): email addresses containing a name.

The name is matched as a case-insensitive regular expression, so "(" fails as ``re`` fails on it.
"""

from __future__ import annotations

from typing import ClassVar

from ..environment import DIRECTORY
from ._common import SessionTable, Toolkit


class CompanyDirectoryTool(Toolkit):
    TOOLS: ClassVar[dict[str, str]] = {"company_directory_find_email_address": "find_email_address"}

    _emails = SessionTable(DIRECTORY)

    def find_email_address(self, name=""):
        if name == "":
            return "Name not provided."
        addresses = self._emails["email_address"]
        return addresses[addresses.str.contains(name.lower(), case=False)].values.tolist()

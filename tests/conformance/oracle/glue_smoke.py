"""Glue used by the harness's own test: which pandas runs, and that the reference imports."""

from __future__ import annotations


def versions() -> dict:
    import numpy
    import pandas

    return {"pandas": pandas.__version__, "numpy": numpy.__version__}


def reference_imports() -> list[str]:
    import resources_servers.workplace_assistant.utils as utils

    return sorted(utils.get_tools(["email"])["functions"])

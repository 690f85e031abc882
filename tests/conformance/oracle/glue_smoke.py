"""Glue used by the harness's own test: which pandas runs, and that the reference imports."""

from __future__ import annotations


def versions() -> dict:
    import importlib.metadata
    import platform

    import numpy
    import pandas

    names = ("aiohttp", "orjson", "anyio", "urllib3", "fastapi", "starlette", "pydantic", "openai", "nemo-gym")
    return {
        "pandas": pandas.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        **{name: importlib.metadata.version(name) for name in names},
    }


def reference_imports() -> list[str]:
    import resources_servers.workplace_assistant.utils as utils

    return sorted(utils.get_tools(["email"])["functions"])

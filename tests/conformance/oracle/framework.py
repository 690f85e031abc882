"""Runs INSIDE the oracle environment: NeMo Gym's own framework, and its FastAPI apps built as ``run_webserver`` builds
them.

Every glue (``glue_<name>.py``) drives the reference through this module: the released
``nemo_gym`` framework is imported for real (its ``SimpleServer``, ``SimpleResourcesServer``, agents,
request models, session middleware, exception and validation handlers), so a reference server
answers every path exactly as a NeMo Gym deployment does, the framework's own routes
(``/close_session``, ``/reverify_mode``, ``/aggregate_metrics``, liveness) included.

Its import graph reaches a few packages that play no part in serving the requests compared:
``hydra`` (command-line config), ``yappi`` (profiling), ``pydot`` (graph export), ``scipy``
(confidence intervals of ``/aggregate_metrics``, which the suite does not call) and the installed
version of ``ray`` (read at import for the dependency list of spawned server venvs). They are
replaced by the import shims below, whose every attribute is a placeholder that raises if anything
actually uses it, and ray's version is answered by a one-file distribution record. One more,
``wandb``, is used by ``/aggregate_metrics`` for a value it then drops: its ``Histogram`` is a
stand-in that bins the data with ``numpy.histogram`` and keeps nothing. Every package that shapes
an answer compared is installed at the version NeMo Gym pins or locks
(``reference.ORACLE_REQUIREMENTS``). No file of the reference is modified.

:func:`assemble` turns a server object into its app in the order of ``SimpleServer.run_webserver``
(``setup_webserver``, liveness routes, the exception middleware that turns an unhandled error into
``500`` + ``repr(e)``, the cancellation middleware and the request-validation handler), minus
uvicorn, telemetry and the global config; :func:`build_app` makes the server object first.
:class:`Session` is one client (one cookie jar, so one NeMo Gym session) against such an app.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

SHIMMED_MODULES = ("hydra", "yappi", "pydot", "scipy", "scipy.stats", "wandb")
_installed = False


class _Unavailable:
    """A placeholder for a class or function of a shimmed package: any use of it is an error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{type(self).__qualname__} is an oracle import shim; the reference used it")

    def __init_subclass__(cls, **kwargs: Any) -> None:  # subclassing at import time is fine
        super().__init_subclass__()


class _ShimModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Unavailable,), {"__qualname__": f"{self.__name__}.{name}"})


def install_import_shims() -> None:
    """Shims for the packages above that the oracle environment does not have (a package installed
    for real, e.g. by another glue's requirements, is used as it is)."""
    global _installed
    if _installed:
        return
    logging.getLogger().addHandler(logging.NullHandler())  # the reference's request-validation warnings
    missing = {name for name in SHIMMED_MODULES if "." not in name and importlib.util.find_spec(name) is None}
    for name in SHIMMED_MODULES:
        if name.split(".")[0] in missing and name not in sys.modules:
            module = _ShimModule(name)
            module.__path__ = []  # a package, so submodule imports resolve to shims too
            sys.modules[name] = module
    if "wandb" in missing:
        sys.modules["wandb"].Histogram = _wandb_histogram()
    # importlib.metadata.version("ray") must find a distribution: a one-file record in a temp dir
    try:
        importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        _installed = True
        return
    records = Path(tempfile.mkdtemp(prefix="oracle-dists-"))
    info = records / "ray-0.0.0+oracle.shim.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 0.0.0+oracle.shim\n")
    sys.path.append(str(records))
    _installed = True


def _wandb_histogram() -> type:
    """wandb's ``Histogram`` as ``/aggregate_metrics`` uses it: built from a column, then dropped."""
    import numpy

    class Histogram:
        def __init__(self, sequence: Any = None, np_histogram: Any = None, num_bins: int = 64) -> None:
            if num_bins > 512:
                raise ValueError("num_bins must be at most 512")
            numpy.histogram(sequence, bins=num_bins)  # binned, so data that cannot be binned fails here too

    return Histogram


def assemble(server: Any) -> Any:
    """The FastAPI app of a reference server object, assembled like ``SimpleServer.run_webserver`` does."""
    from fastapi.exceptions import RequestValidationError
    from nemo_gym.server_utils import _validation_exception_handler

    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    server.setup_cancellation_middleware(app)
    app.exception_handler(RequestValidationError)(_validation_exception_handler)
    return app


def build_app(server_cls: type, config: Any) -> tuple[Any, Any]:
    """A reference server object of ``server_cls`` (with a server client that is never called) and its app."""
    install_import_shims()
    from unittest.mock import MagicMock

    from nemo_gym.server_utils import ServerClient

    server = server_cls(config=config, server_client=MagicMock(spec=ServerClient))
    return server, assemble(server)


def server_config(name: str, **fields: Any) -> dict[str, Any]:
    """A server's config fields as NeMo Gym's global config gives them (no real host or port)."""
    return {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": name, **fields}


class Session:
    """One client with a cookie jar against an in-process app; answers as ``{status, body}``."""

    def __init__(self, app: Any) -> None:
        import httpx

        self._loop = asyncio.new_event_loop()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://oracle")

    def request(self, call: dict[str, Any]) -> dict[str, Any]:
        """``call``: ``{method?, path, json?}``, ``{method?, path, raw?, content_type?}`` or ``raw_hex``
        for bytes that are not text; answers ``{status, body, content_type}``."""
        kwargs: dict[str, Any] = {}
        headers = dict(call.get("headers") or {})
        if "raw" in call or "raw_hex" in call:
            raw = call.get("raw")
            kwargs["content"] = (
                bytes.fromhex(call["raw_hex"]) if "raw_hex" in call else (None if raw is None else raw.encode())
            )
            if call.get("content_type") is not None:
                headers["content-type"] = call["content_type"]
        elif "json" in call:
            kwargs["content"] = json.dumps(call["json"]).encode()
            headers.setdefault("content-type", "application/json")
        coro = self.client.request(call.get("method", "POST"), call["path"], headers=headers, **kwargs)
        with contextlib.redirect_stdout(io.StringIO()):  # the exception middleware prints tracebacks
            response = self._loop.run_until_complete(coro)
        return {
            "status": response.status_code,
            "body": response.content.decode("utf-8", errors="replace"),
            "content_type": response.headers.get("content-type"),
        }

    def close(self) -> None:
        self._loop.run_until_complete(self.client.aclose())
        self._loop.close()

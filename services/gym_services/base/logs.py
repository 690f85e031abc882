"""Structured logs: one JSON object per line, with the server name on every line.

``gymckpt serve`` calls :func:`configure_logging` once; every module logs through :func:`get_logger`.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_RESERVED = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    def __init__(self, server: str) -> None:
        super().__init__()
        self.server = server

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "server": self.server,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_") and key != "color_message":
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(server: str, level: str = "info") -> None:
    """Route every logger (uvicorn's too) through one JSON handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(server))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel("WARNING")
    logging.Formatter.converter = time.gmtime


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"gym.{name}")

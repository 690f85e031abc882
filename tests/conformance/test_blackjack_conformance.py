"""blackjack answers like NeMo Gym 0.7.0's: same calls to both, status codes and bytes compared."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette

from gym_services.base.config import load_config
from gym_services.resources.blackjack.app import Config, create_app
from tests.support.asgi import base_config


@contextlib.asynccontextmanager
async def our_blackjack(**extra: Any) -> AsyncIterator[Starlette]:
    app = create_app(load_config(Config, overrides=base_config("blackjack", **extra)))
    async with app.router.lifespan_context(app):
        yield app


def blackjack_allowed(call: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    return None

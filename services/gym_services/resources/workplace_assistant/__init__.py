"""Workplace Assistant resources server: domain logic (tables, 27 tools, verify) and the
checkpoint codec. The Starlette app lives in ``app.py`` and uses :class:`WorkplaceSessions`."""

from .codec import InvalidSessionState, UnencodableStateError
from .environment import WorkplaceEnvironment, pristine_tables
from .sessions import SessionNotFound, WorkplaceSessions
from .tools import call_tool, tool_schemas
from .verify import extract_function_calls, is_correct, verify_reward

__all__ = [
    "InvalidSessionState",
    "SessionNotFound",
    "UnencodableStateError",
    "WorkplaceEnvironment",
    "WorkplaceSessions",
    "call_tool",
    "extract_function_calls",
    "is_correct",
    "pristine_tables",
    "tool_schemas",
    "verify_reward",
]

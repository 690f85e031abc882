"""Whether an object implements an interface's methods as the interface declares them, named when it does not.

Used at a server's start-up: the control plane checks its participant
(:func:`gym_services.control.participant.check_participant`), an ``exported`` server's participant its session store
(:func:`gym_services.resources.common.hooks.session_hook_problems`). Every problem names the method and its signature
as the interface declares it, so an author sees what to write.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any


def interface_problems(obj: object, interface: type, names: Iterable[str]) -> list[str]:
    """What keeps ``obj`` from implementing ``names`` as ``interface`` declares them: each missing method, each
    ``async`` one made plain (or the other way round), each that cannot take the interface's arguments; every
    problem names the method and its signature in the interface."""
    problems = []
    for name in names:
        declared = getattr(interface, name)
        wanted = signature_text(name, declared)
        found = getattr(obj, name, None)
        if found is None or not callable(found):
            problems.append(f"missing {wanted}")
            continue
        if inspect.iscoroutinefunction(declared) != inspect.iscoroutinefunction(found):
            problems.append(f"{name} must be {wanted}")
            continue
        try:
            inspect.signature(found).bind(*_positional(declared))
        except TypeError:
            problems.append(f"{name}{_parameters(found)} cannot be called as {wanted}")
        except ValueError:
            continue  # no signature to read (a builtin): taken as it is
    return problems


def signature_text(name: str, function: Callable[..., Any]) -> str:
    """``def name(self, a: A) -> R`` as declared (``async def`` for a coroutine function)."""
    returns = inspect.signature(function).return_annotation
    arrow = "" if returns is inspect.Signature.empty else f" -> {_annotation(returns)}"
    prefix = "async def" if inspect.iscoroutinefunction(function) else "def"
    return f"{prefix} {name}{_parameters(function)}{arrow}"


def _parameters(function: Callable[..., Any]) -> str:
    try:
        parameters = inspect.signature(function).parameters.values()
    except ValueError:
        return "(...)"
    shown = []
    for p in parameters:
        text = p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {_annotation(p.annotation)}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}"
        shown.append(text)
    return f"({', '.join(shown)})"


def _annotation(annotation: object) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))


def _positional(declared: Callable[..., Any]) -> list[None]:
    """Placeholders for every positional argument the interface's method takes, but ``self``."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p for p in inspect.signature(declared).parameters.values() if p.kind in kinds]
    return [None] * (len(params) - 1)

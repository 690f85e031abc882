"""Sub-commands of ``gymckpt`` beyond ``serve``; each module adds its parsers."""

from __future__ import annotations

from gym_services.commands import cluster, demo, forward, stack

REGISTRARS: list = [demo.register, stack.register, cluster.register, forward.register]

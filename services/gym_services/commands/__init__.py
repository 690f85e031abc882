"""Sub-commands of ``gymckpt`` beyond ``serve``; each module adds its parsers (and imports what a command needs only
when it runs, so the CLI starts fast: ``benchmarks/cli_checkpoint.py``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gym_services.commands import check_server, cluster, demo, forward, new_server, servers
from gym_services.commands.stack import parsers as stack_parsers

REGISTRARS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    demo.register,
    stack_parsers.register,
    cluster.register,
    forward.register,
    servers.register,
    check_server.register,
    new_server.register,
]

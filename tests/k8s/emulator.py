"""Run kemu, the Kubernetes API emulator for tests: `python tests/k8s/emulator.py --port N`.

Prints `listening http://127.0.0.1:N` once it accepts connections (with `--port 0` it picks a free
port and prints that one), then serves until SIGTERM or SIGINT. The emulator lives in the `kemu`
package beside this file; see tests/k8s/README.md for what it emulates and what it does not.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kmock  # noqa: E402

from kemu.server import Kemu  # noqa: E402


async def serve(host: str, port: int) -> None:
    emulator = Kemu()
    async with emulator, kmock.Server(emulator, host=host, port=port) as server:
        print(f'listening http://{host}:{server.port}', flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description='Kubernetes API emulator for tests (kmock + fixes).')
    parser.add_argument('--host', default='127.0.0.1', help='interface to bind (default 127.0.0.1)')
    parser.add_argument('--port', type=int, default=0, help='port to bind; 0 picks a free one')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(serve(args.host, args.port))


if __name__ == '__main__':
    main()

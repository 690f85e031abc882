"""Run kemu, the Kubernetes API emulator for tests: `python tests/k8s/emulator.py --port N --tls-dir DIR`.

Serves HTTPS (client-go sends bearer tokens only over TLS) with a certificate for 127.0.0.1 signed
by a CA it writes to `DIR/ca.crt`; prints `listening https://127.0.0.1:N` once it accepts
connections (with `--port 0` it picks a free port and prints that one), then serves until SIGTERM or
SIGINT. Without `--tls-dir` it serves plain HTTP (clients then send no tokens: everything is
anonymous). The emulator lives in the `kemu` package beside this file; see tests/k8s/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp.web
from kemu.server import Kemu
from kemu.tls import make_certificates, server_context


async def serve(host: str, port: int, tls_dir: Path | None) -> None:
    emulator = Kemu()
    context = None
    if tls_dir is not None:
        _, cert, key = make_certificates(tls_dir)
        context = server_context(cert, key)
    async with emulator:
        server = aiohttp.web.Server(emulator)
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(server, host, port, ssl=context)
        bound = listener.sockets[0].getsockname()[1]

        async def outage(seconds: float) -> None:
            """Unreachable for `seconds`: no listener, every open connection (watches too) dropped."""
            nonlocal listener
            listener.close()
            await server.shutdown(timeout=0.1)
            await asyncio.sleep(seconds)
            listener = await loop.create_server(server, host, bound, ssl=context)

        emulator.harness.outage = lambda seconds: asyncio.ensure_future(outage(seconds))
        print(f"listening {'https' if context else 'http'}://{host}:{bound}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            listener.close()
            await server.shutdown(timeout=0.1)  # (open watches would hold it for the whole timeout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Kubernetes API emulator for tests (kmock + fixes).")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument(
        "--tls-dir", type=Path, default=None, help="serve HTTPS; the CA certificate is written to DIR/ca.crt"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(serve(args.host, args.port, args.tls_dir))


if __name__ == "__main__":
    main()

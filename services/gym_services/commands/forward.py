"""``gymckpt forward``: a plain TCP forwarder, the only socket of the chart's in-cluster S3 store on the pod IP.

SeaweedFS opens an unauthenticated gRPC port next to every HTTP port it binds (the S3 gateway's accepts a
new identity configuration), so the chart binds all of SeaweedFS to 127.0.0.1 and puts this forwarder in
front of the S3 HTTP port alone: the S3 API (signed requests only) is the one thing reachable from outside
the pod. Bytes are passed through untouched, so S3 signatures (which cover the Host header) stay valid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

CHUNK = 1 << 18


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still be sending
    except (ConnectionError, OSError):
        writer.close()


def _create_bucket(target: tuple[str, int], bucket: str) -> None:
    """Create ``bucket`` through the S3 API at ``target`` with the AWS_* keys of the environment (exists: fine)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=f"http://{target[0]}:{target[1]}",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10, s3={"addressing_style": "path"}),
    )
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


async def ensure_bucket(target: tuple[str, int], bucket: str, stop: asyncio.Event) -> bool:
    """Until the store answers: try to create the bucket every second (a line on stderr every 10 s)."""
    last_note = 0.0
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            await asyncio.to_thread(_create_bucket, target, bucket)
            print(f"gymckpt forward: bucket {bucket} is there", file=sys.stderr, flush=True)
            return True
        except Exception as exc:
            if loop.time() - last_note >= 10:
                last_note = loop.time()
                print(
                    f"gymckpt forward: waiting for {target[0]}:{target[1]} to create bucket {bucket}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)
    return False


async def forward(
    listen: tuple[str, int],
    target: tuple[str, int],
    max_connections: int,
    connect_timeout_s: float = 10.0,
    ready: asyncio.Event | None = None,
    create_bucket: str | None = None,
) -> None:
    """Forward connections; with ``create_bucket``, first make sure that bucket exists behind ``target`` and only
    then listen, so a readiness probe through this port means the store is usable."""
    slots = asyncio.Semaphore(max_connections)

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        async with slots:
            try:
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(*target), timeout=connect_timeout_s
                )
            except (TimeoutError, OSError):
                client_writer.close()
                return
            try:
                await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))
            finally:
                for writer in (client_writer, upstream_writer):
                    writer.close()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if create_bucket and not await ensure_bucket(target, create_bucket, stop):
        return
    server = await asyncio.start_server(handle, *listen, backlog=1024, reuse_address=True)
    print(f"gymckpt forward: {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", file=sys.stderr, flush=True)
    if ready is not None:
        ready.set()
    async with server:
        await stop.wait()


def cmd_forward(args: argparse.Namespace) -> int:
    asyncio.run(forward(args.listen, args.to, args.max_connections, create_bucket=args.create_bucket))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "forward",
        help="forward TCP connections from one address to another (the in-cluster S3 store's only public port)",
        description="Accept TCP connections on --listen and pass their bytes to --to and back, untouched. The chart "
        "runs it in front of SeaweedFS's S3 port so that nothing else of SeaweedFS is reachable from outside the pod.",
    )
    p.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT", help="address to accept on")
    p.add_argument("--to", type=_address, required=True, metavar="HOST:PORT", help="address to forward to")
    p.add_argument("--max-connections", type=int, default=512, help="connections served at once (default 512)")
    p.add_argument(
        "--create-bucket",
        metavar="NAME",
        help="before listening, create this S3 bucket behind --to "
        "(keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), retrying until the store answers",
    )
    p.set_defaults(func=cmd_forward)

"""What the storage gateway costs a participant: the same objects written and read with the keys in the process
(``S3Storage``, as before) and through the operator's gateway (``GatewayStorage``: one signing request to the
gateway, then the presigned request to the store), against a real SeaweedFS on 127.0.0.1.

Per object size (the packed format's 8 MB packs, and small objects: a manifest, a reuse intent, a decision),
``--objects`` puts then as many gets, ``--workers`` at a time (a persist uploads its packs concurrently), each way;
the table prints the median wall time per object and the throughput. The gateway runs in a thread of this process
(aiohttp, as in the operator), so its signing CPU is on the same two cores as the client's.

    .venv/bin/python benchmarks/storage_gateway.py [--objects 32] [--workers 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from tests.support.ports import free_port  # noqa: E402
from tests.support.seaweed import start_seaweed  # noqa: E402

from gym_services.base.config import StorageConfig  # noqa: E402
from gym_services.control.models import PackEntry  # noqa: E402
from gym_services.control.storage.gateway import GatewayHttp, GatewayStorage, GrantIssuer, GrantSigner, Target  # noqa: E402
from gym_services.control.storage.s3 import S3Storage  # noqa: E402
from gym_services.control.store import CheckpointStore  # noqa: E402

KEY = b"benchmark-gateway-key-0123456789"
SIZES = {"8 MiB pack": 8 * 1024 * 1024, "1 KiB object": 1024}


class NoSecrets:
    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        raise LookupError(name)


def serve_gateway(config: StorageConfig, port: int) -> threading.Event:
    from gym_operator.gateway import Gateway, serve

    ready, stop = threading.Event(), threading.Event()

    def run() -> None:
        async def main() -> None:
            runner = await serve(Gateway(GrantSigner(KEY), NoSecrets(), "ns", config), "127.0.0.1", port)  # type: ignore[arg-type]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.1)
            await runner.cleanup()

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(30)
    return stop


def run_once(
    writer: CheckpointStore, reader: CheckpointStore, size: int, objects: int, workers: int
) -> tuple[float, float]:
    """Seconds per object (median): packs written as a persist writes them, then read back as a restore reads them
    (each checked against its digest, the same both ways)."""
    data = os.urandom(size)

    def put(number: int) -> tuple[float, PackEntry]:
        t0 = time.perf_counter()
        entry = writer.write_pack("ck-1", "p-1", number, data)
        return time.perf_counter() - t0, entry

    def get(entry: PackEntry) -> float:
        t0 = time.perf_counter()
        reader.read_pack(entry)
        return time.perf_counter() - t0

    with ThreadPoolExecutor(workers) as pool:
        written = list(pool.map(put, range(objects)))
        gets = list(pool.map(get, [entry for _, entry in written]))
    return statistics.median(t for t, _ in written), statistics.median(gets)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=32)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seaweed = start_seaweed(Path(tmp) / "weed")
        try:
            seaweed.create_bucket("bench-gateway")
            config = StorageConfig(
                endpoint_url=seaweed.endpoint,
                region="us-east-1",
                access_key_id=seaweed.access_key,
                secret_access_key=seaweed.secret_key,
            )
            port = free_port()
            stop = serve_gateway(config, port)
            http = GatewayHttp(args.workers)
            header = ("objects", "way", "put ms/object", "get ms/object", "put MB/s", "get MB/s")
            print("{:<14} {:<9} {:>14} {:>14} {:>9} {:>9}".format(*header))
            for label, size in SIZES.items():
                for way in ("keys", "gateway"):
                    url = f"s3://bench-gateway/{way}-{size}"
                    if way == "keys":
                        writer = reader = CheckpointStore(S3Storage("bench-gateway", f"{way}-{size}", config))
                    else:  # a capture's grant writes, a restore's reads: one of each, as a participant holds them
                        issuer, gateway = GrantIssuer(GrantSigner(KEY), Target(url=url)), f"http://127.0.0.1:{port}"
                        writer = CheckpointStore(
                            GatewayStorage(url, gateway, issuer.capture("ck-1", "p-1"), http.client)
                        )
                        reader = CheckpointStore(
                            GatewayStorage(url, gateway, issuer.restore("ck-1", "p-1", "r-1"), http.client)
                        )
                    rounds = [run_once(writer, reader, size, args.objects, args.workers) for _ in range(args.rounds)]
                    put_s = statistics.median(r[0] for r in rounds)
                    get_s = statistics.median(r[1] for r in rounds)
                    mb = size / 1e6
                    print(
                        f"{label:<14} {way:<9} {put_s * 1e3:>14.1f} {get_s * 1e3:>14.1f} "
                        f"{mb * args.workers / put_s:>9.1f} {mb * args.workers / get_s:>9.1f}"
                    )
            stop.set()
            http.close()
        finally:
            seaweed.stop()


if __name__ == "__main__":
    main()

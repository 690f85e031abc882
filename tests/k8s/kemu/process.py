"""Running kemu as a subprocess on 127.0.0.1 and writing a kubeconfig for it.

Kept free of kmock imports so conftest files can use it cheaply; the emulator itself runs in its
own process (`python tests/k8s/emulator.py --port 0`), like a real API server would.
"""

from __future__ import annotations

import base64
import re
import select
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

EMULATOR = Path(__file__).resolve().parent.parent / "emulator.py"
READY = re.compile(r"^listening (https?://127\.0\.0\.1:\d+)\s*$")


ADMIN_TOKEN = "kemu-test-token"  # the test harness's admin identity (group system:masters)


class KemuEndpoint(NamedTuple):
    """What a test needs: the API URL and a kubeconfig (token auth, plain http) pointing at it."""

    url: str
    kubeconfig: Path

    @property
    def headers(self) -> dict[str, str]:
        """The admin's Authorization header, for raw HTTP clients (anonymous requests are refused, as on a cluster)."""
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    @property
    def ca_file(self) -> Path:
        """The CA that signed the emulator's serving certificate."""
        return self.kubeconfig.parent / "tls" / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def client(self, token: str | None = ADMIN_TOKEN, **kwargs: Any) -> Any:
        """An httpx.Client on the API, as the admin (or with `token`; None for an anonymous one)."""
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url, headers=headers, verify=self.ssl_context(), timeout=kwargs.pop("timeout", 10), **kwargs
        )

    def kubeconfig_for(self, token: str, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with `token` (e.g. a ServiceAccount's)."""
        return write_kubeconfig(path, self.url, namespace, token, self.ca_file)

    # --- the test harness (kemu/harness.py): audit, faults, outages --------------------------------------

    def audit(self, user: str | None = None) -> list[dict[str, Any]]:
        """Every request served so far (of `user`), oldest first."""
        with self.client() as api:
            answer = api.get("/kemu/v1/audit", params={"user": user} if user else None)
            answer.raise_for_status()
            return answer.json()["items"]

    def inject(self, code: int, times: int = 1, **match: str) -> None:
        """Answer the next `times` requests matching `match` (verb, resource, subresource, name, user) with `code`."""
        with self.client() as api:
            api.post("/kemu/v1/faults", json={"code": code, "times": times, **match}).raise_for_status()

    def faults(self) -> list[dict[str, Any]]:
        with self.client() as api:
            return api.get("/kemu/v1/faults").json()["items"]

    def compact(self) -> str:
        """etcd compaction: watches resuming from a resourceVersion before now get a streamed 410 ERROR event."""
        with self.client() as api:
            answer = api.post("/kemu/v1/compact")
            answer.raise_for_status()
            return answer.json()["resourceVersion"]

    def stall_watches(self, seconds: float, resource: str = "", user: str = "") -> None:
        """The watch streams open now (of `resource` and `user`, empty: any) go silent for `seconds`, then drop."""
        with self.client() as api:
            api.post("/kemu/v1/stall", json={"seconds": seconds, "resource": resource, "user": user}).raise_for_status()

    def outage(self, seconds: float) -> None:
        """The API server becomes unreachable for `seconds` (it keeps every object)."""
        with self.client() as api:
            api.post("/kemu/v1/outage", json={"seconds": seconds}).raise_for_status()


def write_kubeconfig(
    path: Path, url: str, namespace: str = "default", token: str = ADMIN_TOKEN, ca_file: Path | None = None
) -> Path:
    ca = f', certificate-authority-data: "{base64.b64encode(ca_file.read_bytes()).decode()}"' if ca_file else ""
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        f'clusters: [{{name: kemu, cluster: {{server: "{url}"{ca}}}}}]\n'
        f'users: [{{name: kemu, user: {{token: "{token}"}}}}]\n'
        f"contexts: [{{name: kemu, context: {{cluster: kemu, user: kemu, namespace: {namespace}}}}}]\n"
        "current-context: kemu\n",
        encoding="utf-8",
    )
    return path


class KemuProcess:
    """`with KemuProcess(tmp_path) as (url, kubeconfig): ...` starts kemu and stops it afterwards."""

    def __init__(self, workdir: Path, startup_timeout: float = 20.0) -> None:
        self.workdir = workdir
        self.startup_timeout = startup_timeout
        self.log_path = workdir / "kemu.log"
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> KemuEndpoint:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("w", encoding="utf-8")
        self._proc = subprocess.Popen(
            [
                sys.executable,
                str(EMULATOR),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-dir",
                str(self.workdir / "tls"),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        log.close()
        try:
            url = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return KemuEndpoint(
            url, write_kubeconfig(self.workdir / "kubeconfig.yaml", url, ca_file=self.workdir / "tls" / "ca.crt")
        )

    def _wait_ready(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self._proc.stdout.readline()
            if not line:
                break
            if match := READY.match(line):
                return match.group(1)
        raise RuntimeError(
            f"kemu did not start within {self.startup_timeout}s; log:\n"
            f"{self.log_path.read_text(encoding='utf-8')[-4000:]}"
        )

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._proc = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

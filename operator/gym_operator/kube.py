"""A thin async wrapper over the Kubernetes Python client: the few calls the operator makes.

Built once at startup by :mod:`gym_operator.handlers`, which is its only user.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

GROUP = "gym-checkpoint.dev"
VERSION = "v1alpha1"


class Kube:
    """Pods to find participants; Checkpoint/Restore objects and their status."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def connect(cls) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig (``$KUBECONFIG``)."""
        cfg = client.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=cfg)
        return cls(client.ApiClient(cfg))

    async def list_pods(self, namespace: str, selector: str) -> list[Any]:
        result = await asyncio.to_thread(self.core.list_namespaced_pod, namespace, label_selector=selector)
        return list(result.items)

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's decoded data; raises LookupError when missing."""
        import base64

        try:
            secret = await asyncio.to_thread(self.core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise LookupError(f"Secret {name} does not exist in {namespace}") from None
            raise
        data = dict(secret.data or {})
        decoded = {k: base64.b64decode(v).decode() for k, v in data.items()}
        decoded.update(secret.string_data or {})
        return decoded

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await asyncio.to_thread(
                self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            {"status": status},
        )

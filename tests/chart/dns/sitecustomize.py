"""Cluster DNS and Service routing for the emulated cluster's pods (tests/chart/cluster.py), loaded at the start of
every Python process a pod runs (the cluster puts this folder on the pod's ``PYTHONPATH``).

A name under ``.svc`` resolves through the table the cluster keeps in the file ``$GYMCKPT_CLUSTER_DNS``
(``"<host>:<port>"`` -> ``"127.0.0.1:<local port>"``), read at each lookup, as a pod asks the cluster's DNS and
kube-proxy routes the Service's port to a pod's. A name the table does not hold fails as an unknown name does. Every
other name resolves as usual. The resources a process reads from the API keep their ``.svc`` addresses, as in a real
cluster.
"""

from __future__ import annotations

import json
import os
import socket

_TABLE = os.environ.get("GYMCKPT_CLUSTER_DNS")
_resolve = socket.getaddrinfo


def _cluster_getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = host.decode() if isinstance(host, bytes) else host
    if not _TABLE or not isinstance(name, str) or not name.rstrip(".").endswith((".svc", ".svc.cluster.local")):
        return _resolve(host, port, *args, **kwargs)
    try:
        with open(_TABLE) as table:
            routes = json.load(table)
    except (OSError, ValueError):
        routes = {}
    short = name.rstrip(".").removesuffix(".cluster.local")
    local = routes.get(f"{short}:{port}")
    if local is None:
        raise socket.gaierror(socket.EAI_NONAME, f"Name or service not known: {name}:{port}")
    address, _, number = local.rpartition(":")
    return _resolve(address, int(number), *args, **kwargs)


socket.getaddrinfo = _cluster_getaddrinfo

"""`helm upgrade` over CRDs of an older chart (Helm never upgrades crds/): the upgrade goes through, and the operator
refuses to run, naming the command that updates them. (What an upgrade does to the rollouts, a termination of every
replaced pod: tests/chart/test_termination_e2e.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from tests.chart.test_helm_install import CHART, helm_call

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

helm = pytest.importorskip("helm_python")

VALUES = {"servers": [{"name": "counter", "server": "counter", "role": "resources"}]}


def test_older_crds_stop_the_operator_not_the_upgrade(kemu: Any, kubectl: Any) -> None:
    """The chart no longer reads the installed CRDs (a `lookup` needs a cluster-wide get a namespaced deployer lacks,
    and nothing under `helm template`): the upgrade goes through, and the operator's check (crdcheck, through the
    OpenAPI document every client may read) finds the field the older CRD lacks and names the command."""
    import asyncio
    import os

    from gym_operator import crdcheck
    from gym_operator.kube import Kube

    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace="default")
    values = {"rollouts": {"enabled": False}, "servers": VALUES["servers"]}
    try:
        assert helm_call(cfg, "helm_install", "gym", values, disable_hooks=True)["status"] == "deployed"
        # the CRD of an older chart: no spec.deletionPolicy (Helm installed crds/ once and never touches them again)
        crd = yaml.safe_load((CHART / "crds" / "checkpoints.yaml").read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        del schema["properties"]["deletionPolicy"]
        schema["x-kubernetes-validations"] = [
            rule for rule in schema.get("x-kubernetes-validations", []) if "deletionPolicy" not in rule["rule"]
        ]
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(crd))
        assert helm_call(cfg, "helm_upgrade", "gym", values, disable_hooks=True)["revision"] == 2

        os.environ["KUBECONFIG"] = str(kemu.kubeconfig)
        kube = Kube.connect()
        document = asyncio.run(kube.openapi_document(crdcheck.GROUP_VERSION))
        assert crdcheck.missing_spec_fields(document) == {"Checkpoint": ["deletionPolicy"]}
        with pytest.raises(Exception) as stopped:
            asyncio.run(crdcheck.verify(kube))
        assert "Checkpoint has no spec.deletionPolicy" in str(stopped.value)
        assert crdcheck.UPDATE in str(stopped.value)
        # the documented step, then the operator starts
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        assert crdcheck.missing_spec_fields(asyncio.run(kube.openapi_document(crdcheck.GROUP_VERSION))) == {}
        asyncio.run(crdcheck.verify(kube))
    finally:
        cfg.close()

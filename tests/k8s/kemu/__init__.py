"""kemu: a Kubernetes API emulator for tests, built on kmock's KubernetesEmulator."""

from .process import KemuEndpoint, KemuProcess, write_kubeconfig

__all__ = ["KemuEndpoint", "KemuProcess", "write_kubeconfig"]

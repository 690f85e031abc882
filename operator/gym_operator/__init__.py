"""The Kubernetes operator: kopf handlers, pod discovery, spec parsing and status, over
:mod:`gym_services.coordination`."""

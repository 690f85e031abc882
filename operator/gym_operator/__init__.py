"""The Kubernetes operator: kopf handlers (all registered in :mod:`.handlers`), one controller per lifecycle
(:mod:`.controllers`), leader election, pod discovery, spec parsing and status, over
:mod:`gym_services.coordination`."""

"""Servers written for another framework, made participants where they stand (``docs/authoring.md``).

- :mod:`gym_services.adapters.control`: the checkpoint control plane mounted into any Starlette app (a FastAPI app
  is one): control routes, health and metrics, admission and attempt fencing around the app's own routes.
- :mod:`gym_services.adapters.nemo_gym`: a NeMo Gym resources server (``SimpleResourcesServer``) adopted with a few
  lines: its session cookie mapped onto the participant's sessions, its state saved through two functions.
"""

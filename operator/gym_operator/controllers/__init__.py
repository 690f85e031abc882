"""The operator's controllers, one module per lifecycle (Velero's shape: one controller per lifecycle over one
store); :mod:`gym_operator.handlers` registers each with kopf, and is the one place that lists them.

- :mod:`.checkpoint`: a Checkpoint's transaction (a kopf daemon per Checkpoint).
- :mod:`.restore`: a Restore's transaction (a kopf daemon per Restore).
- :mod:`.deletion`: a deleted Checkpoint (its transaction cancelled, its stored objects removed by its
  ``deletionPolicy``) and its expiry (``spec.ttl``).
- :mod:`.release`: the release going away (``helm uninstall``, its namespace deleted): the finalizers let go.

What they share: :mod:`.context` (the operator's settings and clients, the stack discovery call, storage access,
Events) and :mod:`.transaction` (the daemon that runs one Checkpoint's or Restore's transaction).
"""

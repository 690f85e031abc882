"""The token ledger: each rollout's training tokens, one entry per model call, under NeMo Gym 0.7.0's
``token_id_capture`` contracts (``docs/protocol.md``, "The token ledger").

Modules, lowest first (each imports only those before it):

- :mod:`.wire`       the ``/v1/ledger/*`` bodies, shared by both ends (pydantic only);
- :mod:`.lineage`    which stored call a request continues (NeMo Gym's lineage hashes);
- :mod:`.client`     a trainer's client, to the replica each rollout's ledger lives on;
- :mod:`.rollouts`   the ledger itself: writes, freeze and drop, attempts;
- :mod:`.records`    the ledger in a checkpoint: its records, frozen under the pause and restored;
- :mod:`.recording`  how the policy model records its own calls;
- :mod:`.routes`     the HTTP routes.

This package imports nothing here, so a client in another environment can load :mod:`.wire` and
:mod:`.client` from the source tree.
"""

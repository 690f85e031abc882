"""The policy model server: /v1/responses over an upstream inference worker, with generation cuts and held responses."""

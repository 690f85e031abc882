"""What an author of a server uses besides the server API: the conformance harness (``gymckpt check-server``) and
the template ``gymckpt new-server`` writes (``docs/authoring.md``)."""

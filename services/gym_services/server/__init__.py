"""The app factory every server is built with, ``gymckpt serve``, and the registry of servers."""

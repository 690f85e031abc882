"""Every server ``gymckpt serve`` knows: name -> module with ``Config`` and ``create_app(config)``."""

SERVERS: dict[str, str] = {
    "counter": "gym_services.resources.counter.app",
}

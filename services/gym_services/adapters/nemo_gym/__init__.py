"""NeMo Gym resources servers adopted in place: a few lines at the end of the server's ``app.py`` make it a
participant (``docs/authoring.md``, "A NeMo Gym server")."""

from gym_services.adapters.nemo_gym.app import NemoGymConfig, adopt, nemo_app, nemo_server, participate
from gym_services.adapters.nemo_gym.state import SessionDict

__all__ = ["NemoGymConfig", "SessionDict", "adopt", "nemo_app", "nemo_server", "participate"]

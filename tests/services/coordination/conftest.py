"""The in-process stack every coordination test starts from (:mod:`tests.services.coordination.recorders`)."""

from __future__ import annotations

import pytest
from tests.services.coordination.recorders import make_stack


@pytest.fixture
def stack():
    """Six recorders of every role and the counter resources server, served in process."""
    return make_stack()

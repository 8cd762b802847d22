from __future__ import annotations

import pytest

from onbeat.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()

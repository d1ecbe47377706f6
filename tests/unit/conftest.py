"""Unit tests never see this machine's stack: the regions and workers a live `geofence
region` change recorded in the default state dir are not read (a test that wants the record
uses a state dir under tmp_path)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import settings as stack_settings

_real = stack_settings.read_live_topology


def _only_temporary(state_dir: Path) -> dict[str, tuple[str, ...]] | None:
    return _real(state_dir) if Path(tempfile.gettempdir()) in state_dir.parents else None


@pytest.fixture(autouse=True)
def no_live_topology_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(stack_settings, "read_live_topology", _only_temporary)
    yield

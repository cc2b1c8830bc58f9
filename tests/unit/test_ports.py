"""Free ports come from outside the kernel's ephemeral range, where no outgoing connection takes one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from finetune_localcluster import ports
from finetune_localcluster.ports import candidate_ports, ephemeral_range, free_port


def test_the_range_is_read_from_the_kernel_file_or_defaults_to_linuxs(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_range(tmp_path / "range") == (40000, 50000)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
    (tmp_path / "garbled").write_text("forty\n")
    assert ephemeral_range(tmp_path / "garbled") == (32768, 60999)


def test_ports_are_picked_below_the_range_or_above_it_when_there_is_no_room_below() -> None:
    below = candidate_ports(32768, 60999)
    assert (below.start, below.stop) == (20768, 32768)
    above = candidate_ports(1024, 50000)
    assert (above.start, above.stop) == (50001, 65536)


def test_a_free_port_is_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    assert not [p for p in (free_port() for _ in range(20)) if low <= p <= high]


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        busy = held.getsockname()[1]
        other = free_port()
        picks = iter([busy, busy, other])
        monkeypatch.setattr(ports._RANDOM, "choice", lambda _: next(picks))
        assert ports.free_port() == other

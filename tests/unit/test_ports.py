"""Free ports come from outside the kernel's ephemeral range, where no outgoing connection takes one."""

from __future__ import annotations

import os
import socket
import time
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


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "LEASES", tmp_path)
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        busy = held.getsockname()[1]
        other = free_port()
        for lease in tmp_path.iterdir():  # the bind test alone decides here
            lease.unlink()
        picks = iter([busy, busy, other])
        monkeypatch.setattr(ports._RANDOM, "choice", lambda _: next(picks))
        assert ports.free_port() == other


def test_a_port_another_process_picked_recently_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its server may bind it only seconds later: the bind test alone would find it free."""
    monkeypatch.setattr(ports, "LEASES", tmp_path / "leases")
    first, other = free_port(), free_port()
    (tmp_path / "leases" / str(other)).unlink()  # `other`: free and never picked
    picks = iter([first, first, other])
    monkeypatch.setattr(ports._RANDOM, "choice", lambda _: next(picks))
    assert free_port() == other
    assert sorted(p.name for p in (tmp_path / "leases").iterdir()) == sorted([str(first), str(other)])


def test_a_stale_lease_is_taken_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "LEASES", tmp_path)
    port = free_port()
    stale = time.time() - ports.LEASE_S - 1
    os.utime(tmp_path / str(port), (stale, stale))
    monkeypatch.setattr(ports._RANDOM, "choice", lambda _: port)
    assert free_port() == port
    assert (tmp_path / str(port)).stat().st_mtime > stale

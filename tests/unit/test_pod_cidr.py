"""Process nodes of clusters running at once on one machine never share a pod-IP slice."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from finetune_localcluster import pod_cidr


def test_a_held_slice_is_skipped_and_comes_back_once_released(tmp_path: Path) -> None:
    first, held = pod_cidr.claim(tmp_path, first=255)
    second, other = pod_cidr.claim(tmp_path, first=255)
    assert (first, second) == ("127.2.255.0/24", "127.2.0.0/24")  # wraps around the pool
    os.close(held)
    again, fd = pod_cidr.claim(tmp_path, first=255)
    assert again == first
    for d in (other, fd):
        os.close(d)


def test_slices_stay_in_the_pool_and_run_out_loudly(tmp_path: Path) -> None:
    held = [pod_cidr.claim(tmp_path) for _ in range(256)]
    nets = {ipaddress.IPv4Network(net) for net, _ in held}
    assert len(nets) == 256 and all(n.subnet_of(pod_cidr.POOL) for n in nets)
    with pytest.raises(pod_cidr.NoFreeSlice):
        pod_cidr.claim(tmp_path)
    for _, fd in held:
        os.close(fd)

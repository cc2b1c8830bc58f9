"""A resume creates every optimizer state tensor where the optimizer's own first step would.

The portable format restores Adam's moments and step count into a fresh optimizer, before it has
taken a step. torch's fused AdamW (the trainer's client optimizer) keeps its step count as a
float32 tensor on the parameter's device and its kernel reads it there: a CPU step count beside
CUDA parameters made the first step after every resume fail on a GPU, and the job crash-looped.

Each case takes one real step of the optimizer to learn where it puts each state tensor, then
lets `portable` create the state of a fresh one, and compares device, dtype and shape tensor by
tensor. The CUDA cases run torch's real optimizer over fake CUDA parameters (`FakeTensorMode`:
shapes, dtypes and devices without memory or a GPU), so the GPU's placement is checked here.
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest

from finetune_trainer.checkpoint import portable

pytestmark = pytest.mark.timeout(120)  # the first case imports torch (about 15 s on a loaded machine)

STEP = 7
CASES = [
    ("cpu", "trainer"),
    ("cuda", "trainer"),
    ("cuda", "capturable"),
    ("cpu", "foreach"),
    ("cuda", "foreach"),
    ("cpu", "single-tensor"),
]
"""(device, optimizer): `trainer` is the one `rank_setup.client_optimizer` builds (fused AdamW)."""


def _optimizer(kind: str, params: list[Any]) -> Any:
    import torch

    from finetune_operator.plan.search.fixed import fixed_plan
    from finetune_trainer.rank.rank_setup import client_optimizer
    from tests.factories import make_job

    if kind == "trainer":
        spec = make_job().spec
        return client_optimizer(params, spec=spec, plan=fixed_plan(spec), on_gpu=False)
    options: dict[str, dict[str, Any]] = {
        "capturable": {"capturable": True},
        "foreach": {"foreach": True},
        "single-tensor": {"foreach": False},
    }
    return torch.optim.AdamW(params, lr=0.01, **options[kind])


def _placement(optimizer: Any) -> list[dict[str, tuple[str, Any, tuple[int, ...]]]]:
    return [
        {key: (str(value.device), value.dtype, tuple(value.shape)) for key, value in optimizer.state[p].items()}
        for group in optimizer.param_groups
        for p in group["params"]
    ]


def _params(device: str) -> list[Any]:
    import torch

    return [torch.nn.Parameter(torch.zeros(shape, device=device)) for shape in ((4, 3), (5,))]


@pytest.mark.parametrize(("device", "kind"), CASES, ids=[f"{d}-{k}" for d, k in CASES])
def test_resumed_state_sits_where_the_optimizers_first_step_puts_it(device: str, kind: str) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) if device == "cuda" else nullcontext():
        stepped = _optimizer(kind, _params(device))
        for p in (p for group in stepped.param_groups for p in group["params"]):
            p.grad = torch.ones_like(p)
        stepped.step()
        resumed = _optimizer(kind, _params(device))
        portable._ensure_optimizer_state(SimpleNamespace(optimizer=resumed), STEP)
        expected, got = _placement(stepped), _placement(resumed)
    assert got == expected
    assert {key for state in got for key in state} == {"step", *portable.MOMENTS}
    if device == "cpu":  # fake tensors hold no values
        assert all(float(resumed.state[p]["step"]) == STEP for p in resumed.param_groups[0]["params"])

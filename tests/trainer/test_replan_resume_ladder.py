"""A re-plan keeps the work: a LoRA run resumes up the whole re-plan ladder (fp32), and a QLoRA run
across ZeRO 3 <-> 2, offload and world size (tests/support/replan_chains.py says how a chain runs
and what it compares; the other chains are in test_replan_resume.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.replan_chains import LADDER_CHAINS, check_chain
from tests.support.training_runs import Run

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("chain", LADDER_CHAINS)
def test_resume_under_each_replanned_strategy_continues_the_run(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run], chain: str
) -> None:
    check_chain(tmp_path, tiny_model_dir, reverse_jsonl, launch, chain)

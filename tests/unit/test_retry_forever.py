"""kopf gives up a request when its backoffs run out; the operator's never run out."""

from __future__ import annotations

import itertools
from collections.abc import Sized

from finetune_operator.handlers.retry import THEN_EVERY_S, RetryForever


def test_the_backoffs_have_no_length_so_kopf_never_counts_down() -> None:
    backoffs = RetryForever()
    assert not isinstance(backoffs, Sized)
    first = list(itertools.islice(backoffs, 1000))
    assert len(first) == 1000 and first[-1] == THEN_EVERY_S
    assert first[:3] == [1.0, 1.0, 2.0]
    assert list(itertools.islice(backoffs, 3)) == [1.0, 1.0, 2.0], "every request starts from the first backoff"

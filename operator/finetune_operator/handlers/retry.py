"""How long kopf keeps retrying the apiserver: for ever.

kopf retries a failed request along `settings.networking.error_backoffs` (1, 1, 2, 3, 5, 8,
13, 21 s by default) and then raises. For a watch stream that ends the watch: an apiserver or
etcd outage of more than ~54 s left the operator running, healthy by its probes, and blind to
every new FineTuneJob until it was restarted. kopf retries without end when the backoffs are
an iterable without a length, so the operator's are one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

FIRST_BACKOFFS_S = (1.0, 1.0, 2.0, 3.0, 5.0, 8.0)
THEN_EVERY_S = 10.0


class RetryForever:
    """Backoffs that never run out (not Sized: kopf counts no attempts and never gives up)."""

    def __iter__(self) -> Iterator[float]:
        return itertools.chain(FIRST_BACKOFFS_S, itertools.repeat(THEN_EVERY_S))

"""The object store's failed attempts, as this rank's process counted them.

`finetune_trainer.storage.objstore` tallies every failed attempt of an S3 call by kind
(retried: `transient`; refused credentials: `denied`); this collector exports the tally at each
scrape as `finetune_object_storage_failed_attempts_total{kind}`, both kinds from the start. A
store that keeps failing shows as a growing count long before the retry deadline fails the job
(the chart's FineTuneObjectStorageFailing alert).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from finetune_trainer.storage.objstore import FAILED_ATTEMPTS


class ObjectStorageCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "finetune_object_storage_failed_attempts",
            "Failed attempts of this process's object-store (s3://) calls: transient (retried with backoff "
            "until the deadline) or denied (refused credentials); not-found answers are not counted.",
            labels=["kind"],
        )
        for kind, count in FAILED_ATTEMPTS.snapshot().items():
            family.add_metric([kind], count)
        yield family

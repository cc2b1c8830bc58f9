"""The Python client of finetune-operator: `FineTuneClient` (a cluster) and `LocalClient`
(`ftjob run` in local processes), with the same calls, typed with the API's own models.

    from finetune_operator.client import FineTuneClient

    client = FineTuneClient(namespace="ml")
    job = client.submit("job.yaml")
    for line in client.logs(job.name, follow=True):
        print(line)
    done = client.wait(job.name, "Succeeded", timeout=7200)
    print(done.status.result)
"""

from .cluster import FineTuneClient, JobEvent
from .errors import (
    ApiError,
    FineTuneClientError,
    JobExists,
    JobFailed,
    JobNotFound,
    JobRejected,
    MetricsUnavailable,
    ServingRefused,
    StateUnreachable,
    WaitTimeout,
)
from .local import LocalClient

__all__ = [
    "ApiError",
    "FineTuneClient",
    "FineTuneClientError",
    "JobEvent",
    "JobExists",
    "JobFailed",
    "JobNotFound",
    "JobRejected",
    "LocalClient",
    "MetricsUnavailable",
    "ServingRefused",
    "StateUnreachable",
    "WaitTimeout",
]

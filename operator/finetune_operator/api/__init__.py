"""The FineTuneJob API (`finetune.dev/v1alpha1`): models, names and error messages.

Pure: imports neither kopf, the Kubernetes client nor torch (an import-linter contract
holds it to that).
"""

from .errors import describe
from .job import API_VERSION, GROUP, KIND, PLURAL, VERSION, FineTuneJob, is_finetunejob
from .spec import FineTuneJobSpec
from .status import FineTuneJobStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "FineTuneJob",
    "FineTuneJobSpec",
    "FineTuneJobStatus",
    "describe",
    "is_finetunejob",
]

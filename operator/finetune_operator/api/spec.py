"""The desired state of a FineTuneJob: what to train, on what, and how.

These frozen models are the single source of truth for the API: the CRD in `crds/`
is generated from them (`python -m finetune_operator.api.crdgen`), and everything
downstream (planner, renderers, trainer) receives them already validated.
Cross-field rules live in `__rules__` (see `rules.py`) so the apiserver enforces
them too.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from . import mount_paths, object_storage, pod_env, storage_uri
from .base import (
    ABSOLUTE_PATH_PATTERN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    HTTP_URL_HINT,
    HTTP_URL_PATTERN,
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
    SECRET_KEY_PATTERN,
    VISIBLE,
    ApiModel,
    LabelValue,
    Quantity,
    check_node_selector,
    quantity_bytes,
)
from .methods import (
    PREFERENCE_METHODS,
    MethodTraits,
    MethodType,
    Objective,
    ObjectiveTraits,
    PreferenceLoss,
    ReferenceModel,
    TrainingMethod,
    method_traits,
    objective_of,
    objective_traits,
    reference_model,
)
from .object_storage import ObjectStorageSpec, allowed_bucket
from .pod_template import PodTemplateOverlay
from .rules import CrossFieldRule, RuledModel
from .serving import DEFAULT_MAX_LORA_RANK, SERVING_PATTERN_HINTS, ServedModel, ServingSpec
from .storage_uri import (
    ADAPTER_URI_PATTERN,
    DATASET_URI_PATTERN,
    OUTPUT_URI_PATTERN,
    PINNED_HUB_ID,
    REVISION_PATTERN,
    URI_PATTERN,
)
from .toleration import Toleration
from .tracking import EXPERIMENT_HINT, EXPERIMENT_PATTERN, TRACKING_URI_HINT, TRACKING_URI_PATTERN, TrackingSpec

DEFAULT_VALIDATION_SPLIT = 0.05
DEFAULT_WARMUP_RATIO = 0.03

IMAGE_PATTERN = f"^{VISIBLE}+$"
ARCHITECTURE_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9_./]*$"
MODULE_NAME_PATTERN = r"^[A-Za-z0-9_.*-]+$"

PATTERN_HINTS: dict[str, str] = {
    **storage_uri.PATTERN_HINTS,
    **SERVING_PATTERN_HINTS,
    **object_storage.PATTERN_HINTS,
    ENV_NAME_PATTERN: "must be a C identifier (letters, digits, _; not starting with a digit)",
    DNS_SUBDOMAIN_PATTERN: "must be a lowercase DNS name (a-z, 0-9, '-', '.')",
    QUALIFIED_NAME_PATTERN: "must be a label key: an optional DNS prefix and '/', then letters, digits and -_. "
    "(starting and ending with a letter or digit)",
    LABEL_VALUE_PATTERN: "must be a label value: empty, or letters, digits and -_. starting and ending with a letter "
    "or digit",
    QUANTITY_PATTERN: "must be a Kubernetes quantity such as 80Gi, 512Mi or 8 (at most 18 digits)",
    TRACKING_URI_PATTERN: TRACKING_URI_HINT,
    EXPERIMENT_PATTERN: EXPERIMENT_HINT,
    DNS_LABEL_PATTERN: "must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter "
    "or digit",
    REVISION_PATTERN: "must be a hub revision (branch, tag or commit): letters, digits and -_./, starting with a "
    "letter or digit, no '..' and not ending in '.'",
    ABSOLUTE_PATH_PATTERN: "must be an absolute path without spaces or control characters",
    IMAGE_PATTERN: "must be an image reference without spaces or control characters",
    ARCHITECTURE_PATTERN: "must be a catalogue name such as meta-llama/Llama-3.1-8B, or a folder (letters, digits "
    "and -_./, starting with a letter or digit)",
    MODULE_NAME_PATTERN: "must be a module name or glob: letters, digits and _.*-",
}
"""Readable explanations of the regular expressions users are most likely to trip on."""

MAX_ENV_VARS = 64
MAX_ENV_VALUE = 4096
"""Bounds of spec.env: all of it fits the StatefulSet and ConfigMap under etcd's 1 MiB."""

RESERVED_ENV: tuple[str, ...] = tuple(str(name) for name in pod_env.RESERVED)
"""Names the operator or a launcher sets itself (`pod_env.RESERVED`), which spec.env may not name.
Defaults a user may override (HOME, HF_HOME, HF_TOKEN, ...) are not here."""

PLANNER_OWNED_DEEPSPEED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param",
    "bf16",
    "bfloat16",
    "fp16",
    "amp",
    "torch_autocast",
    "elasticity",
    "gradient_clipping",
    "optimizer",
    "scheduler",
)
"""DeepSpeed keys the plan decides (with DeepSpeed's aliases: `bfloat16` is `bf16`; `amp`,
`torch_autocast` and `elasticity` change precision or batch sizes); overriding them would
desynchronise plan and run. A key is refused when it is one of these, below one of these, or
above one (`zero_optimization` as a whole)."""

_OVERRIDE_DENIED_EXACT = tuple(
    sorted({*PLANNER_OWNED_DEEPSPEED_KEYS}
           | {key.rsplit(".", n)[0] for key in PLANNER_OWNED_DEEPSPEED_KEYS for n in range(1, key.count(".") + 1)})
)  # fmt: skip
_OVERRIDE_DENIED_PREFIXES = tuple(key + "." for key in PLANNER_OWNED_DEEPSPEED_KEYS)


def plan_owned_override(key: str) -> bool:
    """Whether an override key sets (part of) what the plan decides."""
    return key in _OVERRIDE_DENIED_EXACT or key.startswith(_OVERRIDE_DENIED_PREFIXES)


OVERRIDES_MESSAGE = (
    "is set by the plan and cannot be overridden: keys the plan owns are "
    + ", ".join(PLANNER_OWNED_DEEPSPEED_KEYS)
    + ", any key below them, and their parents (zero_optimization as a whole)"
)

DOT_DOT_SEGMENT = r"(^|/)\.\.(/|$)"
"""A `..` path segment: a uri stays inside its claim (or path) and never climbs out of it."""


def has_dot_dot(uri: str) -> bool:
    """Whether `uri` holds a `..` segment, as RE2 reads `DOT_DOT_SEGMENT` (Python's `$` would also
    match before a final newline)."""
    return ".." in uri.split("/")


def no_dot_dot(field: str, optional: bool = False) -> CrossFieldRule:
    """The rule keeping `field` (a uri) free of `..` segments."""
    wire = "".join(part.capitalize() if i else part for i, part in enumerate(field.split("_")))
    cel = f"!self.{wire}.matches('{DOT_DOT_SEGMENT.replace(chr(92), chr(92) * 2)}')"
    return CrossFieldRule(
        cel=f"!has(self.{wire}) || {cel}" if optional else cel,
        message="must not contain a '..' path segment: a uri stays inside its claim or path",
        field_path=f".{wire}",
        check=lambda m: getattr(m, field) is None or not has_dot_dot(getattr(m, field)),
    )


class ModelCacheSpec(ApiModel):
    """The download cache of a hub model (a claim per pod that survives gang restarts, or one shared claim),
    which also holds the mirror of s3:// inputs (an emptyDir when there is no hub model)."""

    claim_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None,
        description="A PersistentVolumeClaim every pod downloads into (ReadWriteMany when numNodes > 1). Unset: "
        "for a hub model each pod gets its own ReadWriteOnce claim from the StatefulSet's volumeClaimTemplates, "
        "kept across gang restarts and deleted with the job; without one, s3:// inputs are mirrored into an "
        "emptyDir of `size`.",
    )
    size: Quantity | None = Field(
        default=None,
        description="Size of each pod's cache claim (hub model). Default: the model's weight bytes (from the hub's "
        "safetensors index, the claim's files or the catalogue) plus 20% and 2 GiB; a smaller size than the "
        "weights need is refused (InvalidSpec) naming the size needed. Without a hub model: the emptyDir size "
        "limit and ephemeral-storage request of the s3:// mirror (default 100Gi).",
    )
    storage_class_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None,
        description="StorageClass of the per-pod cache claims (default: the operator's modelCache.storageClassName, "
        "else the cluster's default class).",
    )


class ModelSpec(RuledModel):
    """The base model to fine-tune."""

    uri: Annotated[str, Field(max_length=512, pattern=URI_PATTERN)] = Field(
        description="Where the model is: hub id (`org/name` or `hf://org/name`, optionally `@revision`), "
        "`pvc://claim/path`, an absolute path in the container (the operator cannot read it: set `architecture`), "
        "`builtin://tiny-llama` (random, tiny) "
        "or `builtin://smollm2-135m-instruct` (a real pretrained 135M instruct model)."
    )
    revision: Annotated[str, Field(max_length=128, pattern=REVISION_PATTERN)] | None = Field(
        default=None, description="Hub revision (branch, tag or commit); or pin it in the uri (`org/name@rev`)."
    )
    tokenizer: Annotated[str, Field(max_length=512, pattern=URI_PATTERN)] | None = Field(
        default=None, description="Tokenizer location when it differs from the model's."
    )
    adapter: Annotated[str, Field(max_length=512, pattern=ADAPTER_URI_PATTERN)] | None = Field(
        default=None,
        description="A LoRA adapter of this model to start from instead of a new one: `pvc://claim/path`, "
        "`s3://bucket/prefix` or an absolute path, such as a finished job's `status.result.adapterUri` (DPO after "
        "SFT). Its rank, alpha and target modules must be method.lora's. It trains on; for dpo and orpo the "
        "reference is the model with this adapter as it was loaded.",
    )
    trust_remote_code: bool = Field(default=False, description="Allow code from the model repository to run.")
    architecture: Annotated[str, Field(max_length=128, pattern=ARCHITECTURE_PATTERN)] | None = Field(
        default=None,
        description="What the planner counts instead of the model's own config.json: a catalogue name "
        "(e.g. `meta-llama/Llama-3.1-8B`) or, for `ftjob plan`, a local folder. Needed only for a path inside "
        "the image; hub ids and pvc:// models are planned from their own config.json.",
    )
    cache: ModelCacheSpec | None = Field(
        default=None,
        description="Where a hub model is downloaded, and s3:// inputs mirrored, once per pod before the ranks "
        "start (default: for a hub model a claim per pod sized from the model's weights, kept across gang "
        "restarts; otherwise an emptyDir of 100Gi with a matching ephemeral-storage request). pvc:// models need "
        "no cache.",
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        no_dot_dot("uri"),
        no_dot_dot("tokenizer", optional=True),
        no_dot_dot("adapter", optional=True),
        allowed_bucket("uri"),
        allowed_bucket("tokenizer", optional=True),
        allowed_bucket("adapter", optional=True),
        CrossFieldRule(
            cel=f"!(has(self.revision) && self.uri.matches('{PINNED_HUB_ID}'))",
            message="the uri pins a revision (@...): set it there or in revision, not both",
            field_path=".revision",
            check=lambda m: not (m.revision is not None and re.match(PINNED_HUB_ID, m.uri) is not None),
        ),
    )


class DatasetFormat(StrEnum):
    ALPACA = "alpaca"
    SHAREGPT = "sharegpt"
    MESSAGES = "messages"
    TEXT = "text"
    PREFERENCE = "preference"


class MalformedLinePolicy(StrEnum):
    FAIL = "Fail"
    SKIP = "Skip"


class DatasetSpec(RuledModel):
    """The training data."""

    uri: Annotated[str, Field(max_length=512, pattern=DATASET_URI_PATTERN)] = Field(
        description="JSONL/JSON/Parquet file or folder (`pvc://`, absolute path), a `datasets` hub id, "
        "or a generated demo task: `builtin://reverse-words`, `builtin://secret-code`, or (format preference) "
        "`builtin://secret-code-preference`."
    )
    format: DatasetFormat = Field(default=DatasetFormat.ALPACA, description="Record layout.")
    validation_split: Annotated[float, Field(ge=0.0, le=0.5)] | None = Field(
        default=None,
        description="Fraction of records held out for evaluation (0 to 0.5; default 0.05, "
        "or 0 when validationUri is set).",
    )
    validation_uri: Annotated[str, Field(max_length=512, pattern=DATASET_URI_PATTERN)] | None = Field(
        default=None,
        description="A held-out evaluation set in the same format as uri (any location uri accepts); "
        "exclusive with validationSplit.",
    )
    max_seq_length: Annotated[int, Field(ge=16, le=131072)] = Field(
        default=2048, description="Tokens per sequence after truncation or packing."
    )
    packing: bool = Field(default=False, description="Pack several samples per sequence, without cross-attention.")
    on_malformed_line: MalformedLinePolicy = Field(
        default=MalformedLinePolicy.FAIL,
        description="Fail on the first malformed record, or Skip it and count it in status.",
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="!(has(self.validationSplit) && has(self.validationUri))",
            message="set validationSplit or validationUri, not both",
            field_path=".validationUri",
            check=lambda d: not (d.validation_split is not None and d.validation_uri is not None),
        ),
        CrossFieldRule(
            cel="!has(self.format) || self.format != 'preference' || !has(self.packing) || !self.packing",
            message="packing is not allowed with format preference: a pair's chosen and rejected answers "
            "are scored as sequences of their own",
            field_path=".packing",
            check=lambda d: d.format != DatasetFormat.PREFERENCE or not d.packing,
        ),
        no_dot_dot("uri"),
        no_dot_dot("validation_uri", optional=True),
        allowed_bucket("uri"),
        allowed_bucket("validation_uri", optional=True),
    )

    @property
    def held_out_fraction(self) -> float:
        """The fraction of uri's records held out: none when a separate validation set is given."""
        if self.validation_split is not None:
            return self.validation_split
        return 0.0 if self.validation_uri is not None else DEFAULT_VALIDATION_SPLIT


DEFAULT_LORA_DROPOUT = 0.05
"""LoRA dropout when the spec leaves it unset and the model allows it."""


class LoraSpec(ApiModel):
    """Low-rank adapter settings (LoRA and QLoRA)."""

    r: Annotated[int, Field(ge=1, le=1024)] = Field(default=16, description="Adapter rank.")
    alpha: Annotated[int, Field(ge=1, le=4096)] = Field(default=32, description="Scaling numerator (alpha / r).")
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = Field(
        default=None,
        description=(
            f"Dropout on adapter inputs. Unset: {DEFAULT_LORA_DROPOUT}, or 0 for a mixture-of-experts model whose "
            "fused expert weights the targets adapt (peft cannot apply dropout to them, so a non-zero value is "
            "refused there)."
        ),
    )
    target_modules: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=128, pattern=MODULE_NAME_PATTERN)]],
        Field(min_length=1, max_length=64),
    ] = Field(
        default_factory=lambda: ["all-linear"],
        description="Module names to adapt; `all-linear` adapts every linear layer but the output head.",
    )


class QuantType(StrEnum):
    NF4 = "nf4"
    FP4 = "fp4"


class QloraSpec(ApiModel):
    """4-bit quantisation of the frozen base (bitsandbytes)."""

    quant_type: QuantType = Field(default=QuantType.NF4, description="4-bit data type.")
    double_quant: bool = Field(default=True, description="Quantise the quantisation constants too.")
    compute_dtype: Literal["bfloat16", "float16"] | None = Field(
        default=None, description="Dtype of the dequantised matmuls; defaults to the training precision."
    )


class PreferenceSpec(ApiModel):
    """Preference tuning's settings (method.type dpo or orpo); terms as TRL defines them."""

    base: MethodType | None = Field(
        default=None,
        description="How the policy's weights are adapted: lora (the default), qlora or full. With lora and qlora "
        "the reference is the same base with the adapter switched off (no extra weights); with full, dpo holds "
        "a frozen copy of the model (or precomputed log-probabilities, see precomputeReference).",
    )
    beta: Annotated[float, Field(gt=0.0, le=10.0)] = Field(
        default=0.1,
        description="dpo: how far the policy may move from the reference (the loss's temperature); "
        "orpo: the weight of the odds-ratio term beside the supervised loss (TRL's beta, the paper's lambda).",
    )
    loss_type: PreferenceLoss | None = Field(
        default=None, description="dpo only: sigmoid (the DPO paper's loss, the default) or ipo."
    )
    precompute_reference: bool | None = Field(
        default=None,
        description="dpo with base full only: compute the reference model's log-probabilities once, "
        "before training, and keep them with the prepared data, instead of holding a frozen copy of the "
        "model beside the policy while training.",
    )


def _adapts(adaptation: str, method: str = "self") -> str:
    """CEL: the job's weights are adapted as `adaptation` (`method.type`, or a preference objective's
    `preference.base`, lora when unset); `method` is the CEL path of the method object."""
    base = f"has({method}.preference) && has({method}.preference.base)"
    preference = f"has({method}.type) && ({method}.type == 'dpo' || {method}.type == 'orpo')"
    if adaptation == MethodType.LORA:
        return (
            f"(!has({method}.type) || {method}.type == 'lora' "
            f"|| ({preference} && (!({base}) || {method}.preference.base == 'lora')))"
        )
    return (
        f"((has({method}.type) && {method}.type == '{adaptation}') "
        f"|| ({preference} && {base} && {method}.preference.base == '{adaptation}'))"
    )


class MethodSpec(RuledModel):
    """How the weights are adapted, and what they are trained towards."""

    type: TrainingMethod = Field(
        default=TrainingMethod.LORA,
        description="lora, qlora or full supervised fine-tuning, or a preference objective on preference pairs: "
        "dpo (direct preference optimisation against a reference model) or orpo (odds-ratio preference "
        "optimisation, reference-free); dpo and orpo adapt the weights as preference.base says (lora by "
        "default) and read dataset.format preference.",
    )
    lora: LoraSpec | None = Field(default=None, description="Adapter settings (lora and qlora adaptation).")
    qlora: QloraSpec | None = Field(default=None, description="Quantisation settings (qlora adaptation only).")
    preference: PreferenceSpec | None = Field(default=None, description="Preference settings (dpo and orpo only).")

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel=f"{_adapts(MethodType.QLORA)} || !has(self.qlora)",
            message="qlora settings are only allowed when type is qlora (or a dpo/orpo preference.base is qlora)",
            field_path=".qlora",
            check=lambda m: m.adaptation == MethodType.QLORA or m.qlora is None,
        ),
        CrossFieldRule(
            cel=f"!{_adapts(MethodType.FULL)} || !has(self.lora)",
            message="lora settings are not allowed when type is full (or a dpo/orpo preference.base is full)",
            field_path=".lora",
            check=lambda m: m.adaptation != MethodType.FULL or m.lora is None,
        ),
        CrossFieldRule(
            cel="!has(self.preference) || (has(self.type) && (self.type == 'dpo' || self.type == 'orpo'))",
            message="preference settings are only allowed when type is dpo or orpo",
            field_path=".preference",
            check=lambda m: m.preference is None or m.type in PREFERENCE_METHODS,
        ),
        CrossFieldRule(
            cel="!has(self.preference) || !has(self.preference.lossType) || (has(self.type) && self.type == 'dpo')",
            message="lossType is only allowed when type is dpo",
            field_path=".preference.lossType",
            check=lambda m: m.preference is None or m.preference.loss_type is None or m.type == TrainingMethod.DPO,
        ),
        CrossFieldRule(
            cel="!has(self.preference) || !has(self.preference.precomputeReference) "
            "|| !self.preference.precomputeReference "
            "|| (has(self.type) && self.type == 'dpo' && has(self.preference.base) && self.preference.base == 'full')",
            message="precomputeReference is only allowed when type is dpo and preference.base is full "
            "(lora and qlora use their own base, with the adapter off, as the reference)",
            field_path=".preference.precomputeReference",
            check=lambda m: (
                m.preference is None
                or not m.preference.precompute_reference
                or (m.type == TrainingMethod.DPO and m.adaptation == MethodType.FULL)
            ),
        ),
    )

    @property
    def adaptation(self) -> MethodType:
        """How the weights are adapted: `type` for supervised fine-tuning, `preference.base` (lora when
        unset) for dpo and orpo."""
        if self.type in PREFERENCE_METHODS:
            return (self.preference and self.preference.base) or MethodType.LORA
        return MethodType(self.type)

    @property
    def traits(self) -> MethodTraits:
        """What this method trains and how it holds the frozen part (api.methods)."""
        return method_traits(self.adaptation)

    @property
    def objective(self) -> Objective:
        """What the weights are trained towards: dpo and orpo are their own objective, the rest sft."""
        return objective_of(self.type)

    @property
    def objective_traits(self) -> ObjectiveTraits:
        """What this objective trains towards: rows, sequences per example, reference (api.methods)."""
        return objective_traits(self.objective)

    @property
    def reference(self) -> ReferenceModel:
        """The reference model the objective compares the policy against (api.methods.reference_model),
        for a job that starts without an adapter: `FineTuneJobSpec.reference` is the job's."""
        return self.reference_for(start_adapter=False)

    def reference_for(self, start_adapter: bool) -> ReferenceModel:
        """The reference, when the job does (`model.adapter`) or does not start from an adapter."""
        precompute = bool(self.preference and self.preference.precompute_reference)
        return reference_model(self.adaptation, self.objective, precompute, start_adapter)

    @property
    def preference_or_default(self) -> PreferenceSpec:
        return self.preference or PreferenceSpec()

    @property
    def lora_or_default(self) -> LoraSpec:
        return self.lora or LoraSpec()

    @property
    def qlora_or_default(self) -> QloraSpec:
        return self.qlora or QloraSpec()


class Precision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class LrSchedule(StrEnum):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


AutoInt = Annotated[
    int | Literal["auto"],
    Field(json_schema_extra={"x-ftjob-int-or-string": True}),
]


class TrainingSpec(RuledModel):
    """Optimisation hyper-parameters and the checkpoint/eval cadence."""

    epochs: Annotated[float, Field(gt=0, le=1000)] | None = Field(
        default=None, description="Passes over the data (default 1 when maxSteps is not set)."
    )
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        default=None, description="Optimizer steps; exclusive with epochs."
    )
    micro_batch_size: AutoInt = Field(
        default="auto", description="Sequences per GPU per forward pass, or `auto` to let the planner choose."
    )
    global_batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=32, description="Sequences per optimizer step over all GPUs."
    )
    learning_rate: Annotated[float, Field(gt=0, le=1)] = Field(default=2.0e-4, description="Peak learning rate.")
    lr_schedule: LrSchedule = Field(default=LrSchedule.COSINE, description="Decay after warmup.")
    warmup_ratio: Annotated[float, Field(ge=0, le=0.5)] | None = Field(
        default=None,
        description="Fraction of steps spent warming up linearly, rounded to the nearest step "
        "(default 0.03 when warmupSteps is not set); exclusive with warmupSteps.",
    )
    warmup_steps: Annotated[int, Field(ge=0, le=10_000_000)] | None = Field(
        default=None, description="Optimizer steps spent warming up linearly; exclusive with warmupRatio."
    )
    weight_decay: Annotated[float, Field(ge=0, le=1)] = Field(default=0.0, description="AdamW weight decay.")
    max_grad_norm: Annotated[float, Field(ge=0, le=1000)] = Field(
        default=1.0, description="Gradient clipping norm; 0 disables clipping."
    )
    gradient_checkpointing: Literal["auto", "true", "false"] = Field(
        default="auto",
        description="Recompute activations in backward: `auto` (the planner decides), `true` or `false`. "
        "YAML booleans are accepted.",
        json_schema_extra={"x-ftjob-bool-or-auto": True},
    )
    precision: Precision = Field(default=Precision.BF16, description="bf16, fp16 (with loss scaling) or fp32.")
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = Field(default=42, description="Seed for init and shuffling.")
    checkpoint_every_steps: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=100, description="Save a resumable checkpoint every N optimizer steps."
    )
    checkpoints_to_keep: Annotated[int, Field(ge=1, le=100)] = Field(
        default=2, description="Newest checkpoints kept on the output volume."
    )
    eval_every_steps: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="Evaluate every N steps (default: at the end only)."
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="!(has(self.epochs) && has(self.maxSteps))",
            message="set epochs or maxSteps, not both",
            field_path=".maxSteps",
            check=lambda t: not (t.epochs is not None and t.max_steps is not None),
        ),
        CrossFieldRule(
            cel="!(has(self.warmupRatio) && has(self.warmupSteps))",
            message="set warmupRatio or warmupSteps, not both",
            field_path=".warmupSteps",
            check=lambda t: not (t.warmup_ratio is not None and t.warmup_steps is not None),
        ),
        CrossFieldRule(
            cel="!has(self.microBatchSize) || type(self.microBatchSize) == string "
            "|| (has(self.globalBatchSize) ? self.globalBatchSize : 32) % self.microBatchSize == 0",
            message="must be a multiple of microBatchSize",
            field_path=".globalBatchSize",
            check=lambda t: t.micro_batch_size == "auto" or t.global_batch_size % t.micro_batch_size == 0,
        ),
    )

    def warmup_steps_of(self, total_steps: int) -> int:
        """Warmup steps for a run of `total_steps`: warmupSteps, or warmupRatio rounded to the nearest step."""
        if self.warmup_steps is not None:
            return min(self.warmup_steps, total_steps)
        ratio = DEFAULT_WARMUP_RATIO if self.warmup_ratio is None else self.warmup_ratio
        return math.floor(ratio * total_steps + 0.5)

    @field_validator("gradient_checkpointing", mode="before")
    @classmethod
    def _bool_to_text(cls, value: object) -> object:
        return str(value).lower() if isinstance(value, bool) else value

    @field_validator("micro_batch_size", mode="after")
    @classmethod
    def _positive_micro_batch(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 4096:
            raise ValueError("must be auto or an integer from 1 to 4096")
        return value


class ResourcesSpec(RuledModel):
    """Where the ranks run: nodes, GPUs per node and what each pod requests."""

    num_nodes: Annotated[int, Field(ge=1, le=512)] = Field(default=1, description="Pods (one per node).")
    gpus_per_node: Annotated[int, Field(ge=0, le=16)] = Field(
        default=1, description="GPUs per pod; 0 runs one CPU rank per pod (tests, demos)."
    )
    gpu_memory: Quantity = Field(default="80Gi", description="Memory of each GPU, e.g. 24Gi, 80Gi, 141Gi.")
    cpu: Quantity | None = Field(default=None, description="CPU request and limit of each pod.")
    memory: Quantity | None = Field(
        default=None,
        description="Host memory request and limit of each pod. Unset: the pod requests the plan's host memory "
        "(status.plan.hostBytesPerNode) and has no limit.",
    )
    node_selector: dict[Annotated[str, Field(max_length=317)], LabelValue] | None = Field(
        default=None, description="Node labels the pods must match."
    )
    _node_selector_keys = field_validator("node_selector", mode="after")(check_node_selector)
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = Field(
        default=None, description="Taints the pods tolerate."
    )
    priority_class_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None, description="PriorityClass of the pods."
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="(has(self.numNodes) ? self.numNodes : 1) * (has(self.gpusPerNode) ? self.gpusPerNode : 1) <= 4096",
            message="numNodes × gpusPerNode must not exceed 4096",
            field_path=".numNodes",
            check=lambda r: r.num_nodes * r.gpus_per_node <= 4096,
        ),
    )

    @property
    def gpu_memory_bytes(self) -> int:
        return quantity_bytes(self.gpu_memory)

    @property
    def ranks_per_node(self) -> int:
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @field_validator("gpu_memory", mode="after")
    @classmethod
    def _gpu_memory_sane(cls, value: str | int) -> str | int:
        if quantity_bytes(value) < 2**30:
            raise ValueError("must be at least 1Gi (write it like 24Gi or 80Gi)")
        return value


ZeroStage = Annotated[
    Literal[0, 1, 2, 3, "auto"],
    Field(json_schema_extra={"x-ftjob-int-or-string": True}),
]


class Offload(StrEnum):
    AUTO = "auto"
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class DeepSpeedSpec(RuledModel):
    """DeepSpeed strategy: `auto` lets the planner pick the cheapest one that fits."""

    zero_stage: ZeroStage = Field(default="auto", description="ZeRO stage 0-3, or `auto`.")
    offload_optimizer: Offload = Field(default=Offload.AUTO, description="Where optimizer states live.")
    offload_params: Offload = Field(default=Offload.AUTO, description="Where parameters live (ZeRO-3 only).")
    nvme_path: Annotated[str, Field(max_length=256, pattern=ABSOLUTE_PATH_PATTERN)] | None = Field(
        default=None, description="Local NVMe mount used by nvme offload."
    )
    overrides: (
        dict[
            Annotated[str, Field(max_length=128, pattern=r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")],
            bool | int | float | str,
        ]
        | None
    ) = Field(
        default=None,
        description="Extra DeepSpeed config keys in dotted form, e.g. `zero_optimization.overlap_comm: true`. "
        "Keys the plan owns (batch sizes, stage, offload, precision, optimizer) are rejected.",
        json_schema_extra={"x-ftjob-preserve-unknown": True},
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="!has(self.offloadParams) || self.offloadParams in ['auto', 'none'] || !has(self.zeroStage) "
            "|| self.zeroStage == 'auto' || self.zeroStage == 3",
            message="parameter offload exists only at ZeRO-3: set zeroStage to 3 or auto",
            field_path=".offloadParams",
            check=lambda d: d.offload_params in ("auto", "none") or d.zero_stage in ("auto", 3),
        ),
        CrossFieldRule(
            cel="!((has(self.offloadOptimizer) && self.offloadOptimizer == 'nvme') "
            "|| (has(self.offloadParams) && self.offloadParams == 'nvme')) || has(self.nvmePath)",
            message="nvme offload needs nvmePath",
            field_path=".nvmePath",
            check=lambda d: "nvme" not in (d.offload_optimizer, d.offload_params) or d.nvme_path is not None,
        ),
        CrossFieldRule(
            cel="!has(self.nvmePath) || (" + mount_paths.cel_rule().replace("self", "self.nvmePath") + ")",
            message="nvmePath " + mount_paths.MESSAGE,
            field_path=".nvmePath",
            check=lambda d: d.nvme_path is None or mount_paths.problem(d.nvme_path) is None,
        ),
        CrossFieldRule(
            cel="!has(self.offloadOptimizer) || self.offloadOptimizer in ['auto', 'none'] || !has(self.zeroStage) "
            "|| self.zeroStage == 'auto' || self.zeroStage >= 1",
            message="optimizer offload needs ZeRO stage 1, 2 or 3 (or auto)",
            field_path=".offloadOptimizer",
            check=lambda d: d.offload_optimizer in ("auto", "none") or d.zero_stage == "auto" or d.zero_stage >= 1,
        ),
    )

    @field_validator("overrides", mode="after")
    @classmethod
    def _no_planner_keys(
        cls, value: dict[str, bool | int | float | str] | None
    ) -> dict[str, bool | int | float | str] | None:
        # not a CEL rule: the apiserver's CEL cannot see the keys of a map with untyped values,
        # so the operator answers such a job with Failed/InvalidSpec (and `ftjob validate` refuses it)
        for key in value or {}:
            if plan_owned_override(key):
                raise ValueError(f"key {key!r} {OVERRIDES_MESSAGE}")
        return value


class OutputSpec(RuledModel):
    """Where checkpoints and the trained adapter go."""

    uri: Annotated[str, Field(max_length=512, pattern=OUTPUT_URI_PATTERN)] = Field(
        description="`pvc://claim/path` (the claim must exist; it is never deleted), `s3://bucket/prefix` "
        "(checkpoints, "
        "adapter and merged model are uploaded there; a multi-node job then needs no ReadWriteMany claim; nothing "
        "outside the prefix is ever deleted) or a path in the container."
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (no_dot_dot("uri"), allowed_bucket("uri"))
    merged_model: bool = Field(default=False, description="Also export base + adapter merged, in safetensors.")


class SecretKeyRef(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)]


class EnvSource(ApiModel):
    secret_key_ref: SecretKeyRef = Field(description="Read the value from a Secret (never through the operator).")


class EnvVar(RuledModel):
    """An environment variable for the trainer container."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=ENV_NAME_PATTERN)]
    value: Annotated[str, Field(max_length=MAX_ENV_VALUE)] | None = Field(
        default=None,
        description="At most 4 KiB, so that 64 of them fit the StatefulSet and the ConfigMap the operator "
        "writes (a ConfigMap holds at most 1 MiB).",
    )
    value_from: EnvSource | None = None

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="has(self.value) != has(self.valueFrom)",
            message="set exactly one of value and valueFrom",
            check=lambda e: (e.value is None) != (e.value_from is None),
        ),
        CrossFieldRule(
            cel="!(self.name in " + "[" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "])",
            message="this name is reserved: the operator sets it (" + ", ".join(RESERVED_ENV) + ")",
            field_path=".name",
            check=lambda e: e.name not in RESERVED_ENV,
        ),
        CrossFieldRule(
            # the hub client of every pod (and the operator's config.json reader) goes where HF_ENDPOINT says
            cel=f"self.name != '{pod_env.PodEnv.HF_ENDPOINT}' || !has(self.value) "
            f"|| self.value.matches('{HTTP_URL_PATTERN.replace(chr(92), chr(92) * 2)}')",
            message=f"{pod_env.PodEnv.HF_ENDPOINT} {HTTP_URL_HINT}",
            field_path=".value",
            check=lambda e: (
                e.name != pod_env.PodEnv.HF_ENDPOINT
                or e.value is None
                or re.fullmatch(HTTP_URL_PATTERN, e.value) is not None
            ),
        ),
    )


class OomAction(StrEnum):
    REPLAN = "Replan"
    FAIL = "Fail"


class FailurePolicy(ApiModel):
    """What happens when a rank fails."""

    backoff_limit: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, description="Gang restarts allowed before the job is Failed."
    )
    on_out_of_memory: OomAction = Field(
        default=OomAction.REPLAN, description="Replan (next more frugal strategy) or Fail."
    )


_S3_URI_CEL = (
    "(self.model.uri.startsWith('s3://') || (has(self.model.tokenizer) && self.model.tokenizer.startsWith('s3://')) "
    "|| (has(self.model.adapter) && self.model.adapter.startsWith('s3://')) "
    "|| self.dataset.uri.startsWith('s3://') "
    "|| (has(self.dataset.validationUri) && self.dataset.validationUri.startsWith('s3://')) "
    "|| self.output.uri.startsWith('s3://'))"
)


_LORA_R_CEL = (
    f"(has(self.method) && has(self.method.lora) && has(self.method.lora.r) ? self.method.lora.r : {LoraSpec().r})"
)
_FULL_CEL = f"(has(self.method) && {_adapts(MethodType.FULL, 'self.method')})"
_MERGED_CEL = "(has(self.output.mergedModel) && self.output.mergedModel)"
_SERVING_RULES = (
    CrossFieldRule(
        cel=f"!has(self.serving) || !has(self.serving.model) || self.serving.model == 'auto' || !{_FULL_CEL}",
        message="a full fine-tune serves its model: leave serving.model at auto (adapter and merged are for "
        "lora and qlora)",
        field_path=".serving.model",
        check=lambda s: s.serving is None or s.serving.model == ServedModel.AUTO or s.method.traits.has_adapter,
    ),
    CrossFieldRule(
        cel=f"!has(self.serving) || !has(self.serving.model) || self.serving.model != 'merged' || {_MERGED_CEL}",
        message="serving the merged model needs it exported: set output.mergedModel to true",
        field_path=".serving.model",
        check=lambda s: s.serving is None or s.serving.model != ServedModel.MERGED or s.output.merged_model,
    ),
    CrossFieldRule(
        cel=f"!has(self.serving) || {_FULL_CEL} || (has(self.serving.model) && self.serving.model == 'merged') "
        f"|| {_LORA_R_CEL} <= (has(self.serving.maxLoraRank) ? self.serving.maxLoraRank : {DEFAULT_MAX_LORA_RANK}) "
        f"|| ((!has(self.serving.model) || self.serving.model == 'auto') && {_MERGED_CEL})",
        message="method.lora.r is above serving.maxLoraRank, so the runtime cannot load the adapter: raise "
        "serving.maxLoraRank (vLLM takes up to 512) or serve the merged model (serving.model: merged or auto, with "
        "output.mergedModel: true)",
        field_path=".serving.maxLoraRank",
        check=lambda s: (
            s.serving is None
            or not s.method.traits.has_adapter
            or s.serving.model == ServedModel.MERGED
            or s.method.lora_or_default.r <= s.serving.max_lora_rank
            or (s.serving.model == ServedModel.AUTO and s.output.merged_model)
        ),
    ),
)


class FineTuneJobSpec(RuledModel):
    """A fine-tuning run, as a user asks for it."""

    model: ModelSpec
    dataset: DatasetSpec
    method: MethodSpec = Field(default_factory=MethodSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    deepspeed: DeepSpeedSpec = Field(default_factory=DeepSpeedSpec)
    output: OutputSpec
    serving: ServingSpec | None = Field(
        default=None,
        description="What serves the result once the job succeeds: a KServe InferenceService or "
        "LLMInferenceService, or a vLLM Deployment. Applied after success, not deleted with the job; a refusal "
        "or a failed apply is the Serving condition and never fails the job.",
    )
    image: Annotated[str, Field(max_length=512, pattern=IMAGE_PATTERN)] | None = Field(
        default=None, description="Trainer image; defaults to the operator's configured trainer image."
    )
    env: Annotated[list[EnvVar], Field(max_length=MAX_ENV_VARS)] | None = Field(
        default=None, description="Extra environment for the trainer (secrets only via valueFrom.secretKeyRef)."
    )
    hf_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding a hub token, exposed to the trainer as HF_TOKEN."
    )
    pod_template: PodTemplateOverlay | None = Field(
        default=None,
        description="Additions to the trainer pods (labels, annotations, tolerations, affinity, nodeSelector, "
        "extra resources such as rdma/*, volumes and mounts, runtimeClassName, schedulerName, "
        "priorityClassName, imagePullSecrets, capabilities). Fields the operator owns cannot be overridden.",
    )
    suspend: bool = Field(default=False, description="Scale the workers to 0 while true; resume from checkpoint.")
    queue_name: Annotated[str, Field(max_length=63, pattern=DNS_LABEL_PATTERN)] | None = Field(
        default=None,
        description="Kueue LocalQueue (in the job's namespace) that admits the job: its whole gang starts only "
        "when the queue's ClusterQueue has quota for all of it; preemption suspends it without spending "
        "failurePolicy.backoffLimit. Unset: the operator's default queue, if any; else no queueing.",
    )
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    object_storage: ObjectStorageSpec | None = Field(
        default=None,
        description="The S3-compatible store serving the job's s3:// URIs: connection (defaults from the "
        "operator) and credentials (a Secret, or a service account for workload identity).",
    )
    active_deadline_seconds: Annotated[int, Field(ge=1, le=31_536_000)] | None = Field(
        default=None, description="Fail with DeadlineExceeded after this many seconds of running."
    )
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=31_536_000)] | None = Field(
        default=None, description="Delete the job this long after it Succeeded or Failed."
    )
    tracking: TrackingSpec | None = Field(
        default=None,
        description="Experiment tracking: one MLflow run for the job's whole life (restarts, re-plans and "
        "preemptions continue it) and TensorBoard event files. Unset: the operator's default tracking URI, if any.",
    )

    __rules__: ClassVar[tuple[CrossFieldRule, ...]] = (
        CrossFieldRule(
            cel="!has(self.method) || !has(self.method.type) "
            "|| (self.method.type != 'dpo' && self.method.type != 'orpo') "
            "|| (has(self.dataset.format) && self.dataset.format == 'preference')",
            message="dpo and orpo read preference pairs: set dataset.format to preference "
            "(rows with prompt, chosen and rejected)",
            field_path=".dataset.format",
            check=lambda s: s.method.objective == Objective.SFT or s.dataset.format == DatasetFormat.PREFERENCE,
        ),
        CrossFieldRule(
            cel="!has(self.dataset.format) || self.dataset.format != 'preference' "
            "|| (has(self.method) && has(self.method.type) "
            "&& (self.method.type == 'dpo' || self.method.type == 'orpo'))",
            message="format preference is for preference tuning: set method.type to dpo or orpo",
            field_path=".method.type",
            check=lambda s: s.dataset.format != DatasetFormat.PREFERENCE or s.method.objective != Objective.SFT,
        ),
        *_SERVING_RULES,
        CrossFieldRule(
            cel=f"!has(self.model.adapter) || !has(self.method) || !{_adapts(MethodType.FULL, 'self.method')}",
            message="a full fine-tune trains every weight and takes no adapter: model.adapter needs lora or qlora "
            "(method.type, or method.preference.base for dpo and orpo)",
            field_path=".model.adapter",
            check=lambda s: s.model.adapter is None or s.method.traits.has_adapter,
        ),
        CrossFieldRule(
            cel=f"!has(self.method) || !{_adapts(MethodType.QLORA, 'self.method')} "
            "|| !has(self.training) || !has(self.training.precision) || self.training.precision != 'fp32'",
            message="qlora needs a 16-bit compute dtype: set training.precision to bf16 or fp16",
            field_path=".training.precision",
            check=lambda s: s.method.adaptation != MethodType.QLORA or s.training.precision != Precision.FP32,
        ),
        CrossFieldRule(
            cel="!has(self.podTemplate) || !has(self.podTemplate.priorityClassName) || !has(self.resources) "
            "|| !has(self.resources.priorityClassName)",
            message="set priorityClassName in one place: resources.priorityClassName or podTemplate.priorityClassName",
            field_path=".podTemplate.priorityClassName",
            check=lambda s: (
                s.pod_template is None
                or s.pod_template.priority_class_name is None
                or s.resources.priority_class_name is None
            ),
        ),
        CrossFieldRule(
            cel="(has(self.training) && has(self.training.globalBatchSize) ? self.training.globalBatchSize : 32) % "
            "((has(self.resources) && has(self.resources.numNodes) ? self.resources.numNodes : 1) * "
            "(has(self.resources) && has(self.resources.gpusPerNode) && self.resources.gpusPerNode > 0 "
            "? self.resources.gpusPerNode : 1)) == 0",
            message="must be a multiple of the world size (numNodes × gpusPerNode; one rank per pod when "
            "gpusPerNode is 0): every rank takes an equal share of each optimizer step",
            field_path=".training.globalBatchSize",
            check=lambda s: s.training.global_batch_size % s.world_size == 0,
        ),
        CrossFieldRule(
            cel=_S3_URI_CEL + " ? (has(self.objectStorage) && (has(self.objectStorage.credentials) "
            "|| has(self.objectStorage.serviceAccountName))) : true",
            message="an s3:// URI needs objectStorage.credentials (a Secret with the keys) or "
            "objectStorage.serviceAccountName (workload identity)",
            field_path=".objectStorage",
            check=lambda s: (
                not s.s3_uris
                or (
                    s.object_storage is not None
                    and (s.object_storage.credentials is not None or s.object_storage.service_account_name is not None)
                )
            ),
        ),
        CrossFieldRule(
            cel="!has(self.objectStorage) || !(has(self.objectStorage.credentials) "
            "&& has(self.objectStorage.serviceAccountName))",
            message="set credentials or serviceAccountName, not both",
            field_path=".objectStorage.serviceAccountName",
            check=lambda s: (
                s.object_storage is None
                or s.object_storage.credentials is None
                or s.object_storage.service_account_name is None
            ),
        ),
        CrossFieldRule(
            cel="!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            message="env names must be unique",
            field_path=".env",
            check=lambda s: len({e.name for e in s.env or []}) == len(s.env or []),
        ),
    )

    @property
    def world_size(self) -> int:
        return self.resources.world_size

    @property
    def reference(self) -> ReferenceModel:
        """The reference model the job's objective compares the policy against (`method`, and
        `model.adapter` where the job starts from an adapter)."""
        return self.method.reference_for(start_adapter=self.model.adapter is not None)

    @property
    def s3_uris(self) -> dict[str, str]:
        """The spec's s3:// URIs by field path (`spec.model.uri`, ...)."""
        fields: dict[str, str | None] = {
            "spec.model.uri": self.model.uri,
            "spec.model.tokenizer": self.model.tokenizer,
            "spec.model.adapter": self.model.adapter,
            "spec.dataset.uri": self.dataset.uri,
            "spec.dataset.validationUri": self.dataset.validation_uri,
            "spec.output.uri": self.output.uri,
        }
        return {field: uri for field, uri in fields.items() if uri is not None and storage_uri.is_s3(uri)}


def _same_optional(field: str) -> str:
    return f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"


def _same_defaulted(parent: str, field: str, default: int) -> str:
    def value(obj: str) -> str:
        return f"(has({obj}.{parent}) && has({obj}.{parent}.{field}) ? {obj}.{parent}.{field} : {default})"

    return f"{value('self')} == {value('oldSelf')}"


_FULL_UNCONVERTIBLE = (
    "has(self.deepspeed) && ((has(self.deepspeed.zeroStage) && string(self.deepspeed.zeroStage) == '0') "
    "|| (has(self.deepspeed.offloadOptimizer) && self.deepspeed.offloadOptimizer == 'nvme') "
    "|| (has(self.deepspeed.offloadParams) && self.deepspeed.offloadParams == 'nvme'))"
)
"""A full fine-tuning strategy whose checkpoint cannot be converted to another world size."""

IMMUTABLE_SPEC_RULES: tuple[CrossFieldRule, ...] = (
    *(
        CrossFieldRule(
            cel=_same_optional(field),
            message=f"spec.{field} is immutable: checkpoints of a started job depend on it; "
            "create a new FineTuneJob instead",
            field_path=f".{field}",
            check=lambda _s: True,
            transition=True,
        )
        for field in ("model", "dataset", "method", "training", "output")
    ),
    CrossFieldRule(
        cel=_same_defaulted("resources", "gpusPerNode", 1),
        message="spec.resources.gpusPerNode is immutable: the checkpoint layout depends on the world size",
        field_path=".resources.gpusPerNode",
        check=lambda _s: True,
        transition=True,
    ),
    CrossFieldRule(
        # LoRA/QLoRA checkpoints are strategy-independent (any world size loads them); full fine-tuning's
        # DeepSpeed shards are converted to a universal checkpoint for the new world size, except under a
        # pinned ZeRO-0 or NVMe offload (see finetune_trainer.checkpoint.universal). A change rolls the gang.
        cel=f"!(has(self.method) && {_adapts(MethodType.FULL, 'self.method')}) || ("
        + _same_defaulted("resources", "numNodes", 1)
        + ") || !("
        + _FULL_UNCONVERTIBLE
        + ")",
        message="spec.resources.numNodes cannot change for full fine-tuning with deepspeed.zeroStage 0 or NVMe "
        "offload: those checkpoints cannot be converted to another world size (allowed: zeroStage 1, 2, 3 or "
        "auto, offload none, cpu or auto; LoRA and QLoRA jobs may always change it)",
        field_path=".resources.numNodes",
        check=lambda _s: True,
        transition=True,
    ),
)
"""Transition rules on the spec: what a job cannot change once it exists."""

FineTuneJobSpec.__rules__ = FineTuneJobSpec.__rules__ + IMMUTABLE_SPEC_RULES

"""What a rank's loss trains towards (`method.objective`): one callable per micro-batch.

`Supervised` is the next-token loss over the answers (`loss.TrainingLoss`). `Preference` is DPO
or ORPO over a micro-batch of pairs, every chosen row first (`batching.example_rows`): the
policy's completion log-probabilities from one forward of all 2B rows and, for DPO, the
reference's from a forward without gradients. An adapter method's reference is its own base
with the adapter switched off (peft's `disable_adapter`): no second model; a job that started from
an adapter (`model.adapter`) compares against that adapter, kept frozen (`start_adapter`). Full fine-tuning's
reference is a frozen copy of the base in its own DeepSpeed engine (`rank_setup.build_reference_engine`);
precomputed reference log-probabilities are not trained here yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from finetune_operator.api.methods import Objective, PreferenceLoss, ReferenceModel
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.model import start_adapter
from finetune_trainer.model.loss import TrainingLoss
from finetune_trainer.model.preference_loss import (
    IGNORE_INDEX,
    PreferenceTerms,
    completion_logps,
    dpo_terms,
    orpo_terms,
)
from finetune_trainer.settings import ConfigError


@dataclass(frozen=True)
class StepLoss:
    """One micro-batch's loss and what it is a mean over (trained tokens, or pairs)."""

    loss: Any
    weight: int
    terms: PreferenceTerms | None = None


class RankObjective(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, engine: Any, inputs: dict[str, Any]) -> StepLoss: ...


@dataclass(frozen=True)
class Supervised:
    """The answers' next-token loss (a mean over trained tokens)."""

    loss: TrainingLoss

    @property
    def name(self) -> str:
        return self.loss.name

    def __call__(self, engine: Any, inputs: dict[str, Any]) -> StepLoss:
        trained = int((inputs["labels"][:, 1:] != IGNORE_INDEX).sum())
        return StepLoss(self.loss(engine, inputs), trained)


@dataclass(frozen=True)
class Preference:
    """DPO or ORPO over pairs (a mean over pairs), with TRL's definitions (`preference_loss`)."""

    objective: Objective
    beta: float
    loss_type: PreferenceLoss
    reference: ReferenceModel
    reference_engine: Any = None
    """The frozen copy's engine (a `FROZEN_COPY` reference), None otherwise."""

    @property
    def name(self) -> str:
        return f"{self.objective} (beta {self.beta}" + (
            f", {self.loss_type})" if self.objective == Objective.DPO else ")"
        )

    def __call__(self, engine: Any, inputs: dict[str, Any]) -> StepLoss:
        labels = inputs["labels"]
        model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
        logits = engine(**model_inputs).logits
        sums, tokens = completion_logps(logits, labels)
        pairs = int(labels.shape[0]) // 2
        if self.objective == Objective.DPO:
            reference = self._reference_logps(engine, model_inputs, labels)
            terms = dpo_terms(sums, reference, tokens, beta=self.beta, loss_type=str(self.loss_type))
        else:
            terms = orpo_terms(sums / tokens.clamp(min=1), self._chosen_nll(logits, inputs), beta=self.beta)
        return StepLoss(terms.loss, pairs, terms)

    def _reference_logps(self, engine: Any, model_inputs: dict[str, Any], labels: Any) -> Any:
        import torch

        if self.reference is ReferenceModel.FROZEN_COPY and self.reference_engine is not None:
            with torch.no_grad():
                reference_logits = self.reference_engine(**model_inputs).logits
        elif self.reference is ReferenceModel.ADAPTER_DISABLED:
            with torch.no_grad(), engine.module.disable_adapter():
                reference_logits = engine(**model_inputs).logits
        elif self.reference is ReferenceModel.START_ADAPTER:  # the adapter the job started from, frozen
            with torch.no_grad(), start_adapter.reference_active(engine.module):
                reference_logits = engine(**model_inputs).logits
        else:
            raise ConfigError(f"method.preference: a {self.reference} reference is not trained by this trainer yet")
        return completion_logps(reference_logits, labels)[0]

    @staticmethod
    def _chosen_nll(logits: Any, inputs: dict[str, Any]) -> Any:
        """ORPO's supervised term as TRL takes it: the chosen rows' mean cross entropy over every
        attended token (the prompt's too)."""
        import torch.nn.functional as F

        pairs = int(logits.shape[0]) // 2
        ids = inputs["input_ids"][:pairs]
        attended = inputs["attention_mask"][:pairs] == 1
        targets = ids.masked_fill(~attended, IGNORE_INDEX)[:, 1:]
        return F.cross_entropy(logits[:pairs, :-1].float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def rank_objective(spec: FineTuneJobSpec, loss: TrainingLoss, reference_engine: Any = None) -> RankObjective:
    """The objective a rank trains with: `loss` for SFT, a `Preference` for dpo and orpo
    (`reference_engine`: the frozen copy a full-model DPO compares against)."""
    method = spec.method
    if method.objective == Objective.SFT:
        return Supervised(loss)
    settings = method.preference_or_default
    return Preference(
        objective=method.objective,
        beta=settings.beta,
        loss_type=settings.loss_type or PreferenceLoss.SIGMOID,
        reference=spec.reference,
        reference_engine=reference_engine,
    )

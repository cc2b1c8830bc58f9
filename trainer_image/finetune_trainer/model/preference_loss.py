"""The preference objectives' losses (DPO, ORPO), from per-sequence log-probabilities.

A preference micro-batch holds B pairs as 2B sequences, the chosen answers first, then the
rejected ones (`chunk(2)` splits them back). Only completion tokens are scored: the prompt's
labels are -100, as in supervised fine-tuning. Where a term is ambiguous the definitions are
TRL's (1.16: `trl.trainer.dpo_trainer.DPOTrainer._compute_loss`,
`trl.experimental.orpo.ORPOTrainer`), and `tests/trainer/test_preference_loss.py` holds them
equal within 1e-5:

- DPO's log-probabilities are sums over the completion; `sigmoid` is -log σ(β Δ), where Δ is the
  policy's log-ratio of chosen over rejected less the reference's; `ipo` divides each log-ratio
  by its completion's token count and is (Δ' - 1/(2β))².
- ORPO's log-probabilities are means over the completion; the loss is the chosen answer's
  negative log-likelihood less β log σ(log odds(chosen) - log odds(rejected)).

The rewards (β times the log-ratio for DPO, β times the mean log-probability for ORPO), their
margin and the preference accuracy (the share of pairs whose chosen reward is the larger) are
what the metrics, the status and MLflow carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100


@dataclass(frozen=True)
class PreferenceTerms:
    """One micro-batch's preference loss (a scalar tensor, the mean over pairs) and its rewards
    (one per pair, detached)."""

    loss: Any
    chosen_rewards: Any
    rejected_rewards: Any

    def metrics(self) -> dict[str, float]:
        """Rewards of chosen and rejected, their margin and the preference accuracy, as floats."""
        chosen, rejected = self.chosen_rewards.float(), self.rejected_rewards.float()
        return {
            "rewards_chosen": float(chosen.mean()),
            "rewards_rejected": float(rejected.mean()),
            "reward_margin": float((chosen - rejected).mean()),
            "preference_accuracy": float((chosen > rejected).float().mean()),
        }


def completion_logps(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per-sequence sums of the labels' log-probabilities over completion tokens, and the token
    counts: logits [N, T, V] predict labels [N, T] one position ahead (the causal shift)."""
    import torch

    shifted_logits = logits[:, :-1, :].float()
    shifted_labels = labels[:, 1:]
    mask = shifted_labels != IGNORE_INDEX
    targets = shifted_labels.masked_fill(~mask, 0)
    token_logps = torch.gather(shifted_logits.log_softmax(-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    return (token_logps * mask).sum(-1), mask.sum(-1)


def dpo_terms(
    policy_logps: Any,
    reference_logps: Any,
    tokens: Any,
    *,
    beta: float,
    loss_type: str = "sigmoid",
) -> PreferenceTerms:
    """DPO over 2B sequences (chosen first): summed completion log-probabilities of the policy
    and of the reference, and each sequence's completion token count (for `ipo`)."""
    import torch.nn.functional as F

    policy_chosen, policy_rejected = policy_logps.float().chunk(2)
    reference_chosen, reference_rejected = reference_logps.float().chunk(2)
    chosen_ratio, rejected_ratio = policy_chosen - reference_chosen, policy_rejected - reference_rejected
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "ipo":
        chosen_tokens, rejected_tokens = tokens.chunk(2)
        delta = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss type {loss_type!r} (sigmoid or ipo)")
    return PreferenceTerms(losses.mean(), (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach())


def _log1mexp(x: Any) -> Any:
    """log(1 - exp(x)) for x < 0, stable at both ends."""
    import math

    import torch

    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_terms(mean_logps: Any, chosen_nll: Any, *, beta: float) -> PreferenceTerms:
    """ORPO over 2B sequences (chosen first): mean completion log-probabilities, and the chosen
    answers' negative log-likelihood (the supervised term)."""
    import torch.nn.functional as F

    chosen, rejected = mean_logps.float().chunk(2)
    log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
    loss = chosen_nll - beta * F.logsigmoid(log_odds).mean()
    return PreferenceTerms(loss, (beta * chosen).detach(), (beta * rejected).detach())

"""The preference losses equal TRL's on the same batch (1e-5): DPO (sigmoid, ipo) through
`DPOTrainer._compute_loss` itself, ORPO through `ORPOTrainer.get_batch_logps` and
`odds_ratio_loss`. TRL's code runs unchanged; what it would ask of a trainer instance and a
model is given to it as plain values (the model's per-token log-probabilities are the same
tensors ours are computed from), so the comparison is of the loss definitions, term by term.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import trl.trainer.dpo_trainer as trl_dpo

with warnings.catch_warnings():  # ORPO lives in trl.experimental, which warns that it may change
    warnings.simplefilter("ignore")
    import trl.experimental.orpo.orpo_trainer as trl_orpo

from finetune_trainer.model.preference_loss import (
    IGNORE_INDEX,
    completion_logps,
    dpo_terms,
    orpo_terms,
)

PAIRS, LENGTH, VOCAB = 4, 12, 50


def batch(seed: int) -> tuple[Any, Any, Any]:
    """Token ids, labels (prompt and padding -100) and the attention mask of 2 x PAIRS sequences,
    chosen first, prompts of 3-5 tokens and completions of 2-7."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2 * PAIRS, LENGTH), generator=g)
    labels = torch.full_like(ids, IGNORE_INDEX)
    attention = torch.zeros_like(ids)
    for row in range(2 * PAIRS):
        prompt = int(torch.randint(3, 6, (1,), generator=g))
        completion = int(torch.randint(2, 8, (1,), generator=g))
        end = min(LENGTH, prompt + completion)
        labels[row, prompt:end] = ids[row, prompt:end]
        attention[row, :end] = 1
    return ids, labels, attention


def logits_of(seed: int) -> Any:
    return torch.randn(2 * PAIRS, LENGTH, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


class Accelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather_for_metrics(x: Any) -> Any:
        return x

    @staticmethod
    def gather(x: Any) -> Any:
        return x


def trl_dpo_loss(
    logits: Any, labels: Any, attention: Any, ids: Any, ref: tuple[Any, Any], beta: float, loss: str
) -> Any:
    """TRL's `_compute_loss` on this batch: the model's per-token log-probabilities are the ones
    `logits` give (TRL's fused head would compute the same), the reference's are precomputed."""
    completion = (labels != IGNORE_INDEX).long()
    token_logps = (
        torch.gather(logits[:, :-1].float().log_softmax(-1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        * completion[:, 1:]
    )
    outputs = SimpleNamespace(
        log_probs=token_logps,
        entropy=torch.zeros_like(token_logps),
        mean_logits=torch.zeros_like(token_logps),
        is_top1=torch.zeros_like(token_logps, dtype=torch.bool),
    )
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=Accelerator(),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss],
        loss_weights=[1.0],
        beta=beta,
        use_weighting=False,
        _metrics={"train": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    inputs = {
        "input_ids": ids,
        "attention_mask": attention,
        "completion_mask": completion,
        "ref_chosen_logps": ref[0],
        "ref_rejected_logps": ref[1],
    }
    result = trl_dpo.DPOTrainer._compute_loss(cast(Any, trainer), lambda **_: outputs, inputs, False)
    return result, trainer._metrics["train"]


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_equals_trl(loss_type: str, seed: int) -> None:
    ids, labels, attention = batch(seed)
    logits = logits_of(seed)
    reference = torch.randn(2 * PAIRS, generator=torch.Generator().manual_seed(100 + seed)) * 3 - 20
    beta = 0.1 if loss_type == "sigmoid" else 0.5

    policy, tokens = completion_logps(logits, labels)
    ours = dpo_terms(policy, reference, tokens, beta=beta, loss_type=loss_type)
    theirs, metrics = trl_dpo_loss(
        logits, labels, attention, ids, (reference[:PAIRS], reference[PAIRS:]), beta, loss_type
    )

    assert torch.allclose(ours.loss, theirs, atol=1e-5, rtol=0), (float(ours.loss), float(theirs))
    mine = ours.metrics()
    assert mine["rewards_chosen"] == pytest.approx(metrics["rewards/chosen"][-1], abs=1e-5)
    assert mine["rewards_rejected"] == pytest.approx(metrics["rewards/rejected"][-1], abs=1e-5)
    assert mine["preference_accuracy"] == pytest.approx(metrics["rewards/accuracies"][-1], abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_orpo_equals_trl(seed: int) -> None:
    ids, labels, attention = batch(seed)
    logits = logits_of(seed)
    beta = 0.1

    sums, tokens = completion_logps(logits, labels)
    mean = sums / tokens
    theirs_mean = trl_orpo.ORPOTrainer.get_batch_logps(logits, labels, average_log_prob=True)
    assert torch.allclose(mean, theirs_mean, atol=1e-5, rtol=0)

    # TRL's supervised term: the chosen sequences' mean cross entropy over every attended token
    chosen_labels = torch.where(attention == 1, ids, IGNORE_INDEX)[:PAIRS]
    nll = torch.nn.functional.cross_entropy(
        logits[:PAIRS, :-1].reshape(-1, VOCAB), chosen_labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX
    )
    ours = orpo_terms(mean, nll, beta=beta)

    trainer = SimpleNamespace(beta=beta, accelerator=Accelerator())
    losses, chosen_rewards, rejected_rewards, _, _ = trl_orpo.ORPOTrainer.odds_ratio_loss(
        cast(Any, trainer), cast(Any, theirs_mean[:PAIRS]), cast(Any, theirs_mean[PAIRS:])
    )
    assert torch.allclose(ours.loss, nll - losses.mean(), atol=1e-5, rtol=0)
    assert torch.allclose(ours.chosen_rewards, chosen_rewards, atol=1e-6)
    assert torch.allclose(ours.rejected_rewards, rejected_rewards, atol=1e-6)


def test_a_policy_that_prefers_chosen_more_than_the_reference_has_a_lower_dpo_loss() -> None:
    """The loss is not symmetric by accident: moving chosen up (and rejected down) against the
    reference lowers it, and the accuracy and margin follow."""
    reference = torch.tensor([-10.0, -10.0, -10.0, -10.0])
    tokens = torch.tensor([4, 4, 4, 4])
    worse = dpo_terms(torch.tensor([-11.0, -11.0, -9.0, -9.0]), reference, tokens, beta=0.1)
    better = dpo_terms(torch.tensor([-9.0, -9.0, -11.0, -11.0]), reference, tokens, beta=0.1)
    assert float(better.loss) < float(worse.loss)
    assert better.metrics()["preference_accuracy"] == 1.0 and worse.metrics()["preference_accuracy"] == 0.0
    assert better.metrics()["reward_margin"] == pytest.approx(0.2)  # beta x (+1 - -1)
    assert worse.metrics()["reward_margin"] == pytest.approx(-0.2)


def test_an_unknown_dpo_loss_type_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="sigmoid or ipo"):
        dpo_terms(torch.zeros(2), torch.zeros(2), torch.ones(2), beta=0.1, loss_type="hinge")

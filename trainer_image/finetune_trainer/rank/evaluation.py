"""Validation loss and, for the demo tasks, exact-match accuracy of greedy answers (against the
answer, or a preference pair's chosen one).

Under ZeRO-3 every forward pass gathers parameters collectively, so every rank must run
the same number of forwards: each rank takes a strided shard of the validation set,
padded to equal length with zero-weight repeats, and generation runs a fixed number of
greedy steps (no early stop) on left-padded batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from finetune_trainer.data.batching import Row, collate
from finetune_trainer.data.formats import IGNORE_INDEX


def _shard(n: int, rank: int, world: int) -> list[tuple[int, float]]:
    """(index, weight) pairs of this rank: equal counts on every rank, repeats weigh 0."""
    per_rank = -(-n // world) if n else 0
    mine = list(range(rank, n, world))
    out = [(i, 1.0) for i in mine]
    while len(out) < per_rank:
        out.append((mine[0] if mine else 0, 0.0))
    return out


def eval_loss(
    model: Any,
    rows: Sequence[Row],
    *,
    rank: int,
    world: int,
    batch: int,
    pad_id: int,
    all_reduce_sum: Callable[[list[float]], list[float]],
    loss: Callable[[Any, dict[str, Any]], Any],
) -> float | None:
    """Token-weighted mean loss over the validation rows, identical on every rank.

    `loss(model, inputs)` is the training loss (the chunked one: no full logits here either).
    The trainer passes the planned micro-batch as `batch`: the plan counts no other."""
    import torch

    if not rows:
        return None
    shard = _shard(len(rows), rank, world)
    total = count = 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(shard), batch):
            part = shard[start : start + batch]
            b = collate([rows[i] for i, _ in part], pad_id)
            device = next(model.parameters()).device
            inputs: dict[str, Any] = {k: b[k].to(device) for k in ("input_ids", "position_ids") if k in b}
            if "attention_mask" in b:
                inputs["attention_mask"] = b["attention_mask"].to(device)
            weights = [w for _, w in part]
            labels = b["labels"].clone()
            labels[[i for i, w in enumerate(weights) if w == 0]] = IGNORE_INDEX  # repeats only pad the shard
            inputs["labels"] = labels.to(device)
            trained = int((labels[:, 1:] != IGNORE_INDEX).sum())
            mean = loss(model, inputs)  # every rank runs the forward, even with nothing to count
            if trained:
                total += float(mean) * trained
                count += trained
    model.train(was_training)
    total, count = all_reduce_sum([total, count])
    return total / count if count else None


def exact_match(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    answers: Sequence[str],
    *,
    rank: int,
    world: int,
    batch: int,
    max_new_tokens: int,
    all_reduce_sum: Callable[[list[float]], list[float]],
    kept: int = 3,
) -> tuple[float, list[tuple[str, str]]]:
    """Share of prompts whose greedy continuation (up to EOS) equals the answer, and the first
    `kept` (expected, got) pairs of this rank (the serving tests keep them all, to compare a
    server's answers with these, prompt by prompt)."""
    import torch

    shard = _shard(len(prompts), rank, world)
    correct = seen = 0.0
    examples: list[tuple[str, str]] = []
    pad = int(tokenizer.pad_token_id)
    eos = int(tokenizer.eos_token_id)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, len(shard), batch):
            part = shard[start : start + batch]
            seqs = [list(prompts[i]) for i, _ in part]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
            mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
            for _ in range(max_new_tokens):
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            for row, (index, weight) in enumerate(part):
                new = ids[row, width:].tolist()
                new = new[: new.index(eos)] if eos in new else new
                text = tokenizer.decode(new, skip_special_tokens=True).strip()
                if weight:
                    seen += 1
                    correct += float(text == answers[index].strip())
                    if len(examples) < kept:
                        examples.append((answers[index], text))
    model.train(was_training)
    correct, seen = all_reduce_sum([correct, seen])
    return (correct / seen if seen else 0.0), examples


GENERATION_BATCH = 32
"""Held-out prompts generated for together (left-padded) by `generations`."""


def answer_budget(tokenizer: Any, answers: Sequence[str]) -> int:
    """The greedy steps `generations` takes: the longest answer's tokens, and one for its EOS."""
    return max(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers) + 1


def generations(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    answers: Sequence[str],
    *,
    rank: int,
    world: int,
    all_reduce_sum: Callable[[list[float]], list[float]],
) -> dict[str, Any]:
    """`exact_match` and its first `examples` (expected, got) of greedy answers to a built-in task's
    held-out prompts (none: an empty dict). The answer expected is SFT's answer, or a preference
    pair's chosen one: does the policy now say what it prefers?"""
    if not prompts:
        return {}
    accuracy, examples = exact_match(
        model,
        tokenizer,
        prompts,
        answers,
        rank=rank,
        world=world,
        batch=GENERATION_BATCH,
        max_new_tokens=answer_budget(tokenizer, answers),
        all_reduce_sum=all_reduce_sum,
    )
    return {"exact_match": accuracy, "examples": [{"expected": e, "got": g} for e, g in examples]}


def eval_preference(
    engine: Any,
    rows: Sequence[Row],
    objective: Callable[[Any, dict[str, Any]], Any],
    *,
    rank: int,
    world: int,
    batch: int,
    pad_id: int,
    all_reduce_sum: Callable[[list[float]], list[float]],
) -> dict[str, float]:
    """Held-out preference pairs (rows 2i, 2i+1): the objective's loss, the preference accuracy
    (the share of pairs whose chosen reward is the larger) and the reward margin, the same on
    every rank. Repeats padding a rank's shard weigh 0 in the accuracy and the margin; the loss
    is each micro-batch's mean weighted by its real pairs."""
    import torch

    from finetune_trainer.data.batching import example_rows

    examples = len(rows) // 2
    if not examples:
        return {}
    shard = _shard(examples, rank, world)
    loss_sum = wins = margin = count = 0.0
    model = engine.module
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(shard), batch):
            part = shard[start : start + batch]
            b = collate(example_rows(rows, [i for i, _ in part], 2), pad_id)
            device = next(model.parameters()).device
            inputs: dict[str, Any] = {k: b[k].to(device) for k in ("input_ids", "attention_mask", "labels") if k in b}
            step = objective(engine, inputs)  # every rank runs the forwards, even on repeats
            weights = torch.tensor([w for _, w in part])
            chosen, rejected = step.terms.chosen_rewards.float().cpu(), step.terms.rejected_rewards.float().cpu()
            real = float(weights.sum())
            loss_sum += float(step.loss) * real
            wins += float(((chosen > rejected).float() * weights).sum())
            margin += float(((chosen - rejected) * weights).sum())
            count += real
    model.train(was_training)
    loss_sum, wins, margin, count = all_reduce_sum([loss_sum, wins, margin, count])
    if not count:
        return {}
    return {
        "eval_loss": loss_sum / count,
        "eval_preference_accuracy": wins / count,
        "eval_reward_margin": margin / count,
    }

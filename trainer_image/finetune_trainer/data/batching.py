"""Sequences, packing and micro-batches.

Packing puts several samples into one sequence without letting them see each other:
position ids restart at 0 for every sample, and an explicit block-diagonal causal mask is
built (the trainer runs SDPA: the image has no varlen flash-attention kernel, which could
take the position ids alone). Without packing, batches are right-padded.
Padding tokens never count as "useful" tokens; "trained" tokens are those with a label
(the responses), what the loss is taken over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from finetune_trainer.data.formats import IGNORE_INDEX, Sample


@dataclass(frozen=True)
class Row:
    """One row of a batch: one sample, or several packed ones."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    lengths: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.input_ids)


def unpacked(samples: Sequence[Sample]) -> list[Row]:
    return [Row(s.input_ids, s.labels, (len(s.input_ids),)) for s in samples]


def pack(samples: Sequence[Sample], max_len: int) -> list[Row]:
    """Greedy first-fit packing in sample order (deterministic; samples are never split)."""
    bins: list[list[Sample]] = []
    room: list[int] = []
    for sample in samples:
        size = len(sample.input_ids)
        for index, free in enumerate(room):
            if size <= free:
                bins[index].append(sample)
                room[index] -= size
                break
        else:
            bins.append([sample])
            room.append(max_len - size)
    out: list[Row] = []
    for group in bins:
        ids: list[int] = []
        labels: list[int] = []
        for sample in group:
            ids.extend(sample.input_ids)
            labels.extend([IGNORE_INDEX, *sample.labels[1:]])
        out.append(Row(tuple(ids), tuple(labels), tuple(len(s.input_ids) for s in group)))
    return out


def collate(rows: Sequence[Row], pad_id: int) -> dict[str, Any]:
    """Tensors for one micro-batch.

    Packed rows get a 4D boolean mask (True = may attend) that is causal within each packed
    sample, padding attending only to padding so that no softmax row is empty; unpacked rows
    a padding mask.
    """
    import torch

    width = max(len(r) for r in rows)
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((batch, width), dtype=torch.long)
    segment = torch.full((batch, width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row)
        input_ids[i, :n] = torch.tensor(row.input_ids)
        labels[i, :n] = torch.tensor(row.labels)
        start = 0
        for k, length in enumerate(row.lengths):
            position_ids[i, start : start + length] = torch.arange(length)
            segment[i, start : start + length] = k
            start += length
        if n < width:
            position_ids[i, n:] = torch.arange(width - n)
    useful = int((segment >= 0).sum())
    trained = int((labels[:, 1:] != IGNORE_INDEX).sum())  # the model shifts labels: position 0 is never a target
    out: dict[str, Any] = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    packed = any(len(r.lengths) > 1 for r in rows)
    if packed:
        causal = torch.ones((width, width), dtype=torch.bool).tril()
        same = segment[:, :, None] == segment[:, None, :]
        out["attention_mask"] = (same & causal)[:, None, :, :]
    else:
        out["attention_mask"] = (segment >= 0).long()
    return {**out, "useful_tokens": useful, "trained_tokens": trained, "samples": sum(len(r.lengths) for r in rows)}


def example_rows(rows: Sequence[Row], examples: Sequence[int], rows_per_example: int = 1) -> list[Row]:
    """The rows of `examples` for one micro-batch: example i is row i, or for preference pairs
    rows 2i (chosen) and 2i+1 (rejected), every chosen first, then every rejected, so that a
    preference loss splits the batch with `chunk(2)`."""
    if rows_per_example == 1:
        return [rows[i] for i in examples]
    return [rows[i * rows_per_example + j] for j in range(rows_per_example) for i in examples]


@dataclass(frozen=True)
class EpochSampler:
    """Which sequences each rank reads at each optimizer step: a pure function of the step.

    Every epoch is a permutation seeded by (seed, epoch) alone; an epoch holds
    `steps_per_epoch` whole optimizer steps (the remainder is dropped). Step `s` reads the
    global sample indices `[s * per_step, (s + 1) * per_step)` of the epoch's order, and
    only then are they dealt out to ranks and micro-batches. So the samples of a step depend
    on the global batch, never on how it is split: a resume after a change of world size,
    micro-batch or accumulation continues the exact sample stream, without storing an
    iterator.
    """

    size: int
    world: int
    micro: int
    accumulation: int
    seed: int

    @property
    def per_step(self) -> int:
        return self.world * self.micro * self.accumulation

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.per_step

    def permutation(self, epoch: int) -> list[int]:
        import random

        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def micro_batches(self, step: int, rank: int) -> list[list[int]]:
        """Indices of the `accumulation` micro-batches rank `rank` reads for 0-based `step`."""
        batch = self.global_batch(step)
        out = []
        for a in range(self.accumulation):
            start = (a * self.world + rank) * self.micro
            out.append(batch[start : start + self.micro])
        return out

    def global_batch(self, step: int) -> list[int]:
        """The sequences of 0-based `step` on all ranks together, in global sample order."""
        epoch, within = divmod(step, self.steps_per_epoch)
        base = within * self.per_step
        return self.permutation(epoch)[base : base + self.per_step]

    def position(self, step: int) -> dict[str, int]:
        epoch, within = divmod(step, self.steps_per_epoch)
        return {"epoch": epoch, "step_in_epoch": within, "sample_offset": within * self.per_step}

"""Rank-independent data order.

The global sample order of epoch `e` is `randperm(num_samples)` seeded with `(seed, e)`
only. Each loop step takes the next `batch_size x dp_world_size` global indices (an
epoch holds `num_samples // global_batch` steps; the remainder is dropped) and dp rank `r`
gets the slice `[r * batch_size, (r + 1) * batch_size)`. A checkpoint records the position
(epoch, samples of it consumed), and resume is exact whenever `batch_size x dp_world_size`
is unchanged, whatever the topology.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .errors import DatasetError


@dataclass(frozen=True)
class DataPosition:
    epoch: int
    step_in_epoch: int


def epoch_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_samples, generator=gen)


def steps_per_epoch(num_samples: int, global_batch: int) -> int:
    if num_samples < global_batch:
        raise DatasetError(
            f"--batch_size: the dataset has {num_samples} frames, fewer than one global batch "
            f"(batch_size x dp_world_size = {global_batch}); lower --batch_size"
        )
    return num_samples // global_batch


def resume_position(
    step: int, old_global_batch: int, new_global_batch: int, num_samples: int, saved: tuple[int, int] | None = None
) -> tuple[DataPosition, bool]:
    """Where a checkpoint of a run with `old_global_batch` continues; the bool says if exact.

    `saved` is the checkpoint's (epoch, samples of that epoch consumed): right whatever global
    batches the run used before. Without it (checkpoints before training_step.json version 2)
    the position is derived from loop step `step`, which assumes `old_global_batch` from step 0.
    With the same global batch the position is exact. Otherwise it keeps the epoch and
    rounds the offset inside it up to the next step of the new global batch.
    """
    if saved is None:
        epoch, old_step = divmod(step, steps_per_epoch(num_samples, old_global_batch))
        saved = (epoch, old_step * old_global_batch)
    epoch, offset = saved
    exact = old_global_batch == new_global_batch
    new_step = offset // new_global_batch if exact else -(-offset // new_global_batch)
    if new_step >= steps_per_epoch(num_samples, new_global_batch):
        # past the last whole batch (with the same batch, only in a smaller dataset than the saved one's)
        return DataPosition(epoch + 1, 0), False
    return DataPosition(epoch, new_step), exact


class GlobalOrderBatchSampler(torch.utils.data.Sampler[list[Any]]):
    """Yields this rank's index lists, one per loop step, forever, from `start`.

    With `numbered=True` each entry is `(index, sample)`, `sample` being its place in the run's
    global order (`epoch x num_samples + position in the epoch`): the same on every rank and
    after a resume, new in every epoch (what seeds a sample's image augmentation)."""

    def __init__(self, num_samples: int, *, seed: int, batch_size: int, dp_world_size: int, dp_rank: int, start: DataPosition,
                 numbered: bool = False) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.batch_size = batch_size
        self.global_batch = batch_size * dp_world_size
        self.dp_rank = dp_rank
        self.start = start
        self.per_epoch = steps_per_epoch(num_samples, self.global_batch)
        self.numbered = numbered

    def __iter__(self) -> Iterator[list[Any]]:
        epoch, step = self.start.epoch, self.start.step_in_epoch
        while True:
            order = epoch_order(self.num_samples, self.seed, epoch)
            for s in range(step, self.per_epoch):
                lo = s * self.global_batch + self.dp_rank * self.batch_size
                indices = order[lo : lo + self.batch_size].tolist()
                if self.numbered:
                    first = epoch * self.num_samples + lo
                    yield [(index, first + j) for j, index in enumerate(indices)]
                else:
                    yield indices
            epoch, step = epoch + 1, 0

    def __len__(self) -> int:
        return self.per_epoch

    def position_after(self, steps_taken: int) -> DataPosition:
        """Where the batch produced after `steps_taken` batches from the start comes from."""
        epochs, step = divmod(self.start.step_in_epoch + steps_taken, self.per_epoch)
        return DataPosition(self.start.epoch + epochs, step)

    def epoch_after(self, steps_taken: int) -> int:
        """The epoch of the batch produced after `steps_taken` batches from the start."""
        return self.position_after(steps_taken).epoch

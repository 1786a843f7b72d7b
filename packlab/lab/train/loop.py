"""The training loop: a DataLoader over a packed dataset, the model, and a record per step.

Per step it records the loss, how many positions the loss mask kept, the **data wait** (the
time blocked in ``next(loader)``: reading, collating and, with workers, waiting for them), the
**compute** time (forward, backward, optimizer step), the resident memory of this process and
of its DataLoader workers, and a digest of the batch (equal digests: equal batches).

Resumable from a consumed-samples count, as Megatron's samplers are: :class:`ResumeSampler`
replays the base sampler's order epoch after epoch and starts at sample ``consumed_samples``;
a checkpoint (:func:`save_checkpoint`) holds the model, the optimizer and that count. With no
dropout and deterministic algorithms, the resumed run computes exactly what the uninterrupted
one would have.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from packlab.errors import PacklabError
from packlab.lab.measure.memory import read_status
from packlab.lab.train.batch import batch_digest, thd_view
from packlab.lab.train.model import (
    ModelConfig,
    TinyDecoder,
    build_model,
    deterministic,
    masked_loss,
)


class ResumeSampler:
    """``count`` indices of ``base``'s order, epoch after epoch, starting at sample ``start``
    (epoch ``start // len(base)``, position ``start % len(base)``); ``set_epoch`` is called on
    ``base`` for every epoch it enters."""

    def __init__(self, base: Any, *, start: int = 0, count: int) -> None:
        if len(base) <= 0:
            raise PacklabError("the sampler has no items to train on")
        if start < 0 or count < 0:
            raise PacklabError(f"start {start} and count {count} must be >= 0")
        self.base = base
        self.start = int(start)
        self.count = int(count)

    def __iter__(self) -> Iterator[int]:
        size = len(self.base)
        epoch, position = divmod(self.start, size)
        left = self.count
        while left > 0:
            if hasattr(self.base, "set_epoch"):
                self.base.set_epoch(epoch)
            order = list(self.base)[position:]
            yield from order[:left]
            left -= min(left, len(order))
            epoch, position = epoch + 1, 0

    def __len__(self) -> int:
        return self.count


@dataclass
class TrainRun:
    """What a run left: its per-step records, the model and optimizer, and its position."""

    records: list[dict[str, Any]]
    model: TinyDecoder
    optimizer: torch.optim.Optimizer
    step: int
    consumed_samples: int
    checkpoints: dict[int, Path] = field(default_factory=dict)

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records]


def workers_rss() -> int:
    """Resident bytes of this process's child processes (the DataLoader workers)."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # a worker that just exited
            continue
    return total


def save_checkpoint(path: str | os.PathLike[str], run_model: TinyDecoder,
                    optimizer: torch.optim.Optimizer, *, step: int, consumed_samples: int
                    ) -> Path:
    """The model, the optimizer, the step and the consumed-samples count, in one file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": run_model.state_dict(), "optimizer": optimizer.state_dict(),
                "config": run_model.config.to_dict(), "step": step,
                "consumed_samples": consumed_samples}, path)
    return path


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        return torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        reason = str(exc).splitlines()[0][:200]
        raise PacklabError(f"{path}: not a readable training checkpoint ({reason})") from None


def train(
    dataset: Any,
    config: ModelConfig,
    *,
    steps: int,
    batch_size: int,
    sampler: Any,
    collate_fn: Any,
    num_workers: int = 0,
    lr: float = 1e-3,
    threads: int = 1,
    resume: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    checkpoint_steps: Mapping[int, str | os.PathLike[str]] | None = None,
) -> TrainRun:
    """Train ``steps`` steps over ``DataLoader(dataset, sampler=..., collate_fn=...,
    num_workers=...)``; from a fresh model, or from ``resume`` (a checkpoint: its model,
    optimizer, step, and the data from its consumed-samples count on).
    ``checkpoint_steps`` maps a step number to where to save a checkpoint after it."""
    state = load_checkpoint(resume) if isinstance(resume, str | os.PathLike) else resume
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    step, consumed = 0, 0
    if state is not None:
        if dict(state["config"]) != config.to_dict():
            raise PacklabError(f"the checkpoint's model {dict(state['config'])} is not "
                               f"{config.to_dict()}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, consumed = int(state["step"]), int(state["consumed_samples"])
    order = ResumeSampler(sampler, start=consumed, count=steps * batch_size)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=order, collate_fn=collate_fn,
                        num_workers=num_workers)
    run = TrainRun([], model, optimizer, step, consumed)
    with deterministic(threads):
        batches = iter(loader)
        for _ in range(steps):
            began = time.perf_counter()
            batch = next(batches)
            fetched = time.perf_counter()
            view = thd_view(batch)
            loss, kept = masked_loss(model(view), view)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done = time.perf_counter()
            run.step += 1
            run.consumed_samples += int(view.tokens.shape[0])
            run.records.append({
                "step": run.step, "consumed_samples": run.consumed_samples,
                "loss": float(loss.detach()), "loss_tokens": kept,
                "tokens": int(np.asarray(batch["token_count"]).sum()),
                "wait_seconds": fetched - began, "compute_seconds": done - fetched,
                "rss_bytes": read_status()["VmRSS"],
                "workers_rss_bytes": workers_rss() if num_workers else 0,
                "batch_digest": batch_digest(batch),
            })
            if checkpoint_steps and run.step in checkpoint_steps:
                run.checkpoints[run.step] = save_checkpoint(
                    checkpoint_steps[run.step], model, optimizer, step=run.step,
                    consumed_samples=run.consumed_samples)
        del batches
    return run

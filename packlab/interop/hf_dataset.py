"""A packlab dataset as TRL's pre-packed, padding-free training examples, without re-packing.

TRL's ``SFTTrainer`` packs with ``pack_dataset`` into rows of ``{"input_ids", "labels",
"seq_lengths"}`` and its padding-free collator (``DataCollatorForLanguageModeling(
padding_free=True)``) flattens a batch of such rows, restarting ``position_ids`` at every
``seq_lengths`` boundary. A packlab bin is such a row already: :class:`PrepackedExamples`
serves each bin as one (its labels token-aligned, :func:`packlab.interop.hf_batch.token_labels`),
and it is map-style (``len`` and ``[i]``, iterable, picklable for DataLoader workers), all a
``torch`` DataLoader or transformers' ``Trainer`` asks. TRL's ``SFTTrainer`` takes only a
``datasets`` dataset: :func:`hf_dataset` gives it one (in memory, or streamed bin by bin), and
``SFTTrainer(train_dataset=hf_dataset(dataset), args=SFTConfig(padding_free=True,
max_length=None, dataset_kwargs={"skip_prepare_dataset": True}))`` trains on packlab's bins as
they are stored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from packlab.errors import PacklabError
from packlab.interop.hf_batch import token_labels
from packlab.interop.items import item_bounds

#: the columns TRL's padding-free collator reads of a pre-packed example
COLUMNS = ("input_ids", "labels", "seq_lengths")


class ItemSource(Protocol):
    """What :class:`PrepackedExamples` wraps: a packlab dataset, or anything serving its items."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Mapping[str, Any]: ...


def prepacked_example(item: Mapping[str, Any]) -> dict[str, Any]:
    """One packlab item as TRL's pre-packed row: ``input_ids`` and token-aligned ``labels``
    (int64 arrays, ``-100`` where nothing is trained) and ``seq_lengths`` (a list of ints)."""
    ids, bounds = item_bounds(item)
    return {"input_ids": ids.astype(np.int64), "labels": token_labels(item),
            "seq_lengths": np.diff(bounds).tolist()}


class PrepackedExamples:
    """``dataset`` (a packlab dataset) served as TRL's pre-packed rows, one per bin."""

    def __init__(self, dataset: ItemSource) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"bin {index} out of range [0, {len(self)})")
        return prepacked_example(self.dataset[index % len(self)])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))


def hf_dataset(dataset: ItemSource, *, streaming: bool = False,
               order: np.ndarray | None = None) -> Any:
    """The pre-packed rows as a ``datasets`` dataset, which TRL's ``SFTTrainer`` requires.

    By default a ``datasets.Dataset`` holding every row in memory (Arrow lists of int64; the
    trainer shuffles it). With ``streaming=True`` a ``datasets.IterableDataset`` that reads each
    bin from the packlab dataset when it is reached, in ``order`` (bin indices; default: stored
    order), for shards larger than memory (the trainer then needs ``max_steps``). ``datasets``
    is imported here.
    """
    try:
        import datasets
    except ImportError:
        raise PacklabError("hf_dataset needs the datasets package, which is not installed"
                           ) from None
    examples = PrepackedExamples(dataset)
    if streaming:
        indices = np.arange(len(examples)) if order is None else np.asarray(order, np.int64)
        features = datasets.Features({name: datasets.Sequence(datasets.Value("int64"))
                                      for name in COLUMNS})
        # an array, not a list: datasets would split a list in gen_kwargs into shards
        return datasets.IterableDataset.from_generator(
            _rows, features=features, gen_kwargs={"examples": examples, "order": indices})
    rows = list(examples)
    columns = {}
    for name in COLUMNS:
        values = [np.asarray(row[name], dtype=np.int64) for row in rows]
        offsets = np.concatenate(([0], np.cumsum([v.shape[0] for v in values])))
        if offsets[-1] >= 2**31:
            raise PacklabError(f"hf_dataset: {int(offsets[-1]):,} tokens do not fit one Arrow "
                               "list column in memory; use streaming=True")
        columns[name] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                                 pa.array(np.concatenate(values)))
    return datasets.Dataset(pa.table(columns))


def _rows(examples: PrepackedExamples, order: np.ndarray) -> Iterator[dict[str, Any]]:
    for index in order.tolist():
        yield examples[index]

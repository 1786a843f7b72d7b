"""Train from any packlab output in a Megatron-Bridge recipe: ``cfg.dataset =
PacklabDatasetProvider(path=..., seq_length=...)``.

Megatron-Bridge 0.6.2 plugs a custom dataset into a recipe through its ``DatasetProvider``
contract (``megatron/bridge/data/base.py``; marked deprecated there, and still how a custom
dataset plugs in): a dataclass carrying the loader settings (``DataloaderConfig``:
``dataloader_type``, ``num_workers``, ``drop_last``, ...) whose ``build_datasets(context)``
returns the train, validation and test datasets. Bridge's ``get_dataset_provider`` adapts any
instance (``megatron/bridge/data/utils.py``) and its ``build_train_valid_test_data_loaders``
(``loaders.py``) wraps each dataset in its samplers (``single``, ``cyclic``, ``batch``) with
the dataset's ``collate_fn``.

:class:`PacklabDatasetProvider` names its data as every packlab entry point does
(:mod:`packlab.sources.resolve`: a shard, a directory of shards, a glob, an output layout, a
run folder; local or ``s3://``) and opens it with :func:`packlab.sources.open_dataset` (any
format; object storage read in place where the format allows it, else downloaded and verified
first). A layout (or a run folder) gives its splits by name (``splits``: train, validation,
test; a split it lacks, or one no sequence fell into, is ``None``); any other path is the
training data, ``valid_path`` / ``test_path`` the others. Each dataset is a
:class:`~packlab.interop.bridge_dataset.BridgeSFTDataset`: Bridge 0.6.2's packed batch as its
``collate_fn``, negative indices as loss-masked padding, ``max_train_samples`` mapped as
Bridge maps ``max_num_samples``.

Megatron-Bridge is imported here, by the class this module builds (it is no dependency of
packlab's core, which never imports this module).

What Bridge 0.6.2's builder allows a custom provider: ``dataloader_type="batch"`` with
``drop_last=False`` only when the training length is a multiple of the global batch size
(it pads incomplete global batches with negative indices for its own ``GPTSFTDatasetConfig``
alone). ``max_train_samples="recipe"`` (``train_iters * global_batch_size`` samples) always is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from packlab.errors import PacklabError
from packlab.interop.bridge_dataset import BridgeSFTDataset
from packlab.interop.bridge_metadata import read_pack_metadata
from packlab.loading.collate import Collator
from packlab.sources import open_dataset
from packlab.sources.resolve import resolve_source

try:
    from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
except ImportError as exc:  # one clear line instead of a missing name deep in a recipe
    raise ImportError(f"packlab.sources.bridge_provider needs Megatron-Bridge "
                      f"(megatron.bridge.data.base): {exc}") from exc

#: the resolver's kinds whose shards carry split names (a layout root, a run folder)
SPLIT_KINDS = ("layout", "run")


@dataclass(kw_only=True)
class PacklabDatasetProvider(DatasetProvider):
    """Bridge's datasets over a packlab output (see the module docstring).

    ``seq_length``: the batch's row width cap (Bridge's ``max_seq_length``, the model's
    sequence length); a packlab bin of ``P`` tokens has at most ``P - 1`` positions, so the
    data's pack size must be at most ``seq_length + 1``. ``seed`` seeds the samples mapping and,
    read by Bridge's builder, the ``batch`` sampler's shuffle. ``max_train_samples``: ``None``
    (every bin once an epoch), a number, or ``"recipe"`` (the training samples the recipe asks
    for, ``DatasetBuildContext.train_samples``). ``eos_id``: default the build context's
    tokenizer's. The batch options are Bridge's (``answer_only_loss``, ``pad_to_max_length``,
    ``pad_seq_length_to_mult``, ``pad_seq_to_mult``, ``pad_cu_seqlens`` with ``pack_metadata``:
    the path of the ``pack_metadata.json`` ``packlab pack`` writes, or its list). ``verify``
    checks every bin's checksum as it is read; ``cache_dir`` is where shards downloaded from
    object storage are kept.
    """

    path: str
    seq_length: int
    valid_path: str | None = None
    test_path: str | None = None
    splits: tuple[str, str, str] = ("train", "valid", "test")
    seed: int = 1234
    max_train_samples: int | Literal["recipe"] | None = None
    eos_id: int | None = None
    answer_only_loss: bool = True
    pad_to_max_length: bool = False
    pad_seq_length_to_mult: int = 16
    pad_seq_to_mult: int = 1
    pad_cu_seqlens: bool = False
    pack_metadata: str | list[dict[str, Any]] | None = None
    verify: bool = False
    cache_dir: str | None = None
    dataloader_type: Literal["single", "cyclic", "batch", "external"] | None = "batch"

    def finalize(self) -> None:
        """Bridge's loader settings finalized, then this provider's checked."""
        super().finalize()
        self.check()

    def check(self) -> None:
        """Settings that cannot work, refused before any data is opened."""
        if self.seq_length < 1:
            raise PacklabError(f"{self.path}: seq_length must be >= 1, got {self.seq_length}")
        samples = self.max_train_samples
        if samples is not None and samples != "recipe" and (
                isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
            raise PacklabError(f"{self.path}: max_train_samples must be None, 'recipe' or a "
                               f"number >= 1, got {samples!r}")
        if self.pad_cu_seqlens and (not self.pad_to_max_length or self.pack_metadata is None):
            raise PacklabError(f"{self.path}: pad_cu_seqlens needs pad_to_max_length=True and "
                               "pack_metadata= (the pack_metadata.json packlab pack writes "
                               "beside its output, or its list)")

    def build_datasets(self, context: DatasetBuildContext
                       ) -> tuple[BridgeSFTDataset | None, BridgeSFTDataset | None,
                                  BridgeSFTDataset | None]:
        """Train, validation and test datasets (``None`` where there is no such data)."""
        self.check()
        collate_fn = self.collate_fn(context)
        train, valid, test = self.sources()
        samples = context.train_samples if self.max_train_samples == "recipe" \
            else self.max_train_samples
        return (self._dataset(train, collate_fn, samples),
                self._dataset(valid, collate_fn, None), self._dataset(test, collate_fn, None))

    def sources(self) -> list[tuple[str, str | None] | None]:
        """``(path, split)`` of the train, validation and test data (``None``: no such data)."""
        source = resolve_source(self.path)
        if source.kind not in SPLIT_KINDS or not source.splits:
            return [(self.path, None), *[(p, None) if p is not None else None
                                         for p in (self.valid_path, self.test_path)]]
        if self.valid_path is not None or self.test_path is not None:
            raise PacklabError(f"{self.path}: holds splits ({', '.join(source.splits)}); "
                               "valid_path and test_path are for a path without splits")
        if self.splits[0] not in source.splits:
            raise PacklabError(f"{self.path}: no training split {self.splits[0]!r} (splits "
                               f"here: {', '.join(source.splits)})")
        missing = [name for name in self.splits if name not in source.splits]
        unread = [name for name in source.splits if name not in self.splits]
        if missing and unread:  # a hole where a misspelt or renamed split sits
            raise PacklabError(f"{self.path}: no split {missing[0]!r}, and its split "
                               f"{unread[0]!r} is read by none of train, validation, test "
                               f"(splits={self.splits!r}: pass splits= to name the three)")
        return [(self.path, name) if name in source.splits else None for name in self.splits]

    def collate_fn(self, context: DatasetBuildContext) -> Collator:
        """Bridge 0.6.2's packed batch with this provider's options."""
        eos_id = self.eos_id if self.eos_id is not None else getattr(context.tokenizer,
                                                                     "eos_id", None)
        if eos_id is None:
            raise PacklabError(f"{self.path}: no eos_id (give eos_id=, or a tokenizer with "
                               "eos_id in Bridge's build context)")
        metadata = self.pack_metadata
        if self.pad_cu_seqlens and not isinstance(metadata, list):
            metadata = read_pack_metadata(metadata)  # read once, not per batch
        return Collator(style="megatron_bridge", max_seq_length=self.seq_length,
                        eos_id=int(eos_id), pad_to_max_length=self.pad_to_max_length,
                        pad_seq_length_to_mult=self.pad_seq_length_to_mult,
                        pad_seq_to_mult=self.pad_seq_to_mult, pad_cu_seqlens=self.pad_cu_seqlens,
                        pack_metadata=metadata if self.pad_cu_seqlens else None,
                        answer_only_loss=self.answer_only_loss)

    def _dataset(self, source: tuple[str, str | None] | None, collate_fn: Collator,
                 max_num_samples: int | None) -> BridgeSFTDataset | None:
        if source is None:
            return None
        path, split = source
        options: dict[str, Any] = {"verify": True} if self.verify else {}
        if self.cache_dir is not None:
            options["cache_dir"] = self.cache_dir
        dataset = open_dataset(path, split=split, **options)
        if dataset.pack_size - 1 > self.seq_length:
            where = f"{path} (split {split})" if split else path
            raise PacklabError(f"{where}: bins of up to {dataset.pack_size} tokens "
                               f"({dataset.pack_size - 1} positions) do not fit seq_length "
                               f"{self.seq_length}")
        return BridgeSFTDataset(dataset, collate_fn=collate_fn, max_num_samples=max_num_samples,
                                seed=self.seed)

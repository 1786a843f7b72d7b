"""Reading an output layout: which shards make a split, from ``splits/`` or from ``blend.json``.

A trainer configured with ``nano3_packed_sft_dir: OUT`` reads ``OUT/splits/train/`` and
``OUT/splits/valid/``; :func:`split_source` resolves a split the same way. Where the symlinks
are absent (a copy to object storage, a filesystem without links) the split's shard list comes
from ``blend.json``, whose paths are relative to ``OUT``.

``blend.json`` (version ``packlab_blend_v1``), abridged::

    {"version": "packlab_blend_v1", "packlab_version": "0.1.0", "run_hash": "3f0c...",
     "run_dir": "runs/3f0c...", "format": "parquet",
     "packing": {"format": "parquet", "pack_size": 4096, "algorithm": "first_fit_shuffle",
                 "seed": 0, "overlong": "truncate", "bins_per_shard": 8192, ...},
     "split_rule": {"by": "sequence", "key": "seeded content hash", "seed": 0,
                    "fractions": {"train": 0.98, "valid": 0.01, "test": 0.01}},
     "inputs": [{"name": "chat", "spool": "/data/chat_spool", "weight": 0.7,
                 "manifest": {...the spool's record...}, "config_hashes": {"train": "..."}}],
     "splits": {"train": {"links": ["chat__shard_000000.parquet", ...],
                          "shards": ["runs/3f0c.../datasets/chat/9a1e.../shard_000000.parquet"],
                          "shard_bins": [8192, ...], "weights": [0.41, ...], "num_bins": 123, "num_tokens": 456,
                          "num_sequences": 789, "datasets": [...]}}}

A split's ``weights`` (one per shard, summing to 1) are the probability that a sampled bin
comes from that shard: the dataset's blend weight times the shard's share of that dataset's
bins in the split (:func:`weighted_indices` draws bin indices by them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import FormatError, PacklabError
from packlab.loading.discovery import ShardRef, find_shards
from packlab.storage.files import parse_versioned_json
from packlab.storage.location import Location, as_location

BLEND_FILE = "blend.json"
BLEND_VERSION = "packlab_blend_v1"
SPLITS_DIR = "splits"
RUNS_DIR = "runs"
LINK_SEPARATOR = "__"  # link names of several datasets: {name}__shard_000000.parquet
# nano3_packed_sft_dir's keys and the split each resolves to
NANO3_KEYS = {"packed_train_data_path": "train", "packed_val_data_path": "valid",
              "packed_test_data_path": "test"}


def read_blend(root: str | os.PathLike[str] | Location) -> dict[str, Any] | None:
    """``root/blend.json`` (a local folder or a prefix on object storage), checked; None when
    there is none."""
    path = as_location(root) / BLEND_FILE
    if not path.is_file():
        return None
    return parse_blend(path.read_bytes(), path)


def parse_blend(data: str | bytes, where: object) -> dict[str, Any]:
    """A ``blend.json`` read from anywhere (a local file, an object store), checked."""
    return check_blend(parse_versioned_json(data, where, version=BLEND_VERSION,
                                            kind="blend file"), where)


def check_blend(blend: dict[str, Any], where: object) -> dict[str, Any]:
    """What a blend file holds beyond its version: a ``splits`` object, and a finished run
    (``state`` absent or ``"complete"``: a layout being written is refused, see
    :mod:`packlab.pipeline.layout.build`)."""
    if not isinstance(blend.get("splits"), dict):
        raise FormatError(f"{where}: no 'splits' object")
    state = blend.get("state", "complete")
    if state == "writing":
        raise FormatError(f"{where}: incomplete output layout (run {blend.get('run_hash')} was "
                          "interrupted or is running: run the same `packlab pack` again to "
                          "finish it)")
    if state != "complete":
        raise FormatError(f"{where}: state {state!r} is not 'writing' or 'complete'")
    return blend


def writing_blend(blend: dict[str, Any]) -> dict[str, Any]:
    """What ``blend.json`` says while a run is being written (before its first shard, or while
    a layout is uploaded): the run and its inputs, ``state`` writing, no splits yet. Every
    reader refuses the layout until the finished blend replaces it."""
    keep = ("version", "packlab_version", "run_hash", "run_dir", "format", "packing",
            "split_rule", "inputs")
    return {**{k: blend[k] for k in keep if k in blend}, "state": "writing", "splits": {}}


def blend_format(blend: dict[str, Any]) -> str | None:
    """The format every shard of a blend has, when it says (None: find out per shard)."""
    return blend.get("format") or blend.get("packing", {}).get("format")


def is_layout(root: str | os.PathLike[str] | Location) -> bool:
    """Whether ``root`` is an output layout (a ``splits/`` folder or a ``blend.json``)."""
    p = as_location(root)
    return (p / BLEND_FILE).is_file() or (p / SPLITS_DIR).is_dir()


def known_splits(root: str | os.PathLike[str] | Location) -> list[str]:
    """The splits of a layout, from ``splits/`` (or ``blend.json`` without it: on object
    storage, always), in order."""
    p = as_location(root)
    blend = read_blend(p)
    if (p / SPLITS_DIR).is_dir():
        on_disk = {c.name for c in (p / SPLITS_DIR).iterdir()
                   if c.is_dir() and not c.name.startswith(".")}
        ordered = [s for s in (blend or {}).get("splits", {}) if s in on_disk]
        return ordered + sorted(on_disk - set(ordered))
    return list(blend["splits"]) if blend is not None else []


def split_source(root: str | os.PathLike[str], split: str) -> Path | list[Path]:
    """``root/splits/<split>/``, or the split's shard paths from ``blend.json`` without it.

    An unknown split lists the known ones; an empty split (no sequence fell into it) says so.
    """
    p = Path(root)
    splits = p / SPLITS_DIR
    blend = read_blend(p)
    if not splits.is_dir() and blend is None:
        raise FormatError(f"{p}: no splits/ folder (and no {BLEND_FILE}), so split {split!r} "
                          "cannot be resolved")
    known = known_splits(p)
    if split not in known:
        raise FormatError(f"{p}: no split {split!r}; splits here: {', '.join(known) or 'none'}")
    if splits.is_dir():
        target = splits / split
        if not any(not c.name.startswith(".") for c in target.iterdir()):
            raise FormatError(f"{target}: split {split!r} is empty (no sequence fell into it)")
        return target
    assert blend is not None
    shards = blend["splits"][split].get("shards", [])
    if not shards:
        raise FormatError(f"{p / BLEND_FILE}: split {split!r} is empty (no sequence fell into it)")
    return [p / s for s in shards]


def layout_shards(root: str | os.PathLike[str] | Location, *, format: str | None = None,
                  splits: list[str] | None = None) -> dict[str, list[tuple[str, ShardRef]]]:
    """The shards of every split (or of ``splits``) as ``(name, shard)``, in the order
    :func:`packlab.open_dataset` reads them: the links under ``splits/<split>/`` by their
    names, or, without the folder (a copy on object storage, a filesystem without links), the
    blend's shard paths named by its ``links`` (their format the blend's, when it says)."""
    p = as_location(root)
    blend = read_blend(p)
    linked = (p / SPLITS_DIR).is_dir()
    out: dict[str, list[tuple[str, ShardRef]]] = {}
    for split in splits if splits is not None else known_splits(p):
        if linked:
            target = p / SPLITS_DIR / split
            has = target.is_dir() and any(True for _ in target.iterdir())
            out[split] = [(Path(str(r[0])).name, r) for r in find_shards(target, format=format)
                          ] if has else []
            continue
        assert blend is not None
        entry = blend["splits"][split]
        kind = blend_format(blend)
        if format is not None and kind is not None and format != kind:
            raise FormatError(f"{p}: a {kind} layout, not {format}")
        paths = [p / s for s in entry.get("shards", [])]
        refs = ([ShardRef(s, kind) for s in paths] if kind is not None
                else find_shards(paths, format=format))
        names = list(entry.get("links", []))
        out[split] = [(names[k] if k < len(names) else Path(str(r[0])).name, r)
                      for k, r in enumerate(refs)]
    return out


def nano3_paths(root: str | os.PathLike[str]) -> dict[str, str]:
    """What ``nano3_packed_sft_dir: ROOT`` resolves to: ``packed_train_data_path`` etc., for
    the splits this layout has (directories, with the trailing slash the seed shows)."""
    p = Path(root)
    have = set(known_splits(p))
    return {key: f"{p / SPLITS_DIR / split}/" for key, split in NANO3_KEYS.items() if split in have}


def weighted_indices(root: str | os.PathLike[str], split: str, num_samples: int, *,
                     seed: int = 0) -> np.ndarray:
    """``num_samples`` bin indices into ``open_dataset(root, split=split)``, drawn with the
    blend's per-shard weights (with replacement), deterministic for ``seed``.

    Use it as a DataLoader sampler to train on the blend rather than on the concatenation.
    """
    blend = read_blend(root)
    if blend is None:
        raise FormatError(f"{root}: no {BLEND_FILE}: no blend weights to sample with")
    if split not in blend["splits"]:
        raise FormatError(f"{root}: no split {split!r}; splits here: "
                          f"{', '.join(blend['splits']) or 'none'}")
    entry = blend["splits"][split]
    counts = np.asarray(entry.get("shard_bins", []), dtype=np.int64)
    weights = np.asarray(entry.get("weights", []), dtype=np.float64)
    if counts.size == 0 or counts.shape != weights.shape:
        raise FormatError(f"{root}: split {split!r} has no shards to sample from")
    if num_samples < 0:
        raise PacklabError(f"num_samples must be >= 0, got {num_samples}")
    rng = np.random.default_rng(seed)
    shard = rng.choice(counts.shape[0], size=num_samples, p=weights / weights.sum())
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return first[shard] + (rng.random(num_samples) * counts[shard]).astype(np.int64)

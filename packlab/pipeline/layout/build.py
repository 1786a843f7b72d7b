"""Writing an output layout: spools -> splits -> packed shards -> links -> blend.json.

::

    OUT/
      blend.json                               written last: the layout's commit point
      splits/train/shard_000000.parquet  ->  ../../runs/<run_hash>/datasets/<name>/<hash>/shard_000000.parquet
      splits/valid/...                         (relative links: OUT can be moved or copied)
      runs/<run_hash>/datasets/<name>/<hash>/  one split of one spool, packed
          shard_000000.parquet
          shard_000000.parquet.receipt.json
          config.json                          what <hash> stands for

``<hash>`` hashes one spool's content (its record's checksums), the packing configuration, the split
rule and the split's name; ``<run_hash>`` hashes every input, name and weight with the
configuration. Sequences are split before packing (:mod:`packlab.pipeline.layout.splits`), then each
split of each spool is packed on its own. With several spools, link names are prefixed by the
dataset name (``chat__shard_000000.parquet``) so they stay unique within a split.

A rerun with the same inputs lands in the same directories and keeps every shard whose receipt
still vouches for it; only missing or damaged shards are written (counted as ``reused`` and
``written``). ``splits/`` is rebuilt in a temporary folder and renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.formats import get_format
from packlab.packing import DEFAULT_ALGORITHM, BinAssignment, pack
from packlab.pipeline.dataset_record import writing_lock
from packlab.pipeline.layout.blend import (
    BLEND_FILE,
    BLEND_VERSION,
    LINK_SEPARATOR,
    RUNS_DIR,
    SPLITS_DIR,
    writing_blend,
)
from packlab.pipeline.layout.hashes import short_hash, spool_identity
from packlab.pipeline.layout.splits import parse_fractions, parse_weights, split_sequences
from packlab.pipeline.receipts import RECEIPT_SUFFIX
from packlab.pipeline.shards import ShardPlan, plan_shards, write_planned
from packlab.spool import SpoolReader
from packlab.storage.files import TMP_MARKER, is_temporary, json_default, remove, staged
from packlab.version import __version__

CONFIG_FILE = "config.json"
SPLIT_RULE = "seeded 64-bit content hash of tokens, mask and positions"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def dataset_names(spools: Sequence[str | os.PathLike[str]],
                  names: str | Sequence[str] | None = None) -> list[str]:
    """One name per spool: given (``--names a,b``) or the spool folder's name, made safe."""
    if names is None:
        picked = [re.sub("_{2,}", "_", _UNSAFE.sub("_", Path(s).resolve().name)).strip("_")
                  or "dataset" for s in spools]
    else:
        picked = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if len(picked) != len(spools):
            raise PacklabError(f"{len(picked)} names for {len(spools)} spools: give one per spool")
        for n in picked:
            if not n or _UNSAFE.search(n) or LINK_SEPARATOR in n:
                raise PacklabError(f"dataset name {n!r}: use letters, digits, '_' or '-' "
                                   f"(no {LINK_SEPARATOR!r})")
    if len(set(picked)) != len(picked):
        twice = next(n for n in picked if picked.count(n) > 1)
        raise PacklabError(f"dataset names {', '.join(picked)} are not unique ({twice!r} "
                           "twice: the same spool given twice, or spools in folders of one "
                           "name): give --names")
    return picked


def build_layout(
    spools: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    format: str,
    pack_size: int,
    splits: str | Mapping[str, float] | None = None,
    weights: str | Sequence[float] | None = None,
    names: str | Sequence[str] | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
    seed: int = 0,
    overlong: str = "truncate",
    bins_per_shard: int = 8192,
    workers: int = 2,
    reuse: bool = True,
    verify: str = "receipt",
    format_options: Mapping[str, Any] | None = None,
    executor: str = "process",
    address: str | None = None,
) -> dict[str, Any]:
    """Pack ``spools`` into the output layout at ``out``; returns what was done (the blend's
    counts plus ``reused`` and ``written`` shard counts)."""
    if not spools:
        raise PacklabError("no spool to pack")
    get_format(format)
    readers = [SpoolReader(s) for s in spools]
    labels = dataset_names(spools, names)
    fractions = parse_fractions(splits)
    blend_weights = parse_weights(weights, len(readers))
    packing = {"format": format, "pack_size": int(pack_size), "algorithm": algorithm,
               "seed": int(seed), "overlong": overlong, "bins_per_shard": int(bins_per_shard),
               "format_options": dict(format_options or {})}
    rule = {"by": "sequence", "key": SPLIT_RULE, "seed": int(seed), "fractions": fractions}
    identities = [spool_identity(r) for r in readers]
    run_hash = short_hash({
        "inputs": [{"name": n, "spool": i, "weight": None if blend_weights is None else w}
                   for n, i, w in zip(labels, identities, blend_weights or labels, strict=True)],
        "packing": packing, "split_rule": rule})
    root = Path(out).absolute()
    root.mkdir(parents=True, exist_ok=True)
    with writing_lock(root):  # one job per layout; what a killed one left is swept
        sweep_temporaries(root, (SPLITS_DIR, BLEND_FILE))
        run_dir = root / RUNS_DIR / run_hash
        parts: list[dict[str, Any]] = []
        plans: list[ShardPlan] = []
        for reader, label, identity in zip(readers, labels, identities, strict=True):
            for split, indices in split_sequences(reader, fractions, seed).items():
                config = {"dataset": label, "split": split, "spool": identity, "packing": packing,
                          "split_rule": rule}
                config_hash = short_hash({k: v for k, v in config.items() if k != "dataset"})
                part = {"name": label, "split": split, "config_hash": config_hash,
                        "dir": run_dir / "datasets" / label / config_hash,
                        "num_sequences": int(indices.shape[0]), "plan": None}
                parts.append(part)
                if indices.shape[0] == 0:
                    continue
                assignment, report = _pack_part(reader, indices, packing, f"{label}/{split}")
                part["plan"] = report.to_dict()
                _write_config(part["dir"], {**config, "config_hash": config_hash})
                plans.append(plan_shards(reader, assignment, part["dir"], format=format,
                                         bins_per_shard=bins_per_shard,
                                         existing="reuse" if reuse else "overwrite", verify=verify,
                                         **packing["format_options"]))
        # a writing blend.json first: until the finished blend replaces it, every reader refuses
        # the layout (and the shard folders' own dataset.json say which shards to expect)
        inputs = [{"name": label, "spool": str(Path(s).resolve()), "weight":
                   None if blend_weights is None else blend_weights[k], "manifest": reader.record,
                   "config_hashes": {p["split"]: p["config_hash"] for p in parts
                                     if p["name"] == label}}
                  for k, (label, s, reader) in enumerate(zip(labels, spools, readers, strict=True))]
        blend = {"version": BLEND_VERSION, "packlab_version": __version__, "run_hash": run_hash,
                 "run_dir": f"{RUNS_DIR}/{run_hash}", "format": format, "packing": packing,
                 "split_rule": rule, "inputs": inputs}
        _write_json(root / BLEND_FILE, writing_blend({**blend, "splits": {}}))
        receipts = iter(write_planned(plans, workers, desc=f"write {format}", executor=executor,
                                      address=address))
        for part in parts:
            part["receipts"] = next(receipts) if part["plan"] is not None else []
        splits_entry = _splits_entry(root, fractions, parts, labels, blend_weights)
        _publish_links(root, splits_entry)
        blend = {**blend, "splits": splits_entry}
        _write_json(root / BLEND_FILE, blend)  # last: the layout's commit point
        return _summary(root, blend, parts)


def _pack_part(reader: SpoolReader, indices: np.ndarray, packing: dict[str, Any], where: str
               ) -> tuple[BinAssignment, Any]:
    """Pack one split of one spool; sequence numbers mapped back to the spool's."""
    try:
        local, report = pack(reader.lengths[indices], packing["pack_size"],
                             algorithm=packing["algorithm"], seed=packing["seed"],
                             overlong=packing["overlong"])
    except PacklabError as exc:
        raise PacklabError(f"{where}: {exc}") from None
    return BinAssignment(local.bin_offsets, indices[local.seq_indices], local.pack_size,
                         local.overlong), report


def _splits_entry(root: Path, fractions: Mapping[str, float], parts: list[dict[str, Any]],
                  labels: list[str], blend_weights: list[float] | None) -> dict[str, Any]:
    """Per split: links, shards (relative to OUT), per-shard bins and weights, datasets."""
    prefix = len(labels) > 1
    out: dict[str, Any] = {}
    for split in fractions:
        mine = [p for p in parts if p["split"] == split and p["receipts"]]
        bins = {p["name"]: sum(r["num_bins"] for r in p["receipts"]) for p in mine}
        if blend_weights is None:
            raw = {name: float(n) for name, n in bins.items()}
        else:
            raw = {p["name"]: blend_weights[labels.index(p["name"])] for p in mine}
        total = sum(raw.values()) or 1.0
        rows = []
        for p in mine:
            for r in p["receipts"]:
                link = f"{p['name']}{LINK_SEPARATOR}{r['shard']}" if prefix else r["shard"]
                share = raw[p["name"]] / total * r["num_bins"] / max(bins[p["name"]], 1)
                rows.append((link, (p["dir"] / r["shard"]).relative_to(root).as_posix(),
                             int(r["num_bins"]), share))
        rows.sort()
        every = [p for p in parts if p["split"] == split]
        out[split] = {
            "links": [r[0] for r in rows],
            "shards": [r[1] for r in rows],
            "shard_bins": [r[2] for r in rows],
            "weights": [r[3] for r in rows],
            "num_shards": len(rows),
            "num_bins": sum(r[2] for r in rows),
            "num_tokens": sum(int(x["num_tokens"]) for p in mine for x in p["receipts"]),
            "num_sequences": sum(_packed(p) for p in every),
            "dropped_sequences": sum(p["num_sequences"] - _packed(p) for p in every),
            "datasets": [
                {"name": p["name"], "weight": raw.get(p["name"], 0.0) / total,
                 "config_hash": p["config_hash"], "dir": p["dir"].relative_to(root).as_posix(),
                 "num_sequences": _packed(p),
                 "dropped_sequences": p["num_sequences"] - _packed(p),
                 "num_bins": bins.get(p["name"], 0),
                 "packing": _without_timing(p["plan"])}
                for p in every
            ],
        }
    return out


def _without_timing(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """A packing report as ``blend.json`` keeps it: no wall time, so the same run writes the
    same bytes (a resumed run is byte for byte an uninterrupted one)."""
    return None if plan is None else {k: v for k, v in plan.items() if k != "seconds"}


def sweep_temporaries(folder: Path, names: Sequence[str]) -> list[str]:
    """Remove hidden temporaries of ``names`` in ``folder`` (``.splits.tmp-<pid>-<rand>``):
    what a killed run left. Called with the folder's lock held."""
    gone = []
    for entry in folder.iterdir() if folder.is_dir() else []:
        if is_temporary(entry) and entry.name[1:].split(TMP_MARKER, 1)[0] in names:
            remove(entry)
            gone.append(entry.name)
    return gone


def _packed(part: dict[str, Any]) -> int:
    """Sequences of a part that landed in bins (dropped over-long ones are not packed)."""
    plan = part["plan"]
    return 0 if plan is None else int(plan["num_sequences"]) - int(plan["dropped"])


def _publish_links(root: Path, splits: dict[str, Any]) -> None:
    """Build ``splits/`` (relative links to each shard and its receipt) aside, rename it in."""
    final = root / SPLITS_DIR
    root.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=True, directory=True) as tmp:
        for split, entry in splits.items():
            folder = tmp / split
            folder.mkdir()
            for link, shard in zip(entry["links"], entry["shards"], strict=True):
                target = os.path.relpath(root / shard, final / split)
                os.symlink(target, folder / link)
                if (root / f"{shard}{RECEIPT_SUFFIX}").is_file():
                    os.symlink(f"{target}{RECEIPT_SUFFIX}", folder / f"{link}{RECEIPT_SUFFIX}")


def _write_json(path: Path, obj: Any) -> None:
    with staged(path, overwrite=True) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=json_default) + "\n")


def _write_config(folder: Path, config: dict[str, Any]) -> None:
    """``config.json`` of a shard folder, written once (kept byte for byte on reruns)."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(folder, (CONFIG_FILE,))
    path = folder / CONFIG_FILE
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text() != text:
        _write_json(path, config)


def _summary(root: Path, blend: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    receipts = [r for p in parts for r in p["receipts"]]
    others = sorted(p.name for p in (root / RUNS_DIR).iterdir()
                    if p.is_dir() and p.name != blend["run_hash"])
    return {
        "out": str(root),
        "run_hash": blend["run_hash"],
        "format": blend["format"],
        "num_shards": len(receipts),
        "reused": sum(1 for r in receipts if r["reused"]),
        "written": sum(1 for r in receipts if not r["reused"]),
        "splits": {s: {k: e.get(k, 0) for k in ("num_shards", "num_bins", "num_tokens",
                                                 "num_sequences", "dropped_sequences")}
                   for s, e in blend["splits"].items()},
        "parts": [{"name": p["name"], "split": p["split"], "config_hash": p["config_hash"],
                   "num_sequences": _packed(p),
                   "dropped_sequences": p["num_sequences"] - _packed(p),
                   "reused": sum(1 for r in p["receipts"] if r["reused"]),
                   "written": sum(1 for r in p["receipts"] if not r["reused"]),
                   "plan": p["plan"]} for p in parts],
        "other_runs": others,
    }


def copy_layout(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Copy a whole layout, links as links: they are relative, so the copy reads its own
    shards (``dst`` must not exist)."""
    target = Path(dst)
    if target.exists():
        raise PacklabError(f"{target}: already exists")
    shutil.copytree(src, target, symlinks=True)
    return target

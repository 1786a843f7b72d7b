"""Seeded mutations of real packlab outputs, and what every one of them must survive.

A *reference* is a real output directory of one format (``packlab pack`` through
:func:`packlab.pipeline.shards.write_shards`: shards, receipts, ``dataset.json``,
``pack_metadata.json``) beside the spool it was packed from, and the content hash of every bin
it holds. Mutation ``i`` of a format copies the reference, damages the copy one way (its class
and details drawn from a generator seeded with ``(format, i)``, so any case reruns alone), and
runs the checks in a forked child: every shard opened on its own, every bin read (one by one
and through ``iter_bins``), the shard validated; then ``open_dataset`` of the output directory,
every bin read (one by one and in one batch) and compared with the reference; then
``validate_path``. The parent judges the child's report (:func:`judge`):

- a signal (segfault, bus error), no answer within the timeout, any exception that is not a
  :class:`~packlab.errors.PacklabError`, or a hostile pickle that ran (its marker file exists)
  is a failure;
- a dataset that opens and serves other bins than the reference while ``validate`` passes is a
  *silent* difference: a failure, unless the mutation recomputed every checksum consistently
  (class ``forged``: nothing can tell it from a dataset written that way);
- with ``strict`` (readers that verify per-bin checksums on read), a dataset that serves other
  bins at all is a failure (``read-silent``), even when ``validate`` notices.

Classes: ``bitflip``, ``overwrite``, ``truncate``, ``append`` (any file of the output, and of
the spool for formats that read it), ``delete``, ``swap``, ``duplicate`` (shards, their inner
files, receipts), ``json`` (a value of a receipt or manifest: wrong type, huge number,
non-UTF-8, deleted key, deep nesting), ``pickle`` (a hostile pickle where the format keeps
one), ``forged`` (a shard rewritten with one token changed by its own writer, or a manifest
value edited, and every checksum above it recomputed).

Run it long: ``PYTHONPATH=$PWD .venv/bin/python tests/fuzzing.py --per-format 3000``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import select
import shutil
import signal
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import bin_digest
from packlab.errors import PacklabError

CLASSES = ("bitflip", "overwrite", "truncate", "append", "delete", "swap", "duplicate", "json",
           "pickle", "forged")
FAILURES = ("crash", "hang", "foreign", "silent", "read-silent", "pickle-ran")
TIMEOUT = 60.0  # seconds a child may take for one mutation
MARKER = "PICKLE_RAN"  # what a hostile pickle would create, at the root of the mutated tree


# -- the reference ---------------------------------------------------------------------------
@dataclass
class Reference:
    """One format's output directory (``tree/out``) and spool (``tree/spool``), as written."""

    format: str
    tree: Path
    digests: list[str]  # every bin of the dataset, in order
    shards: dict[str, list[str]]  # shard name -> its bins' digests
    reads_spool: bool  # the format gathers its bins from the spool at read time

    @property
    def contents(self) -> set[tuple[str, ...]]:
        """Every shard's content, whatever its name (a shard in another's place is whole)."""
        return {tuple(d) for d in self.shards.values()}


def build_reference(root: Path, format: str, *, num_sequences: int = 80, pack_size: int = 512,
                    bins_per_shard: int = 8) -> Reference:
    """Pack a random spool into ``format`` under ``root/ref``. Built elsewhere and moved, so
    no absolute path recorded in a shard leads back to an undamaged copy."""
    from conftest import write_random_spool

    from packlab import open_dataset
    from packlab.formats import get_format
    from packlab.packing import pack
    from packlab.pipeline.shards import write_shards

    build = root / "build"
    spool = write_random_spool(build / "spool", num_sequences=num_sequences, max_len=300,
                               seed=7)
    assignment, _ = pack(spool.lengths, pack_size, algorithm="first_fit_decreasing")
    write_shards(spool, assignment, build / "out", format=format,
                 bins_per_shard=bins_per_shard, workers=1)
    tree = root / "ref"
    shutil.move(build, tree)
    dataset = open_dataset(tree / "out")
    digests = [bin_digest(*dataset.read_bin(i)) for i in range(len(dataset))]
    shards, at = {}, 0
    for path, count in zip(dataset.shards, dataset.num_bins_per_shard.tolist(), strict=True):
        shards[path.name] = digests[at:at + count]
        at += count
    dataset.close()
    return Reference(format, tree, digests, shards,
                     reads_spool=bool(get_format(format).Reader.NEEDS_SPOOL))


# -- mutations -------------------------------------------------------------------------------
@dataclass
class Mutation:
    """What was done to the copy: its class, and a line saying exactly what."""

    format: str
    index: int
    cls: str
    what: str = ""
    forged: bool = False  # every checksum recomputed: allowed to pass unnoticed

    def __str__(self) -> str:
        return f"{self.format}#{self.index} {self.cls}: {self.what}"


def rng_for(format: str, index: int) -> random.Random:
    return random.Random(f"{format}:{index}")


def classes_for(ref: Reference) -> list[str]:
    """The classes that apply to a reference (``pickle`` only where a pickle is kept)."""
    return [c for c in CLASSES if c != "pickle" or pickle_sites(ref.tree)]


def mutate(tree: Path, ref: Reference, index: int) -> Mutation:
    """Apply mutation ``index`` of ``ref.format`` to the copy at ``tree``."""
    rng = rng_for(ref.format, index)
    classes = classes_for(ref)
    cls = classes[index % len(classes)]
    m = Mutation(ref.format, index, cls)
    MUTATORS[cls](tree, ref, rng, m)
    return m


def _files(tree: Path, ref: Reference) -> list[Path]:
    """The files a byte-level mutation may hit: the output's, and the spool's when it is read."""
    roots = [tree / "out", *([tree / "spool"] if ref.reads_spool else [])]
    return sorted(p for r in roots for p in r.rglob("*") if p.is_file())


def _pick_file(tree: Path, ref: Reference, rng: random.Random) -> Path:
    files = _files(tree, ref)
    weights = [1.0 if p.suffix == ".json" else 4.0 for p in files]  # mostly data
    return rng.choices(files, weights)[0]


def _rel(tree: Path, path: Path) -> str:
    return str(path.relative_to(tree))


def _position(size: int, rng: random.Random) -> int:
    """A byte of a file: anywhere, or (two times in three) in its first 256 or last 1024 bytes,
    where headers, footers, schemas and indexes live."""
    region = rng.choice(("anywhere", "head", "tail"))
    if region == "head":
        return rng.randrange(min(size, 256))
    if region == "tail":
        return size - 1 - rng.randrange(min(size, 1024))
    return rng.randrange(size)


def _bitflip(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    path = _pick_file(tree, ref, rng)
    data = bytearray(path.read_bytes())
    if not data:
        m.what = f"{_rel(tree, path)} empty, untouched"
        return
    bits = [8 * _position(len(data), rng) + rng.randrange(8)
            for _ in range(rng.choice((1, 1, 2, 3)))]
    for bit in bits:
        data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))
    m.what = f"{_rel(tree, path)} bits {bits}"


def _overwrite(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    path = _pick_file(tree, ref, rng)
    size = path.stat().st_size
    at = _position(size, rng) if size else 0
    n = rng.choice((1, 2, 4, 8, 16, 64))
    fill = rng.choice(("random", "zeros", "ones"))
    junk = {"random": bytes(rng.randrange(256) for _ in range(n)), "zeros": bytes(n),
            "ones": b"\xff" * n}[fill]
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(junk[: max(size - at, 0)] or junk[:1])
    m.what = f"{_rel(tree, path)} {n} {fill} bytes at {at}"


def _truncate(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    path = _pick_file(tree, ref, rng)
    size = path.stat().st_size
    keep = rng.choice((0, rng.randrange(max(size, 1)), max(size - rng.randrange(1, 9), 0)))
    os.truncate(path, keep)
    m.what = f"{_rel(tree, path)} to {keep} of {size} bytes"


def _append(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    path = _pick_file(tree, ref, rng)
    n = rng.choice((1, 7, 64, 4096))
    with open(path, "ab") as f:
        f.write(bytes(rng.randrange(256) for _ in range(n)))
    m.what = f"{n} junk bytes after {_rel(tree, path)}"


def _shards(tree: Path, ref: Reference) -> list[Path]:
    return [tree / "out" / name for name in ref.shards]


def _receipt(shard: Path) -> Path:
    return shard.with_name(f"{shard.name}.receipt.json")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _copy(src: Path, dst: Path) -> None:
    _remove(dst)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)


def _exchange(a: Path, b: Path) -> None:
    tmp = a.with_name(f"{a.name}.swapping")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _inner_files(shard: Path) -> list[str]:
    return sorted(p.name for p in shard.iterdir() if p.is_file()) if shard.is_dir() else []


def _delete(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    shard = rng.choice(_shards(tree, ref))
    spool = sorted((tree / "spool").iterdir()) if ref.reads_spool else []
    choices = {
        "shard": [shard], "shard+receipt": [shard, _receipt(shard)], "receipt": [_receipt(shard)],
        "dataset.json": [tree / "out" / "dataset.json"],
        "pack_metadata.json": [tree / "out" / "pack_metadata.json"],
        "inner file": [shard / rng.choice(_inner_files(shard))] if shard.is_dir() else [shard],
        "spool file": [rng.choice(spool)] if spool else [shard],
    }
    kind = rng.choice(sorted(choices))
    for path in choices[kind]:
        _remove(path)
    m.what = f"deleted {kind}: {', '.join(_rel(tree, p) for p in choices[kind])}"


def _two_shards(tree: Path, ref: Reference, rng: random.Random) -> tuple[Path, Path]:
    a, b = rng.sample(_shards(tree, ref), 2)
    return a, b


def _swap(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    a, b = _two_shards(tree, ref, rng)
    kind = rng.choice(("shards+receipts", "shards", "receipts", "inner files"))
    if kind == "inner files" and a.is_dir():
        name = rng.choice(_inner_files(a))
        _exchange(a / name, b / name)
        m.what = f"swapped {name} of {a.name} and {b.name}"
        return
    if kind in ("shards+receipts", "shards", "inner files"):
        _exchange(a, b)
    if kind in ("shards+receipts", "receipts"):
        _exchange(_receipt(a), _receipt(b))
    m.what = f"swapped {kind} {a.name} <-> {b.name}"


def _duplicate(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    a, b = _two_shards(tree, ref, rng)
    kind = rng.choice(("over another, receipt adjusted", "over another", "as an extra shard",
                       "inner file"))
    if kind == "inner file" and a.is_dir():
        name = rng.choice(_inner_files(a))
        _copy(a / name, b / name)
        m.what = f"copied {a.name}/{name} over {b.name}/{name}"
        return
    if kind == "as an extra shard":
        b = b.with_name(b.name.replace("shard_0000", "shard_9999", 1))
    _copy(a, b)
    if kind != "over another":
        receipt = json.loads(_receipt(a).read_text())
        _receipt(b).write_text(json.dumps({**receipt, "shard": b.name}))
    m.what = f"copied {a.name} {kind} ({b.name})"


# -- JSON values -------------------------------------------------------------------------------
def _json_files(tree: Path, ref: Reference) -> list[Path]:
    return [p for p in _files(tree, ref) if p.suffix == ".json"]


def _leaves(obj: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every place in a JSON document: dict keys and list items, nested ones too."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield (*path, key)
            yield from _leaves(value, (*path, key))
    elif isinstance(obj, list):
        for k, value in enumerate(obj):
            yield (*path, k)
            yield from _leaves(value, (*path, k))


HOSTILE_VALUES: tuple[Any, ...] = (
    2**63, 2**64, -(2**63) - 1, 10**30, -1, 0, 1e308, 0.5, float("nan"), float("inf"),
    "x", "", "../../etc/passwd", [], {}, None, True, [0, 2**63], {"bytes": -1})


def _get(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _edit(obj: Any, path: tuple, action: str, value: Any = None) -> None:
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def _json(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    path = rng.choice(_json_files(tree, ref))
    edit_json(path, rng, m, tree)


def edit_json(path: Path, rng: random.Random, m: Mutation, tree: Path) -> None:
    """One hostile edit of one value of the JSON file at ``path``."""
    obj = json.loads(path.read_text())
    places = list(_leaves(obj))
    kind = rng.choice(("value", "value", "value", "delete", "non-utf8", "deep", "not json"))
    if kind == "non-utf8":
        raw = path.read_bytes()
        quotes = [i for i, c in enumerate(raw) if c == ord('"')]
        at = rng.choice(quotes) + 1 if quotes else 0
        bad = rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"))
        path.write_bytes(raw[:at] + bad + raw[at:])
        m.what = f"{_rel(tree, path)}: byte(s) {bad!r} at {at}"
        return
    if kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
        m.what = f"{_rel(tree, path)}: 100000 nested lists"
        return
    if kind == "not json" or not places:
        path.write_text(rng.choice(("", "null", "[]", "42", '"x"', "{")))
        m.what = f"{_rel(tree, path)}: replaced by {path.read_text()!r}"
        return
    counts = [p for p in places if type(_get(obj, p)) is int]  # counts matter most: 3 in 4
    place = rng.choice(counts if counts and rng.random() < 0.75 else places)
    if kind == "delete":
        _edit(obj, place, "delete")
        m.what = f"{_rel(tree, path)}: deleted {list(place)}"
    else:
        value = rng.choice(HOSTILE_VALUES)
        _edit(obj, place, "set", value)
        m.what = f"{_rel(tree, path)}: {list(place)} = {value!r}"
    path.write_text(json.dumps(obj))


# -- hostile pickles -----------------------------------------------------------------------------
def pickle_sites(tree: Path) -> list[tuple[Path, int, int]]:
    """Where pickle streams are kept in a tree: ``(file, start, end)`` (the object array of a
    pickled ``.npy``, the index of a Modalities pbin)."""
    from packlab.formats.pbin import PbinFile
    from packlab.safe_pickle import npy_is_pickled, read_npy_header

    sites = []
    for path in sorted((tree / "out").rglob("*")):
        if not path.is_file() or path.suffix == ".json":
            continue
        if npy_is_pickled(path):
            with open(path, "rb") as f:
                start = read_npy_header(f, source=str(path)).data_offset
            sites.append((path, start, path.stat().st_size))
            continue
        try:
            pbin = PbinFile(path)
        except PacklabError:
            continue
        sites.append((path, pbin.index_offset, pbin.index_end))
    return sites


class _Call:
    """Pickles as ``fn(*args)``: what a hostile pickle asks the unpickler to run."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return self.fn, self.args


def hostile_pickles(marker: Path) -> list[tuple[str, bytes]]:
    """Pickle streams that create ``marker`` if anything runs them (named, for the report)."""
    import builtins
    import pathlib
    import subprocess

    touch = f"open({str(marker)!r}, 'w').close()"
    out = [
        ("builtins.open (protocol 0)", b"cbuiltins\nopen\n(S'%s'\nS'w'\ntR." % str(marker).encode()),
        ("os.system (protocol 0)", b"cos\nsystem\n(S'touch %s'\ntR." % str(marker).encode()),
        ("posix.system", b"cposix\nsystem\n(S'touch %s'\ntR." % str(marker).encode()),
        ("numpy runstring", b"cnumpy.testing._private.utils\nrunstring\n(S\"%s\"\n(dtR."
         % touch.encode()),
        ("allowed module, other name", b"cnumpy\nload\n(S'%s'\ntR." % str(marker).encode()),
    ]
    for protocol in (2, 4, 5):
        out.append((f"builtins.exec (protocol {protocol})",
                    pickle.dumps(_Call(builtins.exec, touch), protocol=protocol)))
        out.append((f"pathlib.Path.touch (protocol {protocol})",
                    pickle.dumps(_Call(pathlib.Path.touch, pathlib.Path(marker)),
                                 protocol=protocol)))
        out.append((f"subprocess.call (protocol {protocol})",
                    pickle.dumps(_Call(subprocess.call, ["touch", str(marker)]),
                                 protocol=protocol)))
    # the hostile call deep inside what looks like packed data: a list of dicts of arrays
    bins = np.empty(3, dtype=object)
    bins[:] = [{"input_ids": [1, 2], "loss_mask": [1, 0], "seq_start_id": [0]},
               {"input_ids": _Call(builtins.exec, touch), "loss_mask": [0], "seq_start_id": [0]},
               {"input_ids": [3], "loss_mask": [0], "seq_start_id": [0]}]
    out.append(("inside a bin's dict", pickle.dumps(bins, protocol=3)))
    # an allowed constructor handed a hostile argument
    out.append(("allowed constructor, hostile argument",
                b"cnumpy.core.multiarray\n_reconstruct\n(cos\nsystem\n(S'touch %s'\ntRK\x00"
                b"\x85S'b'\ntR." % str(marker).encode()))
    return out


def _pickle(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    path, start, end = rng.choice(pickle_sites(tree))
    name, payload = rng.choice(hostile_pickles(tree / MARKER))
    data = bytearray(path.read_bytes())
    if rng.random() < 0.5 and len(payload) <= end - start:  # in place: the file keeps its size
        data[start:start + len(payload)] = payload
        where = "in place"
    else:  # the stream replaced whole (whatever follows it shifts)
        data[start:end] = payload
        where = "replacing the stream"
    path.write_bytes(bytes(data))
    m.what = f"{_rel(tree, path)}: hostile pickle ({name}) {where}"


# -- forgeries: changed content with every checksum recomputed ----------------------------------
def _forged(tree: Path, ref: Reference, rng: random.Random, m: Mutation) -> None:
    """One token changed and the shard rewritten by its own writer, or one value of a shard's
    own manifest edited; then its receipt and dataset.json recomputed to vouch for it."""
    from packlab.formats import open_shard

    m.forged = True
    shard = rng.choice(_shards(tree, ref))
    if not ref.reads_spool and rng.random() < 0.7:
        with open_shard(shard) as reader:
            bins = [b.copy() for b in reader.iter_bins()]
            metadata, pack_size = dict(reader.metadata), reader.pack_size
        k = rng.randrange(len(bins))
        j = rng.randrange(bins[k].packed_len)
        bins[k].input_ids[j] = (int(bins[k].input_ids[j]) + 1) % 1000
        _rewrite(shard, ref.format, bins, pack_size, metadata)
        m.what = f"{shard.name}: bin {k} token {j} changed, rewritten by its writer"
    else:
        inner = [p for p in shard.rglob("*.json")] if shard.is_dir() else []
        if not inner:
            m.what = "no manifest inside the shard: nothing forged"
            m.forged = False
            return
        edit_json(rng.choice(inner), rng, m, tree)
        m.what += " (checksums recomputed)"
    _vouch(shard)


def _rewrite(shard: Path, format: str, bins: list, pack_size: int, metadata: dict) -> None:
    from packlab.formats import open_writer

    with open_writer(format, shard, pack_size=pack_size, overwrite=True,
                     metadata=metadata) as writer:
        for packed in bins:
            writer.write(packed)


def _vouch(shard: Path) -> None:
    """The receipt and the dataset manifest recomputed for ``shard`` as it now is."""
    from packlab.pipeline.manifest import manifest_path
    from packlab.pipeline.receipts import shard_bytes, shard_checksum

    digest, digest_of = shard_checksum(shard)
    size = shard_bytes(shard)
    receipt = json.loads(_receipt(shard).read_text())
    _receipt(shard).write_text(json.dumps({**receipt, "bytes": size, "sha256": digest,
                                           "sha256_of": digest_of}))
    manifest_file = manifest_path(shard.parent)
    manifest = json.loads(manifest_file.read_text())
    for entry in manifest["shards"]:
        if entry["name"] == shard.name:
            entry.update(bytes=size, sha256=digest, sha256_of=digest_of)
    manifest_file.write_text(json.dumps(manifest))


MUTATORS: dict[str, Callable[[Path, Reference, random.Random, Mutation], None]] = {
    "bitflip": _bitflip, "overwrite": _overwrite, "truncate": _truncate, "append": _append,
    "delete": _delete, "swap": _swap, "duplicate": _duplicate, "json": _json,
    "pickle": _pickle, "forged": _forged,
}


# -- the checks, in a forked child --------------------------------------------------------------
def _stage(report: dict, name: str, fn: Callable[[], Any]) -> Any:
    """Run one step; record ``ok``, ``refused`` (a packlab error) or ``foreign``."""
    try:
        value = fn()
    except PacklabError as exc:
        report["stages"].append((name, "refused", type(exc).__name__, str(exc)))
        return None
    except Exception as exc:  # noqa: BLE001 - exactly what the fuzzing hunts
        report["stages"].append((name, "foreign", type(exc).__name__,
                                 f"{exc}\n{traceback.format_exc()}"))
        return None
    report["stages"].append((name, "ok", "", ""))
    return value


def _command(*argv: object) -> tuple[int, str]:
    """``packlab ARGV`` in this process; a failure must be one line and exit 2."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from packlab.cli import main

    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main([str(a) for a in argv])
    lines = err.getvalue().strip().splitlines()
    if code not in (0, 2) or (code == 2 and len(lines) != 1):
        raise AssertionError(f"packlab {argv[0]}: exit {code}, stderr {err.getvalue()[-2000:]!r}")
    return code, err.getvalue()


def check_tree(tree: Path, ref: Reference, read_options: dict[str, Any]) -> dict[str, Any]:
    """Everything a user does with an output directory, each step recorded (never raises)."""
    from packlab import open_dataset
    from packlab.formats import open_shard

    report: dict[str, Any] = {"stages": [], "shards": {}}
    out = tree / "out"
    for shard in sorted(p for p in out.iterdir() if p.name.startswith("shard_")
                        and not p.name.endswith(".json")):
        reader = _stage(report, f"open {shard.name}",
                        lambda s=shard: open_shard(s, **read_options))
        if reader is None:
            continue
        got = _stage(report, f"read {shard.name}", lambda r=reader: _digests(r))
        _stage(report, f"iter_bins {shard.name}",
               lambda r=reader: [bin_digest(*b) for b in r.iter_bins()])
        summary = _stage(report, f"validate {shard.name}", reader.validate)
        if got is not None:  # a shard without checksums of its own cannot tell a changed token
            report["shards"][shard.name] = (got, summary is not None
                                            and summary.get("checksums", True))
        _stage(report, f"close {shard.name}", reader.close)
        _stage(report, f"packlab inspect {shard.name}", lambda s=shard: _command("inspect", s))
    dataset = _stage(report, "open_dataset", lambda: open_dataset(out, **read_options))
    if dataset is not None:
        report["dataset"] = _stage(report, "read dataset", lambda: _digests(dataset))
        batch = _stage(report, "read_bins dataset",
                       lambda: [bin_digest(*b) for b in dataset.read_bins(range(len(dataset)))])
        if batch is not None and batch != report["dataset"]:
            report["stages"].append(("read_bins dataset", "foreign", "Mismatch",
                                     "read_bins and read_bin disagree"))
    validated = _stage(report, "packlab validate", lambda: _command("validate", out))
    report["validate"] = validated is not None and validated[0] == 0
    return report


def _digests(reader: Any) -> list[str]:
    return [bin_digest(*reader.read_bin(i)) for i in range(len(reader))]


def run_in_child(fn: Callable[[], Any], timeout: float = TIMEOUT) -> tuple[str, Any]:
    """``fn()`` in a forked child: ``("ok", value)``, ``("crash", signal name)`` or
    ``("hang", seconds)``. The child writes a C traceback to stderr if it dies of a signal."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's stack
        code = 0
        try:
            import faulthandler

            os.close(read_end)
            faulthandler.enable()
            data = pickle.dumps(fn())
            with os.fdopen(write_end, "wb") as f:
                f.write(struct.pack("<Q", len(data)) + data)
        except BaseException:  # noqa: BLE001 - report and leave
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_end, "rb", buffering=0) as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "hang", timeout
            chunk = f.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    raw = b"".join(chunks)
    if os.WIFSIGNALED(status):
        return "crash", signal.Signals(os.WTERMSIG(status)).name
    if len(raw) < 8 or os.WEXITSTATUS(status) != 0:
        return "crash", f"exit status {os.WEXITSTATUS(status)}"
    return "ok", pickle.loads(raw[8:])


# -- judging ---------------------------------------------------------------------------------
@dataclass
class Verdict:
    mutation: Mutation
    outcome: str  # refused, harmless, validate-caught, read-caught-by-validate, forged-*, or a failure
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


def judge(m: Mutation, ran: tuple[str, Any], ref: Reference, tree: Path, *,
          strict: bool) -> Verdict:
    kind, report = ran
    if (tree / MARKER).exists():
        return Verdict(m, "pickle-ran", "the hostile pickle created its marker")
    if kind != "ok":
        return Verdict(m, kind, str(report))
    foreign = [s for s in report["stages"] if s[1] == "foreign"]
    if foreign:
        name, _, exc, text = foreign[0]
        return Verdict(m, "foreign", f"{name}: {exc}: {text}")
    for name, (got, vouched) in report["shards"].items():  # a shard read on its own
        if tuple(got) not in ref.contents and vouched and not m.forged:
            return Verdict(m, "silent", f"{name} serves other bins and validates")
    served = report.get("dataset")
    if served is None:
        return Verdict(m, "forged-refused" if m.forged else "refused")
    if served == ref.digests:
        if m.cls == "pickle" and report["validate"]:
            return Verdict(m, "silent", "a hostile pickle in the shard passes validate")
        outcome = "harmless" if report["validate"] else "validate-caught"
        return Verdict(m, f"forged-{outcome}" if m.forged else outcome)
    changed = sum(a != b for a, b in zip(served, ref.digests, strict=False)) + abs(
        len(served) - len(ref.digests))
    if m.forged:
        return Verdict(m, "forged-served" if report["validate"] else "forged-validate-caught",
                       f"{changed} bins differ")
    if report["validate"]:
        return Verdict(m, "silent", f"{changed} of {len(ref.digests)} bins differ, validate "
                                    "passes")
    if strict:
        return Verdict(m, "read-silent", f"{changed} bins differ on read (validate notices)")
    return Verdict(m, "read-caught-by-validate", f"{changed} bins differ")


# -- a run -----------------------------------------------------------------------------------
@dataclass
class FuzzRun:
    format: str
    classes: list[str] = field(default_factory=list)  # the classes that apply to the format
    reads_spool: bool = False
    counts: Counter = field(default_factory=Counter)  # (class, outcome) -> mutations
    failures: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        lines = [f"{self.format}: {sum(self.counts.values())} mutations in {self.seconds:.0f} s"]
        for (cls, outcome), n in sorted(self.counts.items()):
            lines.append(f"  {cls:<10} {outcome:<26} {n}")
        return "\n".join(lines)


def read_options_for(format: str) -> dict[str, Any]:
    """Reader options for the fuzzed reads: per-bin verification where the reader offers it."""
    import inspect

    from packlab.formats import get_format

    reader = get_format(format).Reader
    return {"verify": True} if "verify" in inspect.signature(reader.__init__).parameters else {}


def fuzz_format(format: str, root: Path, count: int, *, first: int = 0,
                progress: Callable[[Verdict], None] | None = None) -> FuzzRun:
    """Mutations ``first .. first + count`` of ``format``, each on a fresh copy of the reference."""
    began = time.monotonic()
    ref = build_reference(root, format)
    options = read_options_for(format)
    strict = bool(options)
    run = FuzzRun(format, classes_for(ref), ref.reads_spool)
    # the untouched reference passes every check (here, in this process: the children then
    # inherit every module the checks import instead of importing it again each)
    untouched = judge(Mutation(format, -1, "none"), ("ok", check_tree(ref.tree, ref, options)),
                      ref, ref.tree, strict=strict)
    if untouched.outcome != "harmless":
        raise AssertionError(f"the reference itself fails its checks: {untouched.outcome}: "
                             f"{untouched.detail}")
    for index in range(first, first + count):
        tree = root / f"case-{index}"
        shutil.copytree(ref.tree, tree, symlinks=True)
        try:
            m = mutate(tree, ref, index)
            verdict = judge(m, run_in_child(lambda t=tree: check_tree(t, ref, options)),
                            ref, tree, strict=strict)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        run.counts[(verdict.mutation.cls, verdict.outcome)] += 1
        if verdict.failed:
            run.failures.append(verdict)
        if progress is not None:
            progress(verdict)
    run.seconds = time.monotonic() - began
    return run


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from packlab.formats import format_names

    parser = argparse.ArgumentParser(description="Fuzz packlab's readers with seeded mutations.")
    parser.add_argument("--per-format", type=int, default=300)
    parser.add_argument("--first", type=int, default=0, help="first mutation index")
    parser.add_argument("--formats", default=",".join(format_names()))
    parser.add_argument("--json", action="store_true", help="counts as one JSON object")
    args = parser.parse_args(argv)
    runs = []
    for format in args.formats.split(","):
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{format}-") as tmp:
            run = fuzz_format(format, Path(tmp), args.per_format, first=args.first)
        runs.append(run)
        print(run.table(), file=sys.stderr)
        for verdict in run.failures[:20]:
            print(f"FAIL {verdict.mutation} -> {verdict.outcome}: {verdict.detail[:2000]}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps({r.format: {"seconds": round(r.seconds, 1),
                                     "counts": {f"{c}/{o}": n for (c, o), n in
                                                sorted(r.counts.items())},
                                     "failures": len(r.failures)} for r in runs}, indent=1))
    return 1 if any(r.failures for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())

"""What :mod:`fuzzing` does to real packlab outputs: a reference, and seeded damage to copies.

A *reference* is a real output directory of one format (``packlab pack`` through
:func:`packlab.pipeline.shards.write_shards`: shards, receipts, ``dataset.json``,
``pack_metadata.json``) beside the spool it was packed from, and the content hash of every bin
it holds. Mutation ``i`` of a format damages a copy one way: its class is the ``i``-th in turn
(so every class is tried), its details are drawn from a generator seeded with ``(seed, format,
i)``, so any case reruns alone. The run's seed (:func:`fuzz_seed`) is the commit checked out
unless one is given (``PACKLAB_FUZZ_SEED``, ``pytest --fuzz-seed``, ``fuzzing.py --seed``): each
commit tries other mutations, and a failure reruns from the seed it prints.

Classes: ``bitflip``, ``overwrite``, ``truncate``, ``append`` (any file of the output, and of
the spool for formats that read it; two times in three near the start or end of the file,
where headers, footers and indexes are), ``delete``, ``swap``, ``duplicate`` (shards, their
inner files, receipts), ``json`` (a value of a receipt or manifest: wrong type, huge number,
non-UTF-8, deleted key, deep nesting), ``pickle`` (a hostile pickle where the format keeps
one: it would create :data:`MARKER` if anything ran it), ``forged`` (a shard rewritten with
one token changed by its own writer, or a value of its manifest edited, and every checksum
above it recomputed: nothing can tell it from an output written that way).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import bin_digest
from packlab.errors import PacklabError

CLASSES = ("bitflip", "overwrite", "truncate", "append", "delete", "swap", "duplicate", "json",
           "pickle", "forged")
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
SEED_VARIABLE = "PACKLAB_FUZZ_SEED"
ROOT = Path(__file__).resolve().parents[1]


def fuzz_seed(given: str | None = None) -> tuple[str, str]:
    """The run's seed and where it came from: ``given``, else ``$PACKLAB_FUZZ_SEED``, else the
    commit checked out (``git rev-parse HEAD``, its first 12 digits; CI tests a clean clone of
    the commit it lands). Without any of them, an error: a run must say what it tried."""
    if given:
        return given, "given"
    if os.environ.get(SEED_VARIABLE):
        return os.environ[SEED_VARIABLE], SEED_VARIABLE
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"{ROOT}: no commit to seed the fuzzing from ({exc}); give one "
                           f"with {SEED_VARIABLE}=... or --fuzz-seed") from exc
    return head[:12], "git HEAD"


@dataclass
class Mutation:
    """What was done to the copy: its class, and a line saying exactly what."""

    format: str
    index: int
    cls: str
    what: str = ""
    forged: bool = False  # every checksum recomputed: allowed to pass unnoticed
    seed: str = ""

    def __str__(self) -> str:
        return f"{self.format}#{self.index} (seed {self.seed}) {self.cls}: {self.what}"


def rng_for(format: str, index: int, seed: str) -> random.Random:
    return random.Random(f"{seed}:{format}:{index}")


def classes_for(ref: Reference) -> list[str]:
    """The classes that apply to a reference (``pickle`` only where a pickle is kept), found
    once per reference (every mutation asks)."""
    key = str(ref.tree)
    if key not in _CLASSES_OF:
        _CLASSES_OF[key] = [c for c in CLASSES if c != "pickle" or pickle_sites(ref.tree)]
    return _CLASSES_OF[key]


_CLASSES_OF: dict[str, list[str]] = {}


def mutate(tree: Path, ref: Reference, index: int, seed: str) -> Mutation:
    """Apply mutation ``index`` of ``ref.format`` under ``seed`` to the copy at ``tree``."""
    rng = rng_for(ref.format, index, seed)
    classes = classes_for(ref)
    cls = classes[index % len(classes)]
    m = Mutation(ref.format, index, cls, seed=seed)
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
    from packlab.codecs.safe_pickle import npy_is_pickled, read_npy_header
    from packlab.formats.pbin import PbinFile

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
    """One token changed and the shard rewritten by its own writer (two turns of the classes in
    three, so every run of a format that does not read its spool has one, whatever the seed), or
    one value of a shard's own manifest edited; then its receipt and dataset.json recomputed to
    vouch for it."""
    from packlab.sources import open_shard

    m.forged = True
    shard = rng.choice(_shards(tree, ref))
    turn = m.index // len(classes_for(ref))
    if not ref.reads_spool and turn % 3 != 1:
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
    from packlab.sources import open_writer

    with open_writer(format, shard, pack_size=pack_size, overwrite=True,
                     metadata=metadata) as writer:
        for packed in bins:
            writer.write(packed)


def _vouch(shard: Path) -> None:
    """The receipt and the dataset record recomputed for ``shard`` as it now is."""
    from packlab.pipeline.dataset_record import dataset_record_path
    from packlab.pipeline.receipts import shard_bytes, shard_checksum

    digest, digest_of = shard_checksum(shard)
    size = shard_bytes(shard)
    receipt = json.loads(_receipt(shard).read_text())
    _receipt(shard).write_text(json.dumps({**receipt, "bytes": size, "sha256": digest,
                                           "sha256_of": digest_of}))
    manifest_file = dataset_record_path(shard.parent)
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

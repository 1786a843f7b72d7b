"""Random access against its floors, and what training's read order costs (notebook 05).

Beside :mod:`~packlab.measure.latency` and :mod:`~packlab.measure.throughput` this module adds:

- **delivery**: every timed read copies the bin's bytes into reusable batch buffers
  (:class:`Sink`: int64 tokens as training consumes them, uint8 mask, int32 boundaries), as a
  collate does. Readers that return views of a memory map (``binidx``, ``arrow_ipc``) would
  otherwise take their page faults after the timer stopped, and a "cold" read would cost nothing;
- the **Python floor**: the same access path (``PackedDataset.__getitem__`` / ``__getitems__``)
  over the same bins already in RAM as numpy CSR arrays (:class:`RamDataset`), timed in the
  same loop as the format, so a format's own cost is its ratio to it;
- batched (``__getitems__``) against single reads; a delivering sequential scan; DataLoader
  rates with a sampler and the real THD collate; shuffled epochs through the two Parquet
  policies (Megatron-Bridge's one-row-group cache with a uniform shuffle, packlab's LRU reader
  with the block-shuffle sampler); the RFC's row-group tuning table, measured.

Every timing loop interleaves the format with its floors (memcpy of the same byte count, a raw
``os.pread`` of it from the largest data file, the Python floor), so a noisy machine shifts
them together. Cold means every data file dropped from the page cache before the access and
``mincore`` finding zero pages left (the count is reported, never assumed).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin
from packlab.dataset import PackedDataset, item_from_bin
from packlab.errors import PacklabError
from packlab.measure.latency import CACHES, _read_all, percentiles
from packlab.measure.pagecache import drop_shard, resident_pages, shard_files
from packlab.measure.verdicts import claim_verdict, holds
from packlab.results import finding
from packlab.samplers import BlockShuffleSampler, ShuffleSampler, dataset_blocks
from packlab.sources import open_dataset
from packlab.tables import fmt_us, human_bytes, markdown_table, times

SAMPLERS = ("shuffle", "block")
# Readers that load every bin at open: once open, nothing is read from disk, so no cold read.
IN_RAM_FORMATS = ("legacy_npy_pickle",)
POLICIES = ("one_row_group", "lru")
MIN_SAMPLES = 10


# -- delivery ----------------------------------------------------------------------------------
class Sink:
    """Reusable batch buffers a benchmark copies every bin into, as a collate would."""

    def __init__(self, capacity: int = 4096) -> None:
        self._resize(max(int(capacity), 1), max(int(capacity), 1) + 1)

    def _resize(self, tokens: int, bounds: int) -> None:
        self.ids = np.empty(tokens, dtype=np.int64)
        self.mask = np.empty(tokens, dtype=np.uint8)
        self.bounds = np.empty(bounds, dtype=np.int32)

    def take(self, item: Mapping[str, Any]) -> int:
        """Copy one item (``input_ids``, ``loss_mask``, ``seq_boundaries``); returns the bytes
        it held in its own dtypes (what the memcpy and pread floors move)."""
        ids, mask, bounds = item["input_ids"], item["loss_mask"], item["seq_boundaries"]
        n, s = ids.shape[0], bounds.shape[0]
        if n > self.ids.shape[0] or s > self.bounds.shape[0]:
            self._resize(max(n, self.ids.shape[0]), max(s, self.bounds.shape[0]))
        np.copyto(self.ids[:n], ids, casting="unsafe")
        np.copyto(self.mask[:n], mask, casting="unsafe")
        np.copyto(self.bounds[:s], bounds, casting="unsafe")
        return int(ids.nbytes + mask.nbytes + bounds.nbytes)

    def take_all(self, items: Iterable[Mapping[str, Any]]) -> int:
        return sum(self.take(item) for item in items)


# -- the Python floor --------------------------------------------------------------------------
class RamShard:
    """One shard's bins held in RAM as CSR arrays (in the dtypes its reader returns);
    ``read_bin`` returns views: the cheapest reader the dataset's access path can call."""

    def __init__(self, reader: Any) -> None:
        self.path = Path(reader.path)
        self.pack_size = int(reader.pack_size)
        lengths = np.asarray(reader.packed_lengths(), dtype=np.int64)
        self.num_bins = int(lengths.shape[0])
        if self.num_bins == 0:
            raise PacklabError(f"{self.path}: no bins to hold in RAM")
        self.token_offsets = np.zeros(self.num_bins + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.token_offsets[1:])
        self.num_tokens = int(self.token_offsets[-1])
        starts: list[np.ndarray] = []
        for b, packed in enumerate(reader.iter_bins()):
            if b == 0:
                self.input_ids = np.empty(self.num_tokens, dtype=packed.input_ids.dtype)
                self.loss_mask = np.empty(self.num_tokens, dtype=packed.loss_mask.dtype)
            lo, hi = self.token_offsets[b], self.token_offsets[b + 1]
            if hi - lo != packed.packed_len:
                raise PacklabError(f"{self.path}: bin {b} has {packed.packed_len} tokens, "
                                   f"its reader's packed_lengths say {hi - lo}")
            self.input_ids[lo:hi] = packed.input_ids
            self.loss_mask[lo:hi] = packed.loss_mask
            starts.append(np.asarray(packed.seq_start_id))
        self.seq_offsets = np.zeros(self.num_bins + 1, dtype=np.int64)
        np.cumsum([s.shape[0] for s in starts], out=self.seq_offsets[1:])
        self.seq_start_id = np.concatenate(starts)

    def __len__(self) -> int:
        return self.num_bins

    def read_bin(self, index: int) -> PackedBin:
        if not -self.num_bins <= index < self.num_bins:
            raise IndexError(f"{self.path} (in RAM): bin {index} out of range [0, {self.num_bins})")
        i = index % self.num_bins
        t0, t1 = self.token_offsets[i], self.token_offsets[i + 1]
        s0, s1 = self.seq_offsets[i], self.seq_offsets[i + 1]
        return PackedBin(self.input_ids[t0:t1], self.loss_mask[t0:t1], self.seq_start_id[s0:s1])

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        return [self.read_bin(int(i)) for i in np.asarray(indices).reshape(-1)]

    def iter_bins(self) -> Any:
        return (self.read_bin(i) for i in range(self.num_bins))

    def packed_lengths(self) -> np.ndarray:
        return np.diff(self.token_offsets)

    def close(self) -> None:
        pass


class RamDataset(PackedDataset):
    """A :class:`PackedDataset` whose readers are :class:`RamShard` copies of another's: the
    same ``locate`` / ``__getitem__`` / ``__getitems__`` code, with the bins already in RAM."""

    def __init__(self, dataset: PackedDataset) -> None:
        self._ram = [RamShard(reader) for reader in dataset.readers()]
        super().__init__(list(zip(dataset.shards, dataset.formats, strict=True)),
                         reader_options=dataset.reader_options)

    def _open_readers(self) -> list[Any]:
        return self._ram


def python_floor(path: str | os.PathLike[str], **reader_options: Any) -> RamDataset:
    """The Python floor of the shards at ``path``: their bins, read once, held in RAM."""
    dataset = open_dataset(path, **reader_options)
    try:
        return RamDataset(dataset)
    finally:
        dataset.close()


def data_files(dataset: PackedDataset) -> list[Path]:
    """Every file a read of ``dataset`` can touch: its shards' files, and the spool a
    ``packed_index`` shard gathers its bins from (else a "cold" read would find it warm)."""
    files: list[Path] = []
    for shard, reader in zip(dataset.shards, dataset.readers(), strict=True):
        files.extend(shard_files(shard))
        spool = getattr(reader, "spool_path", None)
        if spool is not None:
            files.extend(shard_files(spool))
    return sorted(set(files))


def _warm(dataset: PackedDataset, files: Sequence[Path], sink: Sink) -> None:
    """A full pass in order, every bin delivered (maps opened and their pages touched, caches
    filled), then every file read once."""
    for i in range(len(dataset)):
        sink.take(dataset[i])
    for f in files:
        _read_all(f)


def drop_until_cold(files: Sequence[Path], *, tries: int = 20) -> int:
    """Evict ``files`` until ``mincore`` finds no page left (readahead still in flight when
    the first eviction ran lands afterwards); returns the pages left after the last try."""
    left = drop_shard(files)
    for _ in range(tries):
        if left == 0:
            break
        time.sleep(0.001)
        left = drop_shard(files)
    return left


def _open(path: str | os.PathLike[str], floor: RamDataset | None,
          reader_options: Mapping[str, Any] | None) -> tuple[PackedDataset, RamDataset]:
    dataset = open_dataset(path, **dict(reader_options or {}))
    if floor is None:
        floor = RamDataset(dataset)
    elif len(floor) != len(dataset):
        raise PacklabError(f"{path}: the Python floor holds {len(floor)} bins, the dataset "
                           f"{len(dataset)}")
    return dataset, floor


def _forget(dataset: PackedDataset, blocks: np.ndarray, index: int, sink: Sink) -> None:
    """Make the reader hold nothing of bin ``index``: close it (decoded row groups and maps
    go), then reopen it by reading a bin of another block (row group), so the timed read pays
    the data, not the opening. With a single block the timed read also reopens the reader."""
    dataset.close()
    count = blocks.shape[0] - 1
    if count > 1:
        block = int(np.searchsorted(blocks, index, side="right")) - 1
        sink.take(dataset[int(blocks[(block + 1) % count])])


def _timed(fn: Any, *args: Any) -> tuple[int, int]:
    began = time.perf_counter_ns()
    nbytes = fn(*args)
    return time.perf_counter_ns() - began, nbytes


# -- one random bin, warm or cold --------------------------------------------------------------
def random_access(
    path: str | os.PathLike[str],
    *,
    cache: str = "warm",
    samples: int = 1000,
    seed: int = 0,
    max_seconds: float | None = None,
    floor: RamDataset | None = None,
    reader_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Latency of one random bin through ``open_dataset(path)[i]``, delivered, with floors.

    Per sample, interleaved: the format, the Python floor, a memcpy of the same byte count,
    and a raw ``os.pread`` of it from the largest data file. Cold: before the format's read the
    reader is reopened away from the bin (:func:`_forget`: no decoded row group of it is kept)
    and every data file is dropped until ``mincore`` finds no page; the pread file is dropped
    again before the pread. Formats in ``IN_RAM_FORMATS`` have no cold read (reopening them
    reloads everything, untimed, per sample). ``max_seconds`` stops early (after at least
    ``MIN_SAMPLES``) and ``samples`` then says how many were taken. Keys: ``p50_us`` ... and
    ``python_floor_``, ``memcpy_``, ``pread_`` prefixed; ``ratio_to_python_floor``,
    ``ratio_to_memcpy``, ``ratio_to_pread`` (p50 over p50); cold: ``cold_max_resident_pages``
    (``mincore`` after every drop) and ``cold_verified``.
    """
    if cache not in CACHES:
        raise PacklabError(f"cache must be 'warm' or 'cold', got {cache!r}")
    if samples <= 0:
        raise PacklabError(f"samples must be positive, got {samples}")
    dataset, floor = _open(path, floor, reader_options)
    files = data_files(dataset)
    n = len(dataset)
    big = max(files, key=lambda f: f.stat().st_size)
    span = big.stat().st_size
    indices = np.random.default_rng(seed).integers(0, n, size=samples).tolist()
    blocks = dataset_blocks(dataset)
    sink = Sink(dataset.pack_size)
    _warm(dataset, files, sink)
    src = np.ones(sink.take(floor[0]) * 4, dtype=np.uint8)
    dst = np.ones_like(src)
    ns = np.zeros((4, samples), dtype=np.int64)
    worst = 0
    began = time.perf_counter()
    fd = os.open(big, os.O_RDONLY)
    try:
        for k, i in enumerate(indices):
            if cache == "cold":
                _forget(dataset, blocks, i, sink)
                worst = max(worst, drop_until_cold(files))
            ns[0, k], nbytes = _timed(lambda j: sink.take(dataset[j]), i)
            ns[1, k], _ = _timed(lambda j: sink.take(floor[j]), i)
            if nbytes > src.shape[0]:
                src, dst = np.ones(nbytes * 2, dtype=np.uint8), np.ones(nbytes * 2, dtype=np.uint8)
            ns[2, k], _ = _timed(np.copyto, dst[:nbytes], src[:nbytes])
            if cache == "cold":
                worst = max(worst, drop_until_cold([big]))
            offset = i * max(span - nbytes, 0) // max(n - 1, 1)
            ns[3, k], _ = _timed(os.pread, fd, nbytes, offset)
            if max_seconds is not None and k + 1 >= MIN_SAMPLES \
                    and time.perf_counter() - began > max_seconds:
                ns = ns[:, : k + 1]
                break
    finally:
        os.close(fd)
        dataset.close()
    out: dict[str, Any] = {"path": str(path), "format": "+".join(sorted(set(dataset.formats))),
                           "cache": cache, "samples": int(ns.shape[1]), "seed": seed,
                           "num_bins": n, "pread_file": big.name,
                           "bytes_per_bin": float(np.mean([sink.take(floor[i]) for i in
                                                           indices[: ns.shape[1]]]))}
    for row, prefix in enumerate(("", "python_floor_", "memcpy_", "pread_")):
        out.update(percentiles(ns[row], prefix))
    for floor_name in ("python_floor", "memcpy", "pread"):
        base = out[f"{floor_name}_p50_us"]
        out[f"ratio_to_{floor_name}"] = out["p50_us"] / base if base > 0 else None
    if cache == "cold":
        out["cold_max_resident_pages"] = worst
        out["cold_verified"] = worst == 0
    return out


# -- the cold floors of a memory map ----------------------------------------------------------
MMAP_MODES = ("pread", "mmap", "mmap_random", "mmap_random_willneed")


def read_ahead_kb(path: str | os.PathLike[str]) -> int | None:
    """The read-ahead window (KB) of the block device holding ``path``, if sysfs tells."""
    dev = os.stat(path).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (base / "queue", base.parent / "queue", base / ".." / "queue"):
        try:
            return int((queue / "read_ahead_kb").read_text())
        except (OSError, ValueError):
            continue
    return None


def mmap_floors(
    path: str | os.PathLike[str],
    *,
    nbytes: int,
    samples: int = 30,
    seed: int = 0,
) -> dict[str, Any]:
    """Cold reads of ``nbytes`` at random page-aligned offsets of one file, four ways.

    ``pread``: one system call. ``mmap``: a copy out of a read-only map with the default
    advice (a fault reads the device's read-around window, however few bytes are wanted).
    ``mmap_random``: the map advised ``MADV_RANDOM`` (one page per fault). ``mmap_random_willneed``:
    also ``MADV_WILLNEED`` over the wanted range first (one read for the range), inside the
    timer. The file is evicted until ``mincore`` finds no page before every read; the pages a
    read left resident are counted (``<mode>_pages``: what it really read).
    """
    import mmap as mmap_module

    size = os.path.getsize(path)
    page = mmap_module.PAGESIZE
    if nbytes <= 0 or size < nbytes + page:
        raise PacklabError(f"{path}: {size} bytes, too small for reads of {nbytes}")
    rng = np.random.default_rng(seed)
    offsets = (rng.integers(0, size - nbytes, size=samples) // page * page).tolist()
    span = -(-nbytes // page) * page
    ns = {mode: np.zeros(samples, dtype=np.int64) for mode in MMAP_MODES}
    pages = {mode: np.zeros(samples, dtype=np.int64) for mode in MMAP_MODES}
    dst = np.empty(nbytes, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    mapped = mmap_module.mmap(fd, 0, prot=mmap_module.PROT_READ)
    view = np.frombuffer(mapped, dtype=np.uint8)
    try:
        for k, off in enumerate(offsets):
            for mode in MMAP_MODES:
                advice = mmap_module.MADV_NORMAL if mode == "mmap" else mmap_module.MADV_RANDOM
                mapped.madvise(advice)
                drop_until_cold([Path(path)])
                began = time.perf_counter_ns()
                if mode == "pread":
                    os.pread(fd, nbytes, off)
                else:
                    if mode == "mmap_random_willneed":
                        mapped.madvise(mmap_module.MADV_WILLNEED, off, min(span, size - off))
                    np.copyto(dst, view[off:off + nbytes])
                ns[mode][k] = time.perf_counter_ns() - began
                pages[mode][k] = resident_pages(path)[0]
    finally:
        del view
        mapped.close()
        os.close(fd)
    out: dict[str, Any] = {"path": str(path), "nbytes": nbytes, "samples": samples,
                           "read_ahead_kb": read_ahead_kb(path)}
    for mode in MMAP_MODES:
        out.update(percentiles(ns[mode], f"{mode}_"))
        out[f"{mode}_pages"] = float(np.median(pages[mode]))
    return out


def mmap_finding(row: Mapping[str, Any], *, cold_ratio: float = 1.5) -> dict[str, str]:
    """Whether a memory map advised ``MADV_RANDOM`` + ``MADV_WILLNEED`` reads cold within
    ``cold_ratio`` of a raw pread (what a memory-mapped reader could do for the cold target)."""
    ratio = row["mmap_random_willneed_p50_us"] / row["pread_p50_us"]
    return finding(
        f"a memory map advised MADV_RANDOM + MADV_WILLNEED reads cold within {cold_ratio}x of "
        "a raw pread",
        f"{row['mmap_random_willneed_p50_us']:,.0f} us vs pread {row['pread_p50_us']:,.0f} us "
        f"({ratio:.2f}x); default advice {row['mmap_p50_us']:,.0f} us reading "
        f"{row['mmap_pages']:,.0f} pages (read-ahead {row['read_ahead_kb']} KB)",
        holds(ratio <= cold_ratio))


def mmap_table(row: Mapping[str, Any]) -> str:
    return markdown_table(["cold read of one bin's bytes", "p50 µs", "p90 µs", "pages read"],
                          [[mode, fmt_us(row[f"{mode}_p50_us"]), fmt_us(row[f"{mode}_p90_us"]),
                            row[f"{mode}_pages"]] for mode in MMAP_MODES])


# -- batched against single ---------------------------------------------------------------------
def batched_access(
    path: str | os.PathLike[str],
    *,
    batch_size: int = 8,
    samples: int = 200,
    seed: int = 0,
    max_seconds: float | None = None,
    floor: RamDataset | None = None,
    reader_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Per-bin cost of ``__getitems__(batch)`` against ``batch_size`` single ``[i]`` reads (warm,
    delivered), each on its own random batch, alternating which goes first; the Python floor
    of both beside them. ``gain`` = single p50 / batched p50 (above 1: batching is cheaper)."""
    if batch_size < 2 or samples <= 0:
        raise PacklabError(f"batch_size must be >= 2 and samples positive, got {batch_size}, "
                           f"{samples}")
    dataset, floor = _open(path, floor, reader_options)
    files = data_files(dataset)
    rng = np.random.default_rng(seed)
    batches = rng.integers(0, len(dataset), size=(2, samples, batch_size))
    sink = Sink(dataset.pack_size)
    _warm(dataset, files, sink)
    ns = np.zeros((4, samples), dtype=np.int64)
    modes = [(dataset, True), (dataset, False), (floor, True), (floor, False)]
    began = time.perf_counter()
    try:
        for k in range(samples):
            order = range(4) if k % 2 == 0 else (1, 0, 3, 2)
            for m in order:
                source, batched = modes[m]
                batch = batches[0 if batched else 1, k].tolist()
                read = (lambda s, b: sink.take_all(s.__getitems__(b))) if batched else \
                    (lambda s, b: sum(sink.take(s[j]) for j in b))
                ns[m, k] = _timed(read, source, batch)[0] // batch_size
            if max_seconds is not None and k + 1 >= MIN_SAMPLES \
                    and time.perf_counter() - began > max_seconds:
                ns = ns[:, : k + 1]
                break
    finally:
        dataset.close()
    out: dict[str, Any] = {"path": str(path), "batch_size": batch_size,
                           "samples": int(ns.shape[1]), "seed": seed}
    for row, prefix in enumerate(("batched_", "single_", "floor_batched_", "floor_single_")):
        out.update(percentiles(ns[row], prefix))
    out["gain"] = out["single_p50_us"] / out["batched_p50_us"] if out["batched_p50_us"] else None
    return out


# -- sequential scan ----------------------------------------------------------------------------
def _median_pass(run: Any, repeats: int, budget: float) -> float:
    """Median seconds of up to ``repeats`` calls of ``run``, stopping once ``budget`` seconds
    have gone (at least one call): short passes are repeated, long ones are not."""
    seconds: list[float] = []
    began = time.perf_counter()
    while len(seconds) < max(repeats, 1) and (not seconds or time.perf_counter() - began < budget):
        seconds.append(run())
    return float(np.median(seconds))


def scan_rate(
    path: str | os.PathLike[str],
    *,
    cache: str = "warm",
    repeats: int = 5,
    budget: float = 1.0,
    floor: RamDataset | None = None,
    reader_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokens/s of one in-order pass (``iter(dataset)``: the format's streaming path), every
    bin delivered; beside it the Python floor's pass and a raw sequential read of every data
    file in the same cache state (``floor_tokens_per_s``: the tokens those bytes hold, per s).
    Each figure is the median of up to ``repeats`` passes within ``budget`` seconds."""
    if cache not in CACHES:
        raise PacklabError(f"cache must be 'warm' or 'cold', got {cache!r}")
    dataset, floor = _open(path, floor, reader_options)
    files = data_files(dataset)
    sink = Sink(dataset.pack_size)
    tokens = dataset.num_tokens
    _warm(dataset, files, sink)

    def run(source: PackedDataset) -> float:
        if cache == "cold" and source is dataset:
            drop_until_cold(files)
        began = time.perf_counter()
        for item in source:
            sink.take(item)
        return time.perf_counter() - began

    def read() -> float:
        if cache == "cold":
            drop_until_cold(files)
        began = time.perf_counter()
        for f in files:
            _read_all(f)
        return time.perf_counter() - began

    try:
        seconds = _median_pass(lambda: run(dataset), repeats, budget)
        floor_seconds = _median_pass(lambda: run(floor), repeats, budget)
        read_seconds = _median_pass(read, repeats, budget)
    finally:
        dataset.close()
    raw = sum(f.stat().st_size for f in files)
    return {"path": str(path), "cache": cache, "num_bins": len(dataset), "num_tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds,
            "python_floor_tokens_per_s": tokens / floor_seconds,
            "bytes_read": raw, "read_bytes_per_s": raw / read_seconds,
            "floor_tokens_per_s": tokens / read_seconds}


# -- DataLoader ---------------------------------------------------------------------------------
def epoch_sampler(dataset: PackedDataset, sampler: str, *, num_bins: int | None = None,
                  window: int = 4, seed: int = 0) -> ShuffleSampler | BlockShuffleSampler:
    """A uniform shuffle or a block shuffle (blocks: the shards' row groups, or 1024 bins) of
    the first ``num_bins`` bins."""
    n = len(dataset) if num_bins is None else min(int(num_bins), len(dataset))
    if sampler == "shuffle":
        return ShuffleSampler(n, seed=seed)
    if sampler != "block":
        raise PacklabError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    bounds = dataset_blocks(dataset)
    bounds = np.append(bounds[bounds < n], np.int64(n))
    return BlockShuffleSampler(n, boundaries=bounds, window=window, seed=seed)


def loader_rates(
    path: str | os.PathLike[str],
    *,
    workers: Sequence[int] = (0, 2, 4),
    batch_size: int = 8,
    sampler: str = "shuffle",
    max_bins: int | None = None,
    seed: int = 0,
    reader_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Bins/s through ``torch.utils.data.DataLoader`` (``__getitems__`` batches, packlab's THD
    collate) for each worker count, over the first ``max_bins`` bins in ``sampler`` order.

    Each worker count gets a freshly opened dataset (a format that loads everything at open
    pays it in every worker, as in training). Rows: ``workers``, ``bins``, ``epoch_seconds``,
    ``first_batch_seconds`` (start-up), ``bins_per_s``, ``steady_bins_per_s`` (after the first
    batch).
    """
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        raise PacklabError("the DataLoader benchmark needs torch") from None
    from packlab.collate import collate

    rows = []
    for n in workers:
        dataset = open_dataset(path, **dict(reader_options or {}))
        order = epoch_sampler(dataset, sampler, num_bins=max_bins, seed=seed)
        dataset.close()
        began = time.perf_counter()
        first, bins = None, 0
        with warnings.catch_warnings():  # more workers than cores is what is being measured
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            loader = DataLoader(dataset, batch_size=batch_size, sampler=order,
                                num_workers=int(n), collate_fn=collate)
            for batch in loader:
                first = time.perf_counter() if first is None else first
                bins += int(batch["tokens"].shape[0])
        end = time.perf_counter()
        steady_bins = bins - min(batch_size, bins)
        steady = end - (first or end)
        rows.append({"workers": int(n), "sampler": sampler, "bins": bins,
                     "epoch_seconds": end - began, "first_batch_seconds": (first or end) - began,
                     "bins_per_s": bins / (end - began),
                     "steady_bins_per_s": steady_bins / steady if steady > 0 else None})
    return rows


# -- shuffled epochs through Parquet ------------------------------------------------------------
def shuffled_epoch(
    path: str | os.PathLike[str],
    *,
    policy: str = "lru",
    sampler: str = "block",
    window: int = 4,
    max_accesses: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One epoch over every bin of a Parquet shard in ``sampler`` order, delivered.

    ``policy``: ``one_row_group`` (Megatron-Bridge today: one cached row group, rows through
    ``as_py``; :class:`packlab.formats.parquet.OneRowGroupReader`) or ``lru`` (packlab's reader,
    a few decoded row groups). ``max_accesses`` times only the first accesses of the epoch's
    order and projects the epoch as their mean times the bins (``projected`` is then True): under
    a uniform shuffle every position of the order has the same chance of a cache hit, so the
    prefix is an unbiased sample of the epoch. The file is in the page cache first (warm).
    """
    from packlab.formats.parquet import OneRowGroupReader, Reader

    if policy not in POLICIES:
        raise PacklabError(f"policy must be one of {POLICIES}, got {policy!r}")
    reader = OneRowGroupReader(path) if policy == "one_row_group" else Reader(path)
    n = reader.num_bins
    if sampler == "shuffle":
        order = ShuffleSampler(n, seed=seed).indices()
    elif sampler == "block":
        order = BlockShuffleSampler(n, boundaries=reader.row_group_offsets, window=window,
                                    seed=seed).indices()
    else:
        raise PacklabError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    taken = order if max_accesses is None else order[: max(1, int(max_accesses))]
    _read_all(Path(path))
    sink = Sink(reader.pack_size)
    ns = np.empty(taken.shape[0], dtype=np.int64)
    try:
        for k, i in enumerate(taken.tolist()):
            ns[k] = _timed(lambda j: sink.take(item_from_bin(reader.read_bin(j))), i)[0]
        groups = np.asarray(reader.row_group_of(taken))
        switches = 1 + int(np.count_nonzero(np.diff(groups)))
        decodes = switches if policy == "one_row_group" else reader.cache_stats()["misses"]
    finally:
        reader.close()
    seconds = float(ns.sum()) / 1e9
    projected = taken.shape[0] < n
    return {"path": str(path), "policy": policy, "sampler": sampler, "window": window,
            "num_bins": n, "num_row_groups": reader.num_row_groups, "accesses": int(ns.shape[0]),
            "seconds": seconds, "projected": projected,
            "epoch_seconds": seconds * n / ns.shape[0] if projected else seconds,
            "row_group_decodes": decodes, **percentiles(ns, "per_bin_")}


def row_group_miss(
    path: str | os.PathLike[str],
    *,
    samples: int = 50,
    seed: int = 0,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Latency of a random Parquet bin whose row group is not decoded yet (delivered; the file
    in the page cache): what a shuffled read pays each time it leaves the cached row groups.

    packlab's reader with a one-row-group cache; before each timed read, a bin of another row
    group is read (untimed) to evict the target's, or, with a single row group, the reader's
    handles are closed (its reopening, a footer parse, is then inside the timer).
    """
    from packlab.formats.parquet import Reader

    if samples <= 0:
        raise PacklabError(f"samples must be positive, got {samples}")
    reader = Reader(path, cache_row_groups=1)
    groups, n = reader.num_row_groups, reader.num_bins
    indices = np.random.default_rng(seed).integers(0, n, size=samples).tolist()
    _read_all(Path(path))
    sink = Sink(reader.pack_size)
    ns = np.zeros(samples, dtype=np.int64)
    began = time.perf_counter()
    try:
        for k, i in enumerate(indices):
            if groups > 1:
                other = (int(reader.row_group_of(i)) + 1) % groups
                reader.read_bin(int(reader.row_group_offsets[other]))
            else:
                reader.close()
            ns[k] = _timed(lambda j: sink.take(item_from_bin(reader.read_bin(j))), i)[0]
            if max_seconds is not None and k + 1 >= MIN_SAMPLES \
                    and time.perf_counter() - began > max_seconds:
                ns = ns[: k + 1]
                break
    finally:
        reader.close()
    return {"path": str(path), "num_bins": n, "num_row_groups": groups,
            "samples": int(ns.shape[0]), **percentiles(ns)}


# -- the RFC's row-group table (seed 001, "Row Group Size") -------------------------------------
RFC_ROW_GROUPS: dict[int, dict[str, Any]] = {
    100: {"write_memory": 2e6, "read_latency": "Lower", "best_for": "Random access heavy"},
    1000: {"write_memory": 20e6, "read_latency": "Medium", "best_for": "Balanced workloads"},
    10000: {"write_memory": 200e6, "read_latency": "Higher", "best_for": "Sequential scans"},
}
RFC_BYTES_PER_ROW = 20e3  # every row of the RFC's table: ~20 KB of write memory per bin


def row_group_sweep(
    directory: str | os.PathLike[str],
    spool: str | os.PathLike[str],
    assignment: str | os.PathLike[str],
    sizes: Sequence[int],
    *,
    latency_samples: int = 50,
    max_seconds: float | None = 20.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One Parquet shard per row-group size, written in a fresh process (its write-phase peak
    RSS measured), then: bytes on disk, the latency of a random bin whose row group must be
    decoded (:func:`row_group_miss`), the per-bin cost of a block-shuffled epoch, and a warm
    sequential scan. One row per size."""
    from packlab.measure.footprint import write_memory

    if not sizes or min(sizes) < 1:
        raise PacklabError(f"row-group sizes must be positive, got {list(sizes)}")
    rows = []
    for size in sorted(set(int(s) for s in sizes)):
        out = Path(directory) / f"row_group_{size}.parquet"
        wrote = write_memory("parquet", spool, assignment, out, tracemalloc=False,
                             options={"row_group_size": size})
        miss = row_group_miss(out, samples=latency_samples, seed=seed, max_seconds=max_seconds)
        epoch = shuffled_epoch(out, policy="lru", sampler="block", seed=seed)
        scan = scan_rate(out)
        rows.append({
            "row_group_size": size, "num_bins": epoch["num_bins"],
            "num_row_groups": epoch["num_row_groups"], "bytes_on_disk": out.stat().st_size,
            "write_peak_rss_growth_bytes": wrote["write_peak_rss_growth_bytes"],
            "write_peak_anon_growth_bytes": wrote["write_peak_anon_growth_bytes"],
            "write_arrow_pool_peak_bytes": wrote["write_arrow_pool_peak_bytes"],
            "miss_p50_us": miss["p50_us"], "miss_p90_us": miss["p90_us"],
            "miss_samples": miss["samples"],
            "block_epoch_per_bin_us": epoch["per_bin_mean_us"],
            "scan_tokens_per_s": scan["tokens_per_s"],
        })
    return rows


def row_group_findings(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RFC's row-group table, claim against measured, one finding per checkable cell.

    Write memory: the RFC's ~20 KB per row (2 MB / 20 MB / 200 MB), for the rows a row group
    really holds (never more than the shard's bins), within 2x either way, judged on the
    writer's peak anonymous RSS growth (its own allocations; the file-backed rest is the input
    spool's and the output's pages, reclaimable page cache), with the RSS and the Arrow pool
    beside it. Read latency
    "Lower / Medium / Higher": the p50 of a random read that decodes its row group grows with
    the row-group size. "Best for": the smallest size reads such a bin fastest, the largest
    scans fastest.
    """
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: r["row_group_size"])
    out = []
    for row in ordered:
        held = min(row["row_group_size"], row["num_bins"])
        claimed = RFC_BYTES_PER_ROW * held
        measured = float(row["write_peak_anon_growth_bytes"])
        rfc = RFC_ROW_GROUPS.get(row["row_group_size"])
        text = (f"~{human_bytes(rfc['write_memory'])}" if rfc and held == row["row_group_size"]
                else f"~{human_bytes(claimed)} (20 KB x {held} rows)")
        out.append(finding(f"RFC row-group table: write memory at row_group_size "
                           f"{row['row_group_size']} is {text}",
                           f"{human_bytes(measured)} peak anonymous RSS growth (RSS "
                           f"{human_bytes(row.get('write_peak_rss_growth_bytes'))}, Arrow pool "
                           f"{human_bytes(row.get('write_arrow_pool_peak_bytes'))})",
                           claim_verdict(measured, claimed, "estimate")))
    if len(ordered) >= 2:
        latencies = [r["miss_p50_us"] for r in ordered]
        sizes = [r["row_group_size"] for r in ordered]
        growing = all(b > a for a, b in zip(latencies, latencies[1:], strict=False))
        out.append(finding(
            "RFC row-group table: random read latency Lower / Medium / Higher as row groups grow",
            ", ".join(f"{s}: {v:,.0f} us" for s, v in zip(sizes, latencies, strict=True)),
            holds(growing)))
        fastest = min(ordered, key=lambda r: r["miss_p50_us"])["row_group_size"]
        out.append(finding(
            f"RFC row-group table: the smallest row group ({sizes[0]}) is best for random access",
            f"lowest random-read p50 at row_group_size {fastest}", holds(fastest == sizes[0])))
        scans = {r["row_group_size"]: r["scan_tokens_per_s"] for r in ordered}
        best = max(scans, key=lambda s: scans[s])
        out.append(finding(
            f"RFC row-group table: the largest row group ({sizes[-1]}) is best for sequential scans",
            ", ".join(f"{s}: {v / 1e6:,.1f} M tokens/s" for s, v in scans.items()),
            holds(best == sizes[-1])))
    return out


# -- DESIGN.md's targets ------------------------------------------------------------------------
FAST_FORMATS = ("memmap_v1", "binidx", "arrow_ipc")


def target_findings(
    warm: Mapping[str, Mapping[str, Any]],
    cold: Mapping[str, Mapping[str, Any]],
    batched: Mapping[str, Mapping[str, Any]],
    epochs: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    floor_ratio: float = 1.1,
    cold_ratio: float = 1.5,
    parquet_speedup: float = 100.0,
) -> list[dict[str, Any]]:
    """DESIGN.md "Targets", each verdict computed from the numbers given.

    ``warm`` / ``cold`` / ``batched``: per format, rows of :func:`random_access` and
    :func:`batched_access`; ``epochs``: ``{"today": ..., "packlab": ...}`` rows of
    :func:`shuffled_epoch`. Floors and batching are judged for memmap, binidx and arrow (the
    formats the targets name); cold reads for every format whose bins are not all in RAM
    after opening (``IN_RAM_FORMATS`` load everything: they have no cold read).
    """
    out = []
    for fmt in FAST_FORMATS:
        if fmt in warm:
            r = warm[fmt]["ratio_to_python_floor"]
            out.append(finding(f"{fmt}: warm random read within {floor_ratio}x of the Python floor",
                               f"p50 {warm[fmt]['p50_us']:.1f} us vs floor "
                               f"{warm[fmt]['python_floor_p50_us']:.1f} us ({r:.3f}x)",
                               holds(r <= floor_ratio)))
        if fmt in batched:
            b = batched[fmt]
            out.append(finding(f"{fmt}: batched reads (__getitems__) cheaper per bin than single",
                               f"{b['batched_p50_us']:.1f} vs {b['single_p50_us']:.1f} us per bin "
                               f"(batch of {b['batch_size']})",
                               holds(b["batched_p50_us"] < b["single_p50_us"])))
    for fmt, row in cold.items():
        if fmt in IN_RAM_FORMATS:
            continue
        r = row["ratio_to_pread"]
        checked = "" if row.get("cold_verified") else ", pages left resident: not a cold read"
        out.append(finding(f"{fmt}: cold random read within {cold_ratio}x of a raw pread",
                           f"p50 {row['p50_us']:,.0f} us vs pread {row['pread_p50_us']:,.0f} us "
                           f"({r:.2f}x){checked}",
                           holds(bool(row.get("cold_verified")) and r <= cold_ratio)))
    if epochs and {"today", "packlab"} <= set(epochs):
        today, ours = epochs["today"], epochs["packlab"]
        speedup = today["epoch_seconds"] / ours["epoch_seconds"]
        how = (f"projected from {today['accesses']:,} accesses" if today["projected"]
               else "measured")
        out.append(finding(
            f"parquet: shuffled epoch >= {parquet_speedup:.0f}x faster than the one-row-group policy",
            f"{ours['epoch_seconds']:.2f} s (LRU + block shuffle) vs {today['epoch_seconds']:.1f} s "
            f"(one row group + uniform shuffle, {how}): {times(speedup)}",
            holds(speedup >= parquet_speedup)))
    return out


# -- tables and headline numbers for the notebook -----------------------------------------------
def latency_table(latency: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """``latency[cache][format]`` rows of :func:`random_access` as one Markdown table."""
    rows = []
    for name in latency.get("warm", latency.get("cold", {})):
        for cache in ("warm", "cold"):
            r = latency.get(cache, {}).get(name)
            if r is None:
                continue
            rows.append([name, cache, r["samples"]]
                        + [fmt_us(r[k]) for k in ("p50_us", "p90_us", "p99_us", "mean_us",
                                                   "python_floor_p50_us", "memcpy_p50_us",
                                                   "pread_p50_us")]
                        + [f"{r['ratio_to_python_floor']:.2f}x", f"{r['ratio_to_pread']:.2f}x",
                           r.get("cold_verified", "")])
    return markdown_table(["format", "cache", "samples", "p50 µs", "p90 µs", "p99 µs", "mean µs",
                           "Python floor p50", "memcpy p50", "pread p50", "/ Python floor",
                           "/ pread", "0 pages left (mincore)"], rows)


def batched_table(batched: Mapping[str, Mapping[str, Any]]) -> str:
    return markdown_table(
        ["format", "batch", "samples", "batched µs/bin", "single µs/bin", "gain",
         "Python floor batched", "Python floor single"],
        [[n, b["batch_size"], b["samples"], fmt_us(b["batched_p50_us"]),
          fmt_us(b["single_p50_us"]), f"{b['gain']:.2f}x", fmt_us(b["floor_batched_p50_us"]),
          fmt_us(b["floor_single_p50_us"])] for n, b in batched.items()])


def steady_rate(row: Mapping[str, Any]) -> float:
    """A DataLoader row's bins/s after the first batch (the whole epoch's when too short)."""
    return float(row["steady_bins_per_s"] or row["bins_per_s"])


def throughput_table(scans: Mapping[str, Mapping[str, Mapping[str, Any]]],
                     loaders: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Scan tokens/s (warm, cold, Python floor, raw read) and DataLoader bins/s per format."""
    workers = [r["workers"] for r in next(iter(loaders.values()))] if loaders else []
    rows = []
    for n in scans["warm"]:
        warm, cold = scans["warm"][n], scans.get("cold", {}).get(n)
        rows.append([n, warm["tokens_per_s"] / 1e6,
                     cold["tokens_per_s"] / 1e6 if cold else "n/a",
                     warm["python_floor_tokens_per_s"] / 1e6, warm["floor_tokens_per_s"] / 1e6]
                    + [round(steady_rate(r)) for r in loaders.get(n, [])]
                    + [max((r["first_batch_seconds"] for r in loaders.get(n, [])), default=0.0)])
    return markdown_table(["format", "scan warm M tok/s", "scan cold M tok/s",
                           "Python floor M tok/s", "raw read M tok/s"]
                          + [f"DataLoader {w} workers bins/s" for w in workers]
                          + ["first batch s (max)"], rows)


def sweep_table(sweep: Sequence[Mapping[str, Any]]) -> str:
    """:func:`row_group_sweep` rows beside the RFC's claims (~20 KB per row held)."""
    rows = []
    for r in sweep:
        rfc = RFC_ROW_GROUPS.get(r["row_group_size"], {})
        claimed = RFC_BYTES_PER_ROW * min(r["row_group_size"], r["num_bins"])
        rows.append([r["row_group_size"], r["num_row_groups"], human_bytes(r["bytes_on_disk"]),
                     human_bytes(claimed), human_bytes(r["write_peak_anon_growth_bytes"]),
                     human_bytes(r["write_peak_rss_growth_bytes"]),
                     human_bytes(r["write_arrow_pool_peak_bytes"]),
                     rfc.get("read_latency", "n/a"), fmt_us(r["miss_p50_us"]),
                     fmt_us(r["block_epoch_per_bin_us"]), r["scan_tokens_per_s"] / 1e6,
                     rfc.get("best_for", "n/a")])
    return markdown_table(["bins per row group", "row groups", "file size",
                           "claimed write memory", "write peak anon", "write peak RSS",
                           "write Arrow pool peak",
                           "claimed read latency", "random read p50 µs (decodes its group)",
                           "block-shuffle epoch µs/bin", "scan M tok/s", "claimed best for"], rows)


def epoch_table(epochs: Mapping[str, Mapping[str, Any]]) -> str:
    return markdown_table(
        ["policy", "reader", "sampler", "accesses timed", "epoch s", "projected",
         "row-group decodes", "per-bin p50 µs", "per-bin mean µs"],
        [[k, e["policy"], e["sampler"], e["accesses"], e["epoch_seconds"], e["projected"],
          e["row_group_decodes"], fmt_us(e["per_bin_p50_us"]), fmt_us(e["per_bin_mean_us"])]
         for k, e in epochs.items()])


def findings_table(findings: Sequence[Mapping[str, str]]) -> str:
    return markdown_table(["claim", "measured", "verdict"],
                          [[f["claim"], f["measured"], f["verdict"]] for f in findings])


def headline_numbers(
    latency: Mapping[str, Mapping[str, Mapping[str, Any]]],
    scans: Mapping[str, Mapping[str, Mapping[str, Any]]],
    batched: Mapping[str, Mapping[str, Any]],
    loaders: Mapping[str, Sequence[Mapping[str, Any]]],
    sweep: Sequence[Mapping[str, Any]],
    epochs: Mapping[str, Mapping[str, Any]],
    mmap: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Every figure of notebook 05 under a flat, stable key (what ``results.record`` keeps)."""
    out: dict[str, Any] = {}
    if mmap is not None:
        out.update({f"cold_{mode}_p50_us": mmap[f"{mode}_p50_us"] for mode in MMAP_MODES})
        out["read_ahead_kb"] = mmap["read_ahead_kb"]
    keys = ("p50_us", "p90_us", "p99_us", "mean_us", "python_floor_p50_us", "memcpy_p50_us",
            "pread_p50_us", "ratio_to_python_floor", "ratio_to_pread", "samples")
    for cache, per_format in latency.items():
        for n, r in per_format.items():
            out.update({f"{n}_{cache}_{k}": r[k] for k in keys})
    for cache, per_format in scans.items():
        out.update({f"{n}_scan_{cache}_tokens_per_s": r["tokens_per_s"]
                    for n, r in per_format.items()})
    for n, b in batched.items():
        out.update({f"{n}_batched_p50_us": b["batched_p50_us"],
                    f"{n}_single_p50_us": b["single_p50_us"], f"{n}_batch_gain": b["gain"]})
    for n, rows in loaders.items():
        out.update({f"{n}_dataloader_{r['workers']}_workers_bins_per_s": steady_rate(r)
                    for r in rows})
    for r in sweep:
        out.update({f"parquet_rg{r['row_group_size']}_{k}": r[k] for k in (
            "bytes_on_disk", "write_peak_rss_growth_bytes", "write_peak_anon_growth_bytes",
            "miss_p50_us",
            "block_epoch_per_bin_us", "scan_tokens_per_s")})
    for key, e in epochs.items():
        slug = "_".join(key.replace(",", " ").split())
        out[f"parquet_epoch_{slug}_seconds"] = e["epoch_seconds"]
    if {"today", "packlab"} <= set(epochs):
        out["parquet_shuffled_epoch_speedup"] = (epochs["today"]["epoch_seconds"]
                                                 / epochs["packlab"]["epoch_seconds"])
    return out

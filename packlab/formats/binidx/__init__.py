"""Format ``binidx`` (RFC Option C): Megatron-LM's ``MMIDIDX`` bin/idx pair plus two sidecars.

A shard is a directory, published atomically::

    data.bin         tokens of every bin, concatenated (uint16 or int32, no header)
    data.idx         Megatron-LM MMIDIDX version 1: one "sequence" (and one document) per bin
    loss_mask.bin    header + uint8 loss mask per token (bin i at the token offset of data.bin)
    seq_starts.bin   header + CSR of the bins' seq_start_id: offsets int64, starts int32
    checksums.bin    header + each bin's xxh3_64 (packlab.bins.bin_checksum over its tokens as
                     stored, its mask and its starts): 40 bytes, then uint64[num_bins]
    manifest.json    written last: counts, token dtype, pack_size, "bin_checksum": "xxh3_64",
                     the shard's "identity", the "fingerprints" of data.bin and data.idx,
                     every file's bytes and sha256

**The files know their shard.** Each sidecar's header (version 2) ends with the shard's
identity, 8 bytes (the 16 hex digits of the record's ``identity``, derived from what the shard
is before its first byte: its metadata, where the pipeline records its place in its dataset,
and its pack size, so the same job writes the same bytes), checked when the header is read at open. ``data.bin`` and
``data.idx`` stay megatron-core's bytes, so the record keeps their ``fingerprints``
(xxh3_64 of ``data.idx`` whole, a few bytes a bin, and of ``data.bin``'s first and last 4 KiB),
checked on the first read, when the index is read and checked anyway. A file exchanged with
another shard's is refused before a bin is served. Version 1 sidecars (32, 48 and 32-byte
headers, no identity) are shards written before identities: read as before.

``data.bin`` + ``data.idx`` are byte-compatible with megatron-core, so
``IndexedDataset(str(shard / "data"))`` reads every packed row's tokens unchanged; the
sidecars carry what the pretraining format lacks (loss mask, sub-sequence starts).

``data.idx`` is megatron-core's index (:mod:`packlab.codecs.mmidx`, field by field): dtype
code 8 (uint16) or 4 (int32), one sequence and one document per bin, its length the bin's
tokens.

Token dtype: ``dtype="auto"`` stores uint16 when ``vocab_size <= 65536`` (every id fits),
int32 otherwise or when the vocabulary is unknown; the writer refuses a token that does not
fit, naming the bin. uint16 halves ``data.bin`` (see the tests for the sizes).

``checksums.bin``, field by field: magic ``b"PLKSUMS\\x00"``, ``<Q`` version 2, ``<Q`` num_bins,
``8s`` the algorithm (``b"xxh3_64\\x00"``), ``8s`` the shard's identity, then ``<u8`` per bin. megatron-core never opens it.
Shards written before it have none (and no ``bin_checksum`` in the record): they read as
before, and ``verify=True`` refuses them.

The reader opens every file once per process and reads each bin with one ``pread`` per column
into arrays of its own (:mod:`packlab.formats.read.table`: where every bin is, read once from
the index, is kept in RAM, 16 bytes a bin). On object storage it reads in place, as
megatron-core's object-storage path does: the record, the index and the small sidecars
(``data.idx``, ``seq_starts.bin``, ``checksums.bin``) fetched once into a local cache, checked
against the record, then each bin is one ranged GET of its tokens in ``data.bin`` and one of
its mask in ``loss_mask.bin`` (:mod:`packlab.formats.read.ranged`). The arrays it returns stay
valid after the reader is closed or collected. (megatron-core's ``IndexedDataset`` closes its
mmap in ``__del__``, so arrays it returned crash the process once it is collected.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import CHECKSUM, PackedBin, records_checksum, stored_checksum
from packlab.codecs import mmidx
from packlab.errors import FormatError, PacklabError
from packlab.formats.binidx.headers import (
    LossHeader,
    SeqHeader,
    Sidecar,
    SumsHeader,
    VersionPrefix,
    unpack_raw,
)
from packlab.formats.read.shard_reads import reads_for
from packlab.formats.read.table import (
    BinIndex,
    BinTable,
    Column,
    FileReads,
    Placement,
    Runs,
    TableReads,
    refuse_unverifiable,
)
from packlab.formats.shared.base import (
    SHARD_RECORD,
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    head,
    read_shard_record,
    starts_with,
)
from packlab.formats.shared.fingerprints import check_fingerprints, fingerprint
from packlab.formats.shared.scratch import ScratchArray
from packlab.storage.files import (
    AlignedWriter,
    HashedFile,
    file_entry,
    parse_json,
    short_hash,
    verify_files,
)
from packlab.storage.location import Location, as_location
from packlab.storage.objects import cache_entry, cache_root, fetch_files
from packlab.storage.reads import load_array

FORMAT = "binidx"
SUFFIX = ""
VERSION = "binidx_v1"  # the record's "layout" key
RECORD = SHARD_RECORD
DATA = "data.bin"
INDEX = "data.idx"
LOSS = "loss_mask.bin"
SEQS = "seq_starts.bin"
SUMS = "checksums.bin"
PREFIX = "data"  # megatron-core's path_prefix inside the shard directory

# megatron-core's DType codes for the token dtypes packlab writes (and the int32 starts).
DTYPE_CODES: dict[int, np.dtype] = {8: mmidx.DTYPES[8], 4: mmidx.DTYPES[4]}


def detect(location: Location) -> bool:
    """A directory holding a ``data.idx`` that starts with the MMIDIDX magic."""
    return starts_with(location / INDEX, mmidx.MAGIC)


class BinidxFacts(FormatFacts):
    """What ``binidx`` is: a Megatron bin/idx shard with sidecars (RFC Option C)."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    READ_BY = ("Megatron-core",)
    RECORD = RECORD
    RECORD_FORMAT = FORMAT
    FILES = (DATA, INDEX, LOSS, SEQS, SUMS)
    DATA_FILES = (DATA, LOSS)
    READS_IN_PLACE = True
    RAW_RUNS = True
    detect = staticmethod(detect)


def megatron_prefix(path: str | os.PathLike[str]) -> str:
    """The ``path_prefix`` megatron-core's ``IndexedDataset`` takes for this shard."""
    return str(Path(path) / PREFIX)


def resolve_token_dtype(dtype: str, vocab_size: int | None, *, source: str) -> np.dtype:
    """``auto`` -> uint16 when every id of the vocabulary fits, else int32."""
    if dtype == "auto":
        fits = vocab_size is not None and 0 < int(vocab_size) <= 1 << 16
        return DTYPE_CODES[8] if fits else DTYPE_CODES[4]
    if dtype in ("uint16", "<u2", "u2"):
        return DTYPE_CODES[8]
    if dtype in ("int32", "<i4", "i4"):
        return DTYPE_CODES[4]
    raise PacklabError(f"{source}: token dtype must be 'auto', 'uint16' or 'int32', got {dtype!r}")


class Writer(BinidxFacts, ShardWriter):
    """Streams tokens and loss masks to disk; the index and sidecars are assembled at finalize.

    Extra keywords: ``dtype`` (``"auto"``, ``"uint16"``, ``"int32"``) and ``vocab_size`` (for
    ``auto``; also read from ``metadata["vocab_size"]`` when not given).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: str = "auto",
        vocab_size: int | None = None,
        **options: Any,
    ) -> None:
        metadata = options.get("metadata") or {}
        self.vocab_size = vocab_size if vocab_size is not None else metadata.get("vocab_size")
        self.token_dtype = resolve_token_dtype(dtype, self.vocab_size, source=str(path))
        self.token_limit = int(np.iinfo(self.token_dtype).max)
        super().__init__(path, **options)

    def _open(self) -> None:
        self.tmp_path.mkdir()
        # what this shard is, known before its first byte (see the module docstring)
        self.identity = short_hash({"metadata": self.metadata, "pack_size": self.pack_size})
        self._stamp = bytes.fromhex(self.identity)
        self._data = HashedFile(self.tmp_path / DATA)
        self._loss = AlignedWriter(self.tmp_path / LOSS)  # closed in _close
        self._loss.write(bytes(LossHeader.size()))  # placeholder, the header is written last
        self._sums = open(self.tmp_path / SUMS, "wb")  # noqa: SIM115 - closed in _close
        self._sums.write(bytes(SumsHeader.size()))  # placeholder, the header is written last
        self._lengths = ScratchArray(self.tmp_path / ".lengths.scratch", "<i4")
        self._nseqs = ScratchArray(self.tmp_path / ".nseqs.scratch", "<i8")
        self._starts = ScratchArray(self.tmp_path / ".starts.scratch", "<i4")

    def _write(self, packed: PackedBin) -> None:
        tokens = packed.input_ids
        if tokens.dtype != self.token_dtype:
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0 or hi > self.token_limit:
                raise PacklabError(
                    f"{self.path}: bin {self.bins_written}: token ids {lo}..{hi} do not fit "
                    f"{self.token_dtype.name} (vocab_size {self.vocab_size}); use dtype='int32'"
                )
            tokens = tokens.astype(self.token_dtype)
        self._data.write(tokens)
        mask = np.ascontiguousarray(packed.loss_mask, dtype=np.uint8)
        self._loss.write(mask.tobytes())
        self._sums.write(stored_checksum(tokens, mask, packed.seq_start_id,
                                         self.token_dtype).to_bytes(8, "little"))
        self._lengths.append(np.array([tokens.shape[0]]))
        self._nseqs.append(np.array([packed.seq_start_id.shape[0]]))
        self._starts.append(packed.seq_start_id)

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        for scratch in (self._lengths, self._nseqs, self._starts):
            scratch.finish()
        files = {DATA: self._data.close()}
        files[INDEX] = mmidx.write_index(self.tmp_path / INDEX, self._lengths,
                                         self.bins_written, self.token_dtype)
        files[LOSS] = self._finish_loss()
        files[SEQS] = self._write_seq_starts()
        files[SUMS] = self._finish_sums()
        for scratch in (self._lengths, self._nseqs, self._starts):
            scratch.discard()
        record.update(
            layout=VERSION,
            token_dtype=self.token_dtype.str,
            vocab_size=self.vocab_size,
            megatron_prefix=PREFIX,
            bin_checksum=CHECKSUM,
            identity=self.identity,
            fingerprints={DATA: fingerprint(self.tmp_path / DATA, whole=False),
                          INDEX: fingerprint(self.tmp_path / INDEX, whole=True)},
            files=files,
        )
        (self.tmp_path / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        return record

    def _finish_loss(self) -> dict[str, Any]:
        self._loss.seek(0)
        self._loss.write(LossHeader.struct_of(2).pack(
            LossHeader.MAGIC,  # magic
            LossHeader.VERSION,  # version 2
            self.bins_written,  # num_bins
            self.tokens_written,  # num_tokens: uint8 loss mask values that follow
            self._stamp,  # the shard's identity
        ))
        self._loss.flush()
        os.fsync(self._loss.fileno())
        self._loss.close()
        return file_entry(self.tmp_path / LOSS)

    def _finish_sums(self) -> dict[str, Any]:
        self._sums.seek(0)
        self._sums.write(SumsHeader.struct_of(2).pack(
            SumsHeader.MAGIC,  # magic
            SumsHeader.VERSION,  # version 2
            self.bins_written,  # num_bins: uint64 checksums that follow
            CHECKSUM.encode(),  # algorithm, NUL-padded to 8 bytes
            self._stamp,  # the shard's identity
        ))
        self._sums.flush()
        os.fsync(self._sums.fileno())
        self._sums.close()
        return file_entry(self.tmp_path / SUMS)

    def _write_seq_starts(self) -> dict[str, Any]:
        seqs = HashedFile(self.tmp_path / SEQS)
        seqs.write(SeqHeader.struct_of(2).pack(
            SeqHeader.MAGIC,  # magic
            SeqHeader.VERSION,  # version 2
            self.bins_written,  # num_bins
            self.seqs_written,  # num_starts
            self.pack_size,  # pack_size
            mmidx.CODE_OF["<i4"],  # dtype code of the starts (int32)
            self._stamp,  # the shard's identity
        ))
        total = 0  # offsets: int64[num_bins + 1], where each bin's starts begin
        seqs.write(np.zeros(1, dtype="<i8"))
        for counts in self._nseqs.chunks():
            ends = np.cumsum(counts) + total
            seqs.write(ends.astype("<i8"))
            total = int(ends[-1])
        for starts in self._starts.chunks():  # starts: int32[num_starts]
            seqs.write(starts)
        return seqs.close()

    def _discard(self) -> None:
        for name in ("_data", "_lengths", "_nseqs", "_starts"):
            handle = getattr(self, name, None)
            if handle is not None:
                handle.discard()
        for name in ("_loss", "_sums"):
            handle = getattr(self, name, None)
            if handle is not None and not handle.closed:
                handle.close()


def _starts_offset(num_bins: int, header: int) -> int:
    """Byte offset of the starts in ``seq_starts.bin`` (after its ``header`` bytes and the
    offsets)."""
    return header + 8 * (num_bins + 1)


class Reader(BinidxFacts, TableReads, ShardReader):
    """A ``binidx`` shard's reader; opening reads the record and the headers, reads are O(1).

    On first read (in each process) the files are opened and every bin's structure is checked
    over the index (:mod:`packlab.formats.read.table`). ``verify=True``: each bin read is
    checked against its checksum. On object storage (``path`` a
    :class:`~packlab.storage.location.Location` there) the files other than ``DATA_FILES`` are
    fetched once into ``cache_dir`` (default :func:`packlab.storage.objects.cache_root`), the
    data read by ranges.
    """

    @property
    def metadata(self) -> dict[str, Any]:
        found = self.record.get("metadata")
        return found if isinstance(found, dict) else {}

    def __init__(self, path: str | os.PathLike[str] | Location, *, verify: bool = False,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(path)
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self._local = self._local_files()
        self.record = shard_record(self._local)
        self.pack_size = count_field(self.record, "pack_size", self.path / RECORD)
        self.num_bins = count_field(self.record, "num_bins", self.path / RECORD)
        self.num_tokens = count_field(self.record, "num_tokens", self.path / RECORD)
        self.num_seqs = count_field(self.record, "num_seqs", self.path / RECORD)
        self.vocab_size: int | None = self.record.get("vocab_size")
        if self.vocab_size is not None:
            count_field(self.record, "vocab_size", self.path / RECORD, minimum=1)
        self.has_checksums = records_checksum(self.record, self.path / RECORD)
        self.verify = bool(verify)
        refuse_unverifiable(self.path, self.verify, self.has_checksums)
        self.token_dtype = self._read_headers()
        self._check_sizes()
        self._table = None

    def _handles(self) -> tuple[str, ...]:
        return ("_table",)

    # -- opening ------------------------------------------------------------------------------
    def _local_files(self) -> Path:
        """The folder holding the record and the index files locally: the shard itself, or
        (on object storage) their copies fetched once into the cache, each checked against
        the record's size and sha256 (a replaced record is a new cache entry)."""
        if self.location.is_local:
            return self.path
        record = self.path / RECORD
        if not record.is_file():
            raise FormatError(f"{record}: missing (an unfinished or damaged {FORMAT} shard)")
        raw = record.read_bytes()
        files = parse_json(raw, record, unreadable="unreadable record")
        files = files.get("files") if isinstance(files, dict) else None
        listed = files if isinstance(files, dict) else {}
        wanted = {name: listed.get(name) for name in (INDEX, SEQS, SUMS)
                  if name in listed or name != SUMS}
        final = cache_entry(cache_root(self.cache_dir) / "index", self.path,
                            hashlib.sha256(raw).hexdigest())
        return fetch_files(self.path, wanted, final, last={RECORD: raw})

    def _file(self, name: str) -> Path | Location:
        """Where file ``name`` is read: a data file where it is, the others from
        :meth:`_local_files`."""
        return self.path / name if name in self.DATA_FILES else self._local / name

    def _read_headers(self) -> np.dtype:
        """Check every header field against the record; the token dtype of ``data.bin``."""
        idx = self._file(INDEX)
        code, nseq, ndoc = mmidx.parse_header(head(idx, mmidx.HEADER_SIZE), self.path / INDEX)
        if code not in DTYPE_CODES:
            raise FormatError(f"{idx}: token dtype code {code} (packlab writes 8=uint16, 4=int32)")
        token_dtype = DTYPE_CODES[code]
        if token_dtype.str != self.record.get("token_dtype"):
            raise FormatError(f"{idx}: dtype code {code} ({token_dtype.name}) disagrees with the "
                              f"record's token_dtype {self.record.get('token_dtype')!r}")
        if nseq != self.num_bins or ndoc != self.num_bins + 1:
            raise FormatError(f"{idx}: {nseq} sequences / {ndoc} documents, the record says "
                              f"{self.num_bins} bins (expected {self.num_bins + 1} documents)")
        self.header_size: dict[str, int] = {}
        magic, version, nbins, ntok, *stamp = self._sidecar(LOSS, LossHeader)
        if magic != LossHeader.MAGIC:
            raise FormatError(f"{self.path / LOSS}: bad magic or version ({magic!r}, {version})")
        if nbins != self.num_bins or ntok != self.num_tokens:
            raise FormatError(f"{self.path / LOSS}: header says {nbins} bins / {ntok} tokens, "
                              f"the record {self.num_bins} / {self.num_tokens}")
        magic, version, nbins, nstarts, pack_size, code, *stamp = self._sidecar(SEQS, SeqHeader)
        if magic != SeqHeader.MAGIC or code != mmidx.CODE_OF["<i4"]:
            raise FormatError(f"{self.path / SEQS}: bad magic, version or dtype code "
                              f"({magic!r}, {version}, {code})")
        if (nbins, nstarts, pack_size) != (self.num_bins, self.num_seqs, self.pack_size):
            raise FormatError(f"{self.path / SEQS}: header says {nbins} bins, {nstarts} starts, "
                              f"pack_size {pack_size}; the record {self.num_bins}, "
                              f"{self.num_seqs}, {self.pack_size}")
        return token_dtype

    def _sidecar(self, name: str, header: type[Sidecar]) -> tuple[Any, ...]:
        """A sidecar's header fields (its version read first: 1, or 2 with the shard's
        identity, checked here against the record's); its size is remembered."""
        file = self._file(name)
        raw = head(file, header.size(2))  # one read (one ranged GET on object storage)
        _, version = unpack_raw(raw, VersionPrefix.STRUCT, file)
        if version not in (1, 2):
            raise FormatError(f"{file}: header version {version}, this reader knows 1 and 2")
        fields = unpack_raw(raw, header.struct_of(version), file)
        self.header_size[name] = header.size(version)
        expected = self.record.get("identity")
        if version == 2 and isinstance(expected, str) and fields[-1].hex() != expected:
            raise FormatError(f"{file}: belongs to another shard (its header names shard "
                              f"{fields[-1].hex()}, this shard is {expected}): files exchanged "
                              "between shards; refused")
        return fields

    def _check_fingerprints(self, reads: FileReads) -> None:
        """megatron-core's two files against the fingerprints the record keeps (on the
        first read: the index is read and checked whole then anyway)."""
        files = {INDEX: (self._file(INDEX), True)}
        if not reads.in_place:  # on object storage each read is one
            files[DATA] = (self._file(DATA), False)  # ranged GET: per-bin checksums stand
        check_fingerprints(self.record.get("fingerprints"), files, f"its record {RECORD}")

    def _expected_sizes(self) -> dict[str, int]:
        n = self.num_bins
        return {
            DATA: self.num_tokens * self.token_dtype.itemsize,
            INDEX: mmidx.index_size(n),
            LOSS: self.header_size[LOSS] + self.num_tokens,
            SEQS: self.header_size[SEQS] + 8 * (n + 1) + 4 * self.num_seqs,
            **({SUMS: self._sums_header() + 8 * n} if self.has_checksums else {}),
        }

    def _sums_header(self) -> int:
        if SUMS not in self.header_size:
            self._sidecar(SUMS, SumsHeader)
        return self.header_size[SUMS]

    def _check_sizes(self) -> None:
        for name, want in self._expected_sizes().items():
            file = as_location(self._file(name))
            have = file.size() if file.is_file() else -1
            if have < 0:
                raise FormatError(f"{file}: missing (the shard is incomplete)")
            if have != want:
                raise FormatError(f"{file}: {have} bytes, the headers imply {want} "
                                  "(truncated or corrupted)")

    def _placement(self, reads: FileReads) -> Placement:
        """Where the bins are: ``data.idx`` and ``seq_starts.bin`` read as sliced."""
        n, file, width = self.num_bins, self._file, self.token_dtype.itemsize
        self._check_fingerprints(reads)
        checksum = None
        if self.has_checksums:
            self.check_checksums_header()
            checksum = reads.lookups(file(SUMS), "<u8", self._sums_header(), n)
        seqs_at = self.header_size[SEQS]
        return Placement(Column(file(DATA), self.token_dtype, 0, self.num_tokens),
                      Column(file(LOSS), np.dtype("|u1"), self.header_size[LOSS],
                             self.num_tokens),
                      Column(file(SEQS), np.dtype("<i4"), _starts_offset(n, seqs_at),
                             self.num_seqs),
                      _Index(reads, self._local, n, width, self.num_tokens, self.num_seqs,
                             seqs_at, self.path),
                      self.pack_size, str(self.path), checksum)

    def check_checksums_header(self) -> None:
        """``checksums.bin``'s header against the shard (before its values are read)."""
        magic, version, nbins, algorithm, *_ = self._sidecar(SUMS, SumsHeader)
        if (magic, nbins) != (SumsHeader.MAGIC, self.num_bins) \
                or algorithm.rstrip(b"\x00") != CHECKSUM.encode():
            raise FormatError(f"{self.path / SUMS}: header ({magic!r}, version {version}, "
                              f"{nbins} bins, {algorithm!r}) does not match the shard's "
                              f"{self.num_bins} {CHECKSUM} checksums (corrupted)")

    def info(self) -> dict[str, Any]:
        return {**super().info(), "token_dtype": self.token_dtype.name, "num_seqs": self.num_seqs}

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> dict[str, Any]:
        """Sizes, checksums, index consistency, token range and every bin invariant (a local
        shard: ``validate`` downloads one on object storage, verified, first)."""
        if not self.location.is_local:
            raise PacklabError(f"{self.path}: validate a shard on object storage with "
                               "packlab.sources.validate.validate_path (it downloads it whole)")
        verify_files(self.path, self.record.get("files", {}), checksums=True)
        listed = set(self.record.get("files", {}))
        if listed != set(self._expected_sizes()):
            raise FormatError(f"{self.path / RECORD}: lists {', '.join(sorted(listed))}, "
                              f"expected {', '.join(sorted(self._expected_sizes()))}")
        n = self.num_bins
        mmidx.check_documents(load_array(self.path / INDEX, "<i8", mmidx.documents_at(n), n + 1),
                              n, self.path / INDEX)
        reads = reads_for(self.location)
        placement = self._placement(reads)
        table = BinTable.from_placement(placement, reads, check=False)
        limit = self.vocab_size if self.vocab_size else int(np.iinfo(self.token_dtype).max) + 1
        table.check_contents(token_limit=limit)  # every invariant of every bin
        if placement.checksum is not None:
            table.check_checksums(placement.checksum)
        return {"format": FORMAT, "num_bins": self.num_bins, "num_tokens": self.num_tokens,
                "num_seqs": self.num_seqs, "pack_size": self.pack_size,
                "token_dtype": self.token_dtype.name, "bytes_on_disk": self.bytes_on_disk(),
                "bin_checksums": self.has_checksums}


class _Index(BinIndex):
    """``data.idx``'s lengths and byte pointers, ``seq_starts.bin``'s offsets, read as sliced:
    bin ``b``'s tokens are values ``pointer[b] / width`` and on, ``length[b]`` of them."""

    __slots__ = ("num_bins", "_lengths", "_pointers", "_seqs", "width", "num_tokens",
                 "num_seqs", "path")

    def __init__(self, reads: FileReads, local: Path, n: int, width: int, num_tokens: int,
                 num_seqs: int, seqs_at: int, shown: Path | Location) -> None:
        self.num_bins, self.width, self.num_tokens, self.num_seqs = n, width, num_tokens, num_seqs
        self.path = shown  # as messages name the shard
        path = local
        lengths = (path / INDEX, "<i4", mmidx.HEADER_SIZE, n)
        pointers = (path / INDEX, "<i8", mmidx.pointers_at(n), n)
        seqs = (path / SEQS, "<i8", seqs_at, n + 1)
        self._lengths, self._pointers, self._seqs = (reads.values(*c)
                                                     for c in (lengths, pointers, seqs))

    def runs(self, lo: int, hi: int) -> Runs:
        """Bins ``lo..hi-1``. The bins fill ``data.bin`` in order, from its start to its end,
        and their starts ``seq_starts.bin`` likewise: an entry that does not is damage."""
        lengths = self._lengths[lo:hi].astype(np.int64)
        pointers = self._pointers[lo:hi].astype(np.int64)
        seqs = self._seqs[lo:hi + 1].astype(np.int64)
        end = self.num_tokens * self.width
        outside = mmidx.entries_outside(pointers, lengths, self.width, end) \
            | (seqs[:-1] >= seqs[1:])
        outside[0] |= lo == 0 and seqs[0] != 0
        outside[-1] |= hi == self.num_bins and seqs[-1] != self.num_seqs
        if outside.any():
            b = int(np.argmax(outside))
            raise FormatError(
                f"{self.path}: bin {lo + b}: index entry points outside the data (pointer "
                f"{int(pointers[b])}, length {int(lengths[b])}, starts "
                f"{int(seqs[b])}:{int(seqs[b + 1])}; corrupted)")
        previous = mmidx.end_before(self._pointers, self._lengths, lo, self.width)
        b = mmidx.first_stray(pointers, lengths, self.width, previous,
                              end if hi == self.num_bins else None)
        if b >= 0:
            raise FormatError(f"{self.path / INDEX}: bin {lo + b}: byte pointer "
                              f"{int(pointers[b])} does not follow the lengths (corrupted)")
        first = pointers // self.width
        return Runs(first, lengths, first, seqs[:-1], np.diff(seqs))


def shard_record(path: Path) -> dict[str, Any]:
    """The shard's record, checked for its format; errors name the file."""
    return read_shard_record(path, RECORD, kind=FORMAT,
                                   expect={"format": FORMAT, "layout": VERSION})


"""pbin: the Modalities layout (checked by an independent parser), packlab's trailer round trip,
no pickle code ever run, damage caught. What every format promises: test_format_contract."""

from __future__ import annotations

import os
import pickle
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.bins import bins_equal
from packlab.codecs.safe_pickle import UnsafePickleError
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format, pbin
from packlab.formats.pbin import codec as modalities
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_shard
from packlab.spool import SpoolReader


def modalities_documents(path: Path) -> list[np.ndarray]:
    """An independent reader of the published layout, as Modalities' EmbeddedStreamData reads it:
    <Q data bytes, <I token width, unsigned little-endian tokens, pickled [(offset, length)]."""
    raw = path.read_bytes()
    data_len, width = struct.unpack_from("<QI", raw)
    dtype = {1: "<u1", 2: "<u2", 4: "<u4"}[width]
    data = np.frombuffer(raw, dtype=np.uint8, count=data_len, offset=12)
    index = pickle.loads(raw[12 + data_len :])  # trusted here: the test wrote this file
    assert isinstance(index, list) and all(isinstance(e, tuple) for e in index)
    return [data[o : o + n].view(dtype) for o, n in index]


def write_shard(path: Path, spool: SpoolReader, assignment: BinAssignment, **options: object
                ) -> pbin.Reader:
    with pbin.Writer(path, pack_size=assignment.pack_size, **options) as writer:
        for packed in iter_bins(spool, assignment):
            writer.write(packed)
    return pbin.Reader(path)


@pytest.fixture
def shard(tmp_path: Path, spool: SpoolReader, assignment: BinAssignment) -> Path:
    write_shard(tmp_path / "shard.pbin", spool, assignment, vocab_size=spool.vocab_size)
    return tmp_path / "shard.pbin"


def malicious_index(marker: Path) -> bytes:
    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    return pickle.dumps([(0, 4), Exploit()])


@settings(max_examples=12, deadline=None)
@given(
    num_sequences=st.integers(1, 120),
    max_len=st.integers(1, 300),
    pack_size=st.sampled_from([64, 300, 1024]),
    algorithm=st.sampled_from(["next_fit", "first_fit_decreasing", "first_fit_shuffle"]),
    vocab_size=st.sampled_from([200, 256, 257, 65_536, 100_000]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_equals_materialized_bins(num_sequences: int, max_len: int, pack_size: int,
                                             algorithm: str, vocab_size: int, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = write_random_spool(Path(tmp) / "spool", num_sequences=num_sequences,
                                   max_len=max_len, vocab_size=vocab_size, seed=seed)
        assignment, _ = pack(spool.lengths, pack_size, algorithm=algorithm, seed=seed)
        path = Path(tmp) / "shard.pbin"
        reader = write_shard(path, spool, assignment, vocab_size=vocab_size)
        assert detect_format(path) == "pbin"
        assert reader.file.token_width == modalities.token_width_for(vocab_size)
        documents = modalities_documents(path)
        assert len(documents) == reader.num_bins == assignment.num_bins
        for i, packed in enumerate(iter_bins(spool, assignment)):
            assert bins_equal(reader.read_bin(i), packed), i
            assert np.array_equal(documents[i], packed.input_ids), i
        assert np.array_equal(reader.packed_lengths(), assignment.bin_lengths(spool.lengths))
        assert reader.validate()["num_bins"] == assignment.num_bins


def test_token_widths_and_the_header(tmp_path: Path, spool: SpoolReader,
                                     assignment: BinAssignment) -> None:
    tokens = int(assignment.bin_lengths(spool.lengths).sum())
    for width in (2, 4):
        path = tmp_path / f"w{width}.pbin"
        write_shard(path, spool, assignment, token_width=width)
        data_len, header_width = struct.unpack_from("<QI", path.read_bytes())
        assert (data_len, header_width) == (width * tokens, width)
    unknown = write_shard(tmp_path / "unknown.pbin", spool, assignment)  # no vocab: 4 bytes
    assert unknown.file.token_width == 4
    with pytest.raises(PacklabError, match=r"bin \d+: token ids .* do not fit 1-byte"):
        write_shard(tmp_path / "narrow.pbin", spool, assignment, token_width=1)
    assert not (tmp_path / "narrow.pbin").exists()
    with pytest.raises(PacklabError, match="token width must be 1, 2 or 4"):
        pbin.Writer(tmp_path / "x.pbin", pack_size=8, token_width=3)


def test_spool_level_pbin_is_a_plain_modalities_file(tmp_path: Path, spool: SpoolReader) -> None:
    summary = modalities.write_pbin(spool, tmp_path / "spool.pbin")
    assert summary["documents"] == spool.num_sequences and summary["token_width"] == 2
    documents = modalities_documents(tmp_path / "spool.pbin")
    file = pbin.PbinFile(tmp_path / "spool.pbin")
    assert file.footer is None and len(file) == spool.num_sequences
    for i, document in enumerate(documents):
        assert np.array_equal(document, spool.read_sequence(i)[0])
        assert np.array_equal(file.document(i), document)
    with pytest.raises(FormatError, match="a Modalities pbin without packlab's trailer"):
        open_shard(tmp_path / "spool.pbin")
    lossy = pbin.Reader(tmp_path / "spool.pbin", lossy=True)
    first = lossy.read_bin(0)
    assert np.array_equal(first.input_ids, spool.read_sequence(0)[0])
    assert first.loss_mask.tolist() == [1] * (first.packed_len - 1) + [0]
    assert first.seq_start_id.tolist() == [0]
    assert lossy.validate()["lossy"] is True
    with pytest.raises(PacklabError, match="already exists"):
        modalities.write_pbin(spool, tmp_path / "spool.pbin")


def test_a_file_written_the_way_modalities_writes_is_read(tmp_path: Path) -> None:
    """Python's own pickle (protocol 4, memo, frames) as Modalities' TokenizedFileWriter emits."""
    documents = [np.arange(5, dtype="<u2"), np.array([7, 8], dtype="<u2"), np.arange(300, 303)]
    data = b"".join(d.astype("<u2").tobytes() for d in documents)
    offsets = np.cumsum([0] + [2 * len(d) for d in documents])
    index = [(int(o), 2 * len(d)) for o, d in zip(offsets, documents, strict=False)]
    (tmp_path / "m.pbin").write_bytes(struct.pack("<QI", len(data), 2) + data
                                      + pickle.dumps(index))
    file = pbin.PbinFile(tmp_path / "m.pbin")
    assert [file.document(i).tolist() for i in range(3)] == [d.tolist() for d in documents]
    assert [d.tolist() for d in file.iter_documents()] == [d.tolist() for d in documents]


def test_an_index_that_would_run_a_command_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = np.arange(4, dtype="<u2").tobytes()
    path = tmp_path / "evil.pbin"
    path.write_bytes(struct.pack("<QI", len(data), 2) + data + malicious_index(marker))
    with pytest.raises(UnsafePickleError, match="evil.pbin: refused to unpickle global"):
        pbin.PbinFile(path).index()
    with pytest.raises(UnsafePickleError):
        pbin.Reader(path, lossy=True)
    assert not marker.exists()


def test_a_trailer_file_with_a_malicious_index_fails_validation(shard: Path) -> None:
    marker = shard.parent / "pwned"
    raw = bytearray(shard.read_bytes())
    data_len = struct.unpack_from("<Q", raw)[0]
    evil = malicious_index(marker)
    reader = pbin.Reader(shard)
    index_len = reader.footer["sections"]["index"][1]
    assert len(evil) <= index_len
    raw[12 + data_len : 12 + data_len + len(evil)] = evil
    shard.write_bytes(bytes(raw))
    reader = pbin.Reader(shard)  # opening reads the trailer only
    with pytest.raises(UnsafePickleError):
        reader.validate()
    assert not marker.exists()


def test_truncated_and_corrupted_files_are_format_errors(shard: Path) -> None:
    raw = shard.read_bytes()
    shard.write_bytes(raw[:-40])  # trailer cut: now a plain pbin with a broken index
    with pytest.raises(FormatError, match="shard.pbin: .* stray bytes after the pickled index"):
        pbin.Reader(shard, lossy=True)
    with pytest.raises(FormatError, match="shard.pbin: .* stray bytes after the pickled index"):
        pbin.Reader(shard)  # a cut trailer is damage, not "a plain Modalities pbin"
    shard.write_bytes(raw[:7])
    with pytest.raises(FormatError, match="shorter than the 12-byte pbin header"):
        open_shard(shard)
    shard.write_bytes(raw[:8] + struct.pack("<I", 3) + raw[12:])
    with pytest.raises(FormatError, match="token width 3"):
        pbin.Reader(shard)
    shard.write_bytes(struct.pack("<Q", 10**9) + raw[8:])
    with pytest.raises(FormatError, match=r"shard\.pbin: .*(header says|truncated|corrupted)"):
        pbin.Reader(shard)
    flipped = bytearray(raw)
    flipped[20] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    with pytest.raises(FormatError, match="checksum mismatch"):
        pbin.Reader(shard).validate()
    footer = bytearray(raw)
    footer[-20] ^= 0xFF  # inside the JSON footer
    shard.write_bytes(bytes(footer))
    with pytest.raises(FormatError, match="footer"):
        pbin.Reader(shard)


def test_validate_catches_a_leaking_loss_mask(tmp_path: Path, spool: SpoolReader,
                                              assignment: BinAssignment) -> None:
    """A writer with checks off lets a bad bin through; validate must still find it."""
    bins = list(iter_bins(spool, assignment, copy=True))
    bins[1].loss_mask[-1] = 1
    with pbin.Writer(tmp_path / "bad.pbin", pack_size=1024, check=False) as writer:
        for packed in bins:
            writer.write(packed)
    with pytest.raises(InvariantError, match="bad.pbin: bin 1: loss_mask is 1"):
        pbin.Reader(tmp_path / "bad.pbin").validate()


def test_detection_by_suffix_or_trailer(shard: Path) -> None:
    renamed = shard.with_name("no_suffix.bin")
    shard.rename(renamed)
    assert pbin.detect(renamed) and detect_format(renamed) == "pbin"
    (shard.parent / "other.bin").write_bytes(b"x" * 64)
    assert not pbin.detect(shard.parent / "other.bin")

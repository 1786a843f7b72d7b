"""The damage issue 18 found reaching users as foreign exceptions, each now one FormatError
naming the file (and the CLI's one line, exit 2). Each case first shows the library underneath
raising what it raised (so the case is the one the issue names), then packlab's answer."""

from __future__ import annotations

import json
import tokenize
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import one_error_line, random_job, run_cli

from packlab import open_dataset
from packlab.errors import FormatError
from packlab.pipeline.shards import write_shards
from packlab.sources import open_shard
from packlab.sources.validate import validate_path


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    return random_job(tmp_path_factory.mktemp("damage"), num_sequences=60, seed=5)


def output(job, tmp_path: Path, format: str) -> Path:
    """A real output directory of ``format`` with its own copy of the spool (damaged freely)."""
    import shutil

    from packlab.spool import SpoolReader

    spool = tmp_path / "spool"
    shutil.copytree(job[0].path, spool)
    out = tmp_path / "out"
    write_shards(SpoolReader(spool), job[1], out, format=format, bins_per_shard=4, workers=1)
    return out


def read_all(path: Path) -> None:
    dataset = open_dataset(path)
    dataset.read_bins(range(len(dataset)))


def refused(call, *names: object) -> str:
    with pytest.raises(FormatError) as caught:
        call()
    for name in names:
        assert str(name) in str(caught.value), (name, str(caught.value))
    return str(caught.value)


def overwrite_npy_value(path: Path, index: int, value: int) -> None:
    """One value of a 1-D int64 .npy changed in place (its header untouched)."""
    data = np.load(path, mmap_mode="r+")
    data[index] = value
    data.flush()


def test_a_huge_bin_offset_of_packed_index(job, tmp_path) -> None:
    out = output(job, tmp_path, "packed_index")
    offsets = out / "shard_000001" / "bin_offsets.npy"
    overwrite_npy_value(offsets, 2, 2**48)
    refused(lambda: read_all(out), offsets, "bin offsets must rise")
    refused(lambda: validate_path(out), "shard_000001")


def test_a_damaged_spool_offset_under_packed_index(job, tmp_path) -> None:
    out = output(job, tmp_path, "packed_index")
    spool_offsets = np.memmap(tmp_path / "spool" / "offsets.bin", "<u8", "r+")
    spool_offsets[int(np.load(out / "shard_000000" / "seq_indices.npy")[0])] = 2**64 - 1
    spool_offsets.flush()
    refused(lambda: read_all(out), out / "shard_000000", "does not fit its spool")
    refused(lambda: validate_path(out), tmp_path / "spool" / "offsets.bin", "checksum")


@pytest.mark.parametrize("format", ["parquet", "memmap_v1", "legacy_npy_pickle"])
def test_a_receipt_with_one_non_utf8_byte(job, tmp_path, capsys, format) -> None:
    out = output(job, tmp_path, format)
    receipt = next(out.glob("shard_000001*.receipt.json"))
    raw = receipt.read_bytes()
    receipt.write_bytes(raw[:10] + b"\xff" + raw[10:])
    with pytest.raises(UnicodeDecodeError):
        receipt.read_text()
    refused(lambda: validate_path(out), receipt, "unreadable receipt")
    (out / "dataset.json").unlink()  # written before dataset records: receipts place shards
    refused(lambda: open_dataset(out), receipt, "unreadable receipt")
    code, _, err = run_cli(capsys, "validate", out)
    assert code == 2
    one_error_line(err, receipt, prefix="packlab validate: error:")


def break_npy_header(path: Path) -> None:
    """Bytes in a .npy header that make numpy's header parser raise tokenize.TokenError."""
    raw = bytearray(path.read_bytes())
    at = raw.index(b")", raw.index(b"'shape': ("))
    raw[at:at + 1] = b" "  # the shape's bracket never closed
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("format, name", [("memmap_v1", "packed_len.npy"),
                                          ("packed_index", "bin_offsets.npy"),
                                          ("legacy_npy_pickle", "")])
def test_a_npy_header_numpy_cannot_tokenize(job, tmp_path, format, name) -> None:
    out = output(job, tmp_path, format)
    shard = out / "shard_000001" / name if name else out / "shard_000001.npy"
    break_npy_header(shard)
    with pytest.raises(tokenize.TokenError):
        np.load(shard, allow_pickle=False)
    message = refused(lambda: (open_shard(shard.parent if name else shard).read_bin(0)), shard)
    assert "not a valid .npy file: TokenError" in message
    refused(lambda: validate_path(out), "shard_000001")


@pytest.mark.parametrize("key", ["num_bins", "pack_size", "num_tokens"])
def test_a_manifest_count_of_2_to_the_63(job, tmp_path, key) -> None:
    out = output(job, tmp_path, "memmap_v1")
    manifest = out / "shard_000001" / "manifest.json"
    values = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**values, key: 2**63}))
    with pytest.raises(OverflowError):  # what reading it into an index did before
        np.frombuffer(b"", dtype=np.int64, count=2**63)
    refused(lambda: open_shard(out / "shard_000001").read_bin(0), manifest, repr(key))
    refused(lambda: validate_path(out), out / "shard_000001")


def test_a_dataset_manifest_count_of_2_to_the_63(job, tmp_path) -> None:
    out = output(job, tmp_path, "parquet")
    manifest = out / "dataset.json"
    values = json.loads(manifest.read_text())
    values["shards"][0]["bins"] = [0, 2**63]
    manifest.write_text(json.dumps(values))
    refused(lambda: open_dataset(out), manifest)
    refused(lambda: validate_path(out), manifest)


def test_damaged_arrow_schema_bytes(job, tmp_path) -> None:
    out = output(job, tmp_path, "arrow_ipc")
    shard = out / "shard_000001.arrow"
    raw = bytearray(shard.read_bytes())
    at = raw.rindex(b"input_ids")  # the footer's copy of the schema, which readers parse
    raw[at + 1] = 0xEB
    shard.write_bytes(bytes(raw))
    with pytest.raises(UnicodeDecodeError):
        pa.ipc.open_file(pa.memory_map(str(shard))).schema.names  # noqa: B018
    refused(lambda: open_shard(shard), shard, "schema")
    refused(lambda: validate_path(out), shard)


def test_a_spool_manifest_vocab_size_of_the_wrong_type(job, tmp_path) -> None:
    out = output(job, tmp_path, "packed_index")
    manifest = tmp_path / "spool" / "manifest.json"
    values = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**values, "vocab_size": [0, 2**63]}))
    refused(lambda: validate_path(out), "its spool is missing or changed", "vocab_size")


def test_a_sequence_checksums_header_numpy_cannot_tokenize(job, tmp_path) -> None:
    """packed_index's seq_checksums.npy (read by verify=True and validate) goes through the same
    header parser as its index files, never numpy's."""
    out = output(job, tmp_path, "packed_index")
    sums = out / "shard_000001" / "seq_checksums.npy"
    break_npy_header(sums)
    with pytest.raises(tokenize.TokenError):
        np.load(sums, allow_pickle=False)
    refused(lambda: open_shard(sums.parent, verify=True).read_bin(0), sums)
    refused(lambda: validate_path(out), "shard_000001")


@pytest.mark.parametrize("start", [34.0, -8, True, "34"])
def test_a_pbin_trailer_section_that_starts_nowhere(job, tmp_path, start) -> None:
    """A footer whose section start is not a byte offset (the footer itself has no checksum)."""
    from packlab.formats.pbin import TAIL

    out = output(job, tmp_path, "pbin")
    shard = out / "shard_000001.pbin"
    raw = shard.read_bytes()
    length, magic = TAIL.unpack(raw[-TAIL.size:])
    footer = json.loads(raw[-TAIL.size - length:-TAIL.size])
    footer["sections"]["loss_mask"][0] = start
    text = json.dumps(footer, sort_keys=True).encode()
    shard.write_bytes(raw[:-TAIL.size - length] + text + TAIL.pack(len(text), magic))
    refused(lambda: open_shard(shard).read_bin(0), shard, "'loss_mask'")
    refused(lambda: validate_path(out), shard)

"""Modalities' own code over packlab's files, and packlab over Modalities' own files.

Runs the ``modalities`` package (0.5.0, installed by ``make install``): the classes behind its
two data commands, ``IndexGenerator`` (``modalities data create_raw_index``) and
``PackedDataGenerator`` (``modalities data pack_encoded_data``), and its readers
``LargeFileLinesReader``, ``EmbeddedStreamData`` and ``PackedMemMapDatasetBase``. Nothing is
stubbed. (``modalities.api`` and the ``modalities`` command itself do not import beside
transformers 5, which dropped ``LlamaTokenizerFast``; the classes above are what they call.)

The tokenizer Modalities is given wraps packlab's offline BPE (``TokenizerWrapper`` is
Modalities' interface for exactly that), so both sides encode the same text the same way.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error_line, run_cli, write_random_spool
from modalities.dataloader.create_index import IndexGenerator
from modalities.dataloader.create_packed_data import EmbeddedStreamData, PackedDataGenerator
from modalities.dataloader.dataset import PackedMemMapDatasetBase
from modalities.dataloader.large_file_lines_reader import LargeFileLinesReader
from modalities.tokenization.tokenizer_wrapper import TokenizerWrapper

from packlab.formats import format_names, get_format
from packlab.formats.pbin.codec import HEADER_SIZE, SUFFIX, ModalitiesFile
from packlab.interop.modalities import END_OF_TEXT, raw_index_path
from packlab.sources import open_dataset, open_shard
from packlab.tokenize import ChatTokenizer

EOD = "<|endoftext|>"
TEXTS = ["Hello world.", "Zweite Zeile: äöü ß", "数据 packing 🚀", "a\nb\tc \"quoted\"",
         "x" * 3000, "A literal " + EOD + " inside"]


class PacklabBPE(TokenizerWrapper):
    """packlab's offline BPE behind Modalities' tokenizer interface."""

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding = encoding
        self.bpe = ChatTokenizer(encoding)

    def tokenize(self, text: str) -> list[int]:
        return self.bpe.encode_text(text).tolist()

    @property
    def vocab_size(self) -> int:
        return self.bpe.vocab_size

    def get_token_id(self, token: str) -> int:
        assert token == EOD
        return END_OF_TEXT[self.encoding]


def write_jsonl(path: Path, records: list[dict], *, newline: str = "\n", bom: bool = False,
                blank_after: tuple[int, ...] = ()) -> Path:
    lines = []
    for i, record in enumerate(records):
        lines.append(json.dumps(record, ensure_ascii=False))
        if i in blank_after:
            lines.append("   ")
    text = newline.join(lines) + newline
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


@pytest.fixture
def documents(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    records = [{"id": i, "text": TEXTS[i % len(TEXTS)] + f" #{int(rng.integers(1e6))}",
                "meta": {"body": f"nested {i}"}} for i in range(300)]
    return write_jsonl(tmp_path / "docs.jsonl", records)


def test_end_of_text_ids_are_the_encodings_own(tmp_path: Path) -> None:
    for encoding, token in END_OF_TEXT.items():
        assert ChatTokenizer(encoding).decode_bytes([token]) == EOD.encode()


# -- the JSONL line index ---------------------------------------------------------------------
def test_raw_index_equals_modalities_index_generator(documents: Path, tmp_path: Path,
                                                     capsys) -> None:
    theirs = tmp_path / "theirs.idx"
    IndexGenerator(documents).create_index(theirs)
    code, out, err = run_cli(capsys, "raw-index", documents, "--json")
    assert code == 0, err
    ours = Path(json.loads(out)["path"])
    assert ours == raw_index_path(documents) == LargeFileLinesReader.default_index_path(documents)
    assert pickle.loads(ours.read_bytes()) == pickle.loads(theirs.read_bytes())
    reader = LargeFileLinesReader(documents, index_path=ours)
    lines = documents.read_text().splitlines()
    assert len(reader) == len(lines) and all(reader[i] == lines[i] for i in range(len(lines)))


def test_raw_index_of_a_file_modalities_cannot_index(tmp_path: Path, capsys) -> None:
    """CRLF endings, a byte-order mark and blank lines: Modalities' IndexGenerator refuses the
    blank line; packlab's index serves Modalities' reader every record, exactly."""
    records = [{"text": t} for t in TEXTS]
    path = write_jsonl(tmp_path / "awkward.jsonl", records, newline="\r\n", bom=True,
                       blank_after=(1, 3))
    with pytest.raises(ValueError, match="faulty line"):
        IndexGenerator(path).create_index(tmp_path / "theirs.idx")
    assert run_cli(capsys, "raw-index", path)[0] == 0
    reader = LargeFileLinesReader(path, index_path=raw_index_path(path))
    assert [json.loads(reader[i]) for i in range(len(reader))] == records


def test_raw_index_errors_name_the_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": broken}\n')
    code, _, err = run_cli(capsys, "raw-index", path)
    assert code == 2
    one_error_line(err, path, "line 2", prefix="packlab raw-index: error:")
    assert not raw_index_path(path).exists()
    code, _, err = run_cli(capsys, "raw-index", tmp_path / "missing.jsonl")
    assert code == 2


# -- the packed data file ---------------------------------------------------------------------
def modalities_pack(jsonl: Path, index: Path, out: Path) -> Path:
    """Modalities' pack_encoded_data, run through its PackedDataGenerator."""
    generator = PackedDataGenerator(
        jsonl, tokenizer=PacklabBPE(), eod_token=EOD, number_of_processes=2,
        jq_pattern=".text", processing_batch_size=7, raw_samples_queue_size=4,
        processed_samples_queue_size=4, index_path=index)
    generator.run(out)
    return out


def test_pbin_from_jsonl_equals_modalities_pack_encoded_data(documents: Path, tmp_path: Path,
                                                             capsys) -> None:
    assert run_cli(capsys, "raw-index", documents)[0] == 0
    theirs = modalities_pack(documents, raw_index_path(documents), tmp_path / "theirs.pbin")
    code, out, err = run_cli(capsys, "pbin", documents, tmp_path / "ours.pbin", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["documents"] == 300 and summary["token_width"] == 4
    ours = tmp_path / "ours.pbin"
    mine, other = EmbeddedStreamData(ours), EmbeddedStreamData(theirs)
    assert (mine.data_len, mine.token_size_in_bytes) == (other.data_len,
                                                         other.token_size_in_bytes)
    end = HEADER_SIZE + other.data_len
    assert ours.read_bytes()[:end] == theirs.read_bytes()[:end]  # header and every token
    assert mine.index_base == other.index_base
    a = PackedMemMapDatasetBase(ours, sample_key="input_ids")
    b = PackedMemMapDatasetBase(theirs, sample_key="input_ids")
    assert len(a) == len(b) == 300
    bpe = ChatTokenizer("cl100k_base")
    texts = [json.loads(line)["text"] for line in documents.read_text().splitlines()]
    for i in range(300):
        doc = a[i]["input_ids"]
        np.testing.assert_array_equal(doc, b[i]["input_ids"])
        assert doc[-1] == END_OF_TEXT["cl100k_base"]  # a literal "<|endoftext|>" is only text
        assert bpe.decode(doc[:-1]) == texts[i]


def test_packlab_reads_modalities_pack_encoded_data(documents: Path, tmp_path: Path) -> None:
    IndexGenerator(documents).create_index(tmp_path / "docs.idx")
    theirs = modalities_pack(documents, tmp_path / "docs.idx", tmp_path / "theirs.pbin")
    reference = PackedMemMapDatasetBase(theirs, sample_key="ids")
    file = ModalitiesFile(theirs)
    assert len(file) == len(reference)
    assert all(np.array_equal(file.document(i), reference[i]["ids"]) for i in range(len(file)))
    shard = open_shard(theirs, lossy=True)  # each document one bin, learning every next token
    shard.validate()
    assert shard.num_bins == len(reference)
    np.testing.assert_array_equal(shard.read_bin(7).input_ids, reference[7]["ids"])


def test_pbin_from_a_nested_field_and_a_narrow_width(tmp_path: Path, documents: Path,
                                                     capsys) -> None:
    code, out, err = run_cli(capsys, "pbin", documents, tmp_path / "n.pbin", "--field",
                             "meta.body", "--token-width", "2", "--json")
    assert code == 2  # cl100k ids do not fit 2 bytes: refused, not wrapped
    one_error_line(err, tmp_path / "n.pbin", "2-byte", prefix="packlab pbin: error:")
    code, out, err = run_cli(capsys, "pbin", documents, tmp_path / "n.pbin", "--field",
                             ".meta.body", "--json")
    assert code == 0, err
    docs = PackedMemMapDatasetBase(tmp_path / "n.pbin", sample_key="t")
    assert ChatTokenizer().decode(docs[9]["t"][:-1]) == "nested 9"


def test_modalities_reads_packlab_pbin_shards(tmp_path: Path, capsys) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=300, vocab_size=60_000)
    name = next(n for n in format_names() if get_format(n).Writer.SUFFIX == SUFFIX)
    out = tmp_path / "packed"
    code, _, err = run_cli(capsys, "pack", spool.path, out, "--format", name, "--pack-size",
                           1024, "--bins-per-shard", 50)
    assert code == 0, err
    ours = open_dataset(out)
    seen = 0
    for shard in sorted(out.glob(f"shard_*{SUFFIX}")):
        docs = PackedMemMapDatasetBase(shard, sample_key="input_ids")
        for i in range(len(docs)):
            doc = docs[i]["input_ids"]
            assert doc.dtype == np.int32  # Modalities' in-RAM type for 2-byte tokens
            np.testing.assert_array_equal(doc, ours[seen + i]["input_ids"])
        seen += len(docs)
    assert seen == len(ours)


def test_modalities_reads_a_spool_exported_by_packlab_pbin(tmp_path: Path, capsys) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=120, vocab_size=200)
    code, out, err = run_cli(capsys, "pbin", spool.path, tmp_path / "s.pbin", "--json")
    assert code == 0, err
    assert json.loads(out)["token_width"] == 1
    docs = PackedMemMapDatasetBase(tmp_path / "s.pbin", sample_key="x")
    assert len(docs) == spool.num_sequences
    for i in (0, 57, 119):
        np.testing.assert_array_equal(docs[i]["x"], spool.read_sequence(i)[0])


"""A spool exported as a Megatron-core ``.bin/.idx`` prefix (Megatron-LM's ``SFTDataset`` input):
megatron-core's own ``IndexedDataset`` reads it and its ``IndexedDatasetBuilder`` writes the
very same bytes; packlab reads it back as a spool, tokens exact, masks from the sidecar or from
the ChatML role markers (equal to the spool's for real ChatML conversations); a prefix Megatron
wrote reads the same way; damage is one error naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from chat_tokenizers import PROBES, build_tokenizers, write_jsonl
from conftest import write_random_spool

from packlab.errors import FormatError, PacklabError
from packlab.spool import SpoolReader
from packlab.spool.export import export_spool
from packlab.spool.masks import ChatMarkers
from packlab.tokenize import marker_encoder, tokenize_chat_jsonl, tokenizer_spec


def chatml_spool(root: Path, encoding: str = "cl100k_base", copies: int = 4) -> SpoolReader:
    jsonl = write_jsonl(root / "chats.jsonl", PROBES * copies)
    return tokenize_chat_jsonl(jsonl, root / f"spool_{encoding}", encoding=encoding)


def markers_for(spec: object) -> object:
    # packlab's ChatML masks also train the <|im_end|> closing each assistant turn
    return ChatMarkers(train_on_end_of_turn=True).tokenized(marker_encoder(spec))


def same_spool(a: SpoolReader, b: SpoolReader) -> None:
    assert (a.num_sequences, a.num_tokens) == (b.num_sequences, b.num_tokens)
    for name in ("tokens", "masks", "offsets", "lengths"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_export_reads_back_exact_with_masks_from_sidecar_or_markers(tmp_path: Path,
                                                                    encoding: str) -> None:
    spool = chatml_spool(tmp_path, encoding)
    record = export_spool(spool, tmp_path / "conversations")
    assert record["tokens_dtype"] == "int32"  # a 100k/200k vocabulary needs int32
    back = SpoolReader(tmp_path / "conversations")
    same_spool(back, spool)
    back.verify()
    derived = SpoolReader(tmp_path / "conversations.idx",
                          markers=markers_for(encoding))  # the sidecar ignored
    assert "masks" not in derived.columns
    same_spool(derived, spool)
    assert 0 < int(spool.masks.sum()) < spool.num_tokens
    # Megatron-LM's own rule (no end of turn): the same, less each turn's <|im_end|>
    plain = SpoolReader(tmp_path / "conversations",
                        markers=ChatMarkers().tokenized(marker_encoder(encoding)))
    im_end = spool.tokens == markers_for(encoding).end[0]
    assert np.array_equal(plain.masks, spool.masks * ~im_end)


def test_hugging_face_chatml_tokenizer_masks_from_markers(tmp_path: Path) -> None:
    _, folders = build_tokenizers(tmp_path / "tok")
    jsonl = write_jsonl(tmp_path / "chats.jsonl", PROBES * 2)
    spec = tokenizer_spec(folders["chatml"])
    spool = tokenize_chat_jsonl(jsonl, tmp_path / "spool", tokenizer=folders["chatml"])
    export_spool(spool, tmp_path / "hf")
    assert SpoolReader(tmp_path / "hf").token_dtype == np.dtype("<u2")  # a 2048-id vocabulary
    same_spool(SpoolReader(tmp_path / "hf", markers=markers_for(spec)), spool)


def test_megatron_core_reads_it_and_its_builder_writes_the_same_bytes(tmp_path: Path) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    spool = chatml_spool(tmp_path)
    export_spool(spool, tmp_path / "packlab")
    dataset = IndexedDataset(str(tmp_path / "packlab"))
    assert len(dataset) == spool.num_sequences
    assert np.array_equal(dataset.document_indices, np.arange(spool.num_sequences + 1))
    for i in range(spool.num_sequences):
        assert np.array_equal(dataset[i], spool.read_sequence(i)[0]), i
    builder = IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=np.int32)
    for i in range(spool.num_sequences):  # one document per conversation, as SFTDataset reads
        tokens = torch.from_numpy(spool.read_sequence(i)[0].astype(np.int64))
        builder.add_document(tokens, [tokens.numel()])
    builder.finalize(str(tmp_path / "megatron.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"packlab{suffix}").read_bytes() == \
            (tmp_path / f"megatron{suffix}").read_bytes()
    # a prefix Megatron wrote (no sidecar, no record) reads as a spool, masks from the markers
    with pytest.raises(FormatError, match=r"megatron: no mask sidecar \(megatron.masks.bin\)"):
        _ = SpoolReader(tmp_path / "megatron").masks
    theirs = SpoolReader(tmp_path / "megatron", markers=markers_for("cl100k_base"))
    theirs.verify()
    assert np.array_equal(theirs.tokens, spool.tokens)
    assert np.array_equal(theirs.masks, spool.masks)
    # and exports with the derived masks as its sidecar
    export_spool(theirs, tmp_path / "with_masks", markers=theirs.markers)
    same_spool(SpoolReader(tmp_path / "with_masks"), spool)
    del dataset


def test_uint16_when_the_vocabulary_fits(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=2000, vocab_size=32_000)
    record = export_spool(spool, tmp_path / "small")
    assert record["tokens_dtype"] == "uint16"
    assert (tmp_path / "small.bin").stat().st_size == 2 * spool.num_tokens
    same_spool(SpoolReader(tmp_path / "small"), spool)


def test_refusals_and_damage_name_the_file(tmp_path: Path) -> None:
    spool = chatml_spool(tmp_path, copies=1)
    export_spool(spool, tmp_path / "p")
    with pytest.raises(PacklabError, match=r"p\.bin: already exists"):
        export_spool(spool, tmp_path / "p")
    export_spool(spool, tmp_path / "p", overwrite=True)
    for name, damage, message in [
        ("p.bin", lambda f: f.write_bytes(f.read_bytes()[:-4]), r"p\.bin: \d+ bytes, its \.idx"),
        ("p.idx", lambda f: f.write_bytes(b"NOTMMIDX" + f.read_bytes()[8:]), "bad magic"),
        ("p.idx", lambda f: f.write_bytes(f.read_bytes()[:-8]), r"p\.idx: \d+ bytes, its header"),
        ("p.masks.bin", lambda f: f.write_bytes(f.read_bytes()[:-1]), r"p\.masks\.bin: \d+ by"),
    ]:
        copy = tmp_path / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        copy.mkdir()
        for file in tmp_path.glob("p.*"):
            shutil.copy(file, copy / file.name)
        damage(copy / name)
        with pytest.raises(FormatError, match=message):
            SpoolReader(copy / "p")
    flipped = tmp_path / "flip"
    flipped.mkdir()
    for file in tmp_path.glob("p.*"):
        shutil.copy(file, flipped / file.name)
    data = bytearray((flipped / "p.bin").read_bytes())
    data[5] ^= 1
    (flipped / "p.bin").write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"flip/p\.bin: checksum mismatch"):
        SpoolReader(flipped / "p").verify()


def test_export_holds_one_chunk_of_the_spool_at_a_time(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python heap's peak while exporting (numpy's buffers included, tracemalloc) does
    not grow with the spool: it is bounded by one chunk of tokens and the write buffers of the
    two files written, whatever the spool holds (both made small here, so the spools dwarf
    them)."""
    import tracemalloc

    from packlab.spool import export as spool_export
    from packlab.storage import files

    monkeypatch.setattr(spool_export, "_CHUNK_TOKENS", 1 << 15)
    monkeypatch.setattr(files, "WRITE_BUFFER", 1 << 16)
    monkeypatch.setattr(files, "WRITE_ALIGN", 1 << 15)
    peaks = {}
    for sequences in (500, 4000):
        spool = write_random_spool(tmp_path / f"s{sequences}", num_sequences=sequences,
                                   vocab_size=32_000, max_len=600, seed=sequences)
        _ = spool.lengths, spool.offsets  # the index arrays: mapped, not the export's
        tracemalloc.start()
        export_spool(spool, tmp_path / f"p{sequences}")
        peaks[sequences] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        same_spool(SpoolReader(tmp_path / f"p{sequences}"), spool)
    # a chunk's uint16 copy and masks (3 bytes a token), two write buffers and their last write
    bound = 3 * (1 << 15) + 2 * ((1 << 16) + 3 * (1 << 15)) + 100_000
    assert peaks[500] < bound and peaks[4000] < bound  # 1.2M tokens: 3.6 MB written


def test_the_throughput_measurement_reads_what_it_times(tmp_path: Path) -> None:
    from packlab.lab.measure.prefix_export import export_and_read_back

    spool = chatml_spool(tmp_path)
    result = export_and_read_back(spool.path, tmp_path, markers_for("cl100k_base"))
    assert result["same_reads"] and result["masks_equal"]
    assert result["num_tokens"] == spool.num_tokens
    assert set(result["tokens_per_second"]) == {"export", "read_spool", "read_prefix",
                                               "derive_masks", "verify_prefix"}

"""``packlab export`` from the command line, local and ``s3://``: a spool of real ChatML
conversations out as a Megatron prefix and back, masks from the sidecar or the role markers,
``pack --format packed_index`` over the prefix and ``validate`` of it; bad input one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chat_tokenizers import PROBES, write_jsonl
from conftest import BUCKET, one_error_line, run_cli, write_random_spool

from packlab import open_dataset
from packlab.cloud.transfer import upload_shard
from packlab.errors import FormatError
from packlab.loading.dataset import bin_digests
from packlab.sources import open_shard
from packlab.sources.export import export
from packlab.spool import SpoolReader
from packlab.spool.masks import ChatMarkers, MarkerTokens
from packlab.tokenize import marker_encoder, tokenize_chat_jsonl


@pytest.fixture(autouse=True)
def private_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKLAB_STAGING_DIR", str(tmp_path / "staging"))


@pytest.fixture
def spool(tmp_path: Path) -> SpoolReader:
    jsonl = write_jsonl(tmp_path / "chats.jsonl", PROBES * 5)
    return tokenize_chat_jsonl(jsonl, tmp_path / "spool", encoding="cl100k_base")


def same_masks_and_tokens(a: SpoolReader, b: SpoolReader) -> None:
    for name in ("tokens", "masks", "offsets", "lengths"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_export_markers_pack_and_validate(tmp_path: Path, spool: SpoolReader, capsys) -> None:
    code, out, err = run_cli(capsys, "export", spool.path, tmp_path / "conv", "--json")
    assert code == 0, err
    assert json.loads(out)["masks"] == "spool"
    same_masks_and_tokens(SpoolReader(tmp_path / "conv"), spool)
    for name in ("conv", "conv.idx", "conv.bin"):  # a prefix is a spool to validate and inspect
        code, out, err = run_cli(capsys, "validate", tmp_path / name, "--json")
        assert code == 0 and json.loads(out)["kind"] == "spool", err
    code, out, err = run_cli(capsys, "inspect", tmp_path / "conv", "--json")
    described = json.loads(out)
    assert described["format"] == "megatron_prefix_v1" and described["num_tokens"] == \
        spool.num_tokens
    assert described["mask_fraction"] == pytest.approx(spool.masks.mean())
    assert set(described["files"]) == {"conv.bin", "conv.idx", "conv.masks.bin",
                                       "conv.spool.json"}
    # the masks again, derived from the role markers (Megatron-LM's way, plus the end of turn)
    code, out, err = run_cli(capsys, "export", tmp_path / "conv.idx", tmp_path / "derived",
                             "--chat-markers", "cl100k_base", "--end-of-turn", "--json")
    assert code == 0, err
    assert json.loads(out)["masks"] == "chat markers"
    same_masks_and_tokens(SpoolReader(tmp_path / "derived"), spool)
    code, _, err = run_cli(capsys, "export", tmp_path / "conv", tmp_path / "plain",
                           "--chat-markers", "cl100k_base", "--no-thinking-traces")
    assert code == 0, err
    assert int(SpoolReader(tmp_path / "plain").masks.sum()) < int(spool.masks.sum())
    # packed_index over the prefix (index-only packing over offline-tokenized data), as over a spool
    for source, name in ((tmp_path / "derived", "over_prefix"), (spool.path, "over_spool")):
        code, _, err = run_cli(capsys, "pack", source, tmp_path / name, "--format",
                               "packed_index", "--pack-size", 512)
        assert code == 0, err
        code, out, err = run_cli(capsys, "validate", tmp_path / name, "--json")
        assert code == 0, err
    assert bin_digests(open_dataset(tmp_path / "over_prefix")) == \
        bin_digests(open_dataset(tmp_path / "over_spool"))
    # packed_index notices a changed prefix
    data = bytearray((tmp_path / "derived.masks.bin").read_bytes())
    data[3] ^= 1
    (tmp_path / "derived.masks.bin").write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "validate", tmp_path / "over_prefix")
    assert code == 2
    one_error_line(err, "derived", prefix="packlab validate: error:")


def test_refusals_are_one_line(tmp_path: Path, spool: SpoolReader, capsys) -> None:
    assert run_cli(capsys, "export", spool.path, tmp_path / "conv")[0] == 0
    cases = [
        (["export", spool.path, tmp_path / "conv"], "conv.idx: already exists"),
        (["export", tmp_path / "nothing", tmp_path / "x"], "neither a spool"),
        (["export", spool.path, tmp_path / "y", "--end-of-turn"], "need --chat-markers"),
        (["export", spool.path, tmp_path / "y", "--chat-markers", "cl100k_base", "--marker",
          "bogus=x"], "--marker bogus=x"),
        (["export", spool.path, tmp_path / "no" / "y"], "no such folder"),
        (["export", spool.path, tmp_path / "chats", ], None),
    ]
    (tmp_path / "chats.idx").write_text("not mine")
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, (argv, err)
        one_error_line(err, message or "chats.idx", prefix="packlab export: error:")
    assert run_cli(capsys, "export", spool.path, tmp_path / "conv", "--overwrite")[0] == 0
    code, _, err = run_cli(capsys, "export", tmp_path / "conv", tmp_path / "y",
                           "--chat-markers", "not/a/tokenizer")
    assert code == 2
    one_error_line(err, prefix="packlab export: error:")


def test_export_to_and_from_object_storage(tmp_path: Path, spool: SpoolReader, server,
                                           capsys) -> None:
    uri = f"s3://{BUCKET}/megatron/conv"
    code, _, err = run_cli(capsys, "export", spool.path, uri)
    assert code == 0, err
    names = ("conv.bin", "conv.idx", "conv.masks.bin", "conv.spool.json")
    fs = server.filesystem()
    for name in names:
        with fs.open_input_stream(f"{BUCKET}/megatron/{name}") as f:
            (tmp_path / name).write_bytes(f.read())
    export(spool.path, str(tmp_path / "local"))
    for name in names[:3]:
        assert (tmp_path / name).read_bytes() == \
            (tmp_path / name.replace("conv", "local")).read_bytes(), name
    same_masks_and_tokens(SpoolReader(tmp_path / "conv"), spool)
    assert not any((tmp_path / "staging").iterdir())
    code, out, err = run_cli(capsys, "validate", uri, "--json")
    assert code == 0 and json.loads(out)["num_tokens"] == spool.num_tokens, err
    code, _, err = run_cli(capsys, "export", spool.path, uri)
    assert code == 2
    one_error_line(err, uri, prefix="packlab export: error:")
    assert run_cli(capsys, "export", spool.path, uri, "--overwrite")[0] == 0
    # a spool on object storage exported to a local prefix
    upload_shard(spool.path, f"s3://{BUCKET}/spools/chat")
    back = export(f"s3://{BUCKET}/spools/chat", str(tmp_path / "from_s3"))
    assert back["num_sequences"] == spool.num_sequences
    same_masks_and_tokens(SpoolReader(tmp_path / "from_s3"), spool)


def test_a_prefix_on_object_storage_and_packed_index_to_it(tmp_path: Path, spool: SpoolReader,
                                                            server, capsys) -> None:
    uri = f"s3://{BUCKET}/prefixes/conv"
    assert run_cli(capsys, "export", spool.path, uri)[0] == 0
    # a prefix on the store read as a spool: by its name or its .idx, masks from either place
    for source, flags in ((uri, []), (f"{uri}.idx", ["--chat-markers", "cl100k_base",
                                                      "--end-of-turn"])):
        out = tmp_path / f"back{len(flags)}"
        code, _, err = run_cli(capsys, "export", source, out, *flags)
        assert code == 0, err
        same_masks_and_tokens(SpoolReader(out), spool)
    # a prefix on the store packed as it is: fetched once, checked against its record
    code, _, err = run_cli(capsys, "pack", uri, tmp_path / "from_store", "--format", "binidx",
                           "--pack-size", 512)
    assert code == 0, err
    assert run_cli(capsys, "pack", spool.path, tmp_path / "from_spool", "--format", "binidx",
                   "--pack-size", 512)[0] == 0
    assert bin_digests(open_dataset(tmp_path / "from_store")) == bin_digests(
        open_dataset(tmp_path / "from_spool"))
    # bare, as Megatron's own tools leave it (no record, no sidecar): masks from the markers
    fs = server.filesystem()
    fs.delete_file(f"{BUCKET}/prefixes/conv.spool.json")
    fs.delete_file(f"{BUCKET}/prefixes/conv.masks.bin")
    code, _, err = run_cli(capsys, "export", uri, tmp_path / "bare")
    assert code == 2
    one_error_line(err, "no mask sidecar", prefix="packlab export: error:")
    back = export(uri, str(tmp_path / "bare"), markers=chatml_markers())
    assert back["exported_from"]["masks"] == "chat markers"
    same_masks_and_tokens(SpoolReader(tmp_path / "bare"), spool)
    # packed_index over a local prefix, written to the store: the prefix travels along
    out = f"s3://{BUCKET}/packed/over_prefix"
    code, _, err = run_cli(capsys, "pack", tmp_path / "bare", out, "--format", "packed_index",
                           "--pack-size", 512)
    assert code == 0, err
    code, _, err = run_cli(capsys, "validate", out)
    assert code == 0, err
    assert run_cli(capsys, "pack", spool.path, tmp_path / "over_spool", "--format",
                   "packed_index", "--pack-size", 512)[0] == 0
    assert bin_digests(open_dataset(out)) == bin_digests(open_dataset(tmp_path / "over_spool"))


def chatml_markers() -> MarkerTokens:
    return ChatMarkers(train_on_end_of_turn=True).tokenized(marker_encoder("cl100k_base"))


def test_packed_index_over_a_uint16_prefix(tmp_path: Path, capsys) -> None:
    """A prefix of a small vocabulary (uint16 tokens, as megatron-core stores them below 65,500
    ids) packs into packed_index as its int32 spool does: the same bins, the same per-sequence
    checksums (hashed as int32), validated; a token changed in place is found by a verified
    read (naming shard and bin) and by validate (naming the prefix's file)."""
    small = write_random_spool(tmp_path / "small", num_sequences=50, vocab_size=30_000)
    export(small.path, str(tmp_path / "u16"))
    assert SpoolReader(tmp_path / "u16").columns["tokens"].dtype == np.dtype("<u2")
    index, over_spool = tmp_path / "index", tmp_path / "over_spool"
    for source, out in ((tmp_path / "u16", index), (small.path, over_spool)):
        code, _, err = run_cli(capsys, "pack", source, out, "--format", "packed_index",
                               "--pack-size", 4096)
        assert code == 0, err
    assert run_cli(capsys, "validate", index)[0] == 0
    expected = bin_digests(open_dataset(_packed(small.path, tmp_path / "copied", capsys)))
    assert bin_digests(open_dataset(index)) == expected
    assert bin_digests(open_dataset(index, verify=True)) == expected
    sums = sorted(index.glob("shard_*/seq_checksums.npy"))
    assert sums and all(np.array_equal(np.load(a), np.load(over_spool / a.relative_to(index)))
                        for a in sums)
    shard = sorted(index.glob("shard_*"))[0]
    reader = open_shard(shard, verify=True)
    seq = int(reader.assignment.bin_indices(1)[0])
    position = 2 * (int(small.offsets[seq]) + 1)
    with open(tmp_path / "u16.bin", "r+b") as f:  # the second token of bin 1's first sequence
        f.seek(position)
        token = int.from_bytes(f.read(2), "little")
        f.seek(position)
        f.write(((token + 1) % 30_000).to_bytes(2, "little"))
    with pytest.raises(FormatError, match=f"{shard.name}: bin 1: its sequence 0 differs"):
        open_shard(shard, verify=True).read_bin(1)
    code, _, err = run_cli(capsys, "validate", index)
    assert code != 0
    one_error_line(err, "u16.bin", "checksum mismatch", prefix="packlab validate: error:")


def test_packed_index_refuses_an_int64_prefix_on_one_line(tmp_path: Path, capsys) -> None:
    """A prefix megatron-core wrote with int64 tokens reads as a spool, but packed_index gathers
    int32 or uint16 ones: refused before a shard is started, naming the file and its dtype."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(tmp_path / "wide.bin"), dtype=np.int64)
    for n in (5, 9, 3):
        builder.add_document(torch.arange(n, dtype=torch.int64), [n])
    builder.finalize(str(tmp_path / "wide.idx"))
    code, _, err = run_cli(capsys, "pack", tmp_path / "wide", tmp_path / "index", "--format",
                           "packed_index", "--pack-size", 16)
    assert code == 2
    one_error_line(err, "wide.bin", "int64 tokens", prefix="packlab pack: error:")
    assert not list((tmp_path / "index").glob("shard_*"))


def _packed(spool: Path, out: Path, capsys) -> Path:
    assert run_cli(capsys, "pack", spool, out, "--format", "binidx", "--pack-size", 4096)[0] == 0
    return out

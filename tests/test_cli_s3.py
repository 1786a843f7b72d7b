"""The command line on object storage (a local moto server on 127.0.0.1): every format packed
to ``s3://`` and read back by every command; layouts, splits and run folders by URI; spools
from and to URIs; and never a local ``./s3:`` folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
from conftest import BUCKET, one_error_line, run_cli, write_random_spool

from packlab import open_dataset
from packlab.formats import format_names, get_format
from packlab.lab.s3server import S3Server
from packlab.loading.dataset import bin_digests
from packlab.spool import SpoolReader

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

FORMATS = format_names()


def way_of_travel(name: str) -> tuple[bool, bool, bool, bool]:
    """How a format's bytes reach the store and come back: streamed or staged when written,
    read in place or fetched, a spool beside it, one file or a directory. Formats do not know
    where their bytes live (``packlab.storage.location``), so every command's way to and from the store
    is one per way of travel, not one per format: the command test runs one format of each
    (every format's own round trip through the store is ``test_cloud.py``'s)."""
    fmt = get_format(name)
    return (fmt.Writer.STREAMS, fmt.Reader.READS_IN_PLACE, fmt.Writer.NEEDS_SPOOL,
            bool(fmt.SUFFIX))


ONE_PER_WAY = [name for i, name in enumerate(FORMATS)
               if way_of_travel(name) not in {way_of_travel(n) for n in FORMATS[:i]}]
SPLITS = "train=0.8,valid=0.2"
# The module's spool packs into 39 bins at --pack-size 512; 16 a shard makes three shards
# (16, 16, 7): several, and a short last one, where a shard lost, repeated or out of order
# on the way through the store shows. Each shard costs every command its own requests to
# the store (a few dozen), so no more shards than that.
BINS_PER_SHARD = 16



@pytest.fixture(autouse=True)
def private_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads and staging in the test's folder, never the home directory; the working
    directory a folder of its own, to show no ``s3:`` folder appears in it."""
    monkeypatch.setenv("PACKLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKLAB_STAGING_DIR", str(tmp_path / "staging"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3cli")
    write_random_spool(root / "chat", num_sequences=120, max_len=300, seed=7)
    return root / "chat"


def digests(path: object, **kwargs: object) -> list[str]:
    """Every bin's content hash, in order, as ``open_dataset`` serves them."""
    return bin_digests(open_dataset(path, **kwargs))


def objects(server: S3Server, prefix: str) -> list[str]:
    sel = pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True, allow_not_found=True)
    return sorted(i.path for i in server.filesystem().get_file_info(sel)
                  if i.type == pafs.FileType.File)


@pytest.mark.parametrize("name", ONE_PER_WAY)
def test_pack_to_s3_then_every_command_reads_it(server, spool, tmp_path, capsys, name) -> None:
    uri = f"s3://{BUCKET}/every/{name}"
    local = tmp_path / "local"
    pack = ["--format", name, "--pack-size", 512, "--bins-per-shard", BINS_PER_SHARD,
            "--workers", 2]
    assert run_cli(capsys, "pack", spool, uri, *pack)[0] == 0
    assert run_cli(capsys, "pack", spool, local, *pack)[0] == 0
    want = digests(local)
    assert digests(uri) == want
    assert not any(tmp_path.joinpath("cwd").iterdir())  # no ./s3:/... folder
    assert not any(tmp_path.joinpath("staging").iterdir())  # staging removed once uploaded
    keys = objects(server, f"every/{name}")
    assert f"{BUCKET}/every/{name}/dataset.json" in keys

    code, out, err = run_cli(capsys, "validate", uri, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["num_bins"] == len(want) and result["dataset_record"] is True
    assert all(r["receipt"] for r in result["shards"])

    code, out, err = run_cli(capsys, "inspect", uri, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["format"] == name and info["num_bins"] == len(want)
    assert info["num_shards"] == result["num_shards"]

    code, out, err = run_cli(capsys, "bench", "size", uri, "--json")
    assert code == 0, err
    size = json.loads(out)
    code, out, _ = run_cli(capsys, "bench", "size", local, "--json")
    here = json.loads(out)
    for key in ("num_bins", "num_tokens", "num_seqs", "padding_tokens", "token_entropy_bits"):
        assert size[key] == here[key], key
    if not get_format(name).Writer.NEEDS_SPOOL:  # packed_index on S3 carries its spool beside
        assert size["bytes_on_disk"] == here["bytes_on_disk"]

    sql = "SELECT count(*) AS bins, sum(packed_len) AS tokens, sum(loss_tokens) AS loss FROM bins"
    code, out, err = run_cli(capsys, "query", sql, "--data", uri, "--format", "json")
    assert code == 0, err
    code, out_local, _ = run_cli(capsys, "query", sql, "--data", local, "--format", "json")
    assert json.loads(out) == json.loads(out_local)
    assert json.loads(out)["rows"][0]["bins"] == len(want)

    target = f"s3://{BUCKET}/converted/{name}"
    code, _, err = run_cli(capsys, "convert", uri, target, "--format", "parquet")
    assert code == 0, err
    assert digests(target) == want
    assert run_cli(capsys, "validate", target)[0] == 0


def test_a_layout_by_uri_its_splits_and_its_run_folder(server, spool, tmp_path, capsys) -> None:
    other = write_random_spool(tmp_path / "code", num_sequences=80, max_len=200, seed=8).path
    uri = f"s3://{BUCKET}/layout"
    local = tmp_path / "layout"
    # 110 bins: each source's split in several shards but code's valid (chat's valid: 16, 1)
    argv = ["--format", "parquet", "--pack-size", 256, "--split", SPLITS,
            "--bins-per-shard", BINS_PER_SHARD]
    assert run_cli(capsys, "pack", spool, other, uri, *argv)[0] == 0
    assert run_cli(capsys, "pack", spool, other, local, *argv)[0] == 0
    for split in ("train", "valid"):
        want = digests(local, split=split)
        assert digests(uri, split=split) == want
        assert digests(f"{uri}/splits/{split}") == want  # resolved through blend.json
        code, out, err = run_cli(capsys, "validate", uri, "--split", split, "--json")
        assert code == 0 and json.loads(out)["num_bins"] == len(want), err
    code, out, err = run_cli(capsys, "validate", uri, "--json")
    assert code == 0, err
    assert set(json.loads(out)["splits"]) == {"train", "valid"}
    code, out, _ = run_cli(capsys, "query", "SELECT split, count(*) AS n FROM bins GROUP BY "
                           "split ORDER BY split", "--data", uri, "--format", "json")
    assert [r["n"] for r in json.loads(out)["rows"]] == [
        len(digests(local, split=s)) for s in ("train", "valid")]
    runs = f"{uri}/runs"
    code, out, err = run_cli(capsys, "inspect", runs, "--split", "valid", "--json")
    assert code == 0, err
    assert json.loads(out)["num_bins"] == len(digests(local, split="valid"))
    code, _, err = run_cli(capsys, "convert", uri, tmp_path / "c", "--format", "arrow_ipc",
                           "--split", "valid")
    assert code == 0, err
    assert digests(tmp_path / "c") == digests(local, split="valid")


def test_spools_to_and_from_object_storage(server, tmp_path, capsys) -> None:
    uri = f"s3://{BUCKET}/spools/chat"
    code, out, err = run_cli(capsys, "synth", uri, "-n", 60, "--seed", 2, "--json")
    assert code == 0, err
    assert json.loads(out)["path"] == uri
    assert not any(tmp_path.joinpath("cwd").iterdir())
    code, out, _ = run_cli(capsys, "inspect", uri, "--json")
    assert code == 0 and json.loads(out)["num_sequences"] == 60
    assert run_cli(capsys, "validate", uri)[0] == 0
    code, out, _ = run_cli(capsys, "plan", uri, "--pack-size", 4096, "--json")
    assert code == 0 and json.loads(out)["num_sequences"] == 60
    code, _, err = run_cli(capsys, "pack", uri, tmp_path / "out", "--format", "binidx",
                           "--pack-size", 4096)
    assert code == 0, err
    assert len(open_dataset(tmp_path / "out")) == json.loads(out)["num_bins"]
    code, _, err = run_cli(capsys, "synth", uri, "-n", 5)  # an existing spool: refused
    assert code == 2
    one_error_line(err, uri, "already exists", "--overwrite")
    assert run_cli(capsys, "synth", uri, "-n", 5, "--overwrite")[0] == 0
    local = tmp_path / "again"
    assert run_cli(capsys, "synth", local, "-n", 5)[0] == 0
    assert SpoolReader(local).num_sequences == 5


def test_a_nemotron_spool_on_object_storage_is_one_clear_refusal(server, tmp_path,
                                                                  capsys) -> None:
    """A spool uploaded as Nemotron writes it (no file checksums to fetch it verified):
    reading it by URI is refused in one line that says why and what to do; nothing written."""
    from nemotron_layout import chat_sft_extra, random_sequences, write_nemotron_spool

    spool = tmp_path / "nemotron"
    write_nemotron_spool(spool, random_sequences(np.full(40, 50), seed=1), chat_sft_extra(0))
    fs = server.filesystem()
    for file in spool.iterdir():
        with fs.open_output_stream(f"{BUCKET}/nemotron/{file.name}") as out:
            out.write(file.read_bytes())
    uri = f"s3://{BUCKET}/nemotron"
    code, _, err = run_cli(capsys, "pack", uri, tmp_path / "out", "--format", "memmap_v1",
                           "--pack-size", 256)
    assert code == 2
    one_error_line(err, uri, "records no file checksums", "download it first")
    assert not (tmp_path / "out").exists()


def test_convert_to_one_object_reports_its_uri(server, spool, tmp_path, capsys) -> None:
    run_cli(capsys, "pack", spool, tmp_path / "p", "--format", "arrow_ipc", "--pack-size", 512)
    shard = sorted((tmp_path / "p").glob("*.arrow"))[0]
    target = f"s3://{BUCKET}/one/c.parquet"
    code, out, err = run_cli(capsys, "convert", shard, target, "--format", "parquet", "--json")
    assert code == 0, err
    assert json.loads(out)["shards"][0]["destination"] == target
    assert digests(target) == digests(shard)
    code, _, err = run_cli(capsys, "convert", shard, target, "--format", "parquet")
    assert code == 2
    one_error_line(err, target, "--overwrite")
    assert run_cli(capsys, "convert", shard, target, "--format", "parquet", "--overwrite")[0] == 0


def test_what_an_upload_leaves_behind_is_refused_until_finished(server, spool, tmp_path,
                                                                  capsys) -> None:
    """An output whose upload stopped half way (dataset.json still "writing") is refused by
    every reader; the same pack finishes it, sending only what is missing."""
    uri = f"s3://{BUCKET}/halfway"
    argv = ["--format", "parquet", "--pack-size", 512, "--bins-per-shard", BINS_PER_SHARD]
    assert run_cli(capsys, "pack", spool, uri, *argv)[0] == 0
    fs = server.filesystem()
    manifest = json.loads(fs.open_input_file(f"{BUCKET}/halfway/dataset.json").read())
    writing = {**manifest, "state": "writing"}
    with fs.open_output_stream(f"{BUCKET}/halfway/dataset.json") as f:
        f.write(json.dumps(writing).encode())
    last = manifest["shards"][-1]["name"]
    fs.delete_file(f"{BUCKET}/halfway/{last}")
    for argv_read in (["validate", uri], ["inspect", uri], ["bench", "size", uri],
                      ["query", "SELECT 1", "--data", uri]):
        code, out, err = run_cli(capsys, *argv_read)
        assert code == 2 and out == ""
        one_error_line(err, uri, "incomplete output")
    server.reset_counts()
    assert run_cli(capsys, "pack", spool, uri, *argv)[0] == 0
    sent = [e["path"] for e in server.stats()["log"] if e["method"] == "PUT"
            and e["path"].endswith(".parquet") and "/." not in e["path"]]
    assert sent == [f"/{BUCKET}/halfway/{last}"]  # kept shards are not sent again
    assert run_cli(capsys, "validate", uri)[0] == 0
    assert os.listdir(tmp_path / "cwd") == []


def test_another_pack_into_an_output_on_the_store_is_refused(server, spool, tmp_path,
                                                               capsys) -> None:
    """As for a local folder: a pack whose job differs from the output already at the URI is
    refused in one line naming the URI, nothing on the store changes; --overwrite replaces it."""
    uri = f"s3://{BUCKET}/another"
    argv = ["--format", "parquet", "--bins-per-shard", BINS_PER_SHARD]
    assert run_cli(capsys, "pack", spool, uri, *argv, "--pack-size", 512)[0] == 0
    before = {k: server.filesystem().open_input_file(k).read() for k in objects(server, "another")}
    want = digests(uri)
    code, out, err = run_cli(capsys, "pack", spool, uri, *argv, "--pack-size", 384)
    assert code == 2 and out == ""
    line = one_error_line(err, uri, "already holds another output", "--overwrite")
    assert "staging" not in line
    assert {k: server.filesystem().open_input_file(k).read()
            for k in objects(server, "another")} == before
    assert run_cli(capsys, "pack", spool, uri, *argv, "--pack-size", 512)[0] == 0  # the same job
    assert digests(uri) == want
    assert run_cli(capsys, "pack", spool, uri, *argv, "--pack-size", 384, "--overwrite")[0] == 0
    local = tmp_path / "local"
    assert run_cli(capsys, "pack", spool, local, *argv, "--pack-size", 384)[0] == 0
    assert digests(uri) == digests(local) != want
    assert os.listdir(tmp_path / "cwd") == []


def test_the_command_in_its_own_process_reaches_the_store(server, spool, tmp_path) -> None:
    """``packlab`` as a separate process, configured by the environment alone
    (AWS_ENDPOINT_URL_S3 and keys): files written to and read from URIs, none locally."""
    env = {**os.environ, **server.environment(),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cwd = tmp_path / "cwd"

    def packlab(*argv: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "packlab.cli", *map(str, argv)], env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=300)

    docs = f"s3://{BUCKET}/docs/chat.jsonl"
    done = packlab("corpus", docs, "--records", 5, "--index", "--json")
    assert done.returncode == 0, done.stderr
    done = packlab("raw-index", docs)
    assert done.returncode == 0, done.stderr
    assert {f"{BUCKET}/docs/{n}" for n in ("chat.jsonl", "chat.jsonl.idx", "chat.idx")} <= set(
        objects(server, "docs"))
    out = f"s3://{BUCKET}/process/out"
    done = packlab("pack", spool, out, "--format", "arrow_ipc", "--pack-size", 512)
    assert done.returncode == 0, done.stderr
    done = packlab("validate", out)
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("valid:"), done.stderr
    done = packlab("validate", f"s3://{BUCKET}/process/nothing")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert os.listdir(cwd) == []


def test_one_file_outputs_on_the_store_are_guarded_as_local_ones(server, spool, tmp_path,
                                                                capsys) -> None:
    """corpus, raw-index and pbin to ``s3://``: the file and its record on the store, validated
    by URI; rerun refused without --overwrite, replaced with it; a person's object at such a
    URI refused whatever the flag and kept byte for byte."""
    from packlab.storage.location import resolve
    from packlab.storage.objects import put_object

    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]})
        + "\n" for i in range(4)))
    base = f"s3://{BUCKET}/files"
    commands = {"corpus": ["corpus", f"{base}/docs.jsonl", "--records", 3],
                "raw-index": ["raw-index", chat, "--index-path", f"{base}/chat.idx"],
                "pbin": ["pbin", spool, f"{base}/chat.pbin"]}
    for name, argv in commands.items():
        uri = next(str(a) for a in argv if str(a).startswith("s3://"))
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, (name, err)
        assert f"files/.{uri.rsplit('/', 1)[1]}.record.json" in \
            " ".join(objects(server, "files")), name
        code, _, err = run_cli(capsys, "validate", uri)
        assert code == 0, (name, err)
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, name
        one_error_line(err, uri, "already exists", "--overwrite")
        assert run_cli(capsys, *argv, "--overwrite")[0] == 0, name
        person = uri.replace("files/", "files/mine_")
        put_object(b"a person's bytes\n", resolve(person))
        mine = [person if a == uri else a for a in argv]
        code, _, err = run_cli(capsys, *mine, "--overwrite")
        assert code == 2, name
        one_error_line(err, person, "--overwrite replaces only packlab's own")
        assert resolve(person).read_bytes() == b"a person's bytes\n", name
    assert not any(tmp_path.joinpath("cwd").iterdir())

"""Object storage against a local moto server (127.0.0.1, started and stopped here): every
format through s3://, killed and failing writers, bad checksums, the cost of a random Parquet
access counted by the server, the layout through blend.json, DuckDB over s3://."""

from __future__ import annotations

import gc
import json
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pyarrow.fs as pafs
import pytest
from conftest import BUCKET, write_random_spool

from packlab import cloud, open_dataset, open_shard, open_writer
from packlab import open_dataset as open_local_dataset
from packlab.cloud import sql
from packlab.errors import FormatError, PacklabError
from packlab.formats import format_names, get_format, parquet
from packlab.lab.s3server import HOST, CountingMiddleware, S3Server
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.shards import write_shards
from packlab.sources.convert import convert
from packlab.sources.validate import validate_path
from packlab.storage import location as storage
from packlab.storage.objects import put_object


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A spool, an assignment and the bins it packs into (copies)."""
    root = tmp_path_factory.mktemp("cloud")
    spool = write_random_spool(root / "spool", num_sequences=300, max_len=400, seed=3)
    assignment, _ = pack(spool.lengths, 512, algorithm="first_fit_shuffle", seed=0)
    bins = [b.copy() for b in iter_bins(spool, assignment)]
    return root, spool, assignment, bins


def write(writer, bins) -> dict:
    with writer:
        for b in bins:
            writer.write(b)
    return writer


def same_bins(dataset, bins) -> None:
    assert len(dataset) == len(bins)
    got = dataset.read_bins(np.arange(len(bins)))
    for i, (have, want) in enumerate(zip(got, bins, strict=True)):
        assert np.array_equal(have.input_ids, want.input_ids), i
        assert np.array_equal(have.loss_mask, want.loss_mask), i
        assert np.array_equal(have.seq_start_id, want.seq_start_id), i


def keys(server, prefix: str) -> list[str]:
    """Every object under ``prefix``, hidden temporaries included."""
    fs = server.filesystem()
    sel = pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True, allow_not_found=True)
    return sorted(i.path for i in fs.get_file_info(sel) if i.type == pafs.FileType.File)


# -- the server --------------------------------------------------------------------------------
def test_server_binds_localhost_only_and_stops() -> None:
    srv = S3Server(configure=False).start()
    try:
        listening = [c.laddr for c in psutil.Process(srv.process.pid).net_connections()
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == HOST for addr in listening)
        assert {addr.port for addr in listening} == {srv.port}
    finally:
        srv.stop()
    assert not srv.running
    with pytest.raises(OSError), socket.create_connection((HOST, srv.port), timeout=2):
        pass


def test_server_counts_requests_and_bytes(server) -> None:
    fs = server.filesystem()
    with fs.open_output_stream(f"{BUCKET}/count/x.bin") as f:
        f.write(b"z" * 10_000)
    server.reset_counts()
    with fs.open_input_file(f"{BUCKET}/count/x.bin") as f:
        assert f.read_at(100, 5000) == b"z" * 100
    log = server.stats()["log"]
    assert [(e["method"], e["range"]) for e in log] == [("HEAD", None), ("GET", "bytes=5000-5099")]
    assert server.counts() == {"requests": 2, "bytes_out": 100, "bytes_in": 0}


def test_server_logs_requests_in_the_order_they_arrive() -> None:
    """A client reads a response and sends its next request while the server thread is still
    leaving the first one's body iterator: the log must still put the first request first (CI
    once saw an upload's temporary logged after the final key's copy)."""
    def app(environ, start_response):
        start_response("200 OK", [])
        return [environ["PATH_INFO"].encode()]

    def request(method: str, path: str) -> dict:
        return {"REQUEST_METHOD": method, "PATH_INFO": path, "CONTENT_LENGTH": "3"}

    middleware = CountingMiddleware(app)
    first = iter(middleware(request("PUT", "/b/.x.tmp-1"), lambda *a: None))
    assert next(first) == b"/b/.x.tmp-1"  # the client has the whole response ...
    assert list(middleware(request("PUT", "/b/x"), lambda *a: None)) == [b"/b/x"]
    assert list(first) == []  # ... before the first thread finishes
    stats = middleware.stats()
    assert [(e["method"], e["path"], e["status"]) for e in stats["log"]] == [
        ("PUT", "/b/.x.tmp-1", 200), ("PUT", "/b/x", 200)]
    assert [e["bytes_out"] for e in stats["log"]] == [11, 4]
    assert (stats["requests"], stats["bytes_in"], stats["bytes_out"]) == (2, 6, 15)


# -- URIs --------------------------------------------------------------------------------------
def test_resolve_uris_and_paths(server, tmp_path: Path) -> None:
    loc = storage.resolve("s3://lab/a/b/shard.parquet")
    assert (str(loc), loc.path, loc.name, loc.suffix) == (
        "s3://lab/a/b/shard.parquet", "lab/a/b/shard.parquet", "shard.parquet", ".parquet")
    assert str(loc.parent / "../c") == "s3://lab/a/c"
    assert isinstance(loc.filesystem, pafs.S3FileSystem)
    assert pickle.loads(pickle.dumps(loc)).uri == loc.uri
    local = storage.resolve(f"file://{tmp_path}/x")
    assert local.is_local and local.path == f"{tmp_path}/x"
    assert not storage.is_remote(str(tmp_path)) and not storage.is_remote(f"file://{tmp_path}")
    assert storage.is_remote("s3://lab/x") and storage.is_remote("gs://b/x")
    with pytest.raises(PacklabError, match="no bucket"):
        storage.resolve("s3://")
    with pytest.raises(PacklabError, match="no filesystem"):
        storage.resolve("nosuchscheme://x/y")


def test_any_fsspec_filesystem(data) -> None:
    """A Parquet shard written and read through an fsspec filesystem (in memory, no server)."""
    import fsspec

    _, _, _, bins = data
    mem = fsspec.filesystem("memory")
    write(open_writer("parquet", "memory://shards/a.parquet", filesystem=mem,
                            pack_size=512, row_group_size=16), bins)
    reader = open_shard("shards/a.parquet", filesystem=mem)
    assert isinstance(reader, parquet.Reader) and reader.location.local_path is None
    assert str(reader.path) == "memory://shards/a.parquet"
    assert [i.base_name for i in storage.resolve("shards", mem).walk_files()] == ["a.parquet"]
    same_bins(open_dataset("memory://shards", filesystem=mem), bins)


# -- every format through s3:// ----------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in format_names() if n != "packed_index"])
def test_every_format_round_trips(server, data, tmp_path: Path, name: str) -> None:
    _, spool, _, bins = data
    suffix = get_format(name).SUFFIX
    uri = f"s3://{BUCKET}/rt/{name}/shard_000000{suffix}"
    options = {"vocab_size": spool.vocab_size} if name in ("binidx", "pbin") else {}
    writer = write(open_writer(name, uri, pack_size=512, num_bins=len(bins), **options),
                   bins)
    direct = get_format(name).Writer.STREAMS
    assert isinstance(writer, get_format(name).Writer if direct else cloud.UploadingWriter)
    assert direct or not Path(writer.staging).exists()  # the local staging copy is gone
    ds = open_dataset(f"s3://{BUCKET}/rt/{name}", cache_dir=tmp_path / "cache")
    assert ds.formats == [name]
    same_bins(ds, bins)
    reader = ds.readers()[0]
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()) \
        if (tmp_path / "cache").exists() else []
    if name == "parquet":  # read in place, nothing cached
        assert isinstance(reader, parquet.Reader) and reader.location.local_path is None
        assert cached == []
    elif get_format(name).Reader.READS_IN_PLACE:  # the index cached, the data read in place
        assert isinstance(reader.path, storage.Location) and reader.path.local_path is None
        data = get_format(name).Reader.DATA_FILES
        assert cached and not [c for c in cached if c.endswith(data)], cached
    else:
        assert Path(reader.path).is_relative_to(tmp_path / "cache")
    assert not [k for k in keys(server, f"rt/{name}") if ".tmp-" in k]  # no temporaries left
    clone = pickle.loads(pickle.dumps(ds))
    same_bins(clone, bins)


def test_packed_index_travels_with_its_spool(server, data, tmp_path: Path) -> None:
    _, spool, assignment, bins = data
    tree = tmp_path / "tree"
    tree.mkdir()
    local_spool = write_random_spool(tree / "spool", num_sequences=300, max_len=400, seed=3)
    assert local_spool.record["files"] == spool.record["files"]
    write_shards(local_spool, assignment, tree / "out", format="packed_index",
                 bins_per_shard=10**6)
    with pytest.raises(PacklabError, match="upload_tree"):
        open_writer("packed_index", f"s3://{BUCKET}/pi/x", pack_size=512)
    cloud.upload_tree(tree, f"s3://{BUCKET}/pi")
    ds = open_dataset(f"s3://{BUCKET}/pi/out", cache_dir=tmp_path / "cache")
    assert ds.formats == ["packed_index"]
    same_bins(ds, bins)
    assert Path(ds.readers()[0].spool_path).is_relative_to(tmp_path / "cache")


# -- writers that die --------------------------------------------------------------------------
def test_pyarrow_stream_dropped_unclosed_publishes_partial_data(server) -> None:
    """Why the writers go through a temporary key: pyarrow has no abort, and an output stream
    that is garbage collected *completes* its upload. (If pyarrow changes this, revisit.)"""
    fs = server.filesystem()
    stream = fs.open_output_stream(f"{BUCKET}/trap/partial.bin")
    stream.write(b"half a shard")
    del stream
    gc.collect()
    assert fs.get_file_info(f"{BUCKET}/trap/partial.bin").size == len(b"half a shard")


@pytest.mark.parametrize("direct", [True, False])
def test_writer_failing_leaves_nothing(server, data, direct: bool) -> None:
    _, _, _, bins = data
    uri = f"s3://{BUCKET}/fail/{direct}/shard.parquet"
    with pytest.raises(RuntimeError, match="boom"), \
            open_writer("parquet", uri, pack_size=512, row_group_size=4,
                              direct=direct) as writer:
        for b in bins[:20]:
            writer.write(b)
        raise RuntimeError("boom")
    assert keys(server, f"fail/{direct}") == []
    bad = bins[0]._replace(loss_mask=bins[0].loss_mask * 2)  # breaks an invariant
    with pytest.raises(PacklabError, match="bin 1"), \
            open_writer("parquet", uri, pack_size=512, direct=direct) as writer:
        writer.write(bins[0])
        writer.write(bad)
    assert keys(server, f"fail/{direct}") == []
    with pytest.raises(PacklabError, match="only 1 of 3 bins"):
        write(open_writer("parquet", uri, pack_size=512, num_bins=3, direct=direct),
              bins[:1])
    assert keys(server, f"fail/{direct}") == []


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import packlab
    from packlab.storage import location as storage
    from packlab.bins import PackedBin
    storage.configure("s3", **{endpoint!r})
    rng = np.random.default_rng(0)
    def bins():
        while True:  # incompressible bins of 4096 tokens
            yield PackedBin(rng.integers(0, 2**31 - 1, 4096, dtype=np.int32),
                            np.zeros(4096, np.uint8), np.array([0], np.int32))
    if sys.argv[1] == "parquet":
        w = packlab.open_writer("parquet", sys.argv[2], pack_size=4096, row_group_size=64,
                              compression="none")
        for i, b in enumerate(bins()):
            w.write(b)
            if i == 2000:  # ~32 MB sent: several multipart parts are on the server
                os.kill(os.getpid(), signal.SIGKILL)
    else:  # memmap: the data files uploaded, killed before the manifest
        import packlab.cloud.transfer as transfer
        real = transfer.upload_file
        def upload_file(local, target, **kw):
            out = real(local, target, **kw)
            if target.name == "seq_starts.npy":
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        transfer.upload_file = upload_file
        w = packlab.open_writer("memmap_v1", sys.argv[2], pack_size=4096, staging_dir=sys.argv[3])
        for i, b in zip(range(300), bins()):
            w.write(b)
        w.finalize()
""")


@pytest.mark.parametrize("name", ["parquet", "memmap_v1"])
def test_writer_killed_mid_upload_leaves_nothing_readable(server, tmp_path: Path,
                                                          name: str) -> None:
    uri = f"s3://{BUCKET}/killed/{name}/shard"
    server.reset_counts()
    script = KILLED_WRITER.format(endpoint=server.options())
    done = subprocess.run([sys.executable, "-c", script, name, uri, str(tmp_path)], timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    log = server.stats()["log"]
    assert sum(e["bytes_in"] for e in log) > 1_000_000  # it was killed mid-upload
    fs = server.filesystem()
    assert fs.get_file_info(f"{BUCKET}/killed/{name}/shard").type == pafs.FileType.NotFound \
        or name != "parquet"
    if name == "parquet":
        assert any("uploadId" in e["query"] and e["method"] == "PUT" for e in log)  # parts
        assert keys(server, f"killed/{name}") == []  # not even the temporary is visible
        with pytest.raises(FormatError):
            open_dataset(uri)
    else:
        assert f"{BUCKET}/killed/{name}/shard/seq_starts.npy" in keys(server, "killed")
        with pytest.raises(FormatError, match="but no manifest.json: .* did not finish"):
            open_dataset(uri, cache_dir=tmp_path)
        with pytest.raises(FormatError, match="no manifest.json"):
            open_dataset(f"s3://{BUCKET}/killed/{name}", cache_dir=tmp_path)


# -- bad checksums -----------------------------------------------------------------------------
def _corrupt(server, key: str, *, truncate: bool = False) -> None:
    fs = server.filesystem()
    with fs.open_input_file(f"{BUCKET}/{key}") as f:
        raw = bytearray(f.read())
    if truncate:
        raw = raw[:-10]
    else:
        raw[len(raw) // 2] ^= 0xFF
    with fs.open_output_stream(f"{BUCKET}/{key}") as f:
        f.write(bytes(raw))


@pytest.mark.parametrize("name", ["memmap_v1", "binidx"])
@pytest.mark.parametrize("truncate", [False, True])
def test_directory_shard_with_bad_checksum_is_refused(server, data, tmp_path: Path, name: str,
                                                       truncate: bool) -> None:
    _, spool, _, bins = data
    uri = f"s3://{BUCKET}/bad/{name}{truncate}/shard"
    options = {"vocab_size": spool.vocab_size} if name == "binidx" else {}
    write(open_writer(name, uri, pack_size=512, **options), bins)
    data_file = {"memmap_v1": "input_ids.npy", "binidx": "data.bin"}[name]
    _corrupt(server, f"bad/{name}{truncate}/shard/{data_file}", truncate=truncate)
    cache = tmp_path / "cache"
    message = "truncated" if truncate else "checksum mismatch"
    if not get_format(name).Reader.READS_IN_PLACE:  # downloaded first, verified: refused
        with pytest.raises(FormatError, match=f"{uri}/{data_file}: .*{message}"):
            open_dataset(uri, cache_dir=cache)
        assert [p for p in cache.rglob("*") if p.is_file()] == []  # nothing cached
        return
    # read in place: a truncated data file is refused at open (its size against the headers);
    # a flipped byte by the bin's checksum when read with verify=True, and by validate (which
    # downloads the shard whole, verified); only the index files are ever cached
    if truncate:
        with pytest.raises(FormatError, match=f"{uri}/{data_file}: .*{message}"):
            open_dataset(uri, cache_dir=cache)
    else:
        reader = open_shard(uri, cache_dir=cache, verify=True)
        with pytest.raises(FormatError, match=rf"{uri}: bin \d+: {message}"):
            reader.read_bins(np.arange(reader.num_bins))
        with pytest.raises(FormatError, match=f"{uri}/{data_file}: .*{message}"):
            validate_path(uri, cache_dir=tmp_path / "download")
    data_files = get_format(name).Reader.DATA_FILES
    assert not [p for p in cache.rglob("*") if p.name in data_files]


def test_one_file_shards_with_damage_are_refused(server, data, tmp_path: Path) -> None:
    _, _, _, bins = data
    uri = f"s3://{BUCKET}/bad/arrow/shard.arrow"
    write(open_writer("arrow_ipc", uri, pack_size=512, batch_size=8), bins)
    _corrupt(server, "bad/arrow/shard.arrow")
    with pytest.raises(FormatError, match=uri):
        open_dataset(uri, cache_dir=tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    uri = f"s3://{BUCKET}/bad/parquet/shard.parquet"  # read in place: page checksums
    write(open_writer("parquet", uri, pack_size=512, row_group_size=8,
                            compression="none"), bins)
    _corrupt(server, "bad/parquet/shard.parquet")
    reader = open_shard(uri)
    with pytest.raises(FormatError, match=uri):
        reader.validate()


# -- the cost of a random Parquet access --------------------------------------------------------
@pytest.mark.parametrize("row_group_size", [4, 32, 1000])
def test_random_parquet_access_costs_one_row_group_plus_footer(server, data,
                                                               row_group_size: int) -> None:
    _, _, _, bins = data
    uri = f"s3://{BUCKET}/cost/rg{row_group_size}.parquet"
    write(open_writer("parquet", uri, pack_size=512, row_group_size=row_group_size,
                            overwrite=True), bins)
    for tail in (8, parquet.TAIL_BYTES):
        server.reset_counts()
        reader = open_shard(uri, tail_bytes=tail, cache_row_groups=1)
        opened = server.stats()
        footer = reader.footer_bytes
        assert opened["requests"] == 1 + (2 if footer > tail else 1)  # HEAD + the tail (+ rest)
        assert footer <= opened["bytes_out"] <= max(footer, min(tail, reader.size))
        rng = np.random.default_rng(row_group_size)
        previous = -1  # the one row group the reader keeps (cache_row_groups=1)
        for index in rng.integers(0, len(bins), 8).tolist():
            group = int(reader.row_group_of(index))
            server.reset_counts()
            packed = reader.read_bin(index)
            cost = server.stats()
            assert np.array_equal(packed.input_ids, bins[index].input_ids)
            if group == previous:
                assert cost["requests"] == 0
                continue
            previous = group
            assert cost["requests"] == 1  # one coalesced ranged GET
            assert cost["log"][0]["range"] is not None
            assert cost["bytes_out"] == reader.row_group_bytes(group)
        if tail == 8:  # the strict form: exactly the footer, then exactly one row group
            assert opened["bytes_out"] == footer


# -- in place: the index fetched once, then exactly a bin's bytes per read ---------------------
def bin_ranges(name: str, shard: Path, b: int) -> list[tuple[str, int, int]]:
    """Where bin ``b`` is in the files of the local ``shard`` as megatron-core's index says:
    ``(file, first byte, byte count)`` per data file (read here from the ``.idx`` itself)."""
    if name == "megatron_sft":
        idx, data, words = shard, shard.name.replace(".idx", ".bin"), 4
    else:
        idx, data, words = shard / "data.idx", "data.bin", open_shard(shard).token_dtype.itemsize
    count = int(np.fromfile(idx, "<u8", count=1, offset=18)[0])
    length = int(np.fromfile(idx, "<i4", count=1, offset=34 + 4 * b)[0])
    pointer = int(np.fromfile(idx, "<i8", count=1, offset=34 + 4 * count + 8 * b)[0])
    ranges = [(data, pointer, length * words)]
    if name == "binidx":  # its mask: one byte a token after a 40-byte header (version 2)
        ranges.append(("loss_mask.bin", 40 + pointer // words, length))
    return ranges


@pytest.mark.parametrize("name", ["megatron_sft", "binidx"])
def test_a_random_bin_in_place_is_one_ranged_get_of_exactly_its_bytes(
        server, data, tmp_path: Path, name: str) -> None:
    """Megatron-core's object-storage path: the index fetched once into the cache, then each
    read one ranged GET of exactly the bin's bytes per data file, nothing else, counted by
    the server; a second reader sharing the cache fetches no index again."""
    _, spool, _, bins = data
    suffix = get_format(name).SUFFIX
    local = tmp_path / f"shard{suffix}"
    options = {"vocab_size": spool.vocab_size} if name == "binidx" else {}
    write(open_writer(name, local, pack_size=512, **options), bins)
    uri = f"s3://{BUCKET}/inplace/{name}/shard{suffix}"
    write(open_writer(name, uri, pack_size=512, **options), bins)
    data_files = get_format(name).Reader.DATA_FILES
    for attempt in range(2):
        server.reset_counts()
        reader = open_shard(uri, cache_dir=tmp_path / "cache")
        opened = [e for e in server.stats()["log"] if e["method"] == "GET"]
        index = local if name == "megatron_sft" else local / "data.idx"
        fetched = sum(e["bytes_out"] for e in opened if e["path"].endswith(index.name))
        # the index whole, once, then from the cache (detection reads binidx's 9-byte magic)
        magic = 0 if name == "megatron_sft" else 9
        assert fetched == (index.stat().st_size if attempt == 0 else 0) + magic, opened
        # of the data files, at most a header (binidx's loss_mask.bin: 40 bytes, its version 2
        # header ending with the shard's identity)
        assert sum(e["bytes_out"] for e in opened if e["path"].endswith(data_files)) <= 40
        rng = np.random.default_rng(7)
        for b in rng.choice(len(bins), 12, replace=False).tolist():
            reader.read_bin(0 if b else 1)  # a neighbour first: each read is its own request
            server.reset_counts()
            packed = reader.read_bin(b)
            log = server.stats()["log"]
            assert np.array_equal(packed.input_ids, bins[b].input_ids), b
            assert np.array_equal(packed.loss_mask, bins[b].loss_mask), b
            assert np.array_equal(packed.seq_start_id, bins[b].seq_start_id), b
            folder = f"/{BUCKET}/inplace/{name}/" + ("" if name == "megatron_sft"
                                                     else f"shard{suffix}/")
            want = [(folder + f, a, n) for f, a, n in bin_ranges(name, local, b)]
            assert [(e["method"], e["path"], e["range"]) for e in log] == [
                ("GET", path, f"bytes={first}-{first + nbytes - 1}")
                for path, first, nbytes in want], b
            assert [e["bytes_out"] for e in log] == [n for _, _, n in want], b
        reader.close()


# -- the layout through blend.json -------------------------------------------------------------
def test_layout_split_resolves_through_blend_json(server, tmp_path: Path) -> None:
    from packlab.pipeline.layout import build_layout

    spools = [write_random_spool(tmp_path / n, num_sequences=150, max_len=300, seed=s)
              for n, s in (("chat", 1), ("code", 2))]
    out = tmp_path / "out"
    build_layout([s.path for s in spools], out, format="parquet", pack_size=512,
                 splits="train=0.8,valid=0.2", weights="0.7,0.3", bins_per_shard=20, workers=1)
    uri = f"s3://{BUCKET}/layout/out"
    server.reset_counts()
    cloud.upload_layout(out, uri)
    writes = [e["path"] for e in server.stats()["log"]  # (pyarrow adds "dir/" markers)
              if e["method"] in ("PUT", "POST") and not e["path"].endswith("/")]
    assert writes[-1].endswith("/blend.json")  # the commit point goes last
    at = [k for k, w in enumerate(writes) if w.endswith("/blend.json")]
    assert len(at) == 2 and not any(w.endswith(".parquet") for w in writes[:at[0]])
    assert not [k for k in keys(server, "layout") if "/splits/" in k]
    for split in ("train", "valid"):
        local = open_local_dataset(out, split=split)
        remote = open_dataset(uri, split=split)
        assert len(remote.shards) == len(local.shards)
        same_bins(remote, local.read_bins(np.arange(len(local))))
    with pytest.raises(FormatError, match="no split 'test'; splits here: train, valid"):
        open_dataset(uri, split="test")
    with pytest.raises(PacklabError, match="open one split"):
        open_dataset(uri)
    plain = f"s3://{BUCKET}/layout/plain"  # shards, not a layout: no blend.json to name splits
    write(open_writer("parquet", f"{plain}/shard_000000.parquet", pack_size=512),
          open_local_dataset(out, split="valid").read_bins(np.arange(2)))
    with pytest.raises(FormatError, match="no blend.json"):
        open_dataset(plain, split="train")
    with pytest.raises(PacklabError, match="already exists"):
        cloud.upload_layout(out, uri)


# -- DuckDB ------------------------------------------------------------------------------------
def test_duckdb_queries_s3_shards_without_httpfs(server, data) -> None:
    _, _, _, bins = data
    prefix = f"s3://{BUCKET}/sql"
    for k in range(2):
        part = bins[k::2]
        write(open_writer("parquet", f"{prefix}/shard_{k:06d}.parquet", pack_size=512,
                                row_group_size=16, overwrite=True), part)
    con = sql.connect()
    uris = sql.create_view(con, "bins", prefix)
    assert len(uris) == 2
    server.reset_counts()
    count, tokens = con.execute("SELECT count(*), sum(len(input_ids)) FROM bins").fetchone()
    assert (count, tokens) == (len(bins), sum(b.packed_len for b in bins))
    log = server.stats()["log"]
    assert log and all(e["method"] in ("HEAD", "GET") for e in log)
    assert any(e["range"] for e in log)  # ranged reads, through packlab's filesystem
    loaded = con.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()
    assert ("httpfs",) not in loaded
    con.register("ds", sql.arrow_dataset(prefix))
    assert con.execute("SELECT count(*) FROM ds").fetchone()[0] == len(bins)


def test_duckdb_reads_shards_larger_than_one_read_whole(server, tmp_path: Path) -> None:
    # DuckDB reads a file of more than 2 MB in 2 MB pieces, from several threads through one
    # handle (seek, then read): with one position for all, a piece came from another's offset
    # (notebook 09 at the default scale: "ZSTD Decompression failure", short reads at offset 0)
    spool = write_random_spool(tmp_path / "spool", num_sequences=8000, max_len=1500, seed=9)
    assignment, _ = pack(spool.lengths, 2048, seed=0)
    bins = [b.copy() for b in iter_bins(spool, assignment)]
    prefix = f"s3://{BUCKET}/sql_large"
    for k in range(2):
        write(open_writer("parquet", f"{prefix}/shard_{k:06d}.parquet", pack_size=2048,
                          overwrite=True), bins[k::2])
    sizes = [server.filesystem().get_file_info(u.removeprefix("s3://")).size
             for u in sql.create_view(sql.connect(), "bins", prefix)]
    assert min(sizes) > 4 << 20  # three pieces each
    want = (len(bins), sum(b.packed_len for b in bins))
    for _ in range(4):  # without per-thread positions, most runs of 30 saw a wrong read
        con = sql.connect()
        sql.create_view(con, "bins", prefix)
        assert con.execute("SELECT count(*), sum(len(input_ids)) FROM bins").fetchone() == want
        con.close()


def test_each_thread_reads_at_its_own_position() -> None:
    import threading

    import pyarrow as pa

    data = bytes(range(256)) * 64
    file = sql.ThreadPositionedFile(pa.BufferReader(data))
    both_sought = threading.Barrier(2)
    got = {}

    def seek_then_read(at: int) -> None:
        file.seek(at)
        both_sought.wait()  # the other thread seeks between this one's seek and its read
        got[at] = file.read(100), file.tell()

    threads = [threading.Thread(target=seek_then_read, args=(at,)) for at in (10, 5000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == {10: (data[10:110], 110), 5000: (data[5000:5100], 5100)}
    file.seek(-6, 2)
    assert file.read() == data[-6:] and file.read(10) == b"" and file.tell() == len(data)
    buffer = bytearray(8)
    file.seek(3)
    assert file.readinto(buffer) == 8 and bytes(buffer) == data[3:11]


# -- housekeeping ------------------------------------------------------------------------------
def test_overwrite_and_sweep(server, data, tmp_path: Path) -> None:
    _, _, _, bins = data
    uri = f"s3://{BUCKET}/ow/a.parquet"
    write(open_writer("parquet", uri, pack_size=512), bins[:5])
    with pytest.raises(PacklabError, match="already exists"):
        open_writer("parquet", uri, pack_size=512)
    write(open_writer("parquet", uri, pack_size=512, overwrite=True), bins[:7])
    assert len(open_shard(uri)) == 7
    stale = storage.resolve(f"s3://{BUCKET}/ow/.b.parquet.tmp-1-deadbeef")
    put_object(b"left by a killed writer", stale)
    assert cloud.sweep_temporaries(f"s3://{BUCKET}/ow", older_than_s=3600) == []
    assert cloud.sweep_temporaries(f"s3://{BUCKET}/ow", older_than_s=-60) == [stale.uri]
    assert keys(server, "ow") == [f"{BUCKET}/ow/a.parquet"]
    local = tmp_path / "m"
    write(get_format("memmap_v1").Writer(local, pack_size=512), bins[:3])
    cloud.upload_shard(local, f"s3://{BUCKET}/ow/m")
    manifest = json.loads(storage.resolve(f"s3://{BUCKET}/ow/m/manifest.json").read_bytes())
    assert manifest["num_bins"] == 3


def test_a_pack_output_replaces_another_only_with_overwrite(server, data, tmp_path: Path
                                                            ) -> None:
    """upload_tree of a pack output where another job's output is: refused, the store as it
    was; the very same job finishes (an interrupted upload); overwrite=True replaces."""
    _, spool, assignment, bins = data
    for name, per_shard in (("a", 32), ("b", 20)):
        write_shards(spool, assignment, tmp_path / name, format="parquet",
                     bins_per_shard=per_shard, workers=1)
    uri = f"s3://{BUCKET}/jobs/out"
    cloud.upload_tree(tmp_path / "a", uri)
    before = {k: storage.resolve(f"s3://{k}").read_bytes() for k in keys(server, "jobs")}
    with pytest.raises(PacklabError, match=f"{uri}: already holds another output .*overwrite"):
        cloud.upload_tree(tmp_path / "b", uri)
    assert {k: storage.resolve(f"s3://{k}").read_bytes() for k in keys(server, "jobs")} == before
    shards = [k for k in before if k.endswith(".parquet")]
    assert cloud.upload_tree(tmp_path / "a", uri)["kept"] == len(shards)  # nothing sent again
    cloud.upload_tree(tmp_path / "b", uri, overwrite=True)
    remote = open_dataset(uri)
    assert [s.name for s in remote.shards] == [s.name for s in open_dataset(tmp_path / "b").shards]
    same_bins(remote, bins)


# -- the registry, forked readers, the notebook's measurements ---------------------------------
def test_the_facade_hands_uris_to_packlab_cloud(server, data) -> None:
    import packlab

    _, _, _, bins = data
    uri = f"s3://{BUCKET}/registry/shard.parquet"
    write(packlab.open_writer("parquet", uri, pack_size=512, row_group_size=8), bins)
    assert packlab.detect_format(uri) == "parquet"
    reader = packlab.open_shard(uri)
    assert isinstance(reader, parquet.Reader) and reader.location.local_path is None and len(reader) == len(bins)
    assert packlab.detect_format(f"s3://{BUCKET}/registry") == "parquet"


def test_remote_dataset_in_forked_workers(server, data) -> None:
    import multiprocessing

    _, _, _, bins = data
    uri = f"s3://{BUCKET}/fork/shard.parquet"
    write(open_writer("parquet", uri, pack_size=512, row_group_size=8), bins)
    ds = open_dataset(uri)
    ds.read_bin(0)  # the parent's reader is open: a child must not reuse its handle
    with multiprocessing.get_context("fork").Pool(2) as pool:
        lengths = pool.map(_packed_len, [(ds, i) for i in range(0, len(bins), 7)])
    assert lengths == [bins[i].packed_len for i in range(0, len(bins), 7)]


def _packed_len(job) -> int:
    ds, index = job
    return int(ds[index]["input_ids"].shape[0])


def test_bench_counts_bound_and_compares(server, data) -> None:
    from packlab.lab.measure import object_store as bench

    root, spool, assignment, _ = data
    written = bench.write_shards(server, spool, assignment, f"s3://{BUCKET}/bench/rg",
                                 format="parquet", row_group_size=8, num_shards=2)
    assert len(written["uris"]) == 2 and written["bytes_in"] > 0
    costs = bench.access_costs(server, written["uris"][0], accesses=12, seed=1)
    assert costs["max_requests_per_fetch"] == 1 and costs["max_bytes_over_bound"] == 1.0
    assert costs["open_requests"] == 2 and costs["open_bytes"] >= costs["footer_bytes"]
    assert costs["fetching_accesses"] >= 1
    assert costs["bytes_per_fetch"] == costs["row_group_bytes_mean"]
    opens = bench.open_comparison(server, {"parquet": f"s3://{BUCKET}/bench/rg"})
    assert [(r["cache"], r["num_bins"]) for r in opens] == [("cold", assignment.num_bins),
                                                            ("warm", assignment.num_bins)]
    rows = bench.write_comparison(server, spool, assignment, f"s3://{BUCKET}/bench/w",
                                  row_group_size=16)
    by = {r["way"]: r for r in rows}
    assert by["parquet direct"]["local_disk_bytes"] == 0
    assert by["parquet local+upload"]["local_disk_bytes"] > 0
    assert by["memmap_v1 local+upload"]["bytes_sent"] > by["parquet direct"]["bytes_sent"]
    assert bench.modelled_seconds(2, 100e6) == pytest.approx(2 * 0.030 + 1.0)


def test_in_place_costs_per_format(server, data) -> None:
    """Notebook 09's in-place table: the Megatron pairs read exactly a bin's bytes per read
    (one request per data file), Parquet its row group, memmap_v1 the whole shard first."""
    from packlab.lab.measure.in_place import in_place_comparison

    _, spool, assignment, bins = data
    measured = in_place_comparison(server, spool, assignment, f"s3://{BUCKET}/ip", accesses=10,
                                   seed=2, format_options={"parquet": {"row_group_size": 8}})
    rows = {r["format"]: r for r in measured}
    assert sorted(rows) == sorted(n for n in format_names()
                                  if not get_format(n).Writer.NEEDS_SPOOL)
    assert [r["reads_in_place"] for r in measured] == sorted(
        (r["reads_in_place"] for r in measured), reverse=True)  # in-place readers first
    sft, binidx, pq, memmap = (rows[n] for n in ("megatron_sft", "binidx", "parquet",
                                                 "memmap_v1"))
    assert (sft["requests_per_bin"], sft["max_requests_per_bin"]) == (1.0, 1)
    assert (binidx["requests_per_bin"], binidx["max_requests_per_bin"]) == (2.0, 2)
    # an item: three header words, the starts, then one int32 word a token
    assert 4 < sft["bytes_per_token_read"] < 4.2
    assert binidx["bytes_per_token_read"] == 3.0  # uint16 tokens and a mask byte
    assert pq["max_requests_per_bin"] == 1 and pq["bytes_per_bin"] > sft["bytes_per_bin"]
    assert memmap["requests_per_bin"] == 0  # downloaded whole before the first bin
    assert memmap["first_bin_bytes"] >= memmap["shard_bytes"] > sft["first_bin_bytes"]
    assert sft["first_bin_bytes"] < sft["shard_bytes"] and sft["num_bins"] == len(bins)
    assert all(r["accesses"] == 10 for r in rows.values())


def test_packlab_open_dataset_takes_uris(server, data) -> None:
    import packlab

    _, _, _, bins = data
    uri = f"s3://{BUCKET}/entry/shard.parquet"
    write(open_writer("parquet", uri, pack_size=512, row_group_size=8), bins)
    ds = packlab.open_dataset(f"s3://{BUCKET}/entry")
    assert isinstance(ds, cloud.RemoteDataset) and ds.formats == ["parquet"]
    same_bins(ds, bins)
    assert len(packlab.open_dataset([uri, uri])) == 2 * len(bins)


def test_bridges_pairs_on_s3_open_validate_and_convert_item_exact(server, data,
                                                                  tmp_path: Path) -> None:
    """Pairs as Bridge writes them (megatron-core's builder, no packlab sidecar), copied to the
    store as they are: a directory, a glob, one prefix open item-exact, in place (the .idx
    cached, a ranged GET per bin); validate and convert take them too."""
    from sft_pairs import builder_pair, item_from_facts

    _, _, _, bins = data
    parts = (bins[:9], bins[9:20], bins[20:])
    fs = server.filesystem()
    for k, part in enumerate(parts):
        idx = builder_pair(tmp_path / "bridge" / f"training_512_{k}.sft",
                           [item_from_facts(b) for b in part])
        for file in (idx, idx.with_suffix(".bin")):
            with fs.open_output_stream(f"{BUCKET}/bridge/{file.name}") as out:
                out.write(file.read_bytes())
    root = f"s3://{BUCKET}/bridge"
    for name, want in ((root, bins), (f"{root}/*.sft.idx", bins),
                       (f"{root}/training_512_1.sft", parts[1])):
        ds = open_dataset(name, cache_dir=tmp_path / "cache")
        assert ds.formats == ["megatron_sft"] * len(ds.shards), name
        same_bins(ds, want)
    reader = open_shard(f"{root}/training_512_2.sft.bin", cache_dir=tmp_path / "cache")
    assert isinstance(reader.path, storage.Location) and not reader.has_checksums
    server.reset_counts()
    packed = reader.read_bin(3)
    log = [e for e in server.stats()["log"] if e["method"] == "GET"]
    assert len(log) == 1 and log[0]["path"].endswith("training_512_2.sft.bin"), log
    assert np.array_equal(packed.input_ids, parts[2][3].input_ids)
    summary = validate_path(root, cache_dir=tmp_path / "download")
    assert summary["num_bins"] == len(bins)
    convert(root, str(tmp_path / "parquet"), format="parquet")
    same_bins(open_dataset(tmp_path / "parquet"), bins)

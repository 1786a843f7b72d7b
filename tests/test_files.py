"""files: staged() publishes whole or not at all, HashedFile hashes what it says, json_default."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packlab.errors import PacklabError
from packlab.storage import files
from packlab.storage.files import HashedFile, Staging, is_temporary, json_default, staged


def test_staged_publishes_on_a_normal_exit(tmp_path: Path) -> None:
    final = tmp_path / "out.json"
    with staged(final) as tmp:
        assert tmp.parent == tmp_path and is_temporary(tmp) and tmp.name.startswith(".out.json")
        tmp.write_text("new\n")
        assert not final.exists()
    assert final.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_staged_removes_the_temporary_on_an_exception(tmp_path: Path) -> None:
    final = tmp_path / "out.json"
    final.write_text("old\n")
    with pytest.raises(RuntimeError, match="boom"), staged(final, overwrite=True) as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert final.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_staged_refuses_an_existing_name_before_the_work(tmp_path: Path) -> None:
    final = tmp_path / "out.json"
    final.write_text("old\n")
    ran = False
    with pytest.raises(PacklabError, match="out.json: already exists"), staged(final):
        ran = True
    assert not ran and final.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_staged_directory_replaces_a_directory_whole(tmp_path: Path) -> None:
    final = tmp_path / "tree"
    final.mkdir()
    (final / "stale").write_text("x")
    with staged(final, overwrite=True, directory=True) as tmp:
        assert tmp.is_dir() and not any(tmp.iterdir())
        (tmp / "fresh").write_text("y")
    assert [p.name for p in final.iterdir()] == ["fresh"]
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]
    with pytest.raises(ValueError), staged(final, overwrite=True, directory=True) as tmp:
        (tmp / "partial").write_text("z")
        raise ValueError
    assert [p.name for p in final.iterdir()] == ["fresh"]
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]


def test_staging_publishes_or_discards_on_request(tmp_path: Path) -> None:
    kept, dropped = Staging(tmp_path / "kept"), Staging(tmp_path / "dropped", directory=True)
    kept.path.write_bytes(b"1")
    (dropped.path / "file").write_bytes(b"2")
    kept.publish()
    dropped.discard()
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert (tmp_path / "kept").read_bytes() == b"1"


def test_hashed_file_hashes_only_the_hashed_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    with HashedFile(path) as out:
        out.write(bytes(4), hashed=False)  # a header filled in last
        out.write(np.arange(3, dtype="<u2"))
        out.align(8)
        assert out.bytes == 16
        digest = out.hexdigest()
        out.write(b"footer", hashed=False)
        out.patch(0, b"HEAD")
        with pytest.raises(ValueError, match="outside the 22 bytes"):
            out.patch(20, b"xyz")
        entry = out.close()
    raw = path.read_bytes()
    assert raw == b"HEAD" + np.arange(3, dtype="<u2").tobytes() + bytes(6) + b"footer"
    assert entry == {"bytes": 22, "sha256": digest}
    assert digest == hashlib.sha256(raw[4:16]).hexdigest()


def test_json_default_writes_numpy_arrays_and_scalars() -> None:
    text = json.dumps({"a": np.arange(3), "b": np.float32(1.5), "c": np.int64(2)},
                      default=json_default)
    assert json.loads(text) == {"a": [0, 1, 2], "b": 1.5, "c": 2}


def test_aligned_writer_writes_every_byte_in_aligned_chunks(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # small sizes stand in for 4 MiB and 2 MiB: every write the kernel sees while the buffer
    # fills ends at a multiple of the alignment; a seek and the close write out the rest;
    # nothing is lost or reordered
    monkeypatch.setattr(files, "WRITE_BUFFER", 10_000)
    monkeypatch.setattr(files, "WRITE_ALIGN", 4096)
    path = tmp_path / "out.bin"
    out = files.AlignedWriter(path)
    out._raw = spy = _Recording(out._raw)
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes()
              for n in rng.integers(1, 5_000, size=60)]
    for piece in pieces:
        assert out.write(piece) == len(piece)
    assert out.tell() == sum(map(len, pieces))
    assert len(spy.ends) > 5 and all(end % 4096 == 0 for end in spy.ends)
    assert len(out._buffer) < 10_000 + 5_000  # the buffer, at most one write over
    out.seek(3)
    out.write(b"HEAD")
    out.seek(0, os.SEEK_END)
    out.write(np.frombuffer(b"tail", dtype=np.uint8))
    out.close()
    expected = bytearray(b"".join(pieces))
    expected[3:7] = b"HEAD"
    assert path.read_bytes() == bytes(expected) + b"tail"
    assert out.closed


class _Recording:
    """A raw file that records where each of its writes ended."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.ends: list[int] = []

    def write(self, data: Any) -> int:
        written = self.raw.write(data)
        self.ends.append(self.raw.tell())
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

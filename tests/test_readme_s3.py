"""README, "Object storage, step by step": every block of the section runs, in order, as
written: the local store started with its bucket, the environment exported, each ``packlab``
command on ``s3://`` paths, and the Python block.

One liberty: the section's port 9000 is replaced by a free one (another test or a user's
store may hold 9000); the server is the command's own process, stopped at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from readme_sections import run_section, section_blocks

from packlab.lab.s3server import ACCESS_KEY, HOST, SECRET_KEY
from packlab.sources.validate import validate_path

pytestmark = pytest.mark.slow  # a server and a dozen commands over it

TITLE = "## Object storage, step by step"
README_PORT = "9000"
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return str(probe.getsockname()[1])


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The servers the section starts, stopped whatever happens."""
    servers: list[subprocess.Popen[str]] = []
    yield servers
    for server in servers:
        server.terminate()
        server.wait(timeout=30)


def test_the_section_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     started: list[subprocess.Popen[str]]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACKLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKLAB_STAGING_DIR", str(tmp_path / "staging"))
    port = free_port()
    exported: dict[str, str] = {}

    def shell(argv: list[str]) -> None:
        """The section's two kinds of shell line: the store started in the background, and
        ``export NAME=VALUE ...``."""
        argv = [a.replace(README_PORT, port) for a in argv]
        if argv[:3] == ["python", "-m", "packlab.lab.s3server"]:
            assert argv[-1] == "&"  # in the background, as a user runs it
            server = subprocess.Popen([sys.executable, *argv[1:-1]], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
            started.append(server)
            assert server.stdout is not None and server.stderr is not None
            assert server.stdout.readline() == f"PORT {port}\n"
            told = server.stderr.readline() + server.stderr.readline()
            assert f"http://{HOST}:{port} with bucket demo" in told, told
            assert f"AWS_ACCESS_KEY_ID={ACCESS_KEY}" in told  # the keys step 2 exports
            return
        assert argv[0] == "export", argv
        for assignment in argv[1:]:
            name, value = assignment.split("=", 1)
            monkeypatch.setenv(name, value)
            exported[name] = value

    namespace: dict[str, object] = {}
    python_blocks, commands = run_section(TITLE, namespace, shell)
    assert (python_blocks, commands) == (1, 8)
    assert exported == {"AWS_ENDPOINT_URL_S3": f"http://{HOST}:{port}",
                        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                        "AWS_DEFAULT_REGION": "us-east-1"}
    assert started and started[0].poll() is None  # the store served every command
    assert validate_path("s3://demo/binidx")["num_bins"] == len(namespace["dataset"])
    assert not (tmp_path / "s3:").exists()  # no URI taken for a local folder


def test_the_section_says_how_to_stop_the_store() -> None:
    text = "".join(code for _, code in section_blocks(TITLE))
    assert "--bucket demo &" in text
    assert "kill %1" in (ROOT / "README.md").read_text().split(TITLE)[1].split("\n## ")[0]

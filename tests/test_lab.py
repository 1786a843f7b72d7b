"""``make lab``: JupyterLab starts as root, and a notebook opened and saved without an edit
leaves the file as committed (a real server, its REST API doing what the UI does on save)."""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from packlab.lab.jupyter import LANGUAGE_INFO, committed_form, lab_arguments, normalize
from packlab.lab.notebooks import notebook_paths

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

NOTEBOOKS = notebook_paths()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_are_committed_in_their_committed_form(path: Path) -> None:
    text = path.read_text()
    again = nbformat.writes(committed_form(nbformat.reads(text, as_version=4))) + "\n"
    assert again == text, f"{path.name}: not in committed form (outputs or volatile metadata)"


def test_the_committed_form_carries_what_the_kernel_reports() -> None:
    """JupyterLab writes the kernel's language_info and kernelspec into a notebook when the
    kernel connects, and marks it modified unless they are there already, equal (checked in a
    headless Chromium: the old form turned dirty, this one does not)."""
    from ipykernel.ipkernel import IPythonKernel

    reported = dict(IPythonKernel.language_info)
    assert {k: v for k, v in reported.items() if k != "version"} == \
        {k: v for k, v in LANGUAGE_INFO.items() if k != "version"}
    assert reported["version"].rsplit(".", 1)[0] == LANGUAGE_INFO["version"].rsplit(".", 1)[0]


def test_normalize_rewrites_a_notebook_saved_elsewhere(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    nb.metadata.pop("language_info", None)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="x")]
    path = tmp_path / NOTEBOOKS[0].name
    nbformat.write(nb, path)
    assert normalize([path]) == [str(path)]
    assert path.read_text() == NOTEBOOKS[0].read_text()
    assert normalize([path]) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, token: str, data: dict | None = None) -> dict:
    request = urllib.request.Request(
        url, method="PUT" if data is not None else "GET",
        data=json.dumps(data).encode() if data is not None else None,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_jupyterlab_saves_an_unedited_notebook_without_a_diff(tmp_path: Path) -> None:
    assert "--ServerApp.ip=127.0.0.1" in lab_arguments()
    original = NOTEBOOKS[0]
    shutil.copy(original, tmp_path / original.name)
    port, token = _free_port(), "packlab-test"
    server = subprocess.Popen(
        [sys.executable, "-m", "packlab.lab.jupyter", "--no-browser", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _call(f"{base}/status", token)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(server.stderr.read().decode()[-2000:]) from None
                time.sleep(0.3)
        model = _call(f"{base}/contents/{original.name}?content=1", token)
        notebook = copy.deepcopy(model["content"])  # what a session adds before saving:
        notebook["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
        notebook["metadata"]["widgets"] = {"state": {}}
        for cell in notebook["cells"]:
            cell["metadata"]["execution"] = {"iopub.status.idle": "2026-11-23T21:00:00Z"}
            if cell["cell_type"] == "code":
                cell["execution_count"] = 7
                cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x\n"}]
        _call(f"{base}/contents/{original.name}", token,
              {"type": "notebook", "format": "json", "content": notebook})
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert (tmp_path / original.name).read_bytes() == original.read_bytes()

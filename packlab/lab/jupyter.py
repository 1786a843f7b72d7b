"""``make lab``: JupyterLab on ``notebooks/``, saving notebooks in their committed form.

Notebooks are committed without outputs, and a notebook opened and saved without an edit must
leave no diff. JupyterLab adds outputs, execution counts and volatile metadata (the kernel's
``language_info``, widget state, per-cell UI flags) when it saves; the pre-save hook here
(``FileContentsManager.pre_save_hook``) puts every notebook back in the committed form first,
so what lands on disk is what git holds, whatever the session did. No git filter is needed,
so nothing has to be configured on a fresh clone. The committed form carries the kernelspec and
the ``language_info`` the kernel reports, exactly: JupyterLab writes both when the kernel
connects and marks the notebook modified unless they are already there, equal.

The server listens on 127.0.0.1 only; as root (these machines and CI) it needs
``--allow-root``, which is added then.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from packlab.lab.results import notebooks_dir

KEPT_NOTEBOOK_METADATA = ("jupytext", "kernelspec", "language_info")
KEPT_CELL_METADATA = ("tags",)
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
#: what the kernel reports when JupyterLab connects (ipykernel on the project's Python 3.11.7).
#: Lab writes it into the notebook's metadata unless it is there already, equal, and that
#: change alone marks a freshly opened notebook modified; so the committed form carries it.
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3", "version": "3.11.7"}


def committed_form(notebook: dict[str, Any]) -> dict[str, Any]:
    """The notebook as the repository keeps it (in place, and returned): no outputs, no
    execution counts, only the metadata that carries meaning (cell tags such as
    ``parameters``; the kernelspec papermill needs; jupytext's settings) and the kernel's
    ``language_info`` (so opening it in JupyterLab changes nothing)."""
    for cell in notebook.get("cells", []):
        kept = {k: v for k, v in cell.get("metadata", {}).items()
                if k in KEPT_CELL_METADATA and v}
        cell["metadata"] = kept
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        if not cell.get("attachments"):
            cell.pop("attachments", None)
    meta = notebook.get("metadata", {})
    notebook["metadata"] = {k: meta[k] for k in KEPT_NOTEBOOK_METADATA if k in meta}
    notebook["metadata"]["kernelspec"] = dict(KERNELSPEC)
    notebook["metadata"]["language_info"] = json.loads(json.dumps(LANGUAGE_INFO))
    return notebook


def normalize(paths: Sequence[os.PathLike[str] | str]) -> list[str]:
    """Rewrite notebooks in their committed form; returns the ones that changed."""
    import nbformat

    changed = []
    for path in paths:
        text = open(path).read()
        again = nbformat.writes(committed_form(nbformat.reads(text, as_version=4))) + "\n"
        if again != text:
            with open(path, "w") as f:
                f.write(again)
            changed.append(str(path))
    return changed


def pre_save_hook(model: dict[str, Any], **_: Any) -> None:
    """Jupyter's ``FileContentsManager.pre_save_hook``: notebooks are saved committed."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        committed_form(model["content"])


def lab_arguments(extra: Sequence[str] = ()) -> list[str]:
    """``jupyter lab`` arguments: the notebooks folder, the hook, loopback, root allowed; an
    option given in ``extra`` replaces the default of the same name."""
    defaults = {
        "--ServerApp.root_dir": str(notebooks_dir()),
        "--ServerApp.ip": "127.0.0.1",
        "--FileContentsManager.pre_save_hook": f"{__name__}.pre_save_hook",
    }
    given = {arg.split("=", 1)[0] for arg in extra}
    args = [f"{key}={value}" for key, value in defaults.items() if key not in given]
    if os.geteuid() == 0 and "--allow-root" not in given:
        args.append("--allow-root")
    return [*args, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    """Start JupyterLab (extra arguments pass through: ``--no-browser``, ``--port=...``)."""
    from jupyterlab.labapp import main as lab_main

    sys.argv = ["jupyter-lab", *lab_arguments(sys.argv[1:] if argv is None else argv)]
    return int(lab_main() or 0)


if __name__ == "__main__":
    sys.exit(main())

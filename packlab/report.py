"""The HTML report: one page per executed notebook, and a front page with every finding.

The front page puts each claim, the measured value and the verdict side by side, read from
``build/results/*.json`` (written by the notebooks through :func:`packlab.results.record`).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from packlab.results import build_dir


def _first_markdown(notebook: dict) -> str:
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            text = "".join(cell.get("source", []))
            lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
            return lines[0] if lines else ""
    return ""


def write_report(
    executed: Path, out: Path, *, timings: dict[str, float] | None = None, scale: str = ""
) -> Path:
    """Render every notebook in ``executed`` to HTML under ``out`` and write ``index.html``."""
    import nbformat
    from nbconvert import HTMLExporter

    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()
    rows, findings = [], []
    for path in sorted(executed.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        body, _ = exporter.from_notebook_node(notebook)
        page = out / f"{path.stem}.html"
        page.write_text(body)
        seconds = (timings or {}).get(path.stem)
        took = f"{seconds:.0f} s" if seconds is not None else ""
        rows.append(
            f"<tr><td><a href='{page.name}'>{html.escape(path.stem)}</a></td>"
            f"<td>{html.escape(_first_markdown(notebook))}</td><td>{took}</td></tr>"
        )
        results = build_dir() / "results" / f"{path.stem}.json"
        if results.is_file():
            for f in json.loads(results.read_text()).get("findings", []):
                findings.append((path.stem, f))
    finding_rows = "".join(
        f"<tr><td>{html.escape(nb)}</td><td>{html.escape(f['claim'])}</td>"
        f"<td>{html.escape(str(f['measured']))}</td><td>{html.escape(f['verdict'])}</td></tr>"
        for nb, f in findings
    )
    index = out / "index.html"
    index.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>packlab report</title>"
        "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}"
        "td,th{border-bottom:1px solid #ccc;padding:.3em .6em;text-align:left}</style></head>"
        f"<body><h1>packlab report</h1><p>Scale: {html.escape(scale)}</p>"
        "<h2>Notebooks</h2><table><tr><th>notebook</th><th>question</th><th>time</th></tr>"
        + "".join(rows)
        + "</table><h2>Claims and findings</h2><table><tr><th>notebook</th><th>claim</th>"
        "<th>measured</th><th>verdict</th></tr>" + finding_rows + "</table></body></html>\n"
    )
    return index

"""The HTML report: a front page that decides, and one page per executed notebook.

The front page (``index.html``) answers "which format, and why" from one run's results
(``build/results/*.json`` and ``run.json``): a format per use case with its numbers, one row per
format, the three figures that carry the answer, the RFC's claims and packlab's targets as
tables, every verdict grouped by notebook, the notebooks' questions, and the run (date,
commit, machine, versions). Its words come from :mod:`packlab.lab.summaries`, the same Markdown
the notebooks and the README show.

A notebook page is the executed notebook without its code (the narrative, tables, figures and
findings), with a bar linking back to the front page and to the executed notebook, and its
parameters. Any ``NN_*.ipynb`` in the executed folder gets a page and a row.
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packlab.lab.measure.verdicts import COLOURS, RULE, badge
from packlab.lab.results import build_dir
from packlab.lab.summaries import findings_table, front, stack
from packlab.lab.summaries.record import (
    load_run,
    metadata_text,
    other_run,
    recorded_dir,
    reruns_text,
    scale_text,
)
from packlab.lab.tables import human_bytes

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:78em;margin:1.5em auto;
 padding:0 1.2em;color:#1f2328;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em} h2{margin-top:1.8em;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
td,th{border-bottom:1px solid #d0d7de;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f6f8fa} code{background:#eff1f3;padding:0 .25em;border-radius:.2em}
.meta{color:#57606a;font-size:.9em} figure{margin:1em 0} figure img{max-width:100%;
 border:1px solid #d0d7de} figcaption{color:#57606a;font-size:.9em}
details{margin:.4em 0} summary{cursor:pointer;font-weight:600}
"""
NAV_STYLE = """
nav.packlab{position:sticky;top:0;z-index:10;background:#f6f8fa;border-bottom:1px solid #d0d7de;
 padding:.5em 1.2em;font-family:system-ui,sans-serif;font-size:.9em}
nav.packlab .meta{color:#57606a}
"""


def _markdown(text: str) -> str:
    import mistune

    return str(mistune.html(text))


def _page(title: str, body: str) -> str:
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
            f"<body>{body}</body></html>\n")


def question(notebook: Mapping[str, Any]) -> str:
    """The notebook's question: its first Markdown cell without the title line."""
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            text = "".join(cell.get("source", []))
            lines = text.splitlines()
            return "\n".join(lines[1:] if lines and lines[0].startswith("#") else lines).strip()
    return ""


def title(notebook: Mapping[str, Any], default: str) -> str:
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            first = "".join(cell.get("source", [])).splitlines()[:1]
            if first and first[0].startswith("# "):
                return first[0][2:].strip()
            break
    return default


# -- notebook pages ----------------------------------------------------------------------------
def notebook_page(path: Path, out: Path, recorded: Mapping[str, Any] | None, run_line: str
                  ) -> None:
    """``out/NAME.html``: the executed notebook without code, a bar to the front page and to
    the executed notebook (copied beside it), its parameters from the record."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = nbformat.read(path, as_version=4)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(notebook)
    shutil.copy2(path, out / path.name)
    params = (recorded or {}).get("parameters", {})
    shown = ", ".join(f"<code>{html.escape(k)}={html.escape(repr(v))}</code>"
                      for k, v in params.items())
    bar = (f"<nav class='packlab'><a href='index.html'>← packlab report</a> · "
           f"<b>{html.escape(path.stem)}</b> · <a href='{path.name}'>the executed notebook, "
           f"with its code</a><div class='meta'>{html.escape(run_line)}"
           + (f"<br>parameters: {shown}" if shown else "") + "</div></nav>")
    head, sep, rest = body.partition("<body")
    tag_end = rest.index(">") + 1
    page = head + sep + rest[:tag_end] + f"<style>{NAV_STYLE}</style>" + bar + rest[tag_end:]
    (out / f"{path.stem}.html").write_text(page)


# -- the front page ----------------------------------------------------------------------------
def _figures(out: Path, pages: Mapping[str, str]) -> str:
    source = build_dir() / "figures"
    (out / "figures").mkdir(exist_ok=True)
    parts = []
    for name, caption in front.KEY_FIGURES:
        png = source / f"{name}.png"
        if not png.is_file():
            continue
        shutil.copy2(png, out / "figures" / png.name)
        page = next((p for stem, p in pages.items() if name.startswith(stem[:3])), None)
        link = f" (<a href='{page}'>the notebook</a>)" if page else ""
        parts.append(f"<figure><img src='figures/{png.name}' alt='{html.escape(caption)}'>"
                     f"<figcaption>{html.escape(caption)}{link}</figcaption></figure>")
    return "".join(parts) or "<p>No figures in this run.</p>"


def _verdicts_by_notebook(run: Mapping[str, Mapping[str, Any]], pages: Mapping[str, str]) -> str:
    parts = []
    for name, recorded in run.items():
        found = recorded.get("findings", [])
        if not found:
            continue
        link = f"<a href='{pages[name]}'>{html.escape(name)}</a>" if name in pages else name
        parts.append(f"<details><summary>{link}: {front.counts_text(found, colour=True)}"
                     f"</summary>{_markdown(findings_table(found))}</details>")
    return "".join(parts)


def _run_details(meta: Mapping[str, Any]) -> str:
    if not meta:
        return "<p>No run metadata (build/results/run.json) found.</p>"
    machine, versions = meta.get("machine", {}), meta.get("versions", {})
    rows = [("date", meta.get("date")), ("scale", meta.get("scale")),
            ("commit", (meta.get("commit") or "?") + (" (with local changes)"
                                                       if meta.get("dirty") else "")),
            ("cores", machine.get("cores")), ("memory", human_bytes(machine.get("memory_bytes"))),
            ("disk read-ahead", f"{machine.get('read_ahead_kb')} KB"), ("CPU", machine.get("cpu")),
            ("system", machine.get("system")),
            *((f"{k} version", v) for k, v in versions.items() if v)]
    return "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                               for k, v in rows) + "</table>"


def front_page(run: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any],
               notebooks: Mapping[str, Mapping[str, Any]], pages: Mapping[str, str], out: Path,
               other: tuple[Mapping[str, Any], Mapping[str, Any], str] | None = None) -> str:
    """The front page's HTML; ``other``: another whole run to compare the answers with
    (its results, its metadata, where it is)."""
    rfc, targets = front.findings(run, "rfc"), front.findings(run, "target")
    timings = meta.get("timings", {})
    rows = "".join(
        f"<tr><td><a href='{pages[name]}'>{html.escape(name)}</a></td>"
        f"<td>{_markdown(question(nb))}</td>"
        f"<td>{f'{timings[name]:.0f} s' if name in timings else ''}</td></tr>"
        for name, nb in notebooks.items())
    legend = " ".join(badge(v) for v in COLOURS)
    body = (
        "<h1>packlab: which on-disk format for packed SFT data, and why</h1>"
        f"<p class='meta'>{html.escape(metadata_text(meta))}</p>"
        "<h2>The answer, per use case</h2>"
        "<p>Each format is chosen from this run's numbers by the rule beside it, on what the "
        "use case's users feel; differences no one would notice tie.</p>"
        + _markdown(front.recommendations_table(run, other[0] if other else None))
        + f"<p>{html.escape(front.ties_text(run))}</p>"
        + _markdown(reruns_text(meta, other[1] if other else None,
                                other[2] if other else "build/previous/ or results/recorded/"))
        + "<h2>At the RFC's scale</h2>" + _markdown(scale_text())
        + "<h2>Beside what the stack reads today</h2>"
        "<p>What each training stack reads, released, proposed or planned, at the commit "
        "packlab read it at:</p>"
        + _markdown(stack.stack_inputs_table())
        + "<p>packlab's recommendation for local training beside packed Parquet as "
        "Megatron-Bridge reads it and beside the planned prefix path, with this run's "
        "numbers (a difference inside the bands above is a tie):</p>"
        + _markdown(stack.beside_stack_table(run))
        + "<h2>Every format</h2>"
        "<p>Peak memory: RSS growth over the process's baseline, in a fresh process, writing "
        "and loading (notebook 04). Latency: one random bin delivered, p50, with raw CSR numpy "
        "over the shard's own files (the memory-mapped formats), the same access path over bins "
        "in RAM (the Python floor) and a raw <code>pread</code> of the same bytes "
        "measured in the same run (notebook 05); the scan is a warm in-order pass. Bytes per "
        "token: everything on disk, <code>chat</code> data (notebook 03). <i>Read by</i>: "
        "stacks that read the files as written, each checked by a test.</p>"
        + _markdown(front.format_table(run))
        + "<h2>The figures that carry it</h2>" + _figures(out, pages)
        + f"<h2>The RFC's claims</h2><p>{front.counts_text(rfc, colour=True)}</p>"
        + _markdown(findings_table(rfc, notebook=True))
        + f"<h2>packlab's targets</h2><p>{front.counts_text(targets, colour=True)}</p>"
        + _markdown(findings_table(targets, notebook=True))
        + "<h2>Every verdict, by notebook</h2>" + _verdicts_by_notebook(run, pages)
        + f"<h2>How a verdict is decided</h2><p>{legend}</p><p>{html.escape(RULE)}</p>"
        + "<h2>The notebooks</h2><table><tr><th>notebook</th><th>the question</th>"
        f"<th>time</th></tr>{rows}</table>"
        + "<h2>The run</h2>" + _run_details(meta))
    return _page("packlab report", body)


def write_report(executed: Path, out: Path, *, results: Path | None = None) -> Path:
    """Render every executed notebook under ``out`` and write the front page,
    ``out/index.html``, from the results in ``results`` (default ``build/results``)."""
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    run, meta = load_run(results)
    previous = (results or build_dir() / "results").with_name("previous")
    other = next(((*found, where) for where, directory in (
        (f"{previous}", previous), ("results/recorded/", recorded_dir()))
        if (found := other_run(directory, meta)) is not None), None)
    run_line = metadata_text(meta)
    notebooks, pages = {}, {}
    for path in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        notebooks[path.stem] = nbformat.read(path, as_version=4)
        notebook_page(path, out, run.get(path.stem), run_line)
        pages[path.stem] = f"{path.stem}.html"
    index = out / "index.html"
    index.write_text(front_page(run, meta, notebooks, pages, out, other))
    return index

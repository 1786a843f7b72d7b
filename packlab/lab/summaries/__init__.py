"""What each notebook found, in words built from its recorded results, never typed twice.

A notebook records its numbers and findings (:func:`packlab.lab.results.record`) and ends with
``summaries.show("NN_name")``: the Markdown shown there is built from the recorded JSON by
this package, the same text the report and the README carry, so the words cannot drift from
the numbers.

- :func:`notebook_markdown`: a notebook's summary: its bullets (from the module
  ``packlab.lab.summaries.<name>`` when there is one: ``02_packing`` -> :mod:`.packing`, a function
  ``bullets(record, parameters) -> list[str]`` reading the notebook's typed record,
  :mod:`packlab.lab.records`) and its findings as one table;
- :func:`findings_table`: findings as a Markdown table, verdicts coloured or plain;
- :mod:`.front`: the cross-notebook answer (per-format table, a format per use case, the RFC's
  claims, the targets), for the report's front page and the README; :mod:`.decide`, how a
  use case is decided (what its users feel, with the differences they would not notice as
  ties) and how often reruns agree; :mod:`.stack`, the answer beside what the training stack
  reads today;
- :mod:`.record`: a run kept in the repository (``results/recorded/``) and the README's
  generated blocks.

A new notebook needs nothing here to get its findings table; a module named after it adds
bullets.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from packlab.lab.measure.verdicts import badge
from packlab.lab.tables import markdown_table


def module_name(notebook: str) -> str:
    """``02_packing`` -> ``packlab.lab.summaries.packing``."""
    return f"{__name__}.{notebook.split('_', 1)[1] if notebook[:2].isdigit() else notebook}"


def bullets(notebook: str, recorded: Mapping[str, Any]) -> list[str]:
    """The notebook's summary bullets, or none when no module writes them."""
    try:
        module = importlib.import_module(module_name(notebook))
    except ModuleNotFoundError as exc:
        if exc.name != module_name(notebook):
            raise
        return []
    from packlab.lab.records import load

    return list(module.bullets(load(notebook, recorded), recorded.get("parameters", {})))


def findings_table(findings: Sequence[Mapping[str, str]], *, colour: bool = True,
                   notebook: bool = False) -> str:
    """Findings as a Markdown table: claim, measured, verdict (an HTML badge when
    ``colour``); ``notebook``: a first column naming each finding's notebook."""
    if not findings:
        return ""
    headers = (["notebook"] if notebook else []) + ["claim", "measured", "verdict"]
    rows = [([f.get("notebook", "")] if notebook else [])
            + [_cell(f["claim"]), _cell(f["measured"]),
               badge(f["verdict"]) if colour else f["verdict"]] for f in findings]
    return markdown_table(headers, rows)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, one line, and outside code spans
    the underscores and stars that would turn ``__getitems__`` into bold."""
    parts = str(text).replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("_", "\\_").replace("*", "\\*")
                    for i, p in enumerate(parts))


def notebook_markdown(notebook: str, recorded: Mapping[str, Any], *, colour: bool = True) -> str:
    """A notebook's summary: bullets, then its findings."""
    parts = ["\n".join(f"- {b}" for b in bullets(notebook, recorded))]
    table = findings_table(recorded.get("findings", []), colour=colour)
    if table:
        parts.append("**Claims and checks**, each verdict computed from the numbers by one "
                     "rule (stated on the report's front page):\n\n" + table)
    return "\n\n".join(p for p in parts if p)


def show(notebook: str) -> Any:
    """What a notebook's last cell shows: its summary from ``build/results/NOTEBOOK.json``."""
    from IPython.display import Markdown

    from packlab.lab.results import load

    return Markdown(notebook_markdown(notebook, load(notebook)))

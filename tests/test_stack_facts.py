"""What packlab says the stack reads, checked against the facts it comes from.

``packlab/formats/shared/stacks.py`` holds what each training stack reads (released, proposed or
planned, each at a commit and date) and each format names the inputs it is
(``FormatFacts.STACK_INPUTS``). The README's "Megatron-Bridge and Megatron-LM, as of today"
must say the same: its generated table is the facts', every commit and pull request its prose
cites is one of theirs, and no sentence in the README or the report calls the proposal what a
stack reads.
"""

from __future__ import annotations

import re

import pytest

from packlab.formats import format_names, get_format
from packlab.formats.shared import stacks
from packlab.lab.summaries import stack
from packlab.lab.summaries.record import MARKER, load_run, readme_path, recorded_dir

README = readme_path().read_text()
AS_OF_TODAY = "## Megatron-Bridge and Megatron-LM, as of today"


def _section(title: str) -> str:
    text = README[README.index(title):]
    return text[:text.index("\n## ", len(title))]


SECTION = _section(AS_OF_TODAY)
FACTS = " ".join(f"{i.reads} {i.at()} {i.where} {i.change}" for i in stacks.INPUTS)


def test_the_section_prints_the_facts_table() -> None:
    parts = {m.group(2): m.group(3) for m in MARKER.finditer(SECTION)}
    assert parts["stack-inputs"].strip() == stack.stack_inputs_table()
    for stack_input in stacks.INPUTS:
        assert stack_input.status in stacks.STATUSES
        row = next(line for line in parts["stack-inputs"].splitlines()
                   if stack_input.reads in line)
        assert f"**{stack_input.status}**" in row and stack_input.at() in row


def test_every_commit_and_change_the_section_cites_is_a_fact() -> None:
    prose = MARKER.sub("", SECTION)
    commits = set(re.findall(r"`([0-9a-f]{7,40})`", prose))
    assert commits, "the section names the commits it read"
    for commit in commits:
        assert commit in FACTS, f"{commit}: cited in the README, in no fact"
    changes = set(re.findall(r"(?:pull request|issue) #\d+", prose))
    assert {"pull request #5226", "pull request #5017"} <= changes
    for change in changes:
        assert change in FACTS, f"{change}: cited in the README, in no fact"
    for stack_input in stacks.INPUTS:  # and each fact's commit is cited where it is told
        assert stack_input.commit in prose, stack_input.name


def test_each_format_is_the_inputs_it_names() -> None:
    """A format's inputs are written with that format; what a released stack reads by
    default is packed Parquet and the deprecated .npy, never the closed proposal."""
    claimed = {}
    for fmt in format_names():
        for stack_input in get_format(fmt).Reader.STACK_INPUTS:
            assert f"--format {fmt}`" in stack_input.written_by
            claimed[stack_input] = fmt
    assert {i.name: f for i, f in claimed.items() if i.released} == {
        "packed Parquet": "parquet", "packed .npy": "legacy_npy_pickle"}
    assert claimed[stacks.SFT_PAIR] == "megatron_sft" and not stacks.SFT_PAIR.released
    assert stacks.SFT_PAIR.status == stacks.CLOSED
    from packlab.formats import megatron_sft

    assert megatron_sft.BRIDGE_COMMIT == stacks.SFT_PAIR.commit
    for stack_input in stacks.PREFIX_PATH:  # no format: the prefix `packlab export` writes
        assert stack_input not in claimed and "`packlab export`" in stack_input.written_by
        assert not stack_input.released


WRONG = ("stores packed SFT data as `megatron_sft`", "Bridge's choice", "default packed storage",
         "offline packer chose", "Megatron-Bridge packs SFT data offline")


@pytest.mark.parametrize("phrase", WRONG)
def test_no_sentence_calls_the_proposal_what_bridge_reads(phrase: str, tmp_path) -> None:
    from packlab.lab.report import front_page

    run, meta = load_run(recorded_dir())
    assert phrase not in README
    assert phrase not in front_page(run, meta, {}, {}, tmp_path)

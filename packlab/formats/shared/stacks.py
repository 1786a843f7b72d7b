"""What the training stacks read, as packlab last read them at their source: released,
proposed or planned, each at the commit and date it was read at.

These are facts about other projects, kept in one place: a format says which of them it is
(``FormatFacts.STACK_INPUTS``), the report and the README print them (the README's "Megatron-Bridge
and Megatron-LM, as of today"), and ``tests/test_stack_facts.py`` checks that the README says
what these say. "What a released stack reads by default" is an input whose status is
:data:`RELEASED` or :data:`DEPRECATED`; nothing else is.
"""

from __future__ import annotations

from dataclasses import dataclass

#: when packlab last read every input below at its source
READ_ON = "2026-12-01"

#: in a release on the registry and on the main branch, read by default
RELEASED = "released"
#: in the release and on main, and announced there as going away
DEPRECATED = "released, deprecated"
#: a pull request, still open
PROPOSED = "proposed, open"
#: a pull request closed without being merged: on a branch only
CLOSED = "proposed, closed unmerged"
#: named by the project's documentation as coming, with no code in a release
PLANNED = "planned"
STATUSES = (RELEASED, DEPRECATED, PROPOSED, CLOSED, PLANNED)

BRIDGE = "Megatron-Bridge"
MEGATRON_LM = "Megatron-LM"
#: Megatron-Bridge's release on the registry (the one packlab's tests install and run)
BRIDGE_RELEASE = "0.6.2"
BRIDGE_MAIN = "067f987"
BRIDGE_MAIN_DATE = "2026-08-22"


@dataclass(frozen=True)
class StackInput:
    """One input a training stack reads (or proposes, or plans, to read)."""

    name: str  #: a short name for it, as the report's tables print it
    stack: str  #: the project
    status: str  #: one of :data:`STATUSES`
    reads: str  #: what the stack reads, in a phrase
    version: str  #: the release, branch or pull request read
    commit: str  #: the commit it was read at
    date: str  #: that commit's date, or the date the pull request was seen in this state
    where: str  #: the files it was read in
    written_by: str  #: the packlab command that writes it
    change: str = ""  #: the pull request that proposes it

    @property
    def released(self) -> bool:
        """A released stack reads it by default."""
        return self.status in (RELEASED, DEPRECATED)

    def at(self) -> str:
        """``version at commit (date)``: where and when it was read."""
        return f"{self.version} at `{self.commit}` ({self.date})"


PACKED_PARQUET = StackInput(
    name="packed Parquet", stack=BRIDGE, status=RELEASED,
    reads=("packed SFT bins as Parquet (`input_ids`, `seq_start_id`, `loss_mask`; a file, a "
           "directory or a glob), each random access decoding a whole row group, one row group "
           "cached; 0.6.2's builder names its packed output `training_<size>.idx.parquet`"),
    version=f"{BRIDGE_RELEASE} and main", commit=BRIDGE_MAIN, date=BRIDGE_MAIN_DATE,
    where=("`src/megatron/bridge/data/packing/config.py`, `paths.py`, `parquet.py`; "
           "`data/builders/gpt_sft.py`"),
    written_by="`packlab pack --format parquet`")
PACKED_NPY = StackInput(
    name="packed .npy", stack=BRIDGE, status=DEPRECATED,
    reads=("a pickled `.npy` list of packed bins, loaded whole; Bridge warns that it is "
           "deprecated and asks for packed Parquet instead"),
    version=f"{BRIDGE_RELEASE} and main", commit=BRIDGE_MAIN, date=BRIDGE_MAIN_DATE,
    where="`src/megatron/bridge/data/packing/config.py`",
    written_by="`packlab pack --format legacy_npy_pickle`")
SFT_PAIR = StackInput(
    name="packed .sft pair", stack=BRIDGE, status=CLOSED,
    reads=("packed bins as a megatron-core `.sft.bin/.sft.idx` pair, one item of int32 words a "
           "bin (pull request #5226; the branch's last documentation commit, `c1ec70d7f` of "
           "2026-08-04, is titled \"keep packed SFT on Parquet\")"),
    version="pull request #5226, branch `yuya/packed-sft-indexed`",
    commit="c91ec672d971adb9b155e31e2e224c036f34994e", date="August 2026",
    where="`src/megatron/bridge/data/packing/indexed.py`",
    written_by="`packlab pack --format megatron_sft`", change="pull request #5226")
PRETOKENIZED_PREFIX = StackInput(
    name="pre-tokenized prefix", stack=MEGATRON_LM, status=PROPOSED,
    reads=("pre-tokenized conversations as a megatron-core `.bin/.idx` prefix, one document a "
           "conversation, masks derived from the chat role markers, packed online (Modified "
           "First-Fit Decreasing) by its `SFTDataset`"),
    version="pull request #5017, its head",
    commit="97b2c55e4c373a072c36e79104bcdac1d77c022f", date="open on 2026-08-22",
    where="`megatron/core/datasets/sft_dataset.py`",
    written_by="`packlab export` (and `packed_index` to pack or repack over it)",
    change="pull request #5017")
PREPARED_PLAN = StackInput(
    name="prepared SFT prefix", stack=BRIDGE, status=PLANNED,
    reads=("pre-tokenized `.bin/.idx` as its prepared text SFT data (\"planned, not available "
           "yet\"); packed Parquet is its \"transitional\" prepared data until then"),
    version="main", commit=BRIDGE_MAIN, date=BRIDGE_MAIN_DATE,
    where="`data-preparation.md` (in `docs/training/`)",
    written_by="`packlab export`")

#: every input, in the order the README lists them
INPUTS = (PACKED_PARQUET, PACKED_NPY, SFT_PAIR, PRETOKENIZED_PREFIX, PREPARED_PLAN)
#: the planned prepared path: what no packlab format is, but ``packlab export`` writes
PREFIX_PATH = (PRETOKENIZED_PREFIX, PREPARED_PLAN)

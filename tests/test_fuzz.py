"""Seeded mutations of real outputs of every format (:mod:`fuzzing`): no crash, no hang, no
foreign exception, no hostile pickle run, and no silent difference a checksum or an invariant
can catch. ``--fuzz-scale 10`` (or more) for a long run; ``tests/fuzzing.py`` runs standalone
and prints the counts per class and outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzing import CLASSES, MARKER, Mutation, Reference, fuzz_format, judge

from packlab.formats import format_names

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

PER_FORMAT = 30  # per format in CI, each in a forked child (3 a class); long runs: --fuzz-scale


def report(run) -> str:
    lines = [run.table()]
    for verdict in run.failures[:10]:
        lines.append(f"FAIL {verdict.mutation} -> {verdict.outcome}: {verdict.detail[:3000]}")
    return "\n".join(lines)


@pytest.mark.parametrize("name", format_names())
def test_mutated_outputs_fail_cleanly_or_read_the_same(name: str, tmp_path: Path,
                                                        fuzz_scale: float) -> None:
    run = fuzz_format(name, tmp_path, max(len(CLASSES), round(PER_FORMAT * fuzz_scale)))
    print(run.table())
    assert not run.failures, report(run)
    tried = {cls for cls, _ in run.counts}
    assert tried == set(run.classes)  # every class that applies was tried
    assert sum(n for (_, outcome), n in run.counts.items() if outcome == "refused") > 0
    if not run.reads_spool:  # the harness sees a difference: a forgery rewritten by the writer
        assert run.counts[("forged", "forged-served")] > 0, report(run)


def test_the_judge_calls_a_difference_validate_misses_silent(tmp_path: Path) -> None:
    """The verdicts on hand-made reports: what makes a mutation a failure."""
    ref = Reference("memmap_v1", tmp_path, ["a", "b"], {"shard_000000": ["a", "b"]},
                    reads_spool=False)
    served = {"stages": [("open_dataset", "ok", "", "")], "shards": {}, "validate": True}

    def verdict(forged: bool = False, strict: bool = False, **report) -> str:
        return judge(Mutation("memmap_v1", 0, "bitflip", forged=forged), ("ok", {**served, **report}),
                     ref, tmp_path, strict=strict).outcome

    assert verdict(dataset=["a", "b"]) == "harmless"
    assert verdict(dataset=["a", "c"]) == "silent"
    assert verdict(dataset=["a", "c"], forged=True) == "forged-served"
    assert verdict(dataset=["a", "c"], validate=False) == "read-caught-by-validate"
    # reads verified against per-bin checksums: serving a changed bin is a failure by itself
    assert verdict(dataset=["a", "c"], validate=False, strict=True) == "read-silent"
    assert verdict(dataset=["a", "c"], validate=False, strict=True, forged=True) == \
        "forged-validate-caught"
    assert verdict(dataset=None, strict=True) == "refused"
    assert verdict(dataset=["a", "b"], validate=False, strict=True) == "validate-caught"
    assert verdict(dataset=None) == "refused"
    assert verdict(shards={"shard_000000": (["x", "b"], True)}, dataset=None) == "silent"
    assert verdict(shards={"shard_000000": (["x", "b"], False)}, dataset=None) == "refused"
    foreign = [("open_dataset", "foreign", "IndexError", "boom")]
    assert verdict(stages=foreign, dataset=None) == "foreign"
    assert judge(Mutation("memmap_v1", 0, "swap"), ("crash", "SIGSEGV"), ref, tmp_path,
                 strict=False).failed
    (tmp_path / MARKER).touch()
    assert verdict(dataset=["a", "b"]) == "pickle-ran"

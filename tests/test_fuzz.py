"""Seeded mutations of real outputs of every format (:mod:`fuzzing`): no crash, no hang, no
foreign exception, no hostile pickle run, and no silent difference a checksum or an invariant
can catch. The seed is the commit checked out (each landing tries other mutations), printed in
pytest's header and in every failure; ``--fuzz-seed SEED`` (or ``PACKLAB_FUZZ_SEED``) reruns a
run. ``make fuzz`` is the long run (``tests/fuzzing.py``: counts per class and outcome)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fuzzing import CLASSES, MARKER, Mutation, Reference, fuzz_format, fuzz_seed, judge
from mutations import ROOT, SEED_VARIABLE, build_reference, mutate

from packlab.formats import format_names

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

PER_FORMAT = 30  # per format in CI, each in a forked child (3 a class); long runs: --fuzz-scale


def report(run) -> str:
    lines = [run.table(), f"again: pytest tests/test_fuzz.py -k {run.format} --fuzz-seed {run.seed}"]
    for verdict in run.failures[:10]:
        lines.append(f"FAIL {verdict.mutation} -> {verdict.outcome}: {verdict.detail[:3000]}")
    return "\n".join(lines)


@pytest.mark.parametrize("name", format_names())
def test_mutated_outputs_fail_cleanly_or_read_the_same(name: str, tmp_path: Path,
                                                        fuzz_scale: float, fuzz_seed: str) -> None:
    run = fuzz_format(name, tmp_path, max(len(CLASSES), round(PER_FORMAT * fuzz_scale)),
                      seed=fuzz_seed)
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


def test_the_seed_is_the_commit_unless_one_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEED_VARIABLE, raising=False)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert fuzz_seed() == (head[:12], "git HEAD")
    monkeypatch.setenv(SEED_VARIABLE, "4a1c")
    assert fuzz_seed() == ("4a1c", SEED_VARIABLE)
    assert fuzz_seed("77") == ("77", "given")


def test_a_seed_draws_the_same_mutations_again_and_another_seed_others(tmp_path: Path) -> None:
    """What a printed seed promises: the same damage, case for case; what rotating it buys:
    other damage, each class still in turn."""
    ref = build_reference(tmp_path, "memmap_v1")

    def drawn(seed: str) -> list[tuple[str, str]]:
        out = []
        for index in range(2 * len(CLASSES)):
            tree = tmp_path / f"case-{seed}-{index}"
            shutil.copytree(ref.tree, tree, symlinks=True)
            m = mutate(tree, ref, index, seed)
            out.append((m.cls, m.what))
            shutil.rmtree(tree)
        return out

    first = drawn("a")
    assert drawn("a") == first
    other = drawn("b")
    assert [cls for cls, _ in other] == [cls for cls, _ in first]
    assert sum(a != b for a, b in zip(other, first, strict=True)) > len(first) // 2

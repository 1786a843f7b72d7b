"""Every subcommand over a table of bad inputs: one line on stderr, exit 2, nothing on stdout,
no traceback, and the file system exactly as it was (every file's bytes, every link, every
hidden temporary). Plus what a closed pipe does, in a real process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, write_random_spool

from packlab.cli import build_parser, in_cli_words
from packlab.pipeline.dataset_record import DATASET_RECORD

PARQUET = "parquet"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real inputs and outputs to get wrong: spools, a pack output, a layout, an interrupted
    output, a packed_index output that reads a spool, unrelated files and folders."""
    root = tmp_path_factory.mktemp("errors")
    spool = write_random_spool(root / "spool", num_sequences=60, max_len=200, seed=1).path
    other = write_random_spool(root / "other", num_sequences=40, max_len=200, seed=2).path
    ref = write_random_spool(root / "refspool", num_sequences=40, max_len=200, seed=3).path
    pack = ["--pack-size", "256", "--bins-per-shard", "5", "--workers", "1"]
    assert run_cli_quiet("pack", spool, root / "out", "--format", PARQUET, *pack) == 0
    assert run_cli_quiet("pack", ref, root / "byref", "--format", "packed_index", *pack) == 0
    assert run_cli_quiet("pack", spool, other, root / "layout", "--format", PARQUET, *pack,
                         "--split", "train=0.7,valid=0.3") == 0
    shutil.copytree(root / "out", root / "incomplete")
    manifest = json.loads((root / "incomplete" / DATASET_RECORD).read_text())
    (root / "incomplete" / DATASET_RECORD).write_text(json.dumps({**manifest, "state": "writing"}))
    shutil.copytree(root / "out", root / "damaged")
    victim = sorted((root / "damaged").glob("*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    (root / "unrelated").mkdir()
    (root / "unrelated" / "notes.txt").write_text("my notes\n")
    (root / "unrelated" / "photo.jpg").write_bytes(b"\xff\xd8\xff" * 50)
    (root / "file.txt").write_text("precious\n")
    (root / "chat.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
    (root / "bad.jsonl").write_text((root / "chat.jsonl").read_text() + "not json\n")
    return {"root": str(root), "spool": str(spool), "other": str(other), "refspool": str(ref),
            "out": str(root / "out"), "byref": str(root / "byref"),
            "layout": str(root / "layout"), "incomplete": str(root / "incomplete"),
            "damaged": str(root / "damaged"), "victim": str(victim),
            "unrelated": str(root / "unrelated"), "file": str(root / "file.txt"),
            "chat": str(root / "chat.jsonl"), "badjsonl": str(root / "bad.jsonl"),
            "missing": str(root / "missing"), "new": str(root / "new")}


def run_cli_quiet(*argv: object) -> int:
    from packlab.cli import main

    return main([str(a) for a in argv])


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (hidden ones too): a file's checksum, a link's target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                out[key] = "-> " + os.readlink(path)
            elif path.is_dir():
                out[key] = "dir"
            else:
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


P = ["--format", PARQUET, "--pack-size", "64"]
CASES = [
    # synth
    (["synth", "{new}", "-n", "0"], ["--num-sequences", "positive"]),
    (["synth", "{new}", "-n", "5", "--seed", "-1"], ["--seed", "-1"]),
    (["synth", "{new}", "-n", "5", "--profile", "nope"], ["--profile", "nope"]),
    (["synth", "{new}", "-n", "5", "--vocab-size", "10"], ["{new}", "--vocab-size must be"]),
    (["synth", "{spool}", "-n", "5"], ["{spool}", "already exists", "--overwrite"]),
    (["synth", "{file}", "-n", "5"], ["{file}", "not a folder"]),
    (["synth", "{file}", "-n", "5", "--overwrite"], ["{file}", "not a folder"]),
    (["synth", "{unrelated}", "-n", "5", "--overwrite"], ["{unrelated}", "not a spool"]),
    (["synth", "{out}", "-n", "5", "--overwrite"], ["{out}", "not a spool"]),
    (["synth", "{refspool}", "-n", "5", "--overwrite"], ["{refspool}", "still read this spool",
                                                         "{byref}"]),
    # tokenize
    (["tokenize", "{missing}", "{new}"], ["{missing}"]),
    (["tokenize", "{chat}", "{file}"], ["{file}", "not a folder"]),
    (["tokenize", "{chat}", "{unrelated}", "--overwrite"], ["{unrelated}", "not a spool"]),
    (["tokenize", "{chat}", "{spool}"], ["{spool}", "already exists", "--overwrite"]),
    (["tokenize", "{badjsonl}", "{new}"], ["{badjsonl}", "line 2"]),
    (["tokenize", "{chat}", "{new}", "--workers", "0"], ["--workers"]),
    # corpus
    (["corpus", "{new}", "--records", "0"], ["--records", "positive"]),
    (["corpus", "{new}", "--records", "2", "--seed", "-3"], ["--seed", "-3"]),
    (["corpus", "{chat}", "--records", "2"], ["{chat}", "already exists", "--overwrite"]),
    (["corpus", "{unrelated}", "--records", "2", "--overwrite"], ["{unrelated}",
                                                                  "not a JSONL file"]),
    (["corpus", "{spool}/tokens.bin", "--records", "2", "--overwrite"], ["tokens.bin",
                                                                          "not a JSONL file"]),
    # plan
    (["plan", "{spool}", "--pack-size", "64", "--seed", "-1"], ["--seed", "-1"]),
    (["plan", "{spool}", "--pack-size", "0"], ["--pack-size", "positive"]),
    (["plan", "{missing}", "--pack-size", "64"], ["{missing}"]),
    (["plan", "{spool}", "--pack-size", "64", "--algorithm", "magic"], ["magic"]),
    (["plan", "{out}", "--pack-size", "64"], ["{out}"]),
    # pack
    (["pack", "{spool}", "{new}", *P, "--seed", "-1"], ["--seed", "-1"]),
    (["pack", "{spool}", "{new}", "--format", "nope", "--pack-size", "64"], ["nope"]),
    (["pack", "{missing}", "{new}", *P], ["{missing}"]),
    (["pack", "{spool}", "{file}", *P], ["{file}", "not a folder"]),
    (["pack", "{spool}", "{file}", *P, "--overwrite"], ["{file}", "not a folder"]),
    (["pack", "{spool}", "{unrelated}", *P, "--overwrite"], ["{unrelated}",
                                                            "not a packlab output"]),
    (["pack", "{spool}", "{spool}", *P, "--overwrite"], ["{spool}", "not a packlab output"]),
    (["pack", "{spool}", "{out}", *P], ["{out}", "already holds another output",
                                        "--overwrite"]),
    (["pack", "{spool}", "{layout}", *P], ["{layout}", "not a packlab output"]),
    (["pack", "{spool}", "{new}", *P, "--split", "train=0.5,valid=0.6"], ["sum to 1.1"]),
    (["pack", "{spool}", "{new}", *P, "--split", "train=1.5"], ["over 1"]),
    (["pack", "{spool}", "{other}", "{new}", *P, "--weights", "1"], ["1 weights for 2"]),
    (["pack", "{spool}", "{new}", *P, "--weights", "x"], ["weight 1 of 1", "not a number"]),
    (["pack", "{spool}", "{new}", *P, "--bins-per-shard", "0"], ["--bins-per-shard"]),
    (["pack", "{spool}", "{new}", *P, "--workers", "0"], ["--workers"]),
    (["pack", "{spool}", "{new}", *P, "--algorithm", "magic"], ["magic"]),
    # validate
    (["validate", "{missing}"], ["{missing}", "no such file"]),
    (["validate", "{incomplete}"], ["{incomplete}", "incomplete output"]),
    (["validate", "{unrelated}"], ["photo.jpg", "not a shard"]),
    (["validate", "{damaged}"], ["{victim}"]),
    (["validate", "{out}", "--split", "train"], ["{out}", "split 'train'"]),
    (["validate", "{layout}", "--split", "dev"], ["{layout}", "no split 'dev'"]),
    # inspect
    (["inspect", "{missing}"], ["{missing}"]),
    (["inspect", "{incomplete}"], ["{incomplete}", "incomplete output"]),
    (["inspect", "{layout}", "--split", "dev"], ["no split 'dev'"]),
    (["inspect", "{file}"], ["{file}", "not a shard"]),
    # convert
    (["convert", "{out}", "{new}", "--format", "nope"], ["nope"]),
    (["convert", "{out}", "{new}", "--format", "packed_index"], ["cannot be converted into"]),
    (["convert", "{missing}", "{new}", "--format", "arrow_ipc"], ["{missing}"]),
    (["convert", "{out}", "{file}", "--format", "arrow_ipc"], ["{file}", "not a folder"]),
    (["convert", "{out}", "{unrelated}", "--format", "arrow_ipc", "--overwrite"],
     ["{unrelated}", "not a packlab output"]),
    (["convert", "{out}", "{out}", "--format", PARQUET, "--overwrite"], ["DST is SRC"]),
    (["convert", "{layout}", "{new}", "--format", "arrow_ipc"], ["{layout}", "one split"]),
    (["convert", "{incomplete}", "{new}", "--format", "arrow_ipc"], ["incomplete output"]),
    (["convert", "{damaged}", "{new}", "--format", "arrow_ipc"], ["{victim}"]),
    # query
    (["query", "SELECT 1", "--data", "{out}", "--threads", "0"], ["--threads"]),
    (["query", "SELECT 1", "--data", "{out}", "--threads", "-1"], ["--threads"]),
    (["query", "SELECT 1", "--data", "{out}", "--memory-limit", "lots"],
     ["--memory-limit must be", "lots"]),
    (["query", "SELECT 1", "--data", "{out}", "--max-rows", "-1"], ["--max-rows"]),
    (["query", "COPY (SELECT 1) TO '{root}/x.csv'", "--data", "{out}"],
     ["COPY statement", "read-only", "--allow-writes"]),
    (["query", "SELECT 1; COPY bins TO '{out}/x.parquet'", "--data", "{out}"], ["read-only"]),
    (["query", "ATTACH '{root}/db.duckdb'", "--data", "{out}"], ["ATTACH", "read-only"]),
    (["query", "SELECT * FROM read_csv('{file}')", "--data", "{out}"], ["{file}",
                                                                       "Permission"]),
    (["query", "SELECT 1", "--data", "{incomplete}"], ["incomplete output"]),
    (["query", "SELECT 1", "--data", "{missing}"], ["{missing}"]),
    (["query", "SELECT 1", "--data", "{layout}", "--split", "dev"], ["no split 'dev'"]),
    (["query", "SELECT nope FROM bins", "--data", "{out}"], ["nope"]),
    # bench
    (["bench", "size", "{out}", "--seed", "-1"], ["--seed"]),
    (["bench", "latency", "{out}", "--samples", "0"], ["--samples"]),
    (["bench", "throughput", "{out}", "--workers", "-1"], ["--workers"]),
    (["bench", "size", "{missing}"], ["{missing}"]),
    (["bench", "size", "{incomplete}"], ["incomplete output"]),
    (["bench", "memory", "{layout}"], ["{layout}", "one split"]),
    (["bench", "latency", "{out}", "--split", "train"], ["{out}", "split 'train'"]),
    # gc
    (["gc", "{missing}"], ["{missing}", "no such directory"]),
    (["gc", "{file}"], ["{file}", "not a directory"]),
    (["gc", "{victim}"], ["{victim}", "not a directory"]),
    (["gc", "s3://bucket/out"], ["s3://bucket/out", "local directory", "not a URI"]),
    (["gc", "{out}", "--dry-run", "--json", "--json=x"], ["--json"]),
    # pbin, raw-index
    (["pbin", "{missing}", "{new}.pbin"], ["{missing}"]),
    (["pbin", "{spool}", "{file}"], ["{file}", "not a .pbin file"]),
    (["pbin", "{spool}", "{file}", "--overwrite"], ["{file}", "not a .pbin file"]),
    (["pbin", "{spool}", "{new}.pbin", "--token-width", "3"], ["3"]),
    (["raw-index", "{missing}"], ["{missing}"]),
    (["raw-index", "{chat}", "--index-path", "{file}"], ["{file}", "not an index"]),
    (["raw-index", "{badjsonl}"], ["{badjsonl}", "line 2"]),
    # export
    (["export", "{missing}", "{new}"], ["{missing}", "neither a spool"]),
    (["export", "{file}", "{new}"], ["{file}", "neither a spool"]),
    (["export", "{spool}", "{missing}/x"], ["{missing}", "no such folder"]),
    (["export", "{spool}", "{new}", "--end-of-turn"], ["need --chat-markers"]),
    (["export", "{spool}", "{new}", "--chat-markers", "cl100k_base", "--marker", "end"],
     ["--marker 'end'", "NAME=TEXT"]),
    (["export", "{spool}", "{new}", "--chat-markers", "{file}"], ["{file}"]),
    (["export", "{spool}", "{new}", "--chat-markers", "cl100k_base", "--marker", "end="],
     ["end", "encodes to no token"]),
]


@pytest.mark.parametrize("argv, names", CASES, ids=[" ".join(c[0][:2]) + f"-{i}"
                                                     for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_exit_2_and_nothing_changes(tree, capsys, argv, names) -> None:
    root = Path(tree["root"])
    args = [a.format(**tree) for a in argv]
    before = snapshot(root)
    code, out, err = run_cli(capsys, *args)
    assert (code, out) == (2, ""), (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"packlab {argv[0]}: error: "), lines[0]
    for name in names:
        assert name.format(**tree) in lines[0], (name, lines[0])
    assert "=True" not in lines[0]  # the command line's words, not Python's
    assert snapshot(root) == before


def test_the_table_covers_every_subcommand() -> None:
    """A new subcommand gets rows in the table (the generic case below covers it meanwhile)."""
    names = set(subcommands())
    covered = {argv[0] for argv, _ in CASES}
    assert covered <= names
    assert covered == names


def subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


@pytest.mark.parametrize("name", subcommands())
def test_every_subcommand_refuses_an_unknown_flag_on_one_line(name, capsys) -> None:
    code, out, err = run_cli(capsys, name, "--no-such-flag")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"packlab {name}: error:" in err, err


def test_library_words_become_flags() -> None:
    assert in_cli_words("x: already exists (pass overwrite=True to replace it)") == \
        "x: already exists (pass --overwrite to replace it)"
    assert in_cli_words("max_records must be positive, got 0") == \
        "--records must be positive, got 0"
    assert in_cli_words("/a/b: vocab_size must be an integer") == \
        "/a/b: --vocab-size must be an integer"


def test_a_closed_pipe_ends_quietly(tree) -> None:
    """``packlab query ... | head -1`` in real processes: head gets its line, packlab stops
    with the status of a process stopped by SIGPIPE and prints nothing (no traceback)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for argv in (["query", "SELECT * FROM tokens", "--data", tree["out"], "--tokens",
                  "--format", "csv"],
                 ["query", "SELECT * FROM tokens", "--data", tree["out"], "--tokens",
                  "--max-rows", "1000000"]):
        packlab = subprocess.Popen([sys.executable, "-m", "packlab.cli", *argv], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        head = subprocess.run(["head", "-1"], stdin=packlab.stdout, capture_output=True,
                              timeout=120)
        packlab.stdout.close()
        err = packlab.stderr.read().decode()
        assert packlab.wait(timeout=120) == 141, err
        assert err == "" and head.stdout.decode().startswith(("split", "split,"))

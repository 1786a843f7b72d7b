"""Every subcommand over a table of bad inputs: one line on stderr, exit 2, nothing on stdout,
no traceback, and the file system exactly as it was (every file's bytes, every link, every
hidden temporary). Plus what a closed pipe does, in a real process."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_error_line, run_cli, write_random_spool
from test_cli_interrupt import WRITERS

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
    # outputs of the other writing commands, and damaged inputs for the chain of custody
    assert run_cli_quiet("pack", spool, root / "mm", "--format", "memmap_v1", *pack) == 0
    assert run_cli_quiet("pack", spool, root / "bi", "--format", "binidx", *pack) == 0
    assert run_cli_quiet("pack", spool, root / "pb", "--format", "pbin", *pack) == 0
    assert run_cli_quiet("pack", spool, root / "sft", "--format", "megatron_sft", *pack) == 0
    assert run_cli_quiet("pbin", spool, root / "chat.pbin") == 0
    (root / "mydocs.jsonl").write_text((root / "chat.jsonl").read_text())  # a person's
    (root / "theirs.idx").write_bytes(b"MMIDIDX\x00\x00" + bytes(25))  # a person's index
    shutil.copytree(spool, root / "flipped_spool")  # one byte of one token flipped
    _flip(root / "flipped_spool" / "tokens.bin", 1001)
    shutil.copytree(root / "mm", root / "flipped_out")  # one byte of one bin's tokens
    _flip(sorted((root / "flipped_out").glob("shard_*/input_ids.npy"))[1], 200)
    assert run_cli_quiet("convert", root / "out", root / "converting", "--format",
                         "arrow_ipc") == 0
    record = json.loads((root / "converting" / DATASET_RECORD).read_text())
    (root / "converting" / DATASET_RECORD).write_text(json.dumps({**record, "state": "writing"}))
    shutil.copytree(ref, root / "swap" / "spool")  # a packed_index output, then its spool
    assert run_cli_quiet("pack", root / "swap" / "spool", root / "swap" / "out", "--format",
                         "packed_index", *pack) == 0  # replaced: another record in its place
    record = root / "swap" / "spool" / "manifest.json"
    record.write_text(json.dumps(json.loads(record.read_text()), indent=1))
    for name in ("lonebin.bin", "lonemasks.masks.bin", "lonerecord.spool.json", "pair.sft.bin"):
        (root / name).write_text("a person's file\n")  # beside no .idx: not a prefix's
    assert run_cli_quiet("corpus", root / "indexed.jsonl", "--records", "3",
                         "--index") == 0  # a chat JSONL with its line index beside it
    # a system's folders: outputs below a folder with files of its own, or five folders
    # down, are nobody's run folder (read as one, ``validate /`` walked the whole disk)
    shutil.copytree(root / "out", root / "system" / "etc" / "packlab" / "out")
    (root / "system" / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    shutil.copytree(root / "out", root / "deep" / "a" / "b" / "c" / "d" / "out")
    truncated = root / "truncated.pbin"  # a pbin shard cut inside its trailer
    truncated.write_bytes(sorted((root / "pb").glob("*.pbin"))[0].read_bytes()[:-30])
    return {"root": str(root), "spool": str(spool), "other": str(other), "refspool": str(ref),
            "out": str(root / "out"), "byref": str(root / "byref"),
            "layout": str(root / "layout"), "incomplete": str(root / "incomplete"),
            "damaged": str(root / "damaged"), "victim": str(victim),
            "unrelated": str(root / "unrelated"), "file": str(root / "file.txt"),
            "chat": str(root / "chat.jsonl"), "badjsonl": str(root / "bad.jsonl"),
            "missing": str(root / "missing"), "new": str(root / "new"),
            "mm": str(root / "mm"), "bi": str(root / "bi"), "pb": str(root / "pb"),
            "sft": str(root / "sft"), "theirs": str(root / "theirs.idx"),
            "theirs_prefix": str(root / "theirs"), "swapped": str(root / "swap" / "out"),
            "pbinfile": str(root / "chat.pbin"), "mydocs": str(root / "mydocs.jsonl"),
            "flipped_spool": str(root / "flipped_spool"), "flipped_out": str(root / "flipped_out"),
            "converting": str(root / "converting"), "truncated": str(truncated),
            "nonutf8": str(root / os.fsdecode(b"bad\xffname")),
            "indexed": str(root / "indexed.jsonl"), "system": str(root / "system"),
            "deep": str(root / "deep")}


def _flip(path: Path, offset: int) -> None:
    """One bit of the byte ``offset`` bytes from the end of ``path`` flipped (data, not a
    header), nothing else changed."""
    raw = bytearray(path.read_bytes())
    raw[-offset] ^= 1
    path.write_bytes(bytes(raw))


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
    (["tokenize", "{spool}", "{new}"], ["{spool}", "a spool", "not a chat JSONL file"]),
    (["tokenize", "{out}", "{new}"], ["{out}", "a pack output", "not a chat JSONL file"]),
    (["tokenize", "{chat}", "{new}", "--limit", "0"], ["--limit", "positive"]),
    # corpus
    (["corpus", "{new}", "--records", "0"], ["--records", "positive"]),
    (["corpus", "{new}", "--records", "2", "--seed", "-3"], ["--seed", "-3"]),
    (["corpus", "{chat}", "--records", "2"], ["{chat}", "not a chat JSONL packlab wrote"]),
    (["corpus", "{unrelated}", "--records", "2", "--overwrite"], ["{unrelated}",
                                                                  "not a chat JSONL"]),
    (["corpus", "{spool}/tokens.bin", "--records", "2", "--overwrite"],
     ["tokens.bin", "inside {spool}, a spool"]),
    # plan
    (["plan", "{spool}", "--pack-size", "64", "--seed", "-1"], ["--seed", "-1"]),
    (["plan", "{spool}", "--pack-size", "0"], ["--pack-size", "positive"]),
    (["plan", "{missing}", "--pack-size", "64"], ["{missing}"]),
    (["plan", "{spool}", "--pack-size", "64", "--algorithm", "magic"], ["magic"]),
    (["plan", "{out}", "--pack-size", "64"], ["{out}"]),
    # pack
    (["pack", "{spool}", "{new}", *P, "--seed", "-1"], ["--seed", "-1"]),
    (["pack", "{spool}", "{new}", "--format", "nope", "--pack-size", "64"],
     ["nope", "memmap_v1, binidx"]),
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
    (["pack", "{spool}", "{new}", *P, "--algorithm", "magic"], ["magic", "best_fit_decreasing, "]),
    (["pack", "{spool}", "{new}", *P, "--over"], ["unrecognized arguments: --over"]),
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
    (["pbin", "{spool}", "{file}"], ["{file}", "not a Modalities packed data file"]),
    (["pbin", "{spool}", "{file}", "--overwrite"], ["{file}",
                                                    "not a Modalities packed data file"]),
    (["pbin", "{spool}", "{new}.pbin", "--token-width", "3"], ["3"]),
    (["raw-index", "{missing}"], ["{missing}"]),
    (["raw-index", "{chat}", "--index-path", "{file}"], ["{file}",
                                                         "not a Modalities raw index"]),
    (["raw-index", "{badjsonl}"], ["{badjsonl}", "line 2"]),
    # issue 25: --overwrite never reaches inside another output, nor a person's file
    (["raw-index", "{chat}", "--index-path", "{bi}/shard_000000/data.idx", "--overwrite"],
     ["data.idx", "inside {bi}/shard_000000, a binidx shard"]),
    (["corpus", "{mydocs}", "--records", "2", "--overwrite"], ["{mydocs}",
                                                              "not a chat JSONL packlab wrote"]),
    (["pbin", "{spool}", "{pb}/shard_000000.pbin", "--overwrite"],
     ["shard_000000.pbin", "inside {pb}, a packlab output"]),
    (["convert", "{victim}", "{out}/shard_000000.parquet", "--format", PARQUET, "--overwrite"],
     ["inside {out}, a packlab output"]),
    (["synth", "{out}/shard_000000.parquet", "-n", "5", "--overwrite"], ["inside {out}"]),
    (["pack", "{spool}", "{mm}/shard_000000/x", *P, "--overwrite"], ["inside {mm}"]),
    # the chain of custody: corrupted input refused, naming the file and sequences or bin
    (["pack", "{flipped_spool}", "{new}", *P], ["{flipped_spool}/tokens.bin", "sequences",
                                               "checksum mismatch"]),
    (["convert", "{flipped_out}", "{new}", "--format", "arrow_ipc"],
     ["{flipped_out}/shard_000001", "bin", "checksum mismatch"]),
    (["validate", "{converting}"], ["{converting}", "incomplete output",
                                    "`packlab convert` again"]),
    (["validate", "{swapped}"], ["spool", "not the spool {swapped} was packed from",
                                 "replaced"]),
    # limits, before any work
    (["pack", "{spool}", "{new}", "--format", PARQUET, "--pack-size", "2147483648"],
     ["--pack-size", "2,147,483,647"]),
    (["pack", "{spool}", "{new}", "--format", PARQUET, "--pack-size",
      "99999999999999999999"], ["--pack-size", "2,147,483,647"]),
    (["plan", "{spool}", "--pack-size", "99999999999999999999"], ["--pack-size"]),
    (["synth", "{new}", "-n", "99999999999999999999"], ["--num-sequences"]),
    (["tokenize", "{chat}", "{new}", "--limit", "0"], ["--limit"]),
    (["pack", "{spool}", "{new}", "--format", "memmap_v1", "--pack-size", "1000000000"],
     ["{new}", "pads every bin", "5.0 GB"]),
    # its own files, odd names, empty queries
    (["validate", "{truncated}"], ["{truncated}", "stray bytes"]),
    (["synth", "{nonutf8}", "-n", "5"], ["bad\\xffname: the path is not valid UTF-8"]),
    (["pack", "{spool}", "{nonutf8}", *P], ["bad\\xffname: the path is not valid UTF-8"]),
    (["query", "SELECT 1", "--data", "{nonutf8}"], ["bad\\xffname: the path is not valid UTF-8"]),
    (["query", "", "--data", "{out}"], ["no SQL statement"]),
    (["query", ";", "--data", "{out}"], ["no SQL statement"]),
    (["query", "-- hi", "--data", "{out}"], ["no SQL statement"]),
    (["raw-index", "{unrelated}"], ["{unrelated}", "a folder, not a JSONL file"]),
    (["pbin", "{out}", "{new}.pbin"], ["{out}", "a pack output", "not a JSONL file"]),
    (["pbin", "{layout}", "{new}.pbin"], ["{layout}", "an output layout"]),
    # export
    (["export", "{missing}", "{new}"], ["{missing}", "neither a spool"]),
    (["export", "{file}", "{new}"], ["{file}", "neither a spool"]),
    (["export", "{spool}", "{missing}/x"], ["{missing}", "no such folder"]),
    (["export", "{spool}", "{new}", "--end-of-turn"], ["need --chat-markers"]),
    (["export", "{spool}", "{new}", "--chat-markers", "cl100k_base", "--marker", "end"],
     ["--marker end:", "NAME=TEXT"]),
    (["export", "{spool}", "{new}", "--chat-markers", "{file}"], ["{file}"]),
    (["export", "{spool}", "{new}", "--chat-markers", "cl100k_base", "--marker", "end="],
     ["end", "encodes to no token"]),
    # issue 31: a prefix's other files are a person's unless packlab exported them
    (["export", "{spool}", "{root}/lonebin"], ["{root}/lonebin.bin", "would replace it"]),
    (["export", "{spool}", "{root}/lonebin", "--overwrite"], ["{root}/lonebin.bin",
                                                             "would replace it"]),
    (["export", "{spool}", "{root}/lonemasks", "--overwrite"],
     ["{root}/lonemasks.masks.bin", "would replace it"]),
    (["export", "{spool}", "{root}/lonerecord", "--overwrite"],
     ["{root}/lonerecord.spool.json", "would replace it"]),
    (["export", "{spool}", "{unrelated}", "--overwrite"], ["{unrelated}", "a folder",
                                                          "{unrelated}/NAME"]),
    # a JSONL with its line index beside it is a JSONL, not a Megatron prefix
    (["pbin", "{indexed}", "{new}.pbin"], ["{indexed}: line 1", "no 'text'"]),
    (["plan", "{indexed}", "--pack-size", "64"], ["{indexed}", "a file, not a spool",
                                                  "packlab tokenize"]),
    (["pack", "{indexed}", "{new}", *P], ["{indexed}", "a file, not a spool"]),
    (["export", "{indexed}", "{new}"], ["{indexed}", "neither a spool"]),
    (["export", "{chat}", "{new}"], ["{chat}", "neither a spool"]),
    # a misspelt split, a memory limit too small for the views
    (["pack", "{spool}", "{new}", *P, "--split", "train=0.9,vaild=0.1"],
     ["split 'vaild'", "did you mean 'valid'"]),
    (["pack", "{spool}", "{new}", *P, "--split", "trian=0.9,valid=0.1"], ["did you mean 'train'"]),
    (["query", "SELECT 1", "--data", "{out}", "--memory-limit", "1KB"],
     ["{out}", "ran out of memory", "--memory-limit 1KB"]),
    (["query", "ATTACH '{root}/db.duckdb'", "--data", "{out}"], ["an ATTACH statement"]),
    (["pack", "{spool}", "{new}", "--formt", "parquet", "--pack-size", "64"],
     ["unrecognized arguments: --formt (did you mean --format?)"]),
    (["validate", "{system}"], ["{system}/etc", "not a shard"]),
    (["pack", "{spool}", "{new}", "--format", "Parquet", "--pack-size", "64"],
     ["unknown format 'Parquet'", "did you mean 'parquet'?"]),
    (["query", "SELECT 1", "--data", "{out}", "--format", "jsn"], ["did you mean 'json'?"]),
    (["convert", "{out}", "{root}/all.parquet", "--format", PARQUET],
     ["{root}/all.parquet", "a shard's name (.parquet)", "name a folder"]),
    (["convert", "{out}", "{root}/all.sft", "--format", "megatron_sft"],
     ["{root}/all.sft", "a shard's name (.sft)", "name a folder"]),  # a pair's prefix
    (["pack", "{spool}", "{new}", *P, "--split", "train=0.9;valid=0.1"], ["separate them with commas"]),
    (["pack", "{spool}", "{spool}", "{new}", *P], ["'spool' twice", "--names"]),
    (["convert", "{out}/shard_000000.parquet", "{root}/pair.sft", "--format", "megatron_sft"],
     ["{root}/pair.sft.bin", "would replace it"]),  # a pair named by its prefix
    (["inspect", "{deep}"], ["{deep}/a", "not a shard"]),
]


@pytest.mark.parametrize("argv, names", CASES, ids=[" ".join(c[0][:2]) + f"-{i}"
                                                     for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_exit_2_and_nothing_changes(tree, capsys, argv, names) -> None:
    root = Path(tree["root"])
    args = [a.format(**tree) for a in argv]
    before = snapshot(root)
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"packlab {argv[0]}: error: "), lines[0]
    for name in names:
        assert name.format(**tree) in lines[0], (name, lines[0])
    assert_plain_words(lines[0])
    # stdout: nothing, or with --json the same failure as one JSON object
    assert (json.loads(out)["error"] if "--json" in args else out) == (lines[0] if "--json" in args
                                                                        else "")
    assert snapshot(root) == before


#: every command that writes, with --overwrite aimed at TARGET: the test below fills TARGET
#: with a file inside another output, then with a person's file
OVERWRITES = {
    "synth": ["synth", "TARGET", "-n", "5"],
    "tokenize": ["tokenize", "{chat}", "TARGET"],
    "corpus": ["corpus", "TARGET", "--records", "2"],
    "pack": ["pack", "{spool}", "TARGET", *P],
    "convert": ["convert", "{out}", "TARGET", "--format", "arrow_ipc"],
    "raw-index": ["raw-index", "{chat}", "--index-path", "TARGET"],
    "pbin": ["pbin", "{spool}", "TARGET"],
    "export": ["export", "{spool}", "TARGET"],  # TARGET.idx, TARGET.bin, ... (a prefix)
}
INSIDE = ("{out}/shard_000000.parquet", "{bi}/shard_000000/data.idx",
          "{mm}/shard_000000/input_ids.npy", "{spool}/tokens.bin", "{layout}/blend.json",
          "{pb}/shard_000000.pbin", "{sft}/shard_000000.sft.bin", "{sft}/shard_000000.sft.idx")


@pytest.mark.parametrize("name", sorted(OVERWRITES))
def test_overwrite_never_replaces_a_file_inside_another_output_or_a_persons_file(
        tree, capsys, name) -> None:
    """Every writing command, --overwrite aimed at a file inside another output (every kind of
    output packlab makes) and at a person's files: refused in one line, every byte kept."""
    root = Path(tree["root"])
    targets = [*INSIDE, "{file}", "{mydocs}", "{unrelated}/notes.txt", "{theirs}"]
    if name == "export":  # it names a prefix: TARGET.idx is what would be replaced
        targets = [*INSIDE, "{theirs_prefix}"]
    for target in targets:
        argv = [a.replace("TARGET", target).format(**tree) for a in OVERWRITES[name]]
        before = snapshot(root)
        code, out, err = run_cli(capsys, *argv, "--overwrite")
        assert (code, out) == (2, ""), (argv, code, out, err)
        assert len(err.strip().splitlines()) == 1, err
        assert snapshot(root) == before, argv


def test_every_writing_command_is_driven_by_the_overwrite_test() -> None:
    """A new command that writes (it has --overwrite) joins OVERWRITES, and WRITERS of
    tests/test_cli_interrupt.py."""
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    writing = {name for name, sub in action.choices.items()
               if any("--overwrite" in a.option_strings for a in sub._actions)}
    assert writing == set(OVERWRITES) == set(WRITERS)  # and the interruption test drives it


def assert_plain_words(line: str) -> None:
    """A message in the command line's words: no Python keyword arguments (``overwrite=True``,
    ``spool=``), no reprs of lists, dicts or sets, no Python type or class names."""
    assert not re.search(r"\b[a-z_]+=(True|False|None|\s|\)|$)", line), line
    assert not re.search(r"\['|\{'|\bset\(", line), line
    assert not re.search(r"\b(str|dict|list|NoneType|int)\b(?!\w)", line), line
    assert not re.search(r"\b[A-Z][a-z]+[A-Z]\w*(Reader|Writer|File|Dataset|Error)\b", line), line


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
    assert in_cli_words("x.pbin: bin 3: token ids 0..70000 do not fit 2-byte tokens; pass "
                        "token_width=4") == \
        "x.pbin: bin 3: token ids 0..70000 do not fit 2-byte tokens; pass --token-width 4"


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


def test_its_own_files_and_outputs_with_a_persons_folder_inside_are_read(
        tree, tmp_path, capsys) -> None:
    """What ``packlab pbin`` wrote validates and inspects; a folder (even empty) and a file a
    person put inside a pack output are ignored with one warning line by validate, inspect and
    ``open_dataset``, never a failure."""
    from packlab import open_dataset

    for command in ("validate", "inspect"):
        code, out, err = run_cli(capsys, command, tree["pbinfile"])
        assert (code, err) == (0, ""), err
        assert "packlab pbin" in out
    out = tmp_path / "out"
    shutil.copytree(tree["out"], out)
    (out / "my_notes").mkdir()
    (out / "empty").mkdir()
    (out / "my_notes" / "todo.txt").write_text("look at bin 3\n")
    for command in ("validate", "inspect"):
        code, _, err = run_cli(capsys, command, out)
        assert code == 0, err
        warnings = err.strip().splitlines()
        assert len(warnings) == 1 and "empty and 1 more" in warnings[0], err
        assert "ignored" in warnings[0], err
    with pytest.warns(UserWarning, match="ignored"):
        assert len(open_dataset(out)) == len(open_dataset(tree["out"]))


# -- words for people: help, defaults, abbreviations, --json on failure ------------------------
def parsers() -> dict[str, argparse.ArgumentParser]:
    """The command's parser and each subcommand's, by name (``packlab`` for the command)."""
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return {"packlab": parser, **{f"packlab {n}": p for n, p in action.choices.items()}}


@pytest.mark.parametrize("name", sorted(parsers()))
def test_help_is_in_plain_words_and_shows_every_default(name, capsys) -> None:
    """``packlab X -h`` as printed: no reST markup, no doubled ``%``, no Python values shown as
    defaults; and every option that takes a value says its default (argparse's own, added by
    the formatter, or the help's words for a default that is not a value)."""
    code, out, err = run_cli(capsys, *name.split()[1:], "-h")
    assert (code, err) == (0, "") and out.startswith(f"usage: {name}")
    for markup in ("``", ":mod:", ":func:", ":class:", ":meth:", "%%", "%(", "(default: None)",
                   "(default: False)", "(default: True)", "(default: [", "(default: ("):
        assert markup not in out, (markup, out)
    parser = parsers()[name]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and not action.required \
                and action.help is not argparse.SUPPRESS and action.dest != "help":
            shown = formatter._expand_help(action)
            assert "default" in shown, (name, action.option_strings, shown)
            assert " ".join(shown.split()) in " ".join(out.split()), shown  # as printed


def test_plan_help_says_one_percent() -> None:
    out = subprocess.run([sys.executable, "-m", "packlab.cli", "plan", "-h"], capture_output=True,
                         text=True, check=True, env={**os.environ, "COLUMNS": "200"},
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert "lose 1% or more" in out and "%%" not in out


def minimal_argv(parser: argparse.ArgumentParser) -> list[str]:
    """Arguments that satisfy ``parser``'s required ones (the values need only parse)."""
    argv: list[str] = []
    for action in parser._actions:
        value = str(next(iter(action.choices))) if action.choices else "1"
        if action.option_strings and action.required:
            argv += [action.option_strings[0], value]
        elif not action.option_strings and action.dest != "help":
            argv.append(value)
    return argv


@pytest.mark.parametrize("name", sorted(n for n in parsers() if n != "packlab"))
def test_every_option_is_refused_abbreviated(name) -> None:
    """``--overwrit`` is not ``--overwrite``: an abbreviation accepted today would mean
    something else the day an option with the same prefix is added."""
    parser = parsers()[name]
    assert parser.allow_abbrev is False
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    tried = 0
    for action in parser._actions:
        for option in action.option_strings:
            prefix = option[:-1]
            if not option.startswith("--") or len(prefix) < 4 or \
                    sum(o.startswith(prefix) for o in options) > 1:
                continue
            value = str(next(iter(action.choices))) if action.choices else "1"
            token = prefix if action.nargs == 0 else f"{prefix}={value}"
            _, extras = parser.parse_known_args([*minimal_argv(parser), token])
            assert extras == [token], (name, option, extras)
            tried += 1
    assert tried > 0


def test_an_abbreviated_flag_is_refused_and_changes_nothing(tree, capsys) -> None:
    """``gc --dry`` would have removed temporaries if taken for ``--dry-run``'s opposite; it
    is refused, naming the subcommand, and nothing is touched."""
    root = Path(tree["root"])
    stray = root / "out" / ".shard_000009.parquet.tmp-999999999-abcdef12"
    stray.write_bytes(b"left by a killed writer")
    try:
        before = snapshot(root)
        code, out, err = run_cli(capsys, "gc", tree["out"], "--dry")
        assert (code, out) == (2, "")
        assert one_error_line(err, "--dry", prefix="packlab gc: error: unrecognized arguments")
        assert snapshot(root) == before
    finally:
        stray.unlink()


def commands_with_json() -> list[str]:
    return sorted(n.split()[1] for n, p in parsers().items()
                  if any("--json" in a.option_strings for a in p._actions))


def test_every_command_with_json_prints_json_on_failure(tree, capsys) -> None:
    """The first row of the table for each command with ``--json``, run with it: stdout is
    one JSON object holding the stderr line and the exit code (validate adds valid: false)."""
    names = commands_with_json()
    assert {"validate", "pack", "plan", "inspect", "convert", "synth", "tokenize", "corpus",
            "gc", "bench", "pbin", "raw-index"} <= set(names)
    for name in names:
        argv = next(argv for argv, _ in CASES if argv[0] == name and "--json" not in argv)
        code, out, err = run_cli(capsys, *[a.format(**tree) for a in argv], "--json")
        got = json.loads(out)
        assert code == 2 and got["exit_code"] == 2, (name, out, err)
        assert got["error"] == err.strip(), (name, got, err)
    code, out, err = run_cli(capsys, "validate", tree["damaged"], "--json")
    got = json.loads(out)
    assert code == 2 and got["valid"] is False and got["path"] == tree["damaged"]
    assert tree["victim"] in got["error"]
    code, out, _ = run_cli(capsys, "validate", tree["out"], "--json")
    assert code == 0 and json.loads(out)["valid"] is True
    code, out, err = run_cli(capsys, "query", "SELECT nope FROM bins", "--data", tree["out"],
                             "--format", "json")
    assert code == 2 and json.loads(out)["error"] == err.strip()


def test_pack_json_carries_the_warnings_plan_json_has(tree, tmp_path, capsys) -> None:
    """A pack size that truncates most sequences: ``plan --json`` and ``pack --json`` list the
    same warning, and stderr says it once, after the output."""
    code, out, err = run_cli(capsys, "plan", tree["spool"], "--pack-size", "32", "--json")
    planned = json.loads(out)["warnings"]
    assert code == 0 and len(planned) == 1 and "truncates" in planned[0]
    assert err.strip() == f"packlab plan: warning: {planned[0]}"
    code, out, err = run_cli(capsys, "pack", tree["spool"], tmp_path / "packed", "--format",
                             PARQUET, "--pack-size", "32", "--workers", "1", "--json")
    assert code == 0 and json.loads(out)["warnings"] == planned
    assert err.strip() == f"packlab pack: warning: {planned[0]}"
    code, out, _ = run_cli(capsys, "pack", tree["spool"], tmp_path / "roomy", "--format",
                           PARQUET, "--pack-size", "4096", "--workers", "1", "--json")
    assert code == 0 and json.loads(out)["warnings"] == []


def test_tables_print_plain_values(tree, capsys) -> None:
    """What a person reads: lists joined, no Python reprs, no scientific notation."""
    code, out, _ = run_cli(capsys, "inspect", tree["layout"])
    assert code == 0 and "formats" in out
    assert_plain_words(out.replace("\n", " "))
    assert "['" not in out and "e+0" not in out


def test_the_local_s3_store_prints_help_instead_of_serving() -> None:
    """``python -m packlab.lab.s3server --help`` (a server would never return: the timeout
    fails the test) and an abbreviated flag refused in one line."""
    run = [sys.executable, "-m", "packlab.lab.s3server"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m packlab.lab.s3server")
    assert "127.0.0.1 only" in shown.stdout and "(default: 0)" in shown.stdout
    refused = subprocess.run([*run, "--po", "9000"], capture_output=True, text=True, timeout=60,
                             env=env)
    assert refused.returncode == 2 and "unrecognized arguments: --po" in refused.stderr


def test_a_jsonl_beside_its_line_index_is_read_as_jsonl(tmp_path, capsys) -> None:
    """``documents.jsonl.idx`` (packlab's line index) beside ``documents.jsonl`` does not make
    the JSONL a Megatron prefix: ``pbin`` writes the same file with the index as without."""
    from packlab.codecs.jsonl_index import build_jsonl_index

    docs = tmp_path / "documents.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i}: " + "words " * i}) + "\n"
                            for i in range(20)))
    code, _, err = run_cli(capsys, "pbin", docs, tmp_path / "plain.pbin", "--field", "text")
    assert code == 0, err
    build_jsonl_index(docs)
    assert (tmp_path / "documents.jsonl.idx").is_file()
    code, _, err = run_cli(capsys, "pbin", docs, tmp_path / "indexed.pbin", "--field", "text")
    assert code == 0, err
    assert (tmp_path / "indexed.pbin").read_bytes() == (tmp_path / "plain.pbin").read_bytes()


def test_an_export_killed_before_its_idx_is_finished_by_the_same_command(tree, tmp_path,
                                                                         capsys) -> None:
    """An export publishes its ``.idx`` last: files it had published before a kill are its
    own (its record lists them), so the same command, without ``--overwrite``, finishes it."""
    prefix = tmp_path / "conversations"
    assert run_cli(capsys, "export", tree["spool"], prefix)[0] == 0
    whole = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    Path(f"{prefix}.idx").unlink()  # what a kill before the last rename leaves
    code, _, err = run_cli(capsys, "export", tree["spool"], prefix)
    assert code == 0, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == whole


def test_the_local_s3_store_outlives_the_shell_that_started_it(tmp_path) -> None:
    """``python -m packlab.lab.s3server ... &`` (the README's step 1) from a shell that then
    exits keeps serving until it is stopped (``kill``), as its help and the README say."""
    import time
    import urllib.request

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    script = (f"{shlex.quote(sys.executable)} -m packlab.lab.s3server --bucket demo "
              "> port.txt 2> told.txt & echo $! > pid.txt; "
              "while ! grep -q PORT port.txt; do sleep 0.1; done")  # the shell exits once served
    try:
        subprocess.run(["sh", "-c", script], cwd=tmp_path, env=env, check=True, timeout=60)
        pid = int((tmp_path / "pid.txt").read_text())
        port = int((tmp_path / "port.txt").read_text().split()[1])
        time.sleep(2)  # the shell is long gone: a server watching it would have exited
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_packlab/stats", timeout=10) as r:
            assert r.status == 200
        assert f"kill {pid}" in (tmp_path / "told.txt").read_text()
    finally:
        pid = int((tmp_path / "pid.txt").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def test_tokenize_on_a_terminal_draws_a_total_and_an_eta(tmp_path) -> None:
    """The README's promise for ``tokenize``'s bar: records/s, the records to come, an ETA."""
    from test_cli_safety import frames, on_a_terminal

    chat = tmp_path / "chat.jsonl"
    assert run_cli_quiet("corpus", chat, "--records", "3000") == 0
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    code, drawn = on_a_terminal(["tokenize", str(chat), str(tmp_path / "spool"), "--encoding",
                                 "cl100k_base"], env)
    assert code == 0, drawn
    assert {total for _, total in frames(drawn)} == {"3.00k"}, drawn  # all, counted ahead
    assert "records/s" in drawn and re.search(r"\[\d\d:\d\d<\d\d:\d\d", drawn), drawn


def in_a_read_only_folder(folder: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``packlab ARGV`` where ``folder`` cannot be written: a read-only mount in a mount
    namespace of its own as root (root writes through permissions), a folder without write
    permission otherwise."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "packlab.cli", *argv]
    if os.geteuid() == 0:
        command = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$0" && '
                   'shift && exec "$@"', str(folder), "-", *command]
    else:
        folder.chmod(0o555)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_a_folder_that_cannot_be_written_is_named_as_given(tree, tmp_path) -> None:
    """Each writing command into a read-only folder: one line naming the path given (not a
    hidden temporary, nor a one-file output's hidden record), exit 2, nothing left."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    for argv, named in [(["corpus", "{f}/c.jsonl", "--records", "5"], "{f}/c.jsonl"),
                        (["synth", "{f}/s", "-n", "5"], "{f}/s"),
                        (["pbin", tree["spool"], "{f}/x.pbin"], "{f}/x.pbin"),
                        (["tokenize", tree["chat"], "{f}/t", "--encoding", "cl100k_base"],
                         "{f}/t")]:
        argv = [a.format(f=folder) for a in argv]
        done = in_a_read_only_folder(folder, argv)
        assert done.returncode == 2, done
        assert done.stderr.strip().splitlines() == [
            f"packlab {argv[0]}: error: {named.format(f=folder)}: "
            f"{'Read-only file system' if os.geteuid() == 0 else 'Permission denied'}"]
        assert list(folder.iterdir()) == []


def test_a_resumed_pack_says_which_shards_it_kept_and_ends_as_an_uninterrupted_run(
        tree, tmp_path, capsys) -> None:
    """An interrupted one-output pack (its record still "writing", a shard not written), run
    again: the shards it kept are marked ``(kept)``, counted as reused, and the output is byte
    for byte the uninterrupted run's, receipts and records included."""
    argv = ["pack", tree["spool"], str(tmp_path / "out"), "--format", PARQUET, "--pack-size",
            "256", "--bins-per-shard", "5", "--workers", "1"]
    assert run_cli(capsys, *argv)[0] == 0
    whole = snapshot(tmp_path / "out")
    record = tmp_path / "out" / DATASET_RECORD
    record.write_text(json.dumps({**json.loads(record.read_text()), "state": "writing"}))
    for lost in (tmp_path / "out").glob("shard_000001.parquet*"):
        lost.unlink()  # the shard the interruption stopped, and its receipt
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("shard_")]
    assert [line.endswith("(kept)") for line in lines[:3]] == [True, False, True], out
    assert re.search(rf"^reused +{len(lines) - 1}$", out, flags=re.M), out
    assert re.search(r"^written +1$", out, flags=re.M), out
    assert snapshot(tmp_path / "out") == whole


def test_export_takes_its_prefix_by_its_idx_or_bin_as_inputs_are_named(tree, tmp_path,
                                                                       capsys) -> None:
    """``export SPOOL conversations.idx`` writes the prefix ``conversations`` (its .bin, .idx,
    sidecar and record), not ``conversations.idx.idx``."""
    for name in ("by_idx.idx", "by_bin.bin"):
        code, out, err = run_cli(capsys, "export", tree["spool"], tmp_path / name)
        assert code == 0, err
        stem = name.split(".")[0]
        assert sorted(p.name for p in tmp_path.glob(f"{stem}*")) == [
            f"{stem}.bin", f"{stem}.idx", f"{stem}.masks.bin", f"{stem}.spool.json"]


def test_a_misspelt_subcommand_is_named_with_the_one_it_is_closest_to(tree, capsys) -> None:
    root = Path(tree["root"])
    before = snapshot(root)
    code, out, err = run_cli(capsys, "vaildate", tree["out"])
    assert (code, out) == (2, "")
    assert one_error_line(err, "invalid choice: 'vaildate'", "did you mean 'validate'?",
                          prefix="packlab: error: argument COMMAND")
    assert snapshot(root) == before

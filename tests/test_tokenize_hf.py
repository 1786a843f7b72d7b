"""Any Hugging Face tokenizer and chat template, offline: a byte-level BPE trained on the corpus,
the four templates packlab ships, and for every record a mask on exactly the assistant turns.

``transformers`` (installed with the test extra, through Modalities) is the oracle: packlab's
rendering and tokens equal its ``apply_chat_template``, and with ``{% generation %}`` markers
its ``assistant_masks`` too; packlab itself never imports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chat_tokenizers import (
    PROBES,
    TOOLS,
    build_tokenizers,
    chat,
    check_masked_exactly,
    corpus_records,
    mask_runs,
    write_jsonl,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packlab import cli
from packlab.errors import PacklabError
from packlab.spool import SpoolReader
from packlab.tokenize import (
    BUILTIN_TEMPLATES,
    HFChatTokenizer,
    Unlocated,
    builtin_template,
    tokenize_chat_jsonl,
    tokenizer_spec,
)
from packlab.tokenize.train import SPECIAL_TOKENS

TOOL_CALL = {"role": "assistant", "tool_calls": [
    {"type": "function", "function": {"name": "lookup", "arguments": {"name": "json.dumps"}}}]}
TOOL_CHAT = {"messages": [{"role": "user", "content": "What does json.dumps do?"}, TOOL_CALL,
                          {"role": "tool", "content": "Serialize obj to a JSON formatted str."},
                          {"role": "assistant", "content": "It serializes an object to JSON."}],
             "tools": TOOLS}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    return build_tokenizers(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def encoders(built: tuple[Path, dict[str, Path]]) -> dict[str, HFChatTokenizer]:
    return {name: HFChatTokenizer(tokenizer_spec(folder)) for name, folder in built[1].items()}


def test_the_trained_tokenizer_is_real_and_exact(built: tuple[Path, dict[str, Path]],
                                                 encoders: dict[str, HFChatTokenizer]) -> None:
    corpus, folders = built
    encoder = encoders["chatml"]
    assert encoder.vocab_size == 2048
    assert encoder.special_ids == frozenset(range(len(SPECIAL_TOKENS)))
    text = corpus_records(corpus, 1)[0]["messages"][-1]["content"]
    ids = encoder.tokenizer.encode(text).ids
    assert len(ids) < len(text.encode()) / 2  # BPE merges: far fewer tokens than bytes
    assert encoder.decode(ids) == text
    config = json.loads((folders["llama3"] / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<|begin_of_text|>" and "{{- bos_token }}" in config[
        "chat_template"]


@pytest.mark.parametrize("template", BUILTIN_TEMPLATES)
def test_every_record_learns_exactly_its_assistant_turns(
        template: str, built: tuple[Path, dict[str, Path]], encoders: dict[str, HFChatTokenizer],
        tmp_path: Path) -> None:
    """Through the file path: every corpus record and every probe, mask 1 decodes to exactly
    each assistant turn plus the template's end of turn; mask 0 is everything else."""
    corpus, folders = built
    records = corpus_records(corpus) + PROBES
    if template.startswith("chatml"):
        records.append(TOOL_CHAT)  # masked by the markers; unlocated without them
    jsonl = write_jsonl(tmp_path / "chat.jsonl", records)
    spool = tokenize_chat_jsonl(jsonl, tmp_path / "spool", tokenizer=folders[template])
    spool.verify()
    stats = spool.record["source"]["stats"]
    encoder = encoders[template]
    written = [r for r in records if r is not TOOL_CHAT or template == "chatml_generation"]
    assert stats["records"] == len(records) and spool.num_sequences == len(written)
    assert stats["records_unlocated"] == len(records) - len(written)
    for i, record in enumerate(written):
        tokens, mask = spool.read_sequence(i)
        assert encoder.decode(tokens) == encoder.render(record, "r")[0]
        check_masked_exactly(encoder.decode, tokens, mask, record, template)
    assert stats["learn_tokens"] == int(spool.masks.sum())
    assert stats["records_without_response"] == 1  # the probe without an assistant turn
    assert stats["assistant_turns_without_end_token"] == 0
    source = spool.record["source"]
    assert source["chat_template"] == builtin_template(template)
    assert source["mask"] == ("assistant_generation" if template == "chatml_generation"
                              else "assistant_located")
    if template == "chatml":
        assert stats["unlocated"] == [f"{jsonl}: line {len(records)}: assistant message 1 has "
                                      "tool_calls: only a template with {% generation %} "
                                      "markers can mask it"]


@pytest.mark.parametrize("template", BUILTIN_TEMPLATES)
def test_packlab_renders_and_tokenizes_as_transformers_does(
        template: str, built: tuple[Path, dict[str, Path]],
        encoders: dict[str, HFChatTokenizer]) -> None:
    from transformers import AutoTokenizer

    corpus, folders = built
    hf = AutoTokenizer.from_pretrained(str(folders[template]))
    generation = template == "chatml_generation"
    records = corpus_records(corpus, 60) + PROBES + ([TOOL_CHAT] if generation else [])
    for record in records:
        out = hf.apply_chat_template(record["messages"], tools=record.get("tools"),
                                     tokenize=True, return_dict=True,
                                     add_generation_prompt=False,
                                     return_assistant_tokens_mask=generation)
        text = hf.apply_chat_template(record["messages"], tools=record.get("tools"),
                                      tokenize=False, add_generation_prompt=False)
        tokens, mask, _ = encoders[template].encode_record(record, "r")
        assert encoders[template].render(record, "r")[0] == text
        assert tokens.tolist() == list(out["input_ids"])
        if generation:
            assert mask.tolist() == list(out["assistant_masks"])


content = st.text(st.characters(codec="utf-8", exclude_characters="\ue000"), max_size=40)
conversations = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), content),
                         min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=conversations, template=st.sampled_from(BUILTIN_TEMPLATES))
def test_any_text_is_masked_exactly_or_counted_never_guessed(
        pairs: list[tuple[str, str]], template: str,
        encoders: dict[str, HFChatTokenizer]) -> None:
    record = chat(*pairs)
    encoder = encoders[template]
    try:
        tokens, mask, _ = encoder.encode_record(record, "r")
    except Unlocated as exc:
        assert "straddles" in str(exc)  # whitespace at an edge merged with the template's
        edges = [c for r, c in pairs if r == "assistant"]
        assert any(c != c.strip() or not c for c in edges)
        return
    assert encoder.decode(tokens) == encoder.render(record, "r")[0]
    check_masked_exactly(encoder.decode, tokens, mask, record, template)


def test_a_straddling_token_is_unlocated_and_reported(
        built: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    """ChatML puts "\\n" before the answer; an answer starting with "\\n" merges with it into
    one token: no exact mask exists, so the record is counted and named (or an error)."""
    folder = built[1]["chatml"]
    records = [chat(("user", "q"), ("assistant", "fine")),
               chat(("user", "q"), ("assistant", "\nstarts with a newline"))]
    jsonl = write_jsonl(tmp_path / "c.jsonl", records)
    spool = tokenize_chat_jsonl(jsonl, tmp_path / "s", tokenizer=folder)
    stats = spool.record["source"]["stats"]
    assert spool.num_sequences == 1 and stats["records_unlocated"] == 1
    edge = len("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    assert stats["unlocated"] == [f"{jsonl}: line 2: a token straddles the edge of assistant "
                                  f"text (character {edge})"]
    with pytest.raises(PacklabError, match=r"c.jsonl: line 2: cannot mask the assistant text "
                                           r"exactly: a token straddles"):
        tokenize_chat_jsonl(jsonl, tmp_path / "strict", tokenizer=folder, unlocated="error")
    assert not (tmp_path / "strict").exists()
    only_bad = write_jsonl(tmp_path / "bad.jsonl", records[1:])
    with pytest.raises(PacklabError, match="none of the 1 records could be masked exactly"):
        tokenize_chat_jsonl(only_bad, tmp_path / "none", tokenizer=folder)


def test_a_template_that_inspects_the_answer_is_unlocated(built: tuple[Path, dict[str, Path]],
                                                          tmp_path: Path) -> None:
    template = tmp_path / "inspects.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                        "{% if m.role == 'assistant' and '</think>' in m.content %}"
                        "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}"
                        "{% endif %}<|im_end|>\n{% endfor %}")
    spec = tokenizer_spec(built[1]["chatml"], template)
    encoder = HFChatTokenizer(spec)
    tokens, mask, _ = encoder.encode_record(chat(("user", "q"), ("assistant", "plain")), "r")
    assert encoder.decode(tokens[mask == 1]) == "plain<|im_end|>"
    with pytest.raises(Unlocated, match="changes or inspects"):
        encoder.encode_record(chat(("user", "q"), ("assistant", "hmm</think>42")), "r")


def test_where_the_template_comes_from(built: tuple[Path, dict[str, Path]],
                                       tmp_path: Path) -> None:
    folder = built[1]["chatml"]
    record = chat(("user", "q"), ("assistant", "a"), tools=TOOLS)
    by_name = HFChatTokenizer(tokenizer_spec(folder, "llama3"))
    assert by_name.spec.template_origin == "packlab:llama3"
    assert by_name.render(record, "r")[0].startswith("<|start_header_id|>user")  # no bos var
    file_only = HFChatTokenizer(tokenizer_spec(folder / "tokenizer.json", "chatml"))
    assert file_only.variables == {}
    with pytest.raises(PacklabError, match="no chat template"):
        tokenizer_spec(folder / "tokenizer.json")
    named = tmp_path / "named"
    named.mkdir()
    (named / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (named / "tokenizer_config.json").write_text(json.dumps({"eos_token": {
        "content": "<|im_end|>", "special": True}, "chat_template": [
        {"name": "default", "template": "{% for m in messages %}{{ m.content }}{{ eos_token }}"
                                        "{% endfor %}"},
        {"name": "tool_use", "template": "{{ tools | tojson }}|{% for m in messages %}"
                                         "{{ m.content }}{% endfor %}"}]}))
    encoder = HFChatTokenizer(tokenizer_spec(named))
    assert encoder.render(chat(("user", "q"), ("assistant", "a")), "r")[0] == (
        "q<|im_end|>a<|im_end|>")
    assert encoder.render(record, "r")[0] == json.dumps(TOOLS, ensure_ascii=False) + "|qa"
    (named / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}"
                                               "{% endfor %}!")
    assert HFChatTokenizer(tokenizer_spec(named)).render(record, "r")[0] == "qa!"


def test_sandbox_and_hugging_face_helpers(built: tuple[Path, dict[str, Path]],
                                          tmp_path: Path) -> None:
    folder = built[1]["chatml"]

    def rendered(source: str, record: dict[str, Any]) -> str:
        (tmp_path / "t.jinja").write_text(source)
        return HFChatTokenizer(tokenizer_spec(folder, tmp_path / "t.jinja")).render(
            record, "r")[0]

    record = {"messages": [{"role": "user", "content": "<b>é</b>", "name": None,
                            "reasoning": "because"}]}
    assert rendered("{{ messages[0].content | tojson }}", record) == '"<b>é</b>"'
    assert rendered("{{ messages[0].name is defined }}", record) == "False"  # None dropped
    assert rendered("{{ messages[0].reasoning_content }}/{{ messages[0].thinking }}",
                    record) == "because/because"
    assert rendered("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                    "{% endfor %}{{ ns.n }}{{ add_generation_prompt }}", record) == "1False"
    assert len(rendered("{{ strftime_now('%Y') }}", record)) == 4
    with pytest.raises(PacklabError, match=r"r: the chat template failed: .*unsafe|r: the chat "
                                           r"template failed: .*access"):
        rendered("{{ messages.__class__.__mro__ }}", record)
    with pytest.raises(PacklabError, match="r: the chat template failed: roles must alternate"):
        rendered("{{ raise_exception('roles must alternate') }}", record)


def test_masks_from_markers_cover_tool_calls(encoders: dict[str, HFChatTokenizer]) -> None:
    encoder = encoders["chatml_generation"]
    tokens, mask, missing = encoder.encode_record(TOOL_CHAT, "r")
    learned = [encoder.decode(tokens[a:b]) for a, b in mask_runs(mask)]
    assert learned == ['<tool_call>\n{"name": "lookup", "arguments": {"name": "json.dumps"}}\n'
                       '</tool_call><|im_end|>', "It serializes an object to JSON.<|im_end|>"]
    assert missing == 0
    with pytest.raises(Unlocated, match="assistant message 1 has tool_calls"):
        encoders["chatml"].encode_record(TOOL_CHAT, "r")


BAD_TOKENIZERS = [
    ("missing", "no such tokenizer file or folder"),
    ("not_json", "not a Hugging Face tokenizer.json"),
    ("other_json", "not a Hugging Face tokenizer.json"),
    ("empty_folder", "not a Hugging Face tokenizer folder"),
    ("bad_config", "tokenizer_config.json: not valid JSON"),
]


def make_bad_tokenizer(kind: str, root: Path, good: Path) -> Path:
    path = root / kind
    if kind == "not_json":
        path.write_text("this is not JSON")
    elif kind == "other_json":
        path.write_text(json.dumps({"messages": []}))
    elif kind == "empty_folder":
        path.mkdir()
    elif kind == "bad_config":
        path.mkdir()
        (path / "tokenizer.json").write_bytes((good / "tokenizer.json").read_bytes())
        (path / "tokenizer_config.json").write_text("{oops")
    return path


@pytest.mark.parametrize(("kind", "reason"), BAD_TOKENIZERS, ids=[k for k, _ in BAD_TOKENIZERS])
def test_a_path_that_is_not_a_tokenizer_is_one_line_exit_2(
        kind: str, reason: str, built: tuple[Path, dict[str, Path]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = make_bad_tokenizer(kind, tmp_path, built[1]["chatml"])
    jsonl = write_jsonl(tmp_path / "c.jsonl", PROBES)
    assert cli.main(["tokenize", str(jsonl), str(tmp_path / "s"), "--tokenizer", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("packlab tokenize: error: ")
    assert str(path) in err and reason in err
    assert not (tmp_path / "s").exists()


BAD_TEMPLATES = [
    ("{% for m in messages %}{{ m.content }", "t.jinja: line 1: not a valid Jinja template"),
    ("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
     "{% endif %}x", "c.jsonl: line 2: the chat template failed: System role not supported"),
    ("{{ messages[0].content + 1 }}", "c.jsonl: line 1: the chat template failed: can only"),
    ("{% if false %}x{% endif %}", "c.jsonl: line 1: the chat template failed: it renders the "
                                   "record as no text at all"),
]


@pytest.mark.parametrize(("source", "reason"), BAD_TEMPLATES, ids=["syntax", "raises", "type",
                                                                   "empty"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_template_that_fails_is_one_line_exit_2_and_nothing_is_written(
        source: str, reason: str, workers: int, built: tuple[Path, dict[str, Path]],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.jinja").write_text(source)
    jsonl = write_jsonl(tmp_path / "c.jsonl", [chat(("user", "q"), ("assistant", "a")),
                                               chat(("system", "s"), ("user", "q"))])
    out = tmp_path / "s"
    tokenize_chat_jsonl(jsonl, out, tokenizer=built[1]["chatml"])  # an older spool stays
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert cli.main(["tokenize", str(jsonl), str(out), "--tokenizer", str(built[1]["chatml"]),
                     "--chat-template", str(tmp_path / "t.jinja"), "--overwrite",
                     "--workers", str(workers)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "s", "t.jinja"]


BAD_RECORDS = [
    ('{"text": "no messages here"}', 'expected "messages": a list'),
    ('{"messages": []}', '"messages" is empty'),
    ('{"messages": [{"content": "x"}]}', 'message 0: "role" must be a string'),
    ('{"messages": [{"role": "user", "content": "x"}], "tools": "lookup"}', '"tools" must be'),
    ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "not valid Unicode text"),
    ('{"messages": [}', "malformed JSON"),
    ("not json at all", "malformed JSON"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_RECORDS, ids=[r for _, r in BAD_RECORDS])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_record_names_file_and_line_exit_2_nothing_written(
        bad: str, reason: str, workers: int, built: tuple[Path, dict[str, Path]],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = json.dumps(chat(("user", "q"), ("assistant", "a")))
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join([good] * 30 + ["", bad] + [good] * 30) + "\n")  # line 32
    assert cli.main(["tokenize", str(jsonl), str(tmp_path / "s"), "--tokenizer",
                     str(built[1]["llama3"]), "--workers", str(workers)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{jsonl}: line 32: " in err and reason in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_cli_tokenizer_summary(built: tuple[Path, dict[str, Path]], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    corpus, folders = built
    out = tmp_path / "s"
    assert cli.main(["tokenize", str(corpus), str(out), "--tokenizer", str(folders["llama3"]),
                     "--limit", "50", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    spool = SpoolReader(out)
    assert summary["num_sequences"] == summary["num_records"] == 50 == spool.num_sequences
    assert summary["vocab_size"] == 2048 == spool.vocab_size
    assert summary["chat_template"] == str(folders["llama3"] / "tokenizer_config.json")
    assert summary["special_tokens"] == {"bos_token": "<|begin_of_text|>",
                                         "eos_token": "<|eot_id|>"}
    assert summary["records_unlocated"] == 0 and summary["mask"] == "assistant_located"
    assert summary["learn_tokens"] == int(spool.masks.sum())
    for argv, reason in ([["--encoding", "cl100k_base", "--tokenizer", "x"], "not allowed"],
                         [["--chat-template", "llama3"], "--chat-template needs --tokenizer"],
                         [["--tokenizer", str(folders["llama3"]), "--chat-template", "nope"],
                          "nope: no such chat template file"],
                         [["--workers", "0"], "--workers: expected a positive integer"]):
        code = None
        try:
            code = cli.main(["tokenize", str(corpus), str(tmp_path / "x"), *argv])
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
        assert code == 2 and reason in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_decoded_mask_is_never_the_header(encoders: dict[str, HFChatTokenizer]) -> None:
    """The end-of-turn rule takes the special token right after the text, nothing further."""
    encoder = encoders["llama3"]
    tokens, mask, _ = encoder.encode_record(chat(("user", "q"), ("assistant", "a"),
                                                 ("user", "again")), "r")
    assert encoder.decode(tokens[mask == 1]) == "a<|eot_id|>"
    assert int(np.asarray(tokens)[np.flatnonzero(mask)[-1] + 1]) == SPECIAL_TOKENS.index(
        "<|start_header_id|>")


def test_a_tokenizer_rewritten_in_place_is_loaded_again(built: tuple[Path, dict[str, Path]],
                                                        tmp_path: Path) -> None:
    from packlab.tokenize.hf import load_tokenizer
    from packlab.tokenize.train import tokenizer_folder, train_bpe_tokenizer

    corpus, folders = built
    folder = tokenizer_folder(folders["chatml"] / "tokenizer.json", tmp_path / "tok", "chatml")
    assert HFChatTokenizer(tokenizer_spec(folder)).vocab_size == 2048
    spec = tokenizer_spec(folder)
    train_bpe_tokenizer(corpus, folder / "tokenizer.json", vocab_size=600)
    assert HFChatTokenizer(tokenizer_spec(folder)).vocab_size == 600
    load_tokenizer.cache_clear()  # as in a fresh worker process given the old spec
    with pytest.raises(PacklabError, match="changed while tokenizing"):
        HFChatTokenizer(spec)

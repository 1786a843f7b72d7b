"""A real Hugging Face tokenizer, built offline: byte-level BPE trained on the chat corpus.

Nothing may be downloaded, so tests and notebooks train one (about a second for the docstring
corpus of :mod:`packlab.tokenize.corpus`) with the ``tokenizers`` library, shaped like Llama-3's
``tokenizer.json``: the Llama-3 pre-tokenizer regex (contractions, letter runs, digits in
groups of up to three, punctuation, newlines), then byte-level mapping (no unknown token: any
text encodes, and decodes back exactly), a BPE model, a byte-level decoder, and the special
tokens of every template packlab ships (ids ``0..len(SPECIAL_TOKENS)-1``).

:func:`tokenizer_folder` pairs it with one of those templates the way a model repository does::

    tok/tokenizer.json          the trained tokenizer
    tok/tokenizer_config.json   {"tokenizer_class": "PreTrainedTokenizerFast",
                                 "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                 "chat_template": "{{- bos_token }}...", ...}

``transformers.AutoTokenizer.from_pretrained("tok")`` loads that folder as it is.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packlab.codecs.jsonl_index import iter_jsonl_lines, parse_json_line
from packlab.errors import PacklabError
from packlab.storage.files import staged
from packlab.tokenize.hf import CONFIG_FILE, TOKENIZER_FILE, builtin_template

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>",
                  "<|endoftext|>")
# Llama-3's pre-tokenizer split (tiktoken's cl100k pattern).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The special tokens each shipped template expects as variables (as its model's config has).
TEMPLATE_TOKENS: dict[str, dict[str, str]] = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_system": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "chatml": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "chatml_generation": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
}


def chat_texts(jsonl: str | os.PathLike[str]) -> Iterator[str]:
    """Every string ``content`` of every message of a chat JSONL (what BPE learns from)."""
    for line, _, raw in iter_jsonl_lines(jsonl):
        for message in parse_json_line(jsonl, line, raw).get("messages") or ():
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                yield message["content"]


def train_bpe_tokenizer(jsonl: str | os.PathLike[str], out: str | os.PathLike[str], *,
                        vocab_size: int = 8192, overwrite: bool = True) -> Path:
    """Train a byte-level BPE ``tokenizer.json`` on the chat contents of ``jsonl``; written
    atomically to ``out`` (a file). Deterministic for the same corpus."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise PacklabError(f"vocab_size must be at least {len(alphabet) + len(SPECIAL_TOKENS)} "
                           f"(256 bytes and {len(SPECIAL_TOKENS)} special tokens), "
                           f"got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(chat_texts(jsonl), trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged(out, overwrite=overwrite) as tmp:
        tokenizer.save(str(tmp))
    return out


def tokenizer_folder(tokenizer_json: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                     template: str, *, overwrite: bool = True) -> Path:
    """A Hugging Face tokenizer folder: ``tokenizer_json`` plus a ``tokenizer_config.json``
    carrying packlab's template ``template`` and its special tokens; published atomically."""
    out_dir = Path(out_dir)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **TEMPLATE_TOKENS.get(template, {}),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "chat_template": builtin_template(template),
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with staged(out_dir, overwrite=overwrite, directory=True) as tmp:
        shutil.copyfile(tokenizer_json, tmp / TOKENIZER_FILE)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    return out_dir

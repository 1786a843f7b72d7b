"""Chat JSONL -> spool: :func:`tokenize_chat_jsonl`, the one entry point of every path.

A literal spool record's ``source`` (``--tokenizer``; the ``--encoding`` path records ``encoding``,
``template: "chatml"`` and ``mask: "response_only"`` instead of the tokenizer keys)::

    {"generator": "tokenize", "input": "chat.jsonl",
     "tokenizer": "/abs/tok/tokenizer.json", "tokenizer_sha256": "9f2c...",
     "chat_template_origin": "packlab:llama3", "chat_template": "{{- bos_token }}...",
     "special_tokens": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
     "mask": "assistant_located", "limit": null,
     "stats": {"records": 2000, "messages": 5408, "learn_tokens": 612345,
               "records_without_response": 0, "records_unlocated": 1,
               "assistant_turns_without_end_token": 0,
               "unlocated": ["chat.jsonl: line 17: a token straddles the edge of ..."]}}

``chat_template`` is the key Nemotron's chat SFT stage writes. Nothing in the record depends
on how the run was cut (workers, executor, timing), so one worker and many give the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from packlab.codecs.jsonl_index import count_lines
from packlab.errors import PacklabError
from packlab.executors import EXECUTORS
from packlab.progress import progress, progress_enabled
from packlab.spool import SpoolReader, SpoolWriter
from packlab.storage.files import require_file
from packlab.tokenize.hf import tokenizer_spec
from packlab.tokenize.parallel import tokenize_in_parts
from packlab.tokenize.records import (
    UNLOCATED,
    Spec,
    Stats,
    encode_into,
    iter_file_records,
    load_encoder,
)

DEFAULT_ENCODING = "cl100k_base"


def encoder_spec(encoding: str | None = None, tokenizer: str | os.PathLike[str] | None = None,
                 chat_template: str | os.PathLike[str] | None = None) -> Spec:
    """What to tokenize with: a bpe-openai ``encoding`` (packlab's ChatML template), or a
    Hugging Face ``tokenizer`` with its (or ``chat_template``'s) Jinja template."""
    if tokenizer is not None:
        if encoding is not None:
            raise PacklabError("give an --encoding or a --tokenizer, not both")
        return tokenizer_spec(tokenizer, chat_template)
    if chat_template is not None:
        raise PacklabError("--chat-template needs --tokenizer (the --encoding path has its "
                           "own fixed ChatML template)")
    spec = encoding or DEFAULT_ENCODING
    load_encoder(spec)  # an unknown encoding fails here
    return spec


def tokenize_chat_jsonl(
    jsonl: str | os.PathLike[str],
    spool_out: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    chat_template: str | os.PathLike[str] | None = None,
    workers: int = 1,
    executor: str = "process",
    address: str | None = None,
    overwrite: bool = False,
    limit: int | None = None,
    unlocated: str = "skip",
) -> SpoolReader:
    """Tokenize a chat JSONL into a ``spool_v1`` (one sequence per record).

    ``encoding`` (default ``cl100k_base``) or ``tokenizer`` (+ ``chat_template``) choose the
    tokenizer (:func:`encoder_spec`). One worker streams in this process; ``workers > 1`` or
    ``executor="ray"`` run jobs (:mod:`packlab.tokenize.parallel`) and give the same bytes.
    Unlocated records (``--tokenizer`` without ``{% generation %}`` markers) are skipped and
    counted, or, with ``unlocated="error"``, an error naming the line. Any bad record aborts
    the whole spool (nothing appears under ``spool_out``, an existing one stays) with one error
    naming the file and line.
    """
    jsonl, spool_out = Path(jsonl), Path(spool_out)
    if limit is not None and limit < 1:
        raise PacklabError(f"limit must be a positive number of records, got {limit}")
    if workers < 1:
        raise PacklabError(f"workers must be >= 1, got {workers}")
    if executor not in EXECUTORS:
        raise PacklabError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    if unlocated not in UNLOCATED:
        raise PacklabError(f"unlocated must be one of {', '.join(UNLOCATED)}, got {unlocated!r}")
    require_file(jsonl, "a chat JSONL file")
    spec = encoder_spec(encoding, tokenizer, chat_template)
    encoder = load_encoder(spec)
    source = {"generator": "tokenize", "input": str(jsonl), **encoder.describe(),
              "limit": limit}
    stats = Stats()
    with SpoolWriter(spool_out, vocab_size=encoder.vocab_size, source=source,
                     overwrite=overwrite) as writer:
        if workers == 1 and executor == "process":
            records = progress(iter_file_records(jsonl, limit), total=_bar_total(jsonl, limit),
                               desc="tokenize", unit=" records")
            encode_into(encoder, records, writer, stats, unlocated=unlocated)
        else:
            tokenize_in_parts(jsonl, spec, writer, stats, workers=workers, executor=executor,
                              address=address, limit=limit, unlocated=unlocated)
        if stats.records == 0:
            raise PacklabError(f"{jsonl}: no records (empty file)")
        if stats.records == stats.records_unlocated:
            raise PacklabError(f"{jsonl}: none of the {stats.records} records could be masked "
                               f"exactly; the first: {stats.unlocated[0]}")
        writer.source["stats"] = stats.to_dict()
    return SpoolReader(spool_out)


def _bar_total(jsonl: str | os.PathLike[str], limit: int | None) -> int | None:
    """The records a watched bar counts to, so it shows an ETA: the file's lines (one quick
    pass over its bytes; blank lines count, so the last frames may end short of it), at most
    ``limit``. Nothing is counted when no bar is drawn."""
    if not progress_enabled():
        return limit
    lines = count_lines(jsonl)
    return lines if limit is None else min(limit, lines)

"""Chat JSONL -> spool with a real tokenizer, offline, on one core, many, or Ray.

Two tokenizers:

- ``--encoding cl100k_base|o200k_base`` (:mod:`.bpe`): bpe-openai's encodings with packlab's
  fixed ChatML template and special tokens just past the vocabulary;
- ``--tokenizer PATH [--chat-template FILE]`` (:mod:`.hf`): any Hugging Face ``tokenizer.json``
  or tokenizer folder, its Jinja chat template rendered as ``transformers`` renders it
  (:mod:`.chat_template`), the loss mask on exactly the assistant turns.

:func:`tokenize_chat_jsonl` (:mod:`.run`) runs either in one process or in parallel jobs
(:mod:`.parallel`) with the same bytes out. :mod:`.train` builds a real byte-level BPE
tokenizer offline (trained on the docstring corpus) for the tests and notebooks, beside the
templates packlab ships (``templates/*.jinja``).
"""

from packlab.tokenize.bpe import (
    ENCODINGS,
    IM_END,
    IM_START,
    N_VOCAB,
    ROLES,
    TEMPLATE,
    ChatTokenizer,
    decode,
    detokenize,
    validate_messages,
)
from packlab.tokenize.chat_template import Unlocated
from packlab.tokenize.hf import BUILTIN_TEMPLATES, HFChatTokenizer, builtin_template, tokenizer_spec
from packlab.tokenize.records import (
    Stats,
    iter_file_records,
    load_encoder,
    marker_encoder,
    masked_segments,
)
from packlab.tokenize.run import encoder_spec, tokenize_chat_jsonl

__all__ = [
    "BUILTIN_TEMPLATES", "ENCODINGS", "IM_END", "IM_START", "N_VOCAB", "ROLES", "TEMPLATE",
    "ChatTokenizer", "HFChatTokenizer", "Stats", "Unlocated", "builtin_template", "decode",
    "detokenize", "encoder_spec", "iter_file_records", "load_encoder", "marker_encoder",
    "masked_segments", "tokenize_chat_jsonl",
    "tokenizer_spec", "validate_messages",
]

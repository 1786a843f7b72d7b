"""A tiny, randomly initialised ``transformers`` causal LM and a tokenizer for packlab's ids.

Nothing is downloaded: the model is a ``LlamaConfig`` built here from the plain-torch model's
:class:`~packlab.lab.train.model.ModelConfig` (a few layers, a small width, CPU, float32) with
weights fixed by its seed, and the tokenizer a ``tokenizers`` word-level
vocabulary whose tokens are the ids themselves (``"<17>"`` is id 17) plus the synthetic
profiles' special tokens (:func:`packlab.spool.synth.special_tokens`). Text never goes through it:
TRL's ``SFTTrainer`` asks its processing class only for the pad and EOS tokens, and the model's
config agrees with it on both (so TRL has nothing to realign).
"""

from __future__ import annotations

from typing import Any

import torch

from packlab.errors import PacklabError
from packlab.lab import hf_quiet  # noqa: F401  (tqdm.auto settled before transformers loads)
from packlab.lab.train.model import ModelConfig
from packlab.spool.synth import special_tokens

#: attention implementations that run on CPU, in the order they are tried
CPU_ATTENTIONS = ("sdpa", "eager", "flex_attention")


def special_ids(vocab_size: int) -> dict[str, int]:
    """The pad, EOS and BOS ids of a synthetic vocabulary (its reserved top ids)."""
    ids = special_tokens(vocab_size)
    return {"pad": ids["<|pad|>"], "eos": ids["<|end_of_turn|>"], "bos": ids["<|bos|>"]}


def build_llama(config: ModelConfig, attention: str = "sdpa") -> Any:
    """A ``LlamaForCausalLM`` of ``config``'s shape (the plain-torch model's: vocabulary,
    positions, width, layers, heads, MLP ratio), weights a function of ``config.seed`` (the
    caller's RNG left as it was), ``use_cache`` off as a trainer runs it, and ``attention``
    one of :data:`CPU_ATTENTIONS`. Its attention is block-diagonal by itself: it finds the
    sequences in ``position_ids``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if attention not in CPU_ATTENTIONS:
        raise PacklabError(f"attention must be one of {CPU_ATTENTIONS}, got {attention!r}")
    ids = special_ids(config.vocab_size)
    llama = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.width,
        intermediate_size=config.mlp_ratio * config.width, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, num_key_value_heads=config.heads,
        max_position_embeddings=config.max_positions, use_cache=False,
        pad_token_id=ids["pad"], eos_token_id=ids["eos"], bos_token_id=ids["bos"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama)
    model.set_attn_implementation(attention)
    model.generation_config.pad_token_id = ids["pad"]
    return model


def id_tokenizer(vocab_size: int) -> Any:
    """A ``PreTrainedTokenizerFast`` over ids ``0 .. vocab_size - 1`` whose pad, EOS and BOS
    are the synthetic profile's (what TRL reads of a processing class)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    ids = special_ids(vocab_size)
    names = {ids["pad"]: "<|pad|>", ids["eos"]: "<|end_of_turn|>", ids["bos"]: "<|bos|>"}
    vocab = {names.get(i, f"<{i}>"): i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|pad|>",
                                   eos_token="<|end_of_turn|>", bos_token="<|bos|>")

"""Where packlab meets other stacks' own code: Megatron-Bridge, Modalities, Hugging Face, TRL.
Megatron-Bridge's batches, pack metadata and packed SFT dataset (:mod:`.bridge_dataset`:
negative indices, samples mapping, ``collate_fn``), Modalities' JSONL index and packed data
files, Hugging Face's flattened batch (:mod:`.hf_batch`) and TRL's pre-packed rows
(:mod:`.hf_dataset`). (Nemotron's spools and shards are read by :mod:`packlab.spool` and the
formats themselves.)"""

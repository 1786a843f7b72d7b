"""Where packlab meets other stacks' own code: Megatron-Bridge's batches and pack metadata,
Modalities' JSONL index and packed data files. (Nemotron's spools and shards are read by
:mod:`packlab.spool` and the formats themselves.)"""

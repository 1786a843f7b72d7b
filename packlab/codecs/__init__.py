"""File codecs other projects define, read and written without running their code.

- :mod:`~packlab.codecs.mmidx`: Megatron-LM's ``MMIDIDX`` index file;
- :mod:`~packlab.codecs.safe_pickle`: an unpickler that builds plain data and refuses every
  global;
- :mod:`~packlab.codecs.jsonl_index`: a line index of a JSONL file.
"""

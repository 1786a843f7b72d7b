"""Modalities 0.5: a plain packed data file (``.pbin``), one document per bin, tokens only.

The file Modalities' ``pack_encoded_data`` writes (header, tokens in the vocabulary's width,
pickled ``(offset, length)`` index: :mod:`packlab.formats.pbin.codec`), with no packlab
trailer; read by Modalities' own ``PackedMemMapDatasetBase(path, sample_key="input_ids")``,
which returns the tokens as int64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packlab.formats.pbin.codec import (
    TOKEN_DTYPES,
    IndexWriter,
    finish_output,
    open_output,
    token_width_for,
)
from packlab.lab.measure.peers.base import TOKENS_ONLY, Opened, Peer, Reference
from packlab.storage.files import staged

FILE = "bins.pbin"


class Modalities(Peer):
    NAME = "modalities"
    LABEL = "Modalities PackedMemMapDatasetBase"
    COLUMNS = TOKENS_ONLY
    REQUIRES = ("modalities",)

    def write(self, reference: Reference, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        width = token_width_for(reference.vocab_size)
        tokens = reference.columns.input_ids.astype(TOKEN_DTYPES[width])
        with staged(directory / FILE, overwrite=True) as tmp, open_output(tmp) as out:
            out.write(tokens)
            index = IndexWriter(out, width)
            index.add(reference.lengths())
            index.close()
            finish_output(out, int(tokens.nbytes), width)

    def open(self, directory: Path) -> Opened:
        from modalities.dataloader.dataset import PackedMemMapDatasetBase

        dataset = PackedMemMapDatasetBase(directory / FILE, sample_key="input_ids")
        get = dataset.__getitem__
        return Opened(lambda i: (get(i)["input_ids"],), keep=dataset)

    def as_reference(self, got):  # noqa: D102
        return (np.asarray(got[0]),)

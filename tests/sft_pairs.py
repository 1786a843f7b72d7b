"""Megatron-Bridge's packed ``.sft`` pairs as Bridge writes them, for the tests: the lab's
writers (:mod:`packlab.lab.interop_inputs`, which the README's interop section calls too): each
item from the facts alone (not packlab's encoder), the pair by megatron-core's own
``IndexedDatasetBuilder``."""

from packlab.lab.interop_inputs import builder_pair, item_from_facts

__all__ = ["builder_pair", "item_from_facts"]

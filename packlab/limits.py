"""The largest count a shard's record may hold, in a module of its own.

A count read from a record and a count given on the command line share this bound; it imports
nothing, so the command line can name it without loading numpy at start.
"""

MAX_COUNT = 1 << 48  # more bins, sequences, tokens or bytes than one shard holds on any disk

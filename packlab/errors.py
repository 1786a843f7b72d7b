"""Errors in use: what the command line prints as one line and exits 2 on.

Every message names the file (and bin, where there is one) so a user can find the problem
without a traceback.
"""

from __future__ import annotations


class PacklabError(ValueError):
    """Bad input or invalid data; the message is meant for the user, one line."""


class InvariantError(PacklabError):
    """A packed bin breaks a rule of "One packed bin" (DESIGN.md)."""


class FormatError(PacklabError):
    """A shard or spool is missing, truncated, corrupted or of an unknown format."""

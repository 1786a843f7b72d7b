"""Errors in use: what the command line prints as one line and exits 2 on.

Every message names the file (and bin, where there is one) so a user can find the problem
without a traceback.
"""

from __future__ import annotations


class PacklabError(ValueError):
    """Bad input or invalid data; the message is meant for the user, one line."""


class PacklabWarning(UserWarning):
    """Something a user should hear that does not stop the work (a folder of theirs inside an
    output, ignored): one warning line from the command line, a Python warning otherwise."""


class InvariantError(PacklabError):
    """A packed bin breaks a rule of "One packed bin" (docs/design.md)."""


class FormatError(PacklabError):
    """A shard or spool is missing, truncated, corrupted or of an unknown format."""


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` (an exception, a library's message) on one line, whitespace runs made one
    space, cut at ``limit`` characters: how a foreign message goes into packlab's errors."""
    line = " ".join(str(text).split())
    return line if limit is None else line[:limit]

"""`excerpt`: how a message quotes text it got from a user's file or from a message (a cell, a column or
key name, a value): on one line and short, so that an error about a file never prints the file (a
secret in the wrong file, a megabyte-long line) — its start and length say enough to find it."""

from __future__ import annotations

EXCERPT_CHARS = 24      # enough to recognize a name or a cell, too little to carry a key or a password line


def excerpt(value, limit: int = EXCERPT_CHARS) -> str:
    """`value` as text on one line, cut to its first `limit` characters with '…' and its length when longer."""
    text = " ".join(str(value).split())
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def excerpts(values, limit: int = EXCERPT_CHARS, count: int = 8) -> str:
    """The first `count` of `values`, each an `excerpt`, comma-separated, and how many more there are."""
    values = list(values)
    shown = ", ".join(excerpt(v, limit) for v in values[:count])
    return shown + (f" and {len(values) - count} more" if len(values) > count else "")

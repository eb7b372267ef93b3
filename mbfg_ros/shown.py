"""Strings from outside (joint names, frame ids, parameter values, file paths, exception texts that quote
them) as they may appear in a log line, an error or a diagnostics value: bounded and on one line.

A publisher on the domain can send a joint name of a megabyte; quoted whole, every WARN about it would
be a megabyte (and a newline in it would forge log lines).  `shown` keeps the first `MAX_SHOWN`
characters, escapes control characters and says how much was cut.  ROS-free: the CLI uses it too.
"""

from __future__ import annotations

MAX_SHOWN = 200          # characters of an outside string quoted in a message
MAX_LINE = 2000          # characters of a whole log line or diagnostics value built from such strings


def shown(text, limit: int = MAX_SHOWN) -> str:
    """`text` (str() of it if not a string; a list or tuple as its items, comma-separated) cut to
    `limit` characters with a visible marker `…[+N chars]`, control characters escaped.  Costs
    O(limit), not O(len(text)), for a long string."""
    if isinstance(text, (list, tuple)):
        return _shown_items(text, limit)
    if not isinstance(text, str):
        text = str(text)
    cut = len(text) - limit
    head = text[:limit] if cut > 0 else text
    if not head.isprintable():      # newlines, escape sequences, line separators: escaped, on one line
        head = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in head)
    return f"{head}…[+{cut} chars]" if cut > 0 else head


def _shown_items(items, limit: int) -> str:
    out, used = [], 0
    for i, item in enumerate(items):
        part = shown(item, limit)
        if used + len(part) > limit and out:
            out.append(f"…[+{len(items) - i} more]")
            break
        out.append(part)
        used += len(part) + 2
    return "[" + ", ".join(out) + "]"

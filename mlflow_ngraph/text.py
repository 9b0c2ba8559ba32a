"""Text from a tracking store, made safe to show on a terminal or in a file people read.

Anyone who can write an experiment writes its run names, tags, params and results indexes.
A string from there may hold terminal escape sequences (clear the screen, set the window's
title, hide what follows), bidirectional overrides that reorder what a reader sees, or a
line break that makes one value read as two lines of output. :func:`visible` shows every
such character as an escape (``\\x1b``, ``\\u202e``, ``\\n``) instead, on a terminal and on a
pipe alike; ordinary text, accented letters and other scripts included, is left as it is.
"""

from __future__ import annotations

import unicodedata

#: the Unicode categories shown escaped: controls (C0, DEL, C1), format characters
#: (bidirectional overrides and isolates, zero-width characters), line and paragraph
#: separators, lone surrogates
HIDDEN_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))

#: the controls that read better by their short names
SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(char: str) -> str:
    """One character as Python writes it in a string literal: ``\\x1b``, ``\\u202e``."""
    if char in SHORT_ESCAPES:
        return SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: object) -> str:
    """``text`` (``str()`` of it) on one line, every control, format and separator character
    in it written as an escape, never sent as itself. A backslash stays as it is, so that
    the function can be applied twice (a path on Windows reads as one)."""
    text = str(text)
    if text.isprintable():  # the usual case, checked in C
        return text
    return "".join(
        escape(char) if unicodedata.category(char) in HIDDEN_CATEGORIES else char for char in text
    )


def visible_lines(text: object) -> str:
    """Each line of ``text`` made :func:`visible`, the line breaks between them kept: for a
    message of several lines, each of them the tool's own."""
    return "\n".join(visible(line) for line in str(text).split("\n"))

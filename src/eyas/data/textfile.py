"""Untrusted text files (prompt files) read the way config files are: decoded or refused in one line.

A prompt file comes from anywhere: saved by an editor as UTF-16, exported with a BOM, a binary
passed by mistake, a JSON dump on one 200 MB line. `text_chunks` decodes UTF-8 (with or without a
BOM) and UTF-16 with a BOM, streaming a few MB at a time, and refuses anything else naming the file
and the byte offset of the first byte it could not read: invalid UTF-8 or UTF-16, a NUL byte (a
binary file), UTF-32. `text_lines` splits the text into lines as Python's universal newlines do and
refuses a line longer than `MAX_LINE_CHARS`, so a file without line breaks never sits in memory whole.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from pathlib import Path

from eyas.errors import FormatError

MAX_LINE_CHARS = 1 << 24  # one prompt line (or JSON record): far past any target's context in tokens
CHUNK_BYTES = 1 << 22
_HINT = "save prompts as UTF-8 text (UTF-16 with a byte-order mark is read too): one prompt per line, or JSON records"
# Byte-order marks, longest first (the UTF-32 LE mark starts with the UTF-16 LE one); None: refused
_BOMS = ((codecs.BOM_UTF32_LE, None), (codecs.BOM_UTF32_BE, None), (codecs.BOM_UTF8, "utf-8"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_NEWLINE = re.compile(r"\r\n|\r|\n")


def _codec(path: Path, head: bytes) -> tuple[str, int]:
    """(codec, BOM length) from the file's first bytes; UTF-8 when there is no BOM."""
    for bom, codec in _BOMS:
        if head.startswith(bom):
            if codec is None:
                raise FormatError(f"{path}: byte 0: a UTF-32 byte-order mark; eyas reads UTF-8 and UTF-16 text",
                                  _HINT)
            return codec, len(bom)
    return "utf-8", 0


def text_chunks(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
    """The file's text, decoded a chunk at a time (BOM removed); FormatError at the first byte that is
    not text, naming its offset."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise FormatError(f"{path}: cannot be read ({e.strerror})", "check the path and its permissions") from None
    with f:
        codec, offset = _codec(path, f.read(4))
        f.seek(offset)
        decoder = codecs.getincrementaldecoder(codec)()
        label = codec.upper().replace("-LE", " little-endian").replace("-BE", " big-endian")
        while True:
            raw = f.read(chunk_bytes)
            start = offset - len(decoder.getstate()[0])  # byte offset of the text this call decodes
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise FormatError(f"{path}: byte {start + e.start}: not {label} text ({e.reason})", _HINT) from None
            nul = text.find("\0")
            if nul >= 0:
                at = start + len(text[:nul].encode(codec))
                raise FormatError(f"{path}: byte {at}: a NUL byte; this is a binary file, not text", _HINT)
            offset += len(raw)
            if text:
                yield text
            if not raw:
                return


def too_long(path: str | Path, line: int) -> FormatError:
    """The error for a line or record past MAX_LINE_CHARS."""
    return FormatError(f"{path} line {line}: longer than {MAX_LINE_CHARS:,} characters",
                       "one prompt per line (or per JSON record), each shorter than the target's context")


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, line without its line break) for every line; `\\n`, `\\r\\n` and `\\r` end a line."""
    n, rest = 1, ""
    for chunk in text_chunks(path):
        rest += chunk
        held = "\r" if rest.endswith("\r") else ""  # may be the first half of \r\n
        lines = _NEWLINE.split(rest[: len(rest) - len(held)])
        rest = lines.pop() + held
        for line in lines:
            if len(line) > MAX_LINE_CHARS:
                raise too_long(path, n)
            yield n, line
            n += 1
        if len(rest) > MAX_LINE_CHARS:
            raise too_long(path, n)
    if rest:
        yield n, rest.removesuffix("\r")

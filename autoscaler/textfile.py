"""Text input files (configs, recordings, traces) are UTF-8; a file that is not says where it is not.

Files are decoded line by line from bytes, so a binary file or a stray byte is reported with its file,
line and byte (`data.csv:3: not UTF-8 text: byte 0xff at column 7`) as the caller's own `InputError`,
never as a `UnicodeDecodeError` traceback. Lines keep their endings (csv and json readers need them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from autoscaler.errors import InputError


def _decode(raw: bytes, path: Path, line: int, error: type[InputError]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}:{line}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
                    " (a binary file?)") from None


def lines(path: str | Path, error: type[InputError]) -> Iterator[str]:
    """The decoded lines of `path`, read lazily; `error` for a file that cannot be read or decoded."""
    path = Path(path)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    with handle:
        for line, raw in enumerate(handle, start=1):
            yield _decode(raw, path, line, error)


def read_text(path: str | Path, error: type[InputError]) -> str:
    """The whole of `path` as text (for YAML and JSON documents); `error` as for `lines`."""
    return "".join(lines(path, error))

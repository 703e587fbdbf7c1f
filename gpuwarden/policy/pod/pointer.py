"""JSON Pointers (RFC 6901): how a patch, a job's twin fields and a denial message name a field.

Every layer that writes or reads a pointer uses these, so that escaping has one definition."""

from __future__ import annotations

from collections.abc import Sequence


def escape(token: str) -> str:
    """Escape one JSON Pointer reference token (RFC 6901): '~' -> '~0', '/' -> '~1'."""
    if "~" in token:
        token = token.replace("~", "~0")
    return token.replace("/", "~1") if "/" in token else token


def pointer(path: Sequence[str | int]) -> str:
    """The JSON Pointer to ``path`` (map keys and list indices): '' for the whole document."""
    if not path:
        return ""
    tokens = [part if type(part) is str else str(part) for part in path]
    joined = "/".join(tokens)
    # Most paths hold nothing to escape: one look at the joined tokens says so.
    if "~" in joined or joined.count("/") != len(tokens) - 1:
        joined = "/".join([escape(token) for token in tokens])
    return "/" + joined


def tokens(where: str) -> list[str]:
    """The reference tokens of a JSON Pointer, unescaped ('~1' -> '/', then '~0' -> '~'): the
    inverse of :func:`pointer`, list indices read back as strings."""
    return [token.replace("~1", "/").replace("~0", "~") for token in where.split("/")[1:]]

"""The envelope of the signed JSON records configpin writes on objects (the rollout record on
a workload, who changed or approved a source): a JSON object whose `sig` field signs the rest.
"""

from __future__ import annotations

from typing import Any

import orjson


def opened(text: Any, most: int) -> tuple[dict[str, Any], str] | None:
    """The body of a record (without `sig`) and its signature, to be checked by the caller;
    None for anything that is not such a record of at most `most` characters."""
    if not isinstance(text, str) or len(text) > most:
        return None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    sig = body.pop("sig", None)
    return (body, sig) if isinstance(sig, str) else None

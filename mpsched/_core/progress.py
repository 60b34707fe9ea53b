"""A job's progress as it travels and is stored: JSON text of a number in [0, 1] or of a
short dict (``JobContext.set_progress``), and back."""

from __future__ import annotations

import json
import math
from typing import Any

from mpsched._errors import ConfigError

MAX_PROGRESS = 4096  # bytes of a progress value, JSON-encoded


def encode_progress(value: object) -> str:
    """``value`` as the JSON text that travels and is stored.

    Raises:
        ConfigError (a ValueError): as JobContext.set_progress.
    """
    if isinstance(value, dict):
        try:
            text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError("progress", value, f"a dict JSON can encode ({exc})") from None
        if len(text.encode()) > MAX_PROGRESS:
            raise ConfigError(
                "progress",
                f"<{len(text.encode())} bytes of JSON>",
                f"at most {MAX_PROGRESS} bytes of JSON",
            )
        return text
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 <= value <= 1)
    ):
        raise ConfigError("progress", value, "a number in [0, 1] or a dict")
    return repr(float(value))


def decode_progress(text: str | bytes | None) -> float | dict[str, Any] | None:
    """The value of a progress text, as a listing shows it (None for none)."""
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else float(value)

"""The one device resolver: ``auto`` / ``cpu`` / ``cuda[:N]`` → a device name torch accepts.

The engine and the sentence embedder (corpus dedup, L3 cache) both place work on a device chosen
by a setting; they resolve it here so that ``auto`` means the same everywhere and a wrong value
is the same :class:`ConfigError`. torch is imported only when the answer depends on it (``auto``
or a CUDA device), because importing it costs seconds and commands that fail on their input
should not pay for it.
"""

from __future__ import annotations

import re

from harness.common.errors import ConfigError

_DEVICE = re.compile(r"^(cpu|cuda)(:\d+)?$")


def resolve_device(name: str = "auto", *, field: str | None = None) -> str:
    """The device to use for ``name``: ``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``.

    Args:
        name: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        field: the setting the value came from, named in errors (``HARNESS__ENGINE__DEVICE``).

    Raises:
        ConfigError: an unknown device name, or a CUDA device on a machine without CUDA.
    """
    text = name.strip().lower()
    if text == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    m = _DEVICE.match(text)
    if m is None:
        raise ConfigError(f"unsupported device {name!r}; use auto, cpu or cuda[:N]", field=field)
    if m.group(1) == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} asked for but CUDA is not available", field=field)
        index = int(m.group(2)[1:]) if m.group(2) else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name!r} asked for but only {torch.cuda.device_count()} CUDA device(s) exist",
                field=field,
            )
    return text

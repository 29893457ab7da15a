"""Settings shared by every stage, read from the environment with the ``HARNESS__`` prefix.

Each stage declares its own ``BaseSettings`` subclass in its subpackage with
:func:`stage_config`, so ``HARNESS__SERVER__PORT=9000`` sets ``ServerSettings.port`` and
``HARNESS__ENGINE__BLOCK_SIZE=32`` sets ``EngineSettings.block_size``. Command-line options win
over the environment, which wins over the defaults. Unknown ``HARNESS__<STAGE>__*`` variables are
ignored by pydantic-settings, but a value that does not validate is a :class:`ConfigError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from harness.common.errors import ConfigError
from harness.common.io import validation_error

ENV_PREFIX = "HARNESS__"

S = TypeVar("S", bound=BaseSettings)


def stage_config(stage: str) -> SettingsConfigDict:
    """The settings config for one stage: env prefix ``HARNESS__<STAGE>__``, nested with ``__``."""
    return SettingsConfigDict(
        env_prefix=f"{ENV_PREFIX}{stage.upper()}__",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )


class HarnessSettings(BaseSettings):
    """Settings every stage may read."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    run_dir: Path = Path(".harness")
    """Where runtime state lives: embedded Redis socket, caches, run outputs."""

    log_level: str = "INFO"


def load_settings(cls: type[S], **overrides: object) -> S:
    """Build ``cls`` from the environment plus explicit overrides (``None`` overrides are dropped).

    A value that does not validate becomes a :class:`ConfigError` naming the variable.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cls(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        loc = exc.errors()[0].get("loc", ())
        field = ".".join(str(p) for p in loc)
        prefix = str(cls.model_config.get("env_prefix", ""))
        # A field read through an alias (``REDIS_URL``) is reported under the alias, as given.
        named = field.upper() if loc and loc[0] not in cls.model_fields else f"{prefix}{field.upper()}"
        raise validation_error(
            exc, ConfigError, field=named if field else None, what="invalid setting"
        ) from None

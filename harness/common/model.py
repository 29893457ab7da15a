"""The one base of the project's pydantic models: an unknown or misspelt field is an error.

Every file format and report the harness reads or writes is a :class:`StrictModel`, so a typo in a
scenario file, a tier file or a plan fails validation (naming the field) instead of being silently
ignored and leaving a default in place.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model with ``extra="forbid"``; subclasses add to ``model_config`` (pydantic merges it)."""

    model_config = ConfigDict(extra="forbid")

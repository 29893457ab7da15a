"""Server settings (env prefix ``HARNESS__SERVER__``); ``harness serve`` options override them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings

from harness.common.options import Flag
from harness.common.settings import stage_config
from harness.target.engine.settings import FAULTS_PANEL

PANEL = "Server"
ACCESS_PANEL = "Access"


class ServerSettings(BaseSettings):
    """How ``harness serve`` listens and what it admits."""

    model_config = stage_config("server")

    host: Annotated[str, Flag(names=("--bind",), deprecated=("--host",), panel=PANEL)] = Field(
        "127.0.0.1", description="Address to listen on (127.0.0.1: this machine only)"
    )
    """Loopback by default; binding elsewhere is an explicit choice (and needs credentials: protected
    mode, see :mod:`harness.target.server.auth`)."""
    port: Annotated[int, Flag(panel=PANEL)] = Field(
        default=8000, ge=0, le=65535, description="TCP port (0 picks a free one)"
    )
    """``0`` lets the OS pick a free port (announced on stdout)."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body for the OpenAI endpoints; larger is HTTP 413."""
    max_preload_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Largest JSONL body for ``POST /cache/preload``."""
    default_max_tokens: int = Field(default=256, ge=1)
    """Used when a request sets neither ``max_tokens`` nor ``max_completion_tokens`` (capped by the
    context left after the prompt)."""
    served_model_name: str | None = None
    """Name in the API; default: the engine's model name."""
    strict_model_name: bool = True
    """Refuse (404) a request whose ``model`` is not the served one; off: any name is accepted."""
    cache: Annotated[bool, Flag(names=("--cache/--no-cache",), panel=PANEL)] = Field(
        False, description="Put the response cache in front of the engine"
    )
    """Put the response cache stack in front of the engine (``--cache``)."""
    max_stage_labels: int = Field(default=64, ge=1)
    """Distinct ``X-Traffic-Stage`` values kept as metric labels; later ones count as ``other``."""
    preload_concurrency: int = Field(default=4, ge=1)
    """Engine generations in flight while preloading prompts that have no completion."""
    log_requests: bool = False
    """One log line per request (id, stage, trace, status, timings) at INFO."""
    warmup: bool = True
    """Run one 2-token generation at startup so the first client request does not pay one-off costs."""
    graceful_shutdown_s: float = Field(default=5.0, ge=0.0)
    """Time in-flight requests get to finish after SIGINT/SIGTERM."""
    api_key: Annotated[SecretStr | None, Flag(panel=ACCESS_PANEL)] = Field(
        None,
        description="/v1/* needs 'Authorization: Bearer KEY' (tenant 'default'); vLLM's option. Prefer "
        "HARNESS__SERVER__API_KEY: a command line is visible to every user of the machine",
    )
    """``--api-key``: ``/v1/*`` needs ``Authorization: Bearer`` it (tenant ``default``); vLLM's option."""
    api_keys_file: Annotated[Path | None, Flag(names=("--api-keys",), panel=ACCESS_PANEL)] = Field(
        None,
        description='JSON file {"KEY": "TENANT", ...}: /v1/* needs one of the keys, and the tenant comes '
        "from the key (X-Tenant-ID naming another is 403). Combines with --api-key",
    )
    """``--api-keys``: a JSON object ``{"KEY": "TENANT", ...}``; the tenant comes from the key."""
    admin_token: Annotated[SecretStr | None, Flag(panel=ACCESS_PANEL)] = Field(
        None,
        description="/cache/* and /reset_prefix_cache need 'Authorization: Bearer TOKEN'. Prefer "
        "HARNESS__SERVER__ADMIN_TOKEN or --admin-token-file",
    )
    """``--admin-token``: ``/cache/*`` and ``/reset_prefix_cache`` need it as a Bearer token."""
    admin_token_file: Annotated[Path | None, Flag(panel=ACCESS_PANEL)] = Field(
        None, description="Read the admin token from this file"
    )
    """``--admin-token-file``: the admin token read from a file (keeps it out of argv and env)."""
    protect_metrics: Annotated[bool, Flag(panel=ACCESS_PANEL)] = Field(
        False, description="/metrics needs an API key or the admin token"
    )
    """``/metrics`` needs an API key or the admin token."""
    insecure_no_auth: Annotated[bool, Flag(panel=ACCESS_PANEL)] = Field(
        False,
        description="Serve a non-loopback --bind address without API keys and admin token, on purpose "
        "(warns)",
    )
    """Serve a non-loopback address without credentials on purpose (protected mode off, loudly)."""
    inject_error_rate: Annotated[float, Flag(panel=FAULTS_PANEL)] = Field(
        0.0,
        description="This fraction P (0 <= P < 1) of generation requests answers HTTP "
        "500, each drawn independently (--inject-seed). Off: 0",
    )
    """Fault injection (``--inject-error-rate``): this fraction of generation requests answers HTTP 500
    before any cache lookup or generation, each request drawn independently from the
    ``inject_seed`` stream. 0: off. Below 1: a server that fails everything proves nothing a gate
    needs proving (and is not a regression, it is an outage). Never set in production."""
    inject_cache_miss_rate: Annotated[float, Flag(panel=FAULTS_PANEL)] = Field(
        0.0,
        description="This fraction P (0 <= P <= 1) of generation requests misses the "
        "response cache and the engine's prefix cache (computed in full, nothing stored). Off: 0",
    )
    """Fault injection (``--inject-cache-miss-rate``): this fraction of generation requests misses both
    the response cache and the engine's prefix cache (served as if nothing were cached, and leaving
    nothing cached), drawn like ``inject_error_rate``. 0: off; 1: every request cold."""
    inject_seed: Annotated[int, Flag(panel=FAULTS_PANEL)] = Field(
        0, description="Seed of the per-request fault injections' draws"
    )
    """Seed of the one random stream the per-request injections draw from, in arrival order."""

    @field_validator("inject_error_rate", "inject_cache_miss_rate")
    @classmethod
    def _a_fraction(cls, value: float, info: ValidationInfo) -> float:
        """A fraction of requests, said in the words of the option that sets it (NaN fails too)."""
        name = info.field_name or ""
        open_top = name == "inject_error_rate"
        if not (0.0 <= value < 1.0 if open_top else 0.0 <= value <= 1.0):
            flag = "--" + name.replace("_", "-")
            bound = "0 <= P < 1" if open_top else "0 <= P <= 1"
            raise ValueError(f"{flag} is a fraction of generation requests, {bound}; got {value:g}")
        return value

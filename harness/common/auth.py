"""What a client of the target needs to be let in, and how the harness keeps it secret.

:class:`Credentials` is the one value every client of a target takes (the Locust replay user, the
warm check's probes, ``harness capacity``, ``harness cache …``, the preload): an API key sent as
``Authorization: Bearer KEY`` on the OpenAI routes (vLLM's ``--api-key``, TGI's token, a hosted
service), an admin token for the cache admin routes of ``harness serve``, extra headers given as
``--header NAME:VALUE``, and how TLS is verified (on by default; ``--ca-bundle`` for a private CA,
``--insecure`` only when asked for).

Secrets never reach a file the harness writes, a log line or an error message:

* ``repr`` shows which credentials are set, never their values; :meth:`Credentials.describe` is the
  form written to results (``{"api_key": true, "headers": ["X-Org"]}``);
* child processes (the Locust launcher, a ``harness serve`` the harness starts) get them through the
  environment (:meth:`Credentials.to_env`, :data:`SECRETS_ENV`), never on a command line that ``ps``
  shows and ``run.json`` records;
* :meth:`Credentials.redact` blanks every secret value in a text (a server that echoes a header back
  in its error message is not trusted to be careful).
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator

from harness.common.errors import ConfigError
from harness.common.io import json_object
from harness.common.model import StrictModel
from harness.common.options import Flag, Option, options_of

API_KEY_ENV = "OPENAI_API_KEY"
"""Where ``--api-key`` defaults from, as every OpenAI client does."""
ADMIN_TOKEN_ENV = "HARNESS_ADMIN_TOKEN"
"""Where ``--admin-token`` defaults from."""
SECRETS_ENV = "HARNESS_LOAD_SECRETS"
"""How the launcher hands credentials to its Locust child: JSON in the environment, not argv."""
SERVER_API_KEY_ENV = "HARNESS__SERVER__API_KEY"
SERVER_ADMIN_TOKEN_ENV = "HARNESS__SERVER__ADMIN_TOKEN"
"""The settings a ``harness serve`` child reads its key and admin token from."""
REDACTED = "***"

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
"""An HTTP header name (RFC 9110 ``token``)."""
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection", "accept-encoding"})
"""Headers the client's framing and stream reading depend on: not the user's to replace."""


def parse_header(text: str) -> tuple[str, str]:
    """``"NAME:VALUE"`` (curl's ``-H`` form) → ``(name, value)``. The error never shows the value."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise ConfigError("expected NAME:VALUE, e.g. 'X-Org: research'", field="--header")
    if not _TOKEN.match(name):
        raise ConfigError(f"'{name}' is not a valid header name", field="--header")
    if any(c in value for c in "\r\n\0"):
        raise ConfigError(f"the value of '{name}' holds a line break or NUL", field="--header")
    if name.lower() in _FRAMING:
        raise ConfigError(f"'{name}' is set by the client itself and cannot be replaced", field="--header")
    return name, value


@dataclass(frozen=True)
class Credentials:
    """An API key, an admin token, extra headers and the TLS policy for one target."""

    api_key: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Extra ``(name, value)`` pairs on every request (values may be secrets too)."""
    ca_bundle: Path | None = None
    """PEM file of the CA(s) to verify the target's certificate against (default: the system's)."""
    insecure: bool = False
    """Skip TLS verification (a self-signed test target); never the default."""

    @classmethod
    def of(
        cls,
        *,
        api_key: str | None = None,
        admin_token: str | None = None,
        headers: Iterable[str] | None = (),
        ca_bundle: str | Path | None = None,
        insecure: bool = False,
    ) -> Credentials:
        """Build from command-line values (``--header`` items as ``NAME:VALUE``, ``None`` when the
        option was not given); checks them all."""
        ca = Path(ca_bundle) if ca_bundle not in (None, "") else None
        if ca is not None and not ca.is_file():
            raise ConfigError(f"no CA bundle at {ca}", field="--ca-bundle")
        if ca is not None and insecure:
            raise ConfigError(
                "--insecure skips verification: it makes --ca-bundle pointless", field="--insecure"
            )
        return cls(
            api_key=api_key or None,
            admin_token=admin_token or None,
            headers=tuple(parse_header(h) for h in headers or ()),
            ca_bundle=ca,
            insecure=insecure,
        )

    def __repr__(self) -> str:
        return f"Credentials({self.describe()})"

    # ---- what goes on the wire -----------------------------------------------------------------

    def request_headers(self) -> dict[str, str]:
        """Headers for the OpenAI routes: the extra headers, then ``Authorization`` with the key."""
        out = dict(self.headers)
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def admin_headers(self) -> dict[str, str]:
        """Headers for the admin routes (``/cache/*``, ``/reset_prefix_cache``): the admin token, else
        the API key (vLLM guards its dev endpoints with the same key)."""
        out = dict(self.headers)
        token = self.admin_token or self.api_key
        if token:
            out["Authorization"] = f"Bearer {token}"
        return out

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for ``https://`` targets: verifying (system CAs or ``ca_bundle``) unless
        ``insecure``."""
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return ssl.create_default_context(cafile=str(self.ca_bundle) if self.ca_bundle else None)

    def ssl_context_factory(self) -> Callable[..., ssl.SSLContext]:
        """A factory in geventhttpclient's (and Locust's ``FastHttpUser``'s) form: it is called with
        the client's default ``cafile``, which ``ca_bundle`` replaces."""

        def factory(cafile: str | None = None, **_: Any) -> ssl.SSLContext:
            if self.insecure or self.ca_bundle is not None:
                return self.ssl_context()
            return ssl.create_default_context(cafile=cafile)

        return factory

    def httpx_verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify=`` for this policy."""
        if self.insecure:
            return False
        return self.ssl_context() if self.ca_bundle else True

    # ---- keeping them secret -------------------------------------------------------------------

    def secrets(self) -> list[str]:
        """Every secret value (the key, the token, every extra header's value)."""
        values = [self.api_key, self.admin_token, *(v for _, v in self.headers)]
        return [v for v in values if v]

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by ``***`` (longest first, so that a secret that
        contains another is blanked whole)."""
        for secret in sorted(self.secrets(), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    def describe(self) -> dict[str, Any]:
        """What results may say about the credentials: which are set, the header names, TLS policy."""
        return {
            "api_key": self.api_key is not None,
            "admin_token": self.admin_token is not None,
            "headers": [name for name, _ in self.headers],
            "ca_bundle": str(self.ca_bundle) if self.ca_bundle else None,
            "insecure": self.insecure,
        }

    # ---- handing them to child processes -------------------------------------------------------

    def to_env(self) -> dict[str, str]:
        """The secrets as :data:`SECRETS_ENV` for a Locust child (``{}`` when there are none)."""
        doc = {
            "api_key": self.api_key,
            "admin_token": self.admin_token,
            "header": [f"{n}: {v}" for n, v in self.headers],
        }
        if not any(doc.values()):
            return {}
        return {SECRETS_ENV: json.dumps(doc)}

    def server_env(self) -> dict[str, str]:
        """Settings for a ``harness serve`` child keyed with these credentials."""
        out: dict[str, str] = {}
        if self.api_key:
            out[SERVER_API_KEY_ENV] = self.api_key
        if self.admin_token:
            out[SERVER_ADMIN_TOKEN_ENV] = self.admin_token
        return out


def secrets_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a launcher put in :data:`SECRETS_ENV` (``{}`` when nothing): ``api_key``,
    ``admin_token``, ``header``."""
    raw = (environ if environ is not None else os.environ).get(SECRETS_ENV)
    if not raw:
        return {}
    doc = json_object(raw, SECRETS_ENV)
    return {k: v for k, v in doc.items() if k in ("api_key", "admin_token", "header") and v}


# ---- the command-line options, declared once for every command that talks to a target ----------

ACCESS_PANEL = "Target access"


SEND = ("send",)
"""The credentials go with every command that sends load (:data:`harness.load.options.USES`)."""


class AccessOptions(StrictModel):
    """The credentials options of every command that talks to a target, each declared once (the load
    options extend this model; other commands take its options through
    :func:`harness.common.options.options_of`)."""

    api_key: Annotated[SecretStr | None, Flag(envvar=API_KEY_ENV, panel=ACCESS_PANEL, uses=SEND)] = Field(
        None,
        description="Bearer key for the OpenAI routes (default: $OPENAI_API_KEY; prefer the environment: "
        "a command line is visible in ps; never written to results)",
    )
    admin_token: Annotated[SecretStr | None, Flag(envvar=ADMIN_TOKEN_ENV, panel=ACCESS_PANEL, uses=SEND)] = (
        Field(
            None,
            description="Bearer token for the cache admin routes of `harness serve` (preload, flush, stats); "
            "default: the API key",
        )
    )
    header: Annotated[
        list[SecretStr], Flag(deprecated=("-H",), panel=ACCESS_PANEL, metavar="NAME:VALUE", uses=SEND)
    ] = Field(
        default_factory=list,
        description="Extra request header NAME:VALUE, repeatable (values may be secrets: never written "
        "to results)",
    )
    ca_bundle: Annotated[Path | None, Flag(panel=ACCESS_PANEL, uses=SEND)] = Field(
        None, description="PEM CA bundle to verify an https:// target against (default: the system's CAs)"
    )
    insecure: Annotated[bool, Flag(panel=ACCESS_PANEL, uses=SEND)] = Field(
        False, description="Do not verify the target's TLS certificate"
    )

    @field_validator("header")
    @classmethod
    def _headers_well_formed(cls, v: list[SecretStr]) -> list[SecretStr]:
        for item in v:
            try:
                parse_header(item.get_secret_value())
            except ConfigError as exc:
                raise ValueError(exc.message) from None
        return v

    def credentials(self) -> Credentials:
        """The key, token, headers and TLS policy every client of the target uses."""
        return Credentials.of(
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            admin_token=self.admin_token.get_secret_value() if self.admin_token else None,
            headers=[h.get_secret_value() for h in self.header],
            ca_bundle=self.ca_bundle,
            insecure=self.insecure,
        )


def access_from(given: Mapping[str, Any]) -> Credentials:
    """The credentials from a command's given access options (:func:`harness.common.options.with_options`
    over :class:`AccessOptions`), validated; a bad one is a :class:`ConfigError` naming its flag."""
    try:
        return AccessOptions.model_validate(given).credentials()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err.get("loc") else "?"
        raise ConfigError(
            str(err["msg"]).removeprefix("Value error, "), field=f"--{name.replace('_', '-')}"
        ) from None


def access_options() -> list[Option]:
    """The credentials options as flags, for a command that talks to a target without the load
    options: ``@with_options(access_options(), panel=ACCESS_PANEL, param="access")``, then
    ``access_from(access)`` (the load options extend :class:`AccessOptions` and carry them already)."""
    return options_of(AccessOptions)


SECRET_OPTIONS: tuple[str, ...] = ("api_key", "admin_token", "header")
"""The options whose values are secrets (the one list: load options, flags, ``--serve-args``)."""
SECRET_VALUE_FLAGS: frozenset[str] = frozenset({"--api-key", "--admin-token"})
"""Flags whose value is one secret (``harness serve`` has these two as well)."""
_SECRET_FLAGS = frozenset({f"--{n.replace('_', '-')}" for n in SECRET_OPTIONS} | {"-H"})


def redact_args(args: Sequence[str]) -> list[str]:
    """A command line with the values of the secret options blanked (for display and records)."""
    out: list[str] = []
    blank_next = False
    for arg in args:
        if blank_next:
            out.append(REDACTED)
            blank_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in _SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                blank_next = True
            continue
        out.append(arg)
    return out

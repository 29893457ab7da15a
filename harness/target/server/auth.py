"""Who may call ``harness serve``: API keys and tenants, the admin token, protected mode.

Three credentials, all optional, all ``Authorization: Bearer …``:

* **API keys** (``--api-key KEY``, ``--api-keys FILE``) guard ``/v1/*``. With a key file (several
  principals) each key belongs to one tenant and the tenant comes from the key, never from the
  caller: an ``X-Tenant-ID`` that names another tenant is 403 ``tenant_mismatch``; a single
  ``--api-key`` given beside the file is tenant :data:`~harness.common.headers.DEFAULT_TENANT`. A
  single ``--api-key`` alone (vLLM's model: one principal, the operator) admits its holder to every
  partition, so ``X-Tenant-ID`` still picks the tenant: there is no other principal to isolate from,
  and a multi-tenant corpus replays against it as against an unkeyed server.
* **The admin token** (``--admin-token``) guards ``/cache/*`` and ``/reset_prefix_cache``. With keys
  but no admin token the admin API is closed (403 ``admin_disabled``); with nothing configured
  (loopback development) it is open, as it always was.
* ``/metrics`` is open unless ``--protect-metrics`` (then any API key or the admin token).

:meth:`AuthPolicy.tenant` is the one place the server turns a request into a tenant: every cache
tier (L1, L2, L3, bloom) keys by what it returns, so no tier can be reached with a spoofed header.

Secrets are compared as SHA-256 digests with :func:`hmac.compare_digest` (keys: a dict keyed by
digest, so a lookup never compares the secret itself byte by byte), are held only as digests, and
appear in no log line, error message or response.

Protected mode (Redis's): :func:`check_protected_mode` refuses a non-loopback bind without keys and
an admin token unless ``--insecure-no-auth`` says so on purpose; ``prepare`` calls it before a model
loads.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common import headers as H
from harness.common.errors import ConfigError
from harness.target.server.errors import APIError
from harness.target.server.settings import ServerSettings

log = logging.getLogger("harness.target.server")

AUTHORIZATION = "authorization"
_BEARER = "bearer"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_KEYS_FIELD = "--api-keys / HARNESS__SERVER__API_KEYS_FILE"
_ADMIN_FILE_FIELD = "--admin-token-file / HARNESS__SERVER__ADMIN_TOKEN_FILE"


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def bearer(headers: Mapping[str, str]) -> str | None:
    """The credential of an ``Authorization: Bearer …`` header; ``None`` when absent or another
    scheme (``Basic``, a bare key): those are not credentials here, whatever they carry."""
    value = headers.get(AUTHORIZATION)
    if not value:
        return None
    scheme, _, credential = value.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != _BEARER or not credential:
        return None
    return credential


def load_api_keys(path: Path) -> dict[str, str]:
    """A key file: one JSON object mapping each key to its tenant, both non-empty strings.

    Everything that can be wrong is a :class:`ConfigError` naming the file and the field; the message
    never contains a key (it says which entry, by position, is wrong).
    """
    if not path.is_file():
        raise ConfigError("API key file does not exist", file=path, field=_KEYS_FIELD)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the API key file: {exc}", file=path, field=_KEYS_FIELD) from None

    duplicates: list[int] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(items, start=1):
            if k in out:
                duplicates.append(i)
            out[k] = v
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        # The decoder's message names a position only, never the text around it.
        raise ConfigError(
            f"API key file is not JSON ({exc.msg} at line {exc.lineno})", file=path, field=_KEYS_FIELD
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            'API key file must be a JSON object {"KEY": "TENANT", ...}', file=path, field=_KEYS_FIELD
        )
    if duplicates:
        raise ConfigError(
            f"API key file lists a key twice (entry {duplicates[0]}); every key maps to one tenant",
            file=path,
            field=_KEYS_FIELD,
        )
    if not data:
        raise ConfigError("API key file has no keys", file=path, field=_KEYS_FIELD)
    for i, (key, tenant) in enumerate(data.items(), start=1):
        if not key.strip():
            raise ConfigError(f"entry {i}: the key is empty", file=path, field=_KEYS_FIELD)
        if key != key.strip() or any(c.isspace() for c in key):
            # A Bearer credential cannot carry whitespace: such a key could never be presented.
            raise ConfigError(f"entry {i}: the key contains whitespace", file=path, field=_KEYS_FIELD)
        if not isinstance(tenant, str) or not tenant.strip():
            raise ConfigError(
                f"entry {i}: the tenant must be a non-empty string", file=path, field=_KEYS_FIELD
            )
    return dict(data)


def _read_token_file(path: Path) -> str:
    if not path.is_file():
        raise ConfigError("admin token file does not exist", file=path, field=_ADMIN_FILE_FIELD)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the admin token file: {exc}", file=path, field=_ADMIN_FILE_FIELD
        ) from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(
            "admin token file must hold one token (no whitespace inside)", file=path, field=_ADMIN_FILE_FIELD
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine (127.0.0.0/8, ::1, localhost).

    A host name other than ``localhost`` counts as remote: what it resolves to can change.
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def unauthorized(message: str, code: str) -> APIError:
    return APIError(
        401, message, type="invalid_request_error", code=code, reason="unauthorized", headers=_CHALLENGE
    )


def forbidden(message: str, code: str) -> APIError:
    return APIError(403, message, type="invalid_request_error", code=code, reason="forbidden")


@dataclass(frozen=True)
class AuthPolicy:
    """The credentials a server accepts, as digests. Empty: loopback development, everything open."""

    key_tenants: dict[bytes, str] = field(default_factory=dict)
    """SHA-256 of each API key → its tenant."""
    admin_digest: bytes | None = None
    protect_metrics: bool = False
    operator_key: bool = False
    """One ``--api-key`` and no key file: its holder is the only principal and picks the tenant."""

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> AuthPolicy:
        """Read and check every credential setting (files included): a :class:`ConfigError` here
        costs milliseconds, before the model loads."""
        keys: dict[str, str] = {}
        if settings.api_keys_file is not None:
            keys = load_api_keys(Path(settings.api_keys_file))
        if settings.api_key is not None:
            single = settings.api_key.get_secret_value()
            if not single.strip() or any(c.isspace() for c in single):
                raise ConfigError(
                    "the API key must be non-empty and hold no whitespace",
                    field="--api-key / HARNESS__SERVER__API_KEY",
                )
            if single in keys and keys[single] != H.DEFAULT_TENANT:
                raise ConfigError(
                    f"--api-key is also in the key file, for another tenant; --api-key's tenant is "
                    f"'{H.DEFAULT_TENANT}'",
                    file=settings.api_keys_file,
                    field="--api-key / HARNESS__SERVER__API_KEY",
                )
            keys[single] = H.DEFAULT_TENANT
        admin: str | None = None
        if settings.admin_token is not None and settings.admin_token_file is not None:
            raise ConfigError(
                "give the admin token once: --admin-token or --admin-token-file, not both",
                field="--admin-token-file / HARNESS__SERVER__ADMIN_TOKEN_FILE",
            )
        if settings.admin_token is not None:
            admin = settings.admin_token.get_secret_value()
            if not admin.strip() or any(c.isspace() for c in admin):
                raise ConfigError(
                    "the admin token must be non-empty and hold no whitespace",
                    field="--admin-token / HARNESS__SERVER__ADMIN_TOKEN",
                )
        elif settings.admin_token_file is not None:
            admin = _read_token_file(Path(settings.admin_token_file))
        if admin is not None and admin in keys:
            # A tenant would hold the admin API (plant answers for every tenant) with its own key.
            raise ConfigError(
                "the admin token is also an API key; give the admin its own secret",
                field="--admin-token / HARNESS__SERVER__ADMIN_TOKEN",
            )
        if settings.protect_metrics and not keys and admin is None:
            raise ConfigError(
                "--protect-metrics needs a credential to accept: add --api-key, --api-keys or --admin-token",
                field="--protect-metrics / HARNESS__SERVER__PROTECT_METRICS",
            )
        return cls(
            key_tenants={_digest(k): t for k, t in keys.items()},
            admin_digest=_digest(admin) if admin is not None else None,
            protect_metrics=settings.protect_metrics,
            operator_key=settings.api_key is not None and settings.api_keys_file is None,
        )

    @property
    def keyed(self) -> bool:
        """Whether ``/v1/*`` needs an API key."""
        return bool(self.key_tenants)

    @property
    def open(self) -> bool:
        """Nothing configured: loopback development, every route open as before."""
        return not self.key_tenants and self.admin_digest is None

    def _key_tenant(self, credential: str | None) -> str | None:
        if credential is None:
            return None
        return self.key_tenants.get(_digest(credential))

    def _is_admin(self, credential: str | None) -> bool:
        if credential is None or self.admin_digest is None:
            return False
        return hmac.compare_digest(_digest(credential), self.admin_digest)

    def tenant(self, headers: Mapping[str, str]) -> str:
        """The tenant of an OpenAI request (``/v1/*``), or the refusal as an :class:`APIError`.

        Without keys: ``X-Tenant-ID`` or the default tenant (isolation between polite clients only).
        With keys: a missing or unknown key is 401; then the key's tenant, an ``X-Tenant-ID`` naming
        another tenant 403 (absent: the key's tenant), unless the key is the operator's single
        ``--api-key`` (no key file), whose holder picks the tenant with ``X-Tenant-ID``.
        """
        claimed = headers.get(H.TENANT)
        if not self.keyed:
            return claimed or H.DEFAULT_TENANT
        credential = bearer(headers)
        if credential is None:
            raise unauthorized(
                "You didn't provide an API key: send 'Authorization: Bearer YOUR_KEY'", "invalid_api_key"
            )
        tenant = self._key_tenant(credential)
        if tenant is None:
            raise unauthorized("Incorrect API key provided", "invalid_api_key")
        if self.operator_key:
            return claimed or tenant
        if claimed and claimed != tenant:
            raise forbidden(
                f"{H.TENANT} '{claimed}' is not this API key's tenant; the tenant comes from the key "
                f"(drop the header or send '{tenant}')",
                "tenant_mismatch",
            )
        return tenant

    def admin_tenant(self, headers: Mapping[str, str]) -> str:
        """The default tenant of an admin request (preload): the admin may name any tenant."""
        self.require_admin(headers)
        return headers.get(H.TENANT) or H.DEFAULT_TENANT

    def require_admin(self, headers: Mapping[str, str]) -> None:
        """Admit an admin request (``/cache/*``, ``/reset_prefix_cache``) or raise its refusal."""
        if self.admin_digest is None:
            if self.keyed:
                raise forbidden(
                    "the admin API is disabled: this server has API keys but no admin token "
                    "(start it with --admin-token to use /cache/* and /reset_prefix_cache)",
                    "admin_disabled",
                )
            return  # loopback development: open, as documented in the threat model
        credential = bearer(headers)
        if credential is None:
            raise unauthorized(
                "this endpoint needs the admin token: send 'Authorization: Bearer ADMIN_TOKEN'",
                "missing_admin_token",
            )
        if not self._is_admin(credential):
            raise unauthorized("incorrect admin token", "invalid_admin_token")

    def require_metrics(self, headers: Mapping[str, str]) -> None:
        """Admit a ``/metrics`` scrape: open unless ``--protect-metrics``, then any key or the admin token."""
        if not self.protect_metrics:
            return
        credential = bearer(headers)
        if credential is None:
            raise unauthorized(
                "/metrics needs an API key or the admin token (--protect-metrics)", "invalid_api_key"
            )
        if self._key_tenant(credential) is None and not self._is_admin(credential):
            raise unauthorized("incorrect API key or admin token", "invalid_api_key")


def check_protected_mode(settings: ServerSettings, policy: AuthPolicy) -> str | None:
    """Refuse to serve a non-loopback address without API keys and an admin token (Redis's protected
    mode) with a :class:`ConfigError`, unless ``--insecure-no-auth`` asks for it: then the warning to
    show (loudly) is returned. ``None``: nothing to say."""
    if is_loopback(settings.host):
        return None
    missing = []
    exposed = []
    if not policy.keyed:
        missing.append("--api-key or --api-keys")
        exposed.append("use /v1 as any tenant and be answered from that tenant's cache")
    if policy.admin_digest is None:
        missing.append("--admin-token")
        if not policy.keyed:
            exposed.append("plant cached answers and flush the caches")
    if not missing:
        return None
    without = " and ".join(missing)
    if settings.insecure_no_auth:
        consequence = (
            f"anyone who can reach it can {'; '.join(exposed)}"
            if exposed
            else "the admin API stays closed (403 admin_disabled)"
        )
        return f"INSECURE (--insecure-no-auth): serving {settings.host} without {without}: {consequence}"
    risk = f": anyone who could reach it could {'; '.join(exposed)}" if exposed else ""
    raise ConfigError(
        f"protected mode: refusing to serve {settings.host} (not loopback) without {without}{risk}",
        field="--bind / HARNESS__SERVER__HOST",
        hint="add --api-keys FILE (or --api-key) and --admin-token, bind 127.0.0.1, or pass "
        "--insecure-no-auth if this network is trusted on purpose",
    )

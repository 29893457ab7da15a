"""OpenAI-style error responses: one exception type carried to one JSON shape.

Every refusal the server makes (bad JSON, bad field, prompt too long, body too large, queue full,
unknown model) becomes ``{"error": {"message", "type", "param", "code"}}`` with the status OpenAI
would use, so client libraries raise their usual exceptions (``BadRequestError``,
``RateLimitError`` …) and benchmark tools record the failure instead of choking on HTML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response


class APIError(Exception):
    """A refusal with its HTTP status, OpenAI error ``type``/``code`` and the parameter at fault.

    ``reason`` is the label of ``harness_server_rejections_total``.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # the OpenAI field name
        param: str | None = None,
        code: str | None = None,
        reason: str = "bad_request",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.reason = reason
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, extra_headers: Mapping[str, str] | None = None) -> Response:
        headers = {**self.headers, **(extra_headers or {})}
        return Response(
            orjson.dumps(self.body()), status_code=self.status, media_type="application/json", headers=headers
        )


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code, reason="bad_request")


def unsupported(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_value", reason="unsupported")


def loc_to_param(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a JSON path: ``('messages', 0, 'content')`` → ``messages[0].content``.

    Union members that pydantic appends to the location (``str``, ``list[int]``, ``function-after``)
    are dropped: the client cares about its own field, not our type's branches.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or part in {"str", "int", "float", "bool"} or "-" in part:
            continue
        else:
            out += f".{part}" if out else part
    return out


def from_validation_error(exc: ValidationError) -> APIError:
    """The first validation problem, naming the field; all of them in the message when there are few."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    param = loc_to_param(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        return APIError(
            400,
            f"unknown field '{param}': this server does not accept it",
            param=param,
            code="unknown_field",
            reason="bad_request",
        )
    # Union fields fail once per branch; report the field once with the first branch's complaint.
    seen: dict[str, str] = {}
    for err in errors:
        p = loc_to_param(tuple(err.get("loc", ())))
        seen.setdefault(p, str(err.get("msg", "invalid value")))
    parts = [f"'{p}': {m}" for p, m in list(seen.items())[:3]]
    return APIError(400, "invalid request: " + "; ".join(parts), param=param, code="invalid_value")


def retry_after_header(seconds: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (HTTP allows no fractions), at least 1."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}

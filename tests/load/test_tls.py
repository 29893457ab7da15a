"""An ``https://`` target: verified by default (Locust's ``FastHttpUser`` alone would not), against
``--ca-bundle`` for a private CA, skipped only with ``--insecure``."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.helpers import make_corpus
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test CA"),
]


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA): ``(cert.pem, key.pem)``."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_is_verified_unless_told_otherwise(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    corpus = make_corpus(tmp_path / "c.jsonl", 3)
    common = {"corpus": corpus, "rate": 6, "duration": 0.5, "start_delay": 0.5}
    with SSEServer(Behaviour(first_token_s=0.01, gap_s=0.002, tokens=3), tls=server_ctx) as srv:
        assert srv.url.startswith("https://")
        runs = {
            "default": LoadSpec(host=srv.url, results_dir=tmp_path / "default", **common),
            "ca-bundle": LoadSpec(host=srv.url, results_dir=tmp_path / "ca-bundle", ca_bundle=cert, **common),
            "insecure": LoadSpec(host=srv.url, results_dir=tmp_path / "insecure", insecure=True, **common),
        }
        codes = {name: run_locust(spec, timeout_s=120) for name, spec in runs.items()}
    assert codes == {"default": 1, "ca-bundle": 0, "insecure": 0}
    refused = list(read_records(tmp_path / "default"))
    assert len(refused) == 3 and all(
        r.status == 0 and "CERTIFICATE_VERIFY_FAILED" in (r.error or "") for r in refused
    )
    for name in ("ca-bundle", "insecure"):
        s = read_summary(tmp_path / name)
        assert s.requests == 3 and s.errors == 0, [r.error for r in read_records(tmp_path / name)]

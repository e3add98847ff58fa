"""TLS contexts: the coordinator's server side (``--tls-cert``/``--tls-key``) and the clients'
(the worker and ``dt``; ``--ca-file`` for a private CA, else the system's trust store).

Clients always verify the certificate chain and the host name; there is no switch to turn that
off. TLS 1.2 is the oldest version either side accepts. Reading the files happens here, once, at
start: a missing file or a key that does not match its certificate is a :class:`ConfigError`
naming the flag.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from ..errors import ConfigError

__all__ = ["client_context", "describe_tls_error", "server_context"]


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context presenting ``cert`` (PEM chain, leaf first) with private key ``key``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not path.is_file():
            raise ConfigError(f"{flag}: {path} is not a readable file")
    try:
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--tls-cert/--tls-key: cannot load {cert} with key {key}: {exc}") from exc
    return ctx


def client_context(ca_file: Path | None, source: str = "--ca-file") -> ssl.SSLContext:
    """A verifying client context: trusts only ``ca_file`` (PEM bundle) if given, else the system's
    CAs (like curl's ``--cacert``, a private CA replaces the public ones rather than adding to them)."""
    try:
        ctx = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    except (ssl.SSLError, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{source}: cannot load CA certificates from {ca_file}: {reason}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def describe_tls_error(exc: BaseException, url: str) -> str | None:
    """A one-line explanation when ``exc`` (or its cause) is a certificate failure, else None."""
    seen: BaseException | None = exc
    while seen is not None:
        inner = getattr(seen, "certificate_error", None)  # aiohttp's ClientConnectorCertificateError
        if isinstance(inner, ssl.SSLCertVerificationError):
            seen = inner
        if isinstance(seen, ssl.SSLCertVerificationError):
            return (f"the TLS certificate of {url} is not trusted ({seen.verify_message or seen.reason}); "
                    "pass --ca-file (env DT_CA_FILE) with the CA that signed it")
        seen = seen.__cause__ or seen.__context__
    return None

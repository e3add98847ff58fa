"""The token-signing secret's own file (``--jwt-secret-file``, default ``jwt.secret`` beside the
database): never in the database, so a reader of the database or of a backup of it cannot sign
tokens.

The file holds the secret as hex on one line (at least 64 hex digits: 32 bytes) with mode 0600.
The first start creates it; a secret an older version kept in the store's ``meta`` table is moved
into it (:func:`load_or_create` with ``legacy_hex``) and then deleted from the store by the
caller. :func:`rotate` replaces it with a fresh one: after a restart every JWT signed with the old
secret is refused, while API keys (stored as hashes, not signed) keep working.

Blocking file I/O: call these off the event loop.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from ..errors import ConfigError
from .bootstrap import write_secret_file
from .files import tighten
from .tokens import MIN_SECRET_BYTES, generate_secret

__all__ = ["LEGACY_META_KEY", "SECRET_FILE_NAME", "load_or_create", "read_secret", "rotate"]

log = logging.getLogger(__name__)

SECRET_FILE_NAME = "jwt.secret"
LEGACY_META_KEY = "jwt_secret"  # where versions before the secret file kept it, in plain text
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


def _parse(text: str, source: str) -> bytes:
    value = text.strip()
    if not _HEX.fullmatch(value) or len(value) < 2 * MIN_SECRET_BYTES:
        raise ConfigError(f"{source}: must hold the token-signing secret as at least "
                          f"{2 * MIN_SECRET_BYTES} hex digits ({MIN_SECRET_BYTES} bytes) on one line")
    return bytes.fromhex(value)


def read_secret(path: Path) -> bytes:
    """The secret in ``path`` (narrowed to 0600 first if this process owns it and it is open).

    Raises :class:`ConfigError` naming the file when it cannot be read or does not hold at least
    32 bytes as hex."""
    tighten(path)
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII hex"
        raise ConfigError(f"token-signing secret file {path}: cannot read it: {reason}") from exc
    return _parse(text, f"token-signing secret file {path}")


def load_or_create(path: Path, legacy_hex: str | None = None) -> bytes:
    """The secret for this start: read from ``path``; else ``legacy_hex`` (the store's old copy)
    written to ``path``; else a fresh one written to ``path``. The file is written 0600 (its
    directory, if created, 0700). With both a file and ``legacy_hex``, the file wins."""
    if path.exists():
        secret = read_secret(path)
        if legacy_hex:
            log.warning("the store still held a token-signing secret; %s takes precedence and the store's copy "
                        "is deleted", path)
        return secret
    if legacy_hex:
        secret = _parse(legacy_hex, "the store's token-signing secret")
        write_secret_file(path, secret.hex() + "\n")
        log.warning("moved the token-signing secret out of the database into %s (mode 0600). Its old copy may "
                    "survive in the database's free pages and in earlier backups: rotate it "
                    "(dt-coordinator --rotate-jwt-secret, then restart) once workers can fetch new tokens", path)
        return secret
    secret = generate_secret()
    write_secret_file(path, secret.hex() + "\n")
    log.info("created the token-signing secret %s (mode 0600)", path)
    return secret


def rotate(path: Path) -> None:
    """Replace the secret in ``path`` with a fresh random one (atomically, mode 0600)."""
    write_secret_file(path, generate_secret().hex() + "\n")
    log.warning("rotated the token-signing secret in %s: after the coordinator restarts, every JWT signed with "
                "the old one is refused (API keys keep working)", path)

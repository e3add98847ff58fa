"""Bootstrap admin key and the atomic, 0600, no-symlink secret file writer."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_testing.errors import ConfigError
from distributed_testing.security.bootstrap import (
    bootstrap_admin_key,
    write_secret_file,
)
from distributed_testing.security.keys import verify_key
from distributed_testing.security.roles import Role

NOW = 1_700_000_000.0


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_bootstrap_admin_key() -> None:
    plaintext, record = bootstrap_admin_key(NOW)
    assert record.role is Role.ADMIN
    assert record.name == "bootstrap-admin"
    assert record.expires_at is None
    verify_key(plaintext, record, NOW)
    assert bootstrap_admin_key(NOW)[0] != plaintext  # never a fixed key


def test_writes_0600_and_creates_parents(tmp_path: Path, permissive_umask: None) -> None:
    target = tmp_path / "a" / "b" / "admin.key"
    write_secret_file(target, "dtk_secret\n")
    assert target.read_text() == "dtk_secret\n"
    assert _mode(target) == 0o600
    assert _mode(target.parent) == 0o700
    assert sorted(p.name for p in target.parent.iterdir()) == ["admin.key"]


def test_accepts_str_path(tmp_path: Path) -> None:
    write_secret_file(str(tmp_path / "k"), "v")
    assert (tmp_path / "k").read_text() == "v"


def test_replaces_existing_file_atomically(tmp_path: Path) -> None:
    target = tmp_path / "admin.key"
    target.write_text("old")
    os.chmod(target, 0o644)
    old_inode = os.stat(target).st_ino
    write_secret_file(target, "new")
    assert target.read_text() == "new"
    assert _mode(target) == 0o600
    assert os.stat(target).st_ino != old_inode  # a new file renamed into place
    assert [p.name for p in tmp_path.iterdir()] == ["admin.key"]


def test_refuses_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    link = tmp_path / "admin.key"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_secret_file(link, "secret")
    assert victim.read_text() == "keep me"
    assert link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin.key", "victim"]


def test_refuses_dangling_symlink(tmp_path: Path) -> None:
    link = tmp_path / "admin.key"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symbolic link"):
        write_secret_file(link, "secret")
    assert not (tmp_path / "elsewhere").exists()


def test_refuses_directory(tmp_path: Path) -> None:
    (tmp_path / "admin.key").mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        write_secret_file(tmp_path / "admin.key", "secret")


def test_failed_rename_leaves_old_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "admin.key"
    target.write_text("old")

    def fail(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk on fire"):
        write_secret_file(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["admin.key"]


def test_failed_write_leaves_old_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "admin.key"
    target.write_text("old")

    def fail(fd: int, data: object) -> int:
        raise OSError("no space left")

    monkeypatch.setattr(os, "write", fail)
    with pytest.raises(OSError, match="no space"):
        write_secret_file(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["admin.key"]


def test_temp_file_is_private_from_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, permissive_umask: None
) -> None:
    """The temp file is created 0600, so the secret is never readable by others."""
    seen: list[int] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    write_secret_file(tmp_path / "admin.key", "secret")
    assert seen and all(mode == 0o600 for mode in seen)


def test_large_content(tmp_path: Path) -> None:
    text = "x" * 1_000_000
    write_secret_file(tmp_path / "big", text)
    assert (tmp_path / "big").read_text() == text

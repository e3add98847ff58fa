"""The token-signing secret's file and the private-state helpers: creation modes, the move out of
an old database, rotation, refusing malformed secrets, and narrowing state files left open."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from distributed_testing.errors import ConfigError
from distributed_testing.security import files, secret_file


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_first_start_creates_a_private_secret_in_a_private_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "jwt.secret"
    secret = secret_file.load_or_create(path)
    assert len(secret) == 32 and path.read_text() == secret.hex() + "\n"
    assert (mode(path), mode(path.parent)) == (0o600, 0o700)
    assert secret_file.load_or_create(path) == secret  # later starts read it back


def test_a_secret_from_an_old_database_moves_into_the_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    legacy = bytes(range(32))
    path = tmp_path / "jwt.secret"
    assert secret_file.load_or_create(path, legacy.hex()) == legacy
    assert path.read_text().strip() == legacy.hex() and mode(path) == 0o600
    assert "rotate it" in caplog.text
    assert secret_file.load_or_create(path, bytes(range(1, 33)).hex()) == legacy  # the file wins


def test_rotation_replaces_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "jwt.secret"
    first = secret_file.load_or_create(path)
    secret_file.rotate(path)
    assert secret_file.read_secret(path) != first and mode(path) == 0o600


@pytest.mark.parametrize("text", ["", "not hex at all\n", "ab" * 31, "a" * 65])
def test_a_malformed_or_short_secret_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "jwt.secret"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"token-signing secret file {path}: must hold .* at least 64 hex digits"):
        secret_file.load_or_create(path)


def test_an_operators_longer_secret_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "jwt.secret"
    path.write_text("AB" * 48 + "\n")
    assert secret_file.read_secret(path) == b"\xab" * 48


def test_an_open_secret_file_is_narrowed_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "jwt.secret"
    path.write_text("ab" * 32)
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        secret_file.read_secret(path)
    assert mode(path) == 0o600
    assert f"state file {path} had mode 0644, readable by other local users: changed it to 0600" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_of_another_user_is_only_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "theirs"
    path.write_text("x")
    os.chmod(path, 0o644)
    os.chown(path, 65534, 65534)
    with caplog.at_level(logging.WARNING):
        files.tighten(path)
    assert mode(path) == 0o644 and "belongs to uid 65534" in caplog.text


def test_make_private_dir_creates_0700_and_warns_about_an_open_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fresh = tmp_path / "a" / "state"
    files.make_private_dir(fresh)
    assert mode(fresh) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    with caplog.at_level(logging.WARNING):
        files.make_private_dir(open_dir)
    assert mode(open_dir) == 0o755 and f"state directory {open_dir} has mode 0755" in caplog.text
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        files.make_private_dir(tmp_path / "file")


def test_tighten_tree_narrows_a_journal_directory(tmp_path: Path) -> None:
    journal = tmp_path / "c.duckdb.journal"
    journal.mkdir(mode=0o755)
    os.chmod(journal, 0o755)
    seg = journal / "store-00000001.log"
    seg.write_bytes(b"x")
    os.chmod(seg, 0o644)
    files.tighten_tree(journal)
    assert (mode(journal), mode(seg)) == (0o700, 0o600)
    link = tmp_path / "link"
    link.symlink_to(seg)
    files.tighten(link)  # links are not followed


def test_a_file_whose_mode_cannot_change_is_only_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "jwt.secret"
    path.write_text("ab" * 32)
    os.chmod(path, 0o644)

    def read_only(*_a: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(files.os, "chmod", read_only)
    with caplog.at_level(logging.WARNING):
        assert secret_file.read_secret(path) == b"\xab" * 32
    assert "cannot be changed (Read-only file system)" in caplog.text

"""The grammar of a bundle task's Python requirements (tasks/pyreqs.py) and the digest that names
its environment (worker/pyenv.py): what is allowed, what is refused and why, how a
requirements.txt is read, and which changes make a new environment."""

from __future__ import annotations

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.tasks import pyreqs
from distributed_testing.worker.pyenv import env_digest


@pytest.mark.parametrize("entry", [
    "numpy", "numpy>=1.26", "numpy==1.26.4", "transformers[torch]==5.23.0",
    'tomli; python_version < "3.11"', "pkg~=1.0,!=1.0.3", "./mypkg", "./src/pkg_a", "./",
])
def test_allowed(entry: str) -> None:
    assert pyreqs.check(entry) is None


@pytest.mark.parametrize(("entry", "says"), [
    ("", "must not be empty"),
    ("   ", "must not be empty"),
    ("-e .", "pip options are not allowed"),
    ("-r other.txt", "pip options are not allowed"),
    ("--index-url https://evil.example/simple", "pip options are not allowed"),
    ("--extra-index-url=https://evil.example", "pip options are not allowed"),
    ("-f https://evil.example/wheels", "pip options are not allowed"),
    ("--hash=sha256:00", "pip options are not allowed"),
    ("pkg @ https://evil.example/pkg.whl", "URLs and file paths are not allowed"),
    ("pkg@file:///etc", "URLs and file paths are not allowed"),
    ("git+https://evil.example/x.git", "URLs and file paths are not allowed"),
    ("https://evil.example/pkg.tar.gz", "URLs and file paths are not allowed"),
    ("/abs/path", "URLs and file paths are not allowed"),
    ("../outside", "URLs and file paths are not allowed"),
    ("~/pkg", "URLs and file paths are not allowed"),
    ("./a/../../b", "must stay inside the bundle"),
    ("./a b", "letters, digits"),
    ("not a requirement!", "not a valid requirement"),
    ("x" * 201, "at most 200 characters"),
])
def test_refused(entry: str, says: str) -> None:
    reason = pyreqs.check(entry)
    assert reason is not None and says in reason, reason


def test_too_many_entries_are_refused_as_a_list() -> None:
    assert pyreqs.errors(["a"] * 500) == []
    assert pyreqs.errors(["a"] * 501) == [(None, "must hold at most 500 requirements; got 501")]
    assert [i for i, _ in pyreqs.errors(["a", "-e .", "b", "git+https://x"])] == [1, 3]


def test_requirements_txt_drops_comments_and_names_bad_lines() -> None:
    entries, problems = pyreqs.parse_file("# deps\nnumpy>=1  # pinned below\n\n./mypkg\n")
    assert (entries, problems) == (["numpy>=1", "./mypkg"], [])
    _, problems = pyreqs.parse_file("numpy\n-e .\n--index-url https://x\n")
    assert [p.split(":")[0] for p in problems] == ["requirements.txt line 2", "requirements.txt line 3"]


def test_normalise_sorts_strips_and_deduplicates() -> None:
    assert pyreqs.normalise([" b", "a", "b ", ""]) == ["a", "b"]


def _manifest(files: dict[str, str]) -> mf.Manifest:
    return mf.Manifest(files=[mf.FileEntry(path=p, digest=d, size=1, mode=0o644) for p, d in sorted(files.items())])


def test_the_environment_digest_follows_the_requirements_and_the_shipped_package() -> None:
    pkg = _manifest({"mypkg/pyproject.toml": "1" * 64, "mypkg/m/__init__.py": "2" * 64, "test_x.py": "3" * 64})
    base = env_digest(["./mypkg", "numpy"], pkg)
    assert env_digest(["numpy", " ./mypkg", "numpy"], pkg) == base  # order, spaces and repeats do not matter
    other_test = _manifest({"mypkg/pyproject.toml": "1" * 64, "mypkg/m/__init__.py": "2" * 64, "test_x.py": "4" * 64})
    assert env_digest(["./mypkg", "numpy"], other_test) == base  # files outside ./mypkg do not matter
    changed = _manifest({"mypkg/pyproject.toml": "1" * 64, "mypkg/m/__init__.py": "5" * 64, "test_x.py": "3" * 64})
    assert env_digest(["./mypkg", "numpy"], changed) != base
    assert env_digest(["./mypkg", "numpy>=2"], pkg) != base


def test_the_whole_bundle_as_a_package_covers_every_file() -> None:
    one = _manifest({"pyproject.toml": "1" * 64, "m/__init__.py": "2" * 64})
    two = _manifest({"pyproject.toml": "1" * 64, "m/__init__.py": "3" * 64})
    assert env_digest(["./"], one) != env_digest(["./"], two)


@pytest.mark.parametrize("spelling", ["./mypkg/.", "./mypkg/", "./mypkg//", "./mypkg/./", "././/mypkg"])
def test_another_spelling_of_a_bundle_directory_names_it_with_its_files(spelling: str) -> None:
    """``./mypkg/.`` named the environment without mypkg's files: submitter B, shipping another
    mypkg under the same entry, ran in the environment A's mypkg was built into."""
    a = _manifest({"mypkg/pyproject.toml": "1" * 64, "mypkg/m/__init__.py": "2" * 64})
    b = _manifest({"mypkg/pyproject.toml": "1" * 64, "mypkg/m/__init__.py": "6" * 64})
    assert pyreqs.normalise([spelling]) == ["./mypkg"]
    assert env_digest([spelling], a) != env_digest([spelling], b)
    assert env_digest([spelling], a) == env_digest(["./mypkg"], a)


def test_the_bundle_root_has_one_spelling() -> None:
    assert pyreqs.normalise(["./", "./.", ".//", "././"]) == ["./"]

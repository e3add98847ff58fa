"""``dt workers [--state S]`` / ``dt workers drain``: argument parsing and the request it makes. No network."""

from __future__ import annotations

from typing import Any

import pytest

from distributed_testing.cli import dt


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def post(self, path: str, body: Any) -> Any:
        self.calls.append(("POST", path, body))
        return {"worker_id": "w 1", "state": "draining", "deadline_s": body.get("deadline_s", 30.0), "reason": "r"}

    def get(self, path: str, params: Any = None) -> Any:
        self.calls.append(("GET", path, params))
        return {"workers": []}


@pytest.mark.parametrize(("argv", "body"), [
    (["workers", "drain", "w 1"], {}),
    (["workers", "drain", "w 1", "--deadline", "2.5", "--reason", "kernel upgrade"],
     {"deadline_s": 2.5, "reason": "kernel upgrade"}),
])
def test_drain_posts_to_the_drain_route(argv: list[str], body: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    ns = dt.build_parser().parse_args(argv)
    api = Recorder()
    assert ns.run(api, ns) == 0  # type: ignore[arg-type]
    assert api.calls == [("POST", "/api/v1/workers/w%201/drain", body)]
    assert capsys.readouterr().out.startswith("w 1: draining (deadline ")


@pytest.mark.parametrize("argv", [["workers"], ["workers", "list"]])
def test_workers_alone_still_lists(argv: list[str]) -> None:
    ns = dt.build_parser().parse_args(argv)
    api = Recorder()
    assert ns.run(api, ns) == 0  # type: ignore[arg-type]
    assert api.calls == [("GET", "/api/v1/workers", None)]


@pytest.mark.parametrize("argv", [["workers", "--state", "disconnected"], ["workers", "list", "--state", "disconnected"]])
def test_state_filters_the_list(argv: list[str]) -> None:
    ns = dt.build_parser().parse_args(argv)
    api = Recorder()
    assert ns.run(api, ns) == 0  # type: ignore[arg-type]
    assert api.calls == [("GET", "/api/v1/workers?state=disconnected", None)]


def test_state_must_be_one_of_the_four(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        dt.build_parser().parse_args(["workers", "--state", "gone"])
    assert "ready, constrained, draining, disconnected" in capsys.readouterr().err.replace("'", "")


def test_drain_needs_a_worker_id(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        dt.build_parser().parse_args(["workers", "drain"])
    assert "worker_id" in capsys.readouterr().err

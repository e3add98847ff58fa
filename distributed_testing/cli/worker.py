"""``dt-worker`` / ``run_worker_example.py``: run a worker.

Flags and their DT_* variables (flags win) are the rows of ``cli/worker_options.py``. Once the
configuration is read, the credential variables are removed from the process environment, so no
task child inherits them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from aiohttp import web

from ..config import WorkerConfig, environ, read_key_file
from ..errors import ConfigError
from ..process import aio
from ..process.childenv import scrub_environ
from ..process.deadline import ExitDeadline
from ..process.promhttp import serve_metrics
from ..retry import RetriesExhausted
from ..worker import prometheus
from ..worker.agent import WorkerAgent
from ..worker.limits import profile_settings, swap_unavailable_reason
from ..worker.session import SessionRejected
from .common import add_log_flag, setup_logging, tune_gc
from .options import add_settings, resolve
from .worker_options import GROUPS, WORKER_SETTINGS

log = logging.getLogger(__name__)
# Once a stop begins (a signal, or a drain from the coordinator), the process exits within the
# drain's deadline plus this, whatever happens. The stop's own steps after the deadline (hand-back,
# flush, goodbye, closing the connection, the executors and the result store) take seconds; each
# is bounded, but their bounds add up to more (about 75 s) when a task's processes will not die,
# and then this cuts the wait short. Past it, the last resort: what it waited for is logged, its
# child processes are killed, it exits 1.
EXIT_GRACE_S = 60.0


EPILOG = f"""{aio.HELP}

exit status:
  0  stopped cleanly: a signal (SIGTERM, SIGINT) or a drain from the coordinator
  1  gave up connecting: --reconnect-attempts consecutive connects failed (one line on stderr
     says whether no coordinator was ever reached, with the last error); a stop that ran past
     its deadline; --recover --reset-state that could not report everything
  2  could not start: a bad flag or variable, refused credentials (a wrong key or role), a
     registration the coordinator refused, a --db-path another worker holds
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-worker", description="Run a distributed_testing worker.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings(p, WORKER_SETTINGS, GROUPS)
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    """The table's values (flag > variable > default, each checked once), then the rules between
    settings: one credential, a profile's presets under explicit flags, what needs --db-path."""
    values = resolve(WORKER_SETTINGS, ns, env)
    preset = profile_settings(ns.profile, os.cpu_count() or 1) if ns.profile else {}
    values = {**preset, **{k: v for k, v in values.items() if v is not None}}
    if values.get("enable_swap"):
        _enable_swap(values)
    for flag, on in (("--recover", values["recover"]), ("--reset-state", values["reset_state"])):
        if on and values.get("db_path") is None:
            raise ConfigError(f"{flag}: needs --db-path (or DT_DB_PATH); without it the worker keeps no local state")
    values["test_root"] = test_root = Path(values.get("test_root") or Path.cwd()).resolve()
    if not test_root.is_dir():
        raise ConfigError(f"--test-root: {test_root} is not a directory")
    urls = values["coordinator_urls"]
    return WorkerConfig(coordinator_url=urls[0], api_key=_api_key(ns, env), api_key_file=_api_key_file(ns, env),
                        **values)


def _api_key(ns: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """--api-key, --api-key-file, DT_API_KEY, DT_API_KEY_FILE: the first one given. An explicit
    --token or --token-file beats a key from the environment."""
    if ns.api_key and ns.api_key_file:
        raise ConfigError("--api-key and --api-key-file: give one (the file keeps the key out of ps)")
    if ns.api_key or ns.api_key_file:
        return ns.api_key or read_key_file(Path(ns.api_key_file), "--api-key-file")
    if ns.token or ns.token_file:
        return None
    if env.get("DT_API_KEY"):
        return env["DT_API_KEY"]
    if env.get("DT_API_KEY_FILE"):
        return read_key_file(Path(env["DT_API_KEY_FILE"]), "DT_API_KEY_FILE")
    return None


def _api_key_file(ns: argparse.Namespace, env: Mapping[str, str]) -> Path | None:
    """The file :func:`_api_key` read the key from, if it read one: task children must not see it."""
    if ns.api_key_file:
        return Path(ns.api_key_file).absolute()
    if not (ns.api_key or ns.token or ns.token_file or env.get("DT_API_KEY")) and env.get("DT_API_KEY_FILE"):
        return Path(env["DT_API_KEY_FILE"]).absolute()
    return None


def _enable_swap(limits: Mapping[str, object]) -> None:
    """--enable-swap is refused where it would change nothing: without a memory limit to count
    swap in, or on a machine without swap."""
    if limits.get("memory_buffer") is None and limits.get("max_memory_percent") is None:
        raise ConfigError("--enable-swap: counts swap in --memory-buffer and --max-memory-percent; give one of them "
                          "(or a --profile that sets one)")
    if (why := swap_unavailable_reason()) is not None:
        raise ConfigError(f"--enable-swap: {why}; add swap space (swapon) or drop the flag")


async def run_worker(config: WorkerConfig, exit_deadline: ExitDeadline | None = None) -> int:
    """Run a worker until it stops; its exit status. ``exit_deadline``: the process's last resort
    (``entry``), armed when a stop begins and left armed when the agent stopped, so that what
    follows (``asyncio.run`` waits for the default executor's threads) is bounded too; without
    it (a process that runs the worker in-process) one is armed for the stop and disarmed after."""
    from ..worker.factory import build_agent

    if config.reset_state:
        from ..worker.reset import RecoveryIncomplete, recover_then_reset, reset_local_state

        if config.recover:  # report first, reset once the coordinator holds every report
            try:
                await recover_then_reset(config)
            except RecoveryIncomplete as exc:
                log.error("%s", exc)
                return 1
            except RetriesExhausted as exc:
                print(gave_up_line(config, exc, reached=False), file=sys.stderr)
                return 1
            config = dataclasses.replace(config, recover=False)  # the fresh state has nothing to recover
        else:
            await asyncio.to_thread(reset_local_state, config)
    agent = await build_agent(config)
    metrics = None
    if config.metrics_port is not None:
        metrics = await _serve_metrics(agent, config.metrics_host, config.metrics_port)
    try:
        return await _run_agent(agent, exit_deadline)
    finally:
        if metrics is not None:
            await metrics.cleanup()


async def _serve_metrics(agent: WorkerAgent, host: str, port: int) -> web.AppRunner:
    registry = prometheus.registry_for(agent)
    runner, bound = await serve_metrics(lambda: prometheus.render(registry), host, port)
    log.info("metrics on http://%s:%d/metrics (no credential)", host, bound)
    return runner


async def _run_agent(agent: WorkerAgent, exit_deadline: ExitDeadline | None) -> int:
    deadline = exit_deadline or ExitDeadline()
    deadline.loop = asyncio.get_running_loop()
    agent.on_stop = lambda seconds: deadline.arm(seconds + EXIT_GRACE_S, "the worker began to stop")
    runner = asyncio.create_task(agent.run(), name="worker-agent")
    try:
        with _Signals() as signals:
            obeying = asyncio.create_task(_obey(agent, signals, deadline), name="worker-signals")
            await asyncio.wait({runner})
            obeying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await obeying
    finally:
        agent.on_stop = lambda _seconds: None  # a drain still winding down arms nothing from here on
        if exit_deadline is None:  # a process that ran the worker in-process (a test) runs on
            deadline.cancel()
        else:  # the rest of the way out (asyncio.run joins the executor's threads, unbounded) is bounded too
            deadline.arm(EXIT_GRACE_S, "the worker's agent stopped")
    try:
        await runner
    except RetriesExhausted as exc:
        print(gave_up_line(agent.config, exc, reached=agent.sessions > 0), file=sys.stderr)
        return 1
    return 0


def gave_up_line(config: WorkerConfig, exc: RetriesExhausted, *, reached: bool) -> str:
    """The one line ``dt-worker`` ends with when its connects ran out: whether it ever reached a
    coordinator (never: the URL, the network or the coordinator's process is what to check),
    where it tried, and the last attempt's error."""
    cause = exc.__cause__ or exc
    where = ", ".join(config.urls)
    attempts = config.reconnect_attempts
    head = f"dt-worker: gave up after {attempts} attempts (--reconnect-attempts): "
    if not reached:
        return (f"{head}no coordinator was ever reached at {where} (last error: {cause}); check --coordinator "
                "(DT_COORDINATOR_URL) and that the coordinator runs")
    return f"{head}lost the coordinator at {where} and could not reconnect (last error: {cause})"


async def _obey(agent: WorkerAgent, signals: _Signals, deadline: ExitDeadline) -> None:
    """First signal: drain (finish, hand back, flush, goodbye). The second: stop at once. The
    third: exit now (the last resort: child processes killed, exit status 1)."""
    sig = await signals.next()
    log.info("received %s; draining (send it again to stop at once)", sig.name)
    drain = asyncio.create_task(agent.drain(f"received {sig.name}"), name="worker-drain")
    drain.add_done_callback(_outcome_is_logged)
    sig = await signals.next()
    log.warning("received %s again; stopping now (a third one ends the process at once)", sig.name)
    drain.cancel()
    agent.stop()
    sig = await signals.next()
    deadline.now(f"received {sig.name} a third time")


def _outcome_is_logged(task: asyncio.Task[object]) -> None:
    """A drain that failed is logged by the agent (``_shutdown_tasks``), not again here."""
    if not task.cancelled():
        task.exception()


class _Signals:
    """SIGINT and SIGTERM as a queue, for as long as the ``with`` block lasts."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> _Signals:
        self._q: asyncio.Queue[signal.Signals] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self._q.put_nowait, sig)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.remove_signal_handler(sig)

    async def next(self) -> signal.Signals:
        return await self._q.get()


def main(argv: Sequence[str] | None = None, exit_deadline: ExitDeadline | None = None) -> int:
    ns = build_parser().parse_args(argv)
    setup_logging(ns.log_level)
    try:
        config = config_from_args(ns, environ())
        scrub_environ(os.environ, [s for s in (config.api_key, config.token) if s])
        loop = aio.loop_choice()
        tune_gc()
        return aio.run(run_worker(config, exit_deadline), loop)
    except (ConfigError, SessionRejected) as exc:
        print(f"dt-worker: {exc}", file=sys.stderr)
        return 2


def entry() -> int:
    """``dt-worker`` as a process: ``main`` with the process's last resort, which stays armed from
    the moment a stop begins until the process has exited (the event loop's teardown and the
    interpreter's exit wait for threads without a bound). ``main`` without one disarms it once the
    agent stopped, so a process that calls it (a test) runs on."""
    deadline = ExitDeadline()
    code = main(exit_deadline=deadline)
    deadline.arm(EXIT_GRACE_S, "the worker's agent stopped")
    return code


if __name__ == "__main__":
    sys.exit(entry())

"""The environment every task child starts with: the worker's own, minus its credentials.

A task's code (a pytest run, a custom handler, a benchmark's user model, a training rank) must not
find the worker's API key or JWT in its environment: with it, the task could join the pool as this
worker or renew its token. :func:`child_environ` drops every ``DT_*`` variable whose name says it
holds a credential (``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD``: ``DT_API_KEY``, ``DT_TOKEN``,
``DT_API_KEY_FILE``, ...) and any variable whose value contains one of the given secrets (the
worker's key or token, wherever the operator put them). Other variables, credentials of other
services included (``HF_TOKEN``, cloud keys), are the operator's to give tasks and are kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping

_CREDENTIAL_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def is_credential_variable(name: str) -> bool:
    """A ``DT_*`` variable whose name says it holds a credential or points at one."""
    upper = name.upper()
    return upper.startswith("DT_") and any(word in upper for word in _CREDENTIAL_WORDS)


def credential_variables(env: Mapping[str, str], secrets: Iterable[str] = ()) -> list[str]:
    """Names in ``env`` that hold a credential: by name, or because the value contains a secret."""
    known = [s for s in secrets if s]
    return [name for name, value in env.items()
            if is_credential_variable(name) or any(secret in value for secret in known)]


def child_environ(extra: Mapping[str, str] | None = None, secrets: Iterable[str] = (),
                  base: Mapping[str, str] | None = None, drop: Iterable[str] = ()) -> dict[str, str]:
    """``base`` (default: this process's environment) without credentials and without the
    variables named in ``drop``, then ``extra`` over it."""
    env = dict(os.environ if base is None else base)
    for name in [*credential_variables(env, secrets), *(d for d in drop if d in env)]:
        env.pop(name, None)
    env.update(extra or {})
    return env


def scrub_environ(env: MutableMapping[str, str], secrets: Iterable[str]) -> list[str]:
    """Remove the credential variables from ``env`` in place (the worker CLI does this to
    ``os.environ`` once it has read its configuration, so nothing it starts inherits them);
    returns the names removed."""
    names = credential_variables(env, secrets)
    for name in names:
        del env[name]
    return names

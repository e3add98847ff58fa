"""Every pytest where this package is installed imports its plugin (the ``pytest11`` entry
point), with ``--dt-coordinator`` or not: the plugin's module must not import what only a fleet
run needs (the JWT and cryptography code behind ``security``, the bundle upload and its ignore
rules, the environment's capture)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("jwt", "cryptography", "pathspec", "msgspec", "packaging.requirements", "asyncio",
         "distributed_testing.client", "distributed_testing.bundles.upload", "distributed_testing.bundles.environment",
         "distributed_testing.plugin.invocation")


def test_the_plugin_imports_nothing_a_fleet_run_alone_needs() -> None:
    code = ("import sys, pytest; before = set(sys.modules); import distributed_testing.pytest_plugin; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert not [m for m in HEAVY if m in loaded], sorted(loaded)


def test_the_security_package_still_offers_its_names() -> None:
    import distributed_testing.security as security
    from distributed_testing.security import Role, verify_token
    from distributed_testing.security.roles import Role as RoleItself
    from distributed_testing.security.tokens import verify_token as verify_itself

    assert Role is RoleItself and verify_token is verify_itself
    assert security.tls.__name__ == "distributed_testing.security.tls"  # a submodule, bound on use
    assert set(security.__all__) <= set(dir(security)) | set(security._WHERE)

"""What the installed programs import at start is what ``pip install distributed_testing`` installs.

A wheel installed alone (no extras) gave a ``dt-worker`` that died at start with ``No module named
'pytest'``: the test executor imports it, and pytest was only a ``dev`` extra. This test imports
what each entry point loads as it starts (the worker with every executor it builds) in a fresh
interpreter and checks that every distribution those modules come from is in the closure of the
package's own dependencies, extras left out.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

from distributed_testing.testing.suites import dependency_closure

START = '''
import importlib, json, pkgutil, sys
import distributed_testing.worker.executors as ex
for m in ("distributed_testing.cli.worker", "distributed_testing.worker.factory", "distributed_testing.cli.coordinator",
          "distributed_testing.cli.dt", "distributed_testing.cli.dashboard", "distributed_testing.pytest_plugin"):
    importlib.import_module(m)
for i in pkgutil.iter_modules(ex.__path__):
    importlib.import_module("distributed_testing.worker.executors." + i.name)
print(json.dumps(sorted({n.split(".")[0] for n in sys.modules})))
'''
# put on sys.path by the interpreter or this checkout's install, or imported by a dependency only
# when it is present (PyJWT loads cryptography's algorithms if installed; HS256 needs none)
NOT_OURS = {"setuptools", "distributed_testing", "cryptography", "cffi", "pycparser"}


def test_every_module_the_programs_import_at_start_comes_with_the_package() -> None:
    done = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(done.stdout)
    owners = metadata.packages_distributions()
    imported = {re.sub(r"[-_.]+", "-", d).lower() for m in modules for d in owners.get(m, [])}
    installed = dependency_closure("distributed_testing")
    missing = imported - installed - NOT_OURS
    assert not missing, f"imported at start but not a dependency of the package: {sorted(missing)}"

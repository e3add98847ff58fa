"""What a submitter may make a worker run: the pure rules the coordinator and the worker share.

Two kinds of submitter-controlled code reach a worker:

* **User models** (``"model": "package.module:callable"`` of benchmark and training tasks) import
  a module on the worker. That is off unless the worker's operator allows the module by prefix
  (``--allow-model-modules mypkg.models``): a prefix allows itself and its submodules on dotted
  boundaries (``mypkg.models`` allows ``mypkg.models`` and ``mypkg.models.sub``, never
  ``mypkg.modelsX``). Built-in and registry model names contain no colon and need no permission.
  The part after the colon is ONE name (no dots: ``mymodels:torch.os.system`` would walk from an
  allowed module into anything it imports), and what it names must be a class or a function
  *defined* in an allowed module (its ``__module__``), not merely reachable from one (``from os
  import system`` in an allowed module does not allow ``mymodels:system``). The name is checked
  before anything is imported (:func:`refusal`); the definition after the import and before the
  call (:func:`definition_refusal`).
* **pytest arguments** (``test_args``): see :mod:`.pytest_args`.

Pure: no I/O, no environment.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Mapping, Sequence

from ..errors import ConfigError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
ALLOW_MODEL_MODULES_FLAG = "--allow-model-modules"


def is_user_model(name: str) -> bool:
    """A ``module:callable`` model name (registry and built-in names never hold a colon)."""
    return ":" in name


def model_name_error(name: str) -> str | None:
    """Why ``name`` is not a well-formed ``package.module:callable`` (None when it is)."""
    module, _, attr = name.partition(":")
    if not _DOTTED.fullmatch(module):
        return f"model {name!r}: {module!r} is not a dotted module name such as 'mypkg.models'"
    if not _NAME.fullmatch(attr):
        return (f"model {name!r}: {attr!r} must be one name (a class or function defined in module {module!r}, "
                "such as 'make'), not a dotted path")
    return None


def shipped_handler_error(name: str, modules: Sequence[str]) -> str | None:
    """Why ``name`` is not a ``module:function`` handler inside a bundle offering top-level
    ``modules`` (None when it is)."""
    if ":" not in name:
        return (f"custom handler {name!r}: a task with a bundle names its handler as 'module:function' "
                "inside the bundle")
    bad = model_name_error(name)
    if bad is not None:
        return "custom handler" + bad.removeprefix("model")
    top = name.partition(":")[0].split(".")[0]
    if top not in modules:
        return (f"custom handler {name!r}: module {top!r} is not in the bundle (its top-level modules: "
                f"{', '.join(modules) or 'none'})")
    return None


def bundle_modules(files: Iterable[str]) -> tuple[str, ...]:
    """The top-level module names a bundle whose manifest lists ``files`` (relative POSIX paths)
    offers to ``import`` with its root on ``sys.path``: ``NAME.py`` files at the root and the
    directories holding anything, whose NAME is an identifier, sorted. What the worker's
    ``bundles.tree.top_level_modules`` reads from the built tree."""
    names = set()
    for path in files:
        first, sep, _ = path.partition("/")
        name = first if sep else first.removesuffix(".py") if first.endswith(".py") else ""
        if name.isidentifier():
            names.add(name)
    return tuple(sorted(names))


def model_module(imports_model: bool, config: object) -> str | None:
    """The module a task's ``model`` would import on a worker, or None when it names a built-in
    or registry model (or the task's kind has no model: ``imports_model`` false)."""
    if not imports_model or not isinstance(config, Mapping):
        return None
    name = config.get("model")
    if not isinstance(name, str) or not is_user_model(name):
        return None
    return name.partition(":")[0]


def module_allowed(module: str, prefixes: Iterable[str]) -> bool:
    """True when some prefix is ``module`` itself or a dotted parent of it."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def refusal(name: str, prefixes: Iterable[str]) -> str | None:
    """Why a worker allowing ``prefixes`` refuses to import user model ``name`` (None: allowed)."""
    bad = model_name_error(name)
    if bad is not None:
        return bad
    module = name.partition(":")[0]
    if module_allowed(module, prefixes):
        return None
    allowed = ", ".join(sorted(prefixes)) or "none"
    return (f"model {name!r}: this worker does not allow importing module {module!r} (allowed module prefixes: "
            f"{allowed}); its operator can allow it with {ALLOW_MODEL_MODULES_FLAG} {module}")


def definition_refusal(name: str, target: object, prefixes: Iterable[str]) -> str | None:
    """Why ``target``, the object user model ``name`` resolved to, may not be called (None: it may):
    it must be a class or a function whose ``__module__`` an allowed prefix covers."""
    kinds = "class" if inspect.isclass(target) else "function" if inspect.isfunction(target) else None
    origin = getattr(target, "__module__", None) if kinds else None
    if isinstance(origin, str) and module_allowed(origin, prefixes):
        return None
    what = f"a {kinds} from module {origin!r}" if kinds else f"a {type(target).__name__}, not a class or function"
    allowed = ", ".join(sorted(prefixes)) or "none"
    return (f"model {name!r}: {name.partition(':')[2]!r} is not defined in an allowed module (it is {what}; "
            f"allowed module prefixes: {allowed}); a model must be a class or function written in an allowed "
            "module, not one the module imports")


def parse_module_prefixes(text: str, source: str) -> tuple[str, ...]:
    """A comma-separated list of dotted module prefixes; ConfigError naming ``source`` otherwise."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    for item in items:
        if not _DOTTED.fullmatch(item):
            raise ConfigError(f"{source}: {item!r} is not a dotted module name such as mypkg.models")
    return tuple(dict.fromkeys(items))


"""tools/ scripts loaded as modules for their tests (the tools are scripts beside the package, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def tool_module(name: str) -> Iterator[ModuleType]:
    """Yield tools/<name>.py as the module `<name>_tool`, registered in sys.modules while in use (a tool's
    dataclasses resolve their annotations there) and removed after: a module fixture's body, `yield from` it."""
    spec = importlib.util.spec_from_file_location(f"{name}_tool", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]

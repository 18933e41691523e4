"""The package's layers import one way: device/ (runtime) <- kernels/ <- agent/ (stages) <- walkforward/, cli.

A module may import its own layer and the layers below it, never one above: a runtime that imports a
stage's kernels, or kernels that import a stage, make the layers impossible to read (or test) alone.
"""

import ast
from pathlib import Path

import pytest

import fox_numba

PACKAGE = Path(fox_numba.__file__).parent
# What each layer may not import.
FORBIDDEN = {
    "device": ("fox_numba.kernels", "fox_numba.agent", "fox_numba.walkforward", "fox_numba.cli", "fox_numba.actions",
               "fox_numba.features", "fox_numba.market"),
    "kernels": ("fox_numba.agent", "fox_numba.walkforward", "fox_numba.cli"),
    "agent": ("fox_numba.walkforward", "fox_numba.cli"),
}


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downwards(layer):
    bad = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / layer).glob("*.py"))
        for name in imports_of(path)
        if name.startswith(FORBIDDEN[layer])
    ]
    assert not bad, "; ".join(bad)


def test_the_check_sees_a_violation(tmp_path):
    """The import scan finds both import forms (so the test above can fail)."""
    module = tmp_path / "m.py"
    module.write_text("import fox_numba.agent.learner\nfrom fox_numba.kernels import gemm\n")
    assert imports_of(module) == ["fox_numba.agent.learner", "fox_numba.kernels"]

"""The no-copy rule: host<->device only through fox_numba/device (mapped pinned memory).

Three guards: a scan of the package source for explicit copies outside device/; the pytest filter that
turns numba's implicit-copy warning (a plain numpy array passed to a kernel on the GPU) into an error,
checked against the message numba-cuda actually emits; and the launch helpers' refusal of numpy arrays
(tests/device/test_launch_helpers.py), which also holds under the simulator, where numba copies silently.
"""

import ast
import re
import warnings
from pathlib import Path

import numba.cuda
import numpy as np
import pytest
from numba import cuda
from numba.cuda.core.errors import NumbaPerformanceWarning  # the class numba-cuda warns with

import fox_numba

PACKAGE = Path(fox_numba.__file__).parent
DEVICE = PACKAGE / "device"
# Explicit transfers, and host memory that is not mapped (pinned-only or managed).
FORBIDDEN = {"to_device", "copy_to_host", "copy_to_device", "pinned_array", "managed_array"}


def forbidden_calls(source: str) -> list[tuple[int, str]]:
    """(line, name) of every call or import of a forbidden transfer function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in FORBIDDEN:
                found.append((node.lineno, name))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, a.name) for a in node.names if a.name in FORBIDDEN]
    return found


def test_scanner_finds_each_form():
    source = (
        "from numba.cuda import to_device\n"
        "a = cuda.to_device(x)\n"
        "b = d.copy_to_host()\n"
        "d.copy_to_device(x, stream=s)\n"
        "e = to_device(x)\n"
        "f = cuda.managed_array(4)\n"
        "g = stager.upload(x, d)\n"
    )
    assert sorted(forbidden_calls(source)) == [
        (1, "to_device"), (2, "to_device"), (3, "copy_to_host"), (4, "copy_to_device"), (5, "to_device"),
        (6, "managed_array"),
    ]


def test_no_module_outside_device_copies_between_host_and_device():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if DEVICE in path.parents:
            continue
        for line, name in forbidden_calls(path.read_text()):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name}")
    assert not offenders, "use fox_numba.device (Stager, Mapped, copy_device):\n" + "\n".join(offenders)


def numba_implicit_copy_message() -> str:
    """The text numba-cuda warns with when a kernel gets a host array, read from numba-cuda's source."""
    source = (Path(numba.cuda.__file__).parent / "cudadrv" / "devicearray.py").read_text()
    texts = {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "Host array used" in node.value
    }
    assert len(texts) == 1, texts
    return texts.pop()


def test_pytest_turns_numbas_implicit_copy_warning_into_an_error(pytestconfig):
    message = numba_implicit_copy_message()
    filters = [f for f in pytestconfig.getini("filterwarnings") if f.startswith("error:")]
    assert any(re.match(f.split(":", 2)[1], message) for f in filters), (message, filters)
    with pytest.raises(NumbaPerformanceWarning):
        warnings.warn(NumbaPerformanceWarning(message), stacklevel=1)


@cuda.jit
def _double(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * np.float32(2.0)


@pytest.mark.gpu_only("the simulator copies host arrays to kernels without a warning")
def test_a_plain_numpy_array_passed_to_a_kernel_fails_the_test_run():
    with pytest.raises(NumbaPerformanceWarning, match="Host array used in CUDA kernel"):
        _double[1, 4](np.ones(4, np.float32))

"""Fixtures of the environment tests (helpers live in tests/reference_env.py, importable by any test)."""

import pytest
from reference_env import Run


@pytest.fixture
def run_env(stager):
    """Factory: run_env(market, env_config, mode=..., ...) -> a `Run` of kernels and reference side by side."""

    def make(market, env, **kwargs):
        return Run(stager, market, env, **kwargs)

    return make

"""The network and learner as they were before section 43's defaults (tools/results/learner_ablation_h200.md): C51
heads acting on the directions, no mean head, no counterfactual targets, heads started from their Xavier draw (the
default starts them at zero since section 51); and the exact fp32 dense layers (the default is tf32 since section
45), so that on a GPU these tests hold float32 arithmetic to their references. Tests
of the parts that the default counterfactual mean-head learner refuses (a trunk under the crossed columns, IQN,
prioritised replay, n-step returns) or adds to (the layout, the step's kernels) build their configs from here, so
each says which learner it checks."""

from typing import Any

from fox_numba.config import FoxConfig, NetworkConfig

PLAIN_NETWORK = {"mean_head": False, "mean_cross": False, "mirror": False, "head_init_scale": 1.0}
PLAIN_LEARNER = {"counterfactual": False, "counterfactual_held": False}
PLAIN_RUN = {"precision": "fp32"}


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else repr(value)


PLAIN_SECTIONS = (("network", PLAIN_NETWORK), ("learner", PLAIN_LEARNER), ("run", PLAIN_RUN))
PLAIN_OVERRIDES = [f"{section}.{k}={_toml(v)}" for section, plain in PLAIN_SECTIONS for k, v in plain.items()]
"""The same as `--set` overrides, for load_config."""


def plain_network(**fields: Any) -> NetworkConfig:
    """NetworkConfig(**fields) with the plain C51 direction heads unless `fields` says otherwise."""
    return NetworkConfig(**{**PLAIN_NETWORK, **fields})


def plain_config(**sections: Any) -> FoxConfig:
    """FoxConfig(**sections), its network, learner and run plain where `sections` does not give them."""
    cfg = FoxConfig(**sections)
    for name, plain in (("network", PLAIN_NETWORK), ("learner", PLAIN_LEARNER), ("run", PLAIN_RUN)):
        if name not in sections:
            for key, value in plain.items():
                setattr(getattr(cfg, name), key, value)
    return cfg

"""Spectral normalisation of the trunk (network.spectral_norm): the power-iteration vectors and the part a Network
composes (formulas and kernels: kernels/spectral.py).

    vectors = stager.upload_new(init_vectors(layout, seed))   float32 [vectors_len(layout)]: u_l, v_l per layer
    Network(layout, rows, spectral=SpectralKey(vectors, iters))  each trunk layer reads W / sigma

Every trunk layer l (W [in_l, hidden]) has a persistent u_l [hidden] and v_l [in_l]; the one flat buffer holds
u_0, v_0, u_1, v_1, ... back to back (`vector_views`). The learner owns it (Learner.spectral_uv: a fold-reset
registry entry and a checkpoint array); its layout is in ParamLayout.fingerprint, so a checkpoint of another
layout refuses to load.

Who iterates when: the learner's online network runs network.spectral_iters power iterations per layer in every
forward of the step (inside the captured graph: the vectors are device state, nothing comes from the host) and
backpropagates through W / sigma with u, v held constant. The target network, collect, evaluation and the
direction signal read u, v as they are (iters = 0) and use sigma = v^T W u of their own W: the target's and the
averaged network's W drift slowly from the online W the vectors follow, and acting must not move training state.

Initialisation and the fold boundary (`Learner.reset_spectral`): u_l and v_l are unit vectors drawn from
numpy.random.default_rng([seed, l]), then WARMUP_ITERS power iterations run on the current parameters, so the
first collect of a fold (before any gradient step) already reads a converged sigma rather than v^T W u of two
random vectors (near 0, of either sign).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.device.memory import device_empty
from fox_numba.kernels.spectral import spectral_grad, spectral_power, spectral_scale

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout

WARMUP_ITERS = 20
"""Power iterations run on fresh vectors (construction and every fold boundary) before anything reads sigma."""


def layer_widths(layout: ParamLayout) -> list[tuple[int, int]]:
    """(in, out) of every trunk layer."""
    return [(layout.in_dim if k == 0 else layout.hidden, layout.hidden) for k in range(layout.n_layers)]


def vectors_len(layout: ParamLayout) -> int:
    """Floats of the vector buffer: out + in of every trunk layer."""
    return sum(n_in + n_out for n_in, n_out in layer_widths(layout))


def vector_views(layout: ParamLayout, flat: Any) -> list[tuple[Any, Any]]:
    """(u_l [out], v_l [in]) views of a flat vector buffer (host or device), per trunk layer."""
    views, offset = [], 0
    for n_in, n_out in layer_widths(layout):
        views.append((flat[offset : offset + n_out], flat[offset + n_out : offset + n_out + n_in]))
        offset += n_out + n_in
    return views


def init_vectors(layout: ParamLayout, seed: int) -> np.ndarray:
    """float32 [vectors_len]: unit u_l and v_l drawn from default_rng([seed, l]) (module header)."""
    flat = np.zeros(vectors_len(layout), np.float32)
    for layer, (u, v) in enumerate(vector_views(layout, flat)):
        rng = np.random.default_rng([seed % 2**63, layer])
        for part in (u, v):
            x = rng.standard_normal(part.size)
            part[:] = x / np.linalg.norm(x)
    return flat


@dataclass(frozen=True)
class SpectralKey:
    """What a network's spectral normalisation reads: the vector buffer (device) and the power iterations each
    forward runs on it (0: read only)."""

    vectors: Any
    iters: int


def read_only(vectors: Any) -> SpectralKey | None:
    """The key of a network that reads the vectors without iterating (target, acting); None without vectors
    (a layout without spectral normalisation)."""
    return None if vectors is None else SpectralKey(vectors, 0)


class SpectralNorm:
    """The normalised trunk weights of one network (module header), its buffers allocated once."""

    def __init__(self, layout: ParamLayout, key: SpectralKey) -> None:
        if not layout.spectral_norm:
            raise ValueError("SpectralNorm: the layout has no spectral normalisation (network.spectral_norm)")
        if key.iters < 0:
            raise ValueError(f"SpectralNorm: iters must be >= 0, got {key.iters}")
        self.layout, self.key = layout, key
        self.vectors = vector_views(layout, key.vectors)
        self.sigma = device_empty(layout.n_layers, np.float32)
        self.weights = [device_empty(shape, np.float32) for shape in layer_widths(layout)]

    def power(self, p: dict[str, Any], iters: int, *, stream: Any) -> None:
        """`iters` power iterations on every layer's vectors from the parameter views `p`, then its sigma."""
        for layer, (u, v) in enumerate(self.vectors):
            spectral_power(p[f"trunk.{layer}.weight"], u, v, self.sigma, layer, iters, stream=stream)

    def forward(self, p: dict[str, Any], layer: int, *, stream: Any) -> Any:
        """This forward's sigma of trunk layer `layer` (after key.iters iterations) and its W / sigma."""
        u, v = self.vectors[layer]
        w = p[f"trunk.{layer}.weight"]
        spectral_power(w, u, v, self.sigma, layer, self.key.iters, stream=stream)
        spectral_scale(w, self.sigma, layer, self.weights[layer], stream=stream)
        return self.weights[layer]

    def backward(self, g: dict[str, Any], layer: int, *, stream: Any) -> None:
        """Turn layer `layer`'s weight gradient in the views `g` from dL/dW_sn into dL/dW (kernels/spectral.py)."""
        u, v = self.vectors[layer]
        spectral_grad(g[f"trunk.{layer}.weight"], self.weights[layer], u, v, self.sigma, layer, stream=stream)

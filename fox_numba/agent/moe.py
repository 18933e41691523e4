"""Mixture-of-experts heads (network.moe_experts = K > 0): K copies of the dueling C51 head under a per-branch softmax
gate, the part a Network composes in place of its single head (formulas and kernels: kernels/moe.py).

    ParamLayout.build(obs_dim, cfg)     cfg.moe_experts = K: head.weight [H, K HW], head.bias [K HW] (expert k in
                                        columns [k HW, (k + 1) HW)), then moe.weight [H, 4K], moe.bias [4K]
    Network(layout, rows, isv=bus)      the mixture in every forward; `isv` (the learner's online network): the
                                        utilisation of the backward rows, the balance gradient, the signals

What an expert is: a whole head GEMM [H -> HW] (the 4 branch value streams, the 13 advantage streams and the
auxiliary forecast column), so each branch's experts are copies of that branch's dueling head; the K experts' GEMMs
are one [H, K HW] GEMM. The gate reads the same input as the heads (the trunk's last layer, or the observation, or
its VSN gating, without a trunk), so it routes on what the heads see: logits [4K] = x W_m + b_m, a softmax over the
K experts per branch. The head output is the gate-weighted sum of the experts' outputs per branch (a dense mixture,
no top-k: K <= 8 experts of a ~1k-column head are cheap to run in full, and a dense gate is differentiable everywhere,
so no straight-through or noisy top-k estimator is needed), which the dueling combine turns into the gate-weighted
sum of the experts' logits; the auxiliary forecast is the experts' mean (a regression target, not an action value).

Initialisation (`init_params`): every expert block is drawn as the single head is (Xavier with fan-out HW, its own
draw per expert, so the experts differ from the first step and the gate has something to route between); the gate
starts at 0, a uniform mixture, whose fresh logits have 1/sqrt(K) of one head's spread (a smoother start that the
C51 loss rescales in its first steps). With the heads started at zero (network.head_init_scale = 0, the default)
the experts are equal, and under a uniform gate they would stay equal for good (each gets 1/K of the same
gradient, which Adam's normalisation undoes: the mixture is the single head; the market suite measured exactly that,
tools/results/learner_ablation_h200.md section 59); so then the gate is drawn as a trunk layer is (uniform within
sqrt(6 / H)): the mixture still starts at zero, but each expert's gradient is weighted by its own gate per sample,
and the experts part from the first step. Weight decay and the fold boundary's shrink-and-perturb (towards a fresh
draw of the same kind) pull the gate towards that start.

Load balancing: the learner's online network adds lambda sum_b K sum_k u_bk**2 to the loss (u_bk: the batch-mean
gate weight of expert k in branch b, over the s rows), lambda = ISV[MOE_LAMBDA_EFF] driven by the controller in
kernels/moe.py; the signals (utilisation per expert, gate entropy, max utilisation: ISV 118-127, HEALTH_DIAG
moe_*) and the epoch stat moe_balance come from the same usage. The target network, collect, evaluation and the
direction signal run the same mixture forward without the signals (acting reads the mixed logits as it reads a
single head's).

Refused (ConfigError at ParamLayout.build): NoisyNet heads (network.noisy_sigma0 > 0), whose factorised noise and
sigma diagnostics are laid out over one head's columns (kernels/noisy.py). Every other part composes: a trunk's
spectral norm, residual blocks and dropout act below the heads; VSN gates the input both the experts and the gate
read (without a trunk the gate's input gradient joins the VSN backward); IQN reads the same head input beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.actions import N_BRANCHES
from fox_numba.agent.dense import WeightGrad, dense_backward_input, dense_forward
from fox_numba.device.elementwise import axpy_f32
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import device_empty, device_zeros
from fox_numba.kernels.heads import head_width
from fox_numba.kernels.moe import moe_expert_grad, moe_gate_grad, moe_gate_softmax, moe_mix, moe_signals, moe_usage

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout

MOE_PREFIX = "moe."
GATE_W, GATE_B = f"{MOE_PREFIX}weight", f"{MOE_PREFIX}bias"


def moe_entries(width: int, n_experts: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decays) of the gate's layout entries: its dense layer [width -> 4K]."""
    return [(GATE_W, (width, N_BRANCHES * n_experts), True), (GATE_B, (N_BRANCHES * n_experts,), False)]


class MoeHeads:
    """The experts and the gate of one network (module header): buffers allocated once, so a StepGraph captures it."""

    def __init__(self, layout: ParamLayout, batch: int, grad_rows: int, dense: str, *, isv: Any,
                 stream: Any) -> None:
        k, width, hw = layout.moe_experts, layout.head_in, head_width(layout.n_atoms)
        if not k:
            raise ValueError("MoeHeads: the layout has no mixture-of-experts head (network.moe_experts)")
        self.n_experts, self.dense, self.isv, self.grad_rows = k, dense, isv, grad_rows
        self.gate = device_empty((batch, N_BRANCHES * k), np.float32)  # the gate logits, then (in place) weights
        self.experts = device_empty((batch, k * hw), np.float32)
        # per (branch, expert) batch-mean weight, then the branch entropies: written by every forward given the ISV
        self.usage = device_zeros((k + 1) * N_BRANCHES, np.float32, stream=stream)
        self.dexperts = device_empty((grad_rows, k * hw), np.float32)
        self.dgate = device_empty((grad_rows, N_BRANCHES * k), np.float32)
        self.dx = device_empty((grad_rows, width), np.float32)  # the gate's share of the heads' input gradient
        self._wgrad = WeightGrad(dense, grad_rows, width, N_BRANCHES * k)

    def forward(self, p: dict[str, Any], x: Any, out: Any, *, stream: Any) -> None:
        """out [rows, HW] = the mixture of the experts on the heads' input x [rows, width] (the experts' outputs kept
        in `experts`, the gate weights in `gate`); given the ISV, the usage of the first grad_rows rows."""
        dense_forward(self.dense, x, p[GATE_W], p[GATE_B], self.gate, relu=False, stream=stream)
        moe_gate_softmax(self.gate, stream=stream)
        dense_forward(self.dense, x, p["head.weight"], p["head.bias"], self.experts, relu=False, stream=stream)
        moe_mix(self.experts, self.gate, out, stream=stream)
        if self.isv is not None:
            moe_usage(self.gate, self.usage, n_rows=self.grad_rows, stream=stream)

    def signals(self, epoch: Any, *, stream: Any) -> None:
        """ISV 118-128 (the EMAs and the lambda controller) and epoch[MOE_BALANCE] from the last forward's usage."""
        if self.isv is None:
            raise RuntimeError("MoeHeads.signals needs the network built with isv= (the learner's online network)")
        moe_signals(self.usage, self.isv, epoch, n_experts=self.n_experts, stream=stream)

    def backward(self, x: Any, dout: Any, g: dict[str, Any], *, stream: Any) -> Any:
        """From dout [grad_rows, HW] = dL/d(mixed head output): the gate's gradients into the views `g` and the
        experts' output gradient, returned ([grad_rows, K HW]: the head GEMM's dy); x is the heads' input."""
        if self.isv is None:
            raise RuntimeError("MoeHeads.backward needs the network built with isv= (the balance weight and usage)")
        rows = self.grad_rows
        gate = self.gate if int(self.gate.shape[0]) == rows else self.gate[:rows]
        experts = self.experts if int(self.experts.shape[0]) == rows else self.experts[:rows]
        moe_expert_grad(dout, gate, self.dexperts, stream=stream)
        moe_gate_grad(dout, experts, gate, self.usage, self.isv, self.dgate, stream=stream)
        self._wgrad(x, self.dgate, g[GATE_W], g[GATE_B], stream=stream)
        return self.dexperts

    def input_grad(self, p: dict[str, Any], *, act: Any, stream: Any) -> Any:
        """The gate's share of the heads' input gradient, dgate W_m^T (masked where act <= 0 when given), in `dx`."""
        dense_backward_input(self.dense, self.dgate, p[GATE_W], self.dx, act=act, stream=stream)
        return self.dx

    def add_input_grad(self, p: dict[str, Any], dx: Any, *, act: Any, stream: Any) -> None:
        """dx [grad_rows, width] += the gate's share of the heads' input gradient (`input_grad`)."""
        own = self.input_grad(p, act=act, stream=stream)
        launch_strided(axpy_f32, dx.size, dx.reshape(dx.size), np.float32(1.0), own.reshape(own.size), i32(dx.size),
               stream=stream)

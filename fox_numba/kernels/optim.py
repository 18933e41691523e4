"""Optimiser kernels that run inside the captured training step.

Launch shape: 1-D, one thread per parameter, through `fox_numba.device.launch.launch`.
Constraints: per-step scalars (tau_eff, lr_eff, clip_eff, the step) are read from the control block
(`ctl[0].<field>`, a CONTROL_DTYPE record in device memory), never passed as arguments, because a
captured graph would freeze them; arrays are C-contiguous float32; `n` (int32) counts the parameters.
"""

from numba import cuda, float32, from_dtype, int32

from fox_numba.device.control import CONTROL_DTYPE
from fox_numba.kernels.registry import register

_CONTROL = from_dtype(CONTROL_DTYPE)


@register((float32[::1], float32[::1], _CONTROL[::1], int32))
@cuda.jit
def polyak_update(target, online, ctl, n):
    """target[i] += tau_eff * (online[i] - target[i]), tau_eff read from the control block."""
    i = cuda.grid(1)
    if i < n:
        tau = ctl[0].tau_eff
        target[i] = target[i] + tau * (online[i] - target[i])

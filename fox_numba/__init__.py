"""fox_numba: walk-forward training of a distributional, branching-action DQN on order-book data.

Hot work runs as Numba-CUDA kernels; Python drives. The data flow, stage by stage:
market store (`market`) -> features (`features`) -> folds (`walkforward`) -> collect / train / evaluate
(`agent`, on the GPU through `device` and `kernels`) -> HEALTH_DIAG and profiling (`diag`).

Importing the package decides GPU or CUDA simulator once, before numba loads (`accelerator.py`), and keeps the
host's numerical libraries at one thread unless set (`host_threads.py`), before numpy loads.
"""

from fox_numba.accelerator import choose_backend
from fox_numba.host_threads import limit_host_threads

choose_backend()
limit_host_threads()

__version__ = "0.1.0"

"""One tensor of a flat parameter buffer (agent/network.py ParamLayout, agent/tlob.py TlobLayout): its own module so
that the network and the encoders it composes can both name it without importing each other."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamEntry:
    """One tensor of the flat parameter buffer."""

    name: str
    offset: int
    shape: tuple[int, ...]
    decay: bool  # weight decay applies (weights) or not (biases)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stop(self) -> int:
        return self.offset + self.size

"""The branching action space: branch names, sizes, head offsets and bin meanings, in one place.

An action is one bin per branch, stored as int32[4] in branch order (direction, magnitude, order type,
urgency). The network emits one C51 value distribution per bin ("action head"); heads are laid out
branch after branch, so the head of bin k of a branch is `branch.offset + k`:

    direction 0-3 | magnitude 4-6 | order type 7-9 | urgency 10-12        N_HEADS = 13

Direction Hold or Flat opens no new exposure, so its magnitude is always recorded as bin 0 (the seed's
Hold/Flat -> magnitude 0 short-circuit): the magnitude branch then learns nothing from those steps.
The module-level integers are read by kernels as compile-time constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Direction(IntEnum):
    """The position the agent wants to hold after this bar."""

    SHORT = 0  # be short `magnitude` of the maximum position
    HOLD = 1  # keep the current position unchanged
    LONG = 2  # be long `magnitude` of the maximum position
    FLAT = 3  # close the position


class Magnitude(IntEnum):
    """Size of a Short or Long target, as a fraction of `env.max_position` (MAGNITUDE_FRACTIONS)."""

    QUARTER = 0
    HALF = 1
    FULL = 2


MAGNITUDE_FRACTIONS: tuple[float, ...] = (0.25, 0.5, 1.0)


class OrderType(IntEnum):
    """How the position change is sent to the book."""

    MARKET = 0  # cross the spread now
    LIMIT_JOIN = 1  # rest at the best price on our side (join the queue)
    LIMIT_IMPROVE = 2  # rest one tick inside the spread


class Urgency(IntEnum):
    """How long a resting limit order may wait before it is cancelled (Market orders ignore it)."""

    PATIENT = 0
    NORMAL = 1
    URGENT = 2


@dataclass(frozen=True)
class Branch:
    """One action branch: its name, its bins (an IntEnum) and the index of its first head."""

    name: str
    bins: type[IntEnum]
    offset: int

    @property
    def size(self) -> int:
        return len(self.bins)

    def head(self, bin_index: int) -> int:
        """The head (index into the network's A axis) of bin `bin_index` of this branch."""
        if not 0 <= bin_index < self.size:
            raise ValueError(f"{self.name} has bins 0..{self.size - 1}, not {bin_index}")
        return self.offset + bin_index


BRANCHES: tuple[Branch, ...] = (
    Branch("direction", Direction, 0),
    Branch("magnitude", Magnitude, 4),
    Branch("order", OrderType, 7),
    Branch("urgency", Urgency, 10),
)
N_BRANCHES = len(BRANCHES)
N_HEADS = sum(b.size for b in BRANCHES)

# Kernel constants (plain ints: numba freezes module globals at compile time).
N_DIRECTIONS = len(Direction)
DIR_OFFSET, MAG_OFFSET, ORDER_OFFSET, URGENCY_OFFSET = (b.offset for b in BRANCHES)
SHORT, HOLD, LONG, FLAT = (int(d) for d in Direction)

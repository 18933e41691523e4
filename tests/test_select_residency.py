"""tools/select_residency.py's PTX counts, on a hand-written PTX fragment whose counts are known."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from select_residency import ptx_counts  # noqa: E402

PTX = """\tld.param.u64 \t%rd1, [p0];
\tmul.hi.s64 \t%rd2, %rd1, 8680820740569200761;
\tadd.s32 \t%r1, %r2, 5;
\tmul.wide.u32 \t%rd3, %r1, 4;
\t@%p1 bra \t$L__BB0_2;
\tdiv.s64 \t%rd4, %rd3, %rd1;
\tdiv.u32 \t%r3, %r1, %r2;
\tdiv.rn.f32 \t%f1, %f2, %f3;
\tcvt.u32.u64 \t%r4, %rd4;
\tadd.f32 \t%f4, %f1, %f2;
"""


def test_ptx_counts_counts_64_bit_integer_operations_and_integer_divisions() -> None:
    lines, ops64, divs = ptx_counts(PTX)
    assert lines == 10
    # ld.param.u64, mul.hi.s64, div.s64, cvt.u32.u64; not mul.wide.u32 (32-bit operands), add.s32, the float ops
    assert ops64 == 4
    assert divs == 2  # div.s64 and div.u32; div.rn.f32 is a float division

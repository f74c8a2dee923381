"""kiln/codegen/cpp/prelude.h: the max and min a vector lane accumulates with are the sequential ones, bit for bit.

A max or min in lane tiles updates each lane with `maximum_in_lanes` / `minimum_in_lanes` (branch-free, so the loop
vectorizes); the tail of the row, the merge of the lanes and every pointwise max use `maximum` / `minimum` (branchy,
faster in a sequential chain). Both must give the same bits for every pair of operands: NaNs of either sign and any
payload (the first operand's NaN wins, then the second's), signed zeros (the first wins between equal values),
infinities, subnormals, and integers. Each pair is checked in a loop the compiler vectorizes, as the kernels run it.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import kiln
from kiln.runtime.cache import CXX_FLAGS, LIBS

PRELUDE = Path(kiln.__file__).parent / "codegen" / "cpp" / "prelude.h"

PROGRAM = r"""
#include "prelude.h"
#include <cstdio>
#include <vector>

template <typename T, typename Bits> int check(const std::vector<Bits>& specials) {
  std::vector<T> a, b;
  for (Bits x : specials) for (Bits y : specials) {
    T tx, ty;
    std::memcpy(&tx, &x, sizeof(T));
    std::memcpy(&ty, &y, sizeof(T));
    a.push_back(tx);
    b.push_back(ty);
  }
  const int64_t n = static_cast<int64_t>(a.size());
  std::vector<T> max_lanes(n), min_lanes(n);
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    max_lanes[i] = kiln::maximum_in_lanes<T>(a[i], b[i]);
    min_lanes[i] = kiln::minimum_in_lanes<T>(a[i], b[i]);
  }
  int wrong = 0;
  for (int64_t i = 0; i < n; i++) {
    T want_max = kiln::maximum<T>(a[i], b[i]), want_min = kiln::minimum<T>(a[i], b[i]);
    wrong += std::memcmp(&want_max, &max_lanes[i], sizeof(T)) != 0;
    wrong += std::memcmp(&want_min, &min_lanes[i], sizeof(T)) != 0;
  }
  return wrong;
}

int main() {
  std::vector<uint32_t> f32 = {0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x7f800000, 0xff800000, 0x7fc00000,
                               0xffc00000, 0x7fc00001, 0xffc12345, 0x7f800001, 0x00000001, 0x80000001, 0x7f7fffff,
                               0x3f800001};
  std::vector<uint64_t> f64 = {0x0ull, 0x8000000000000000ull, 0x3ff0000000000000ull, 0x7ff0000000000000ull,
                               0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000001ull,
                               0x7ff8000000000abcull, 0x0000000000000001ull, 0xbff0000000000000ull};
  std::vector<uint32_t> i32 = {0u, 1u, 0xffffffffu, 0x7fffffffu, 0x80000000u, 42u};
  printf("%d %d %d\n", check<float>(f32), check<double>(f64), check<int32_t>(i32));
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs the C++ compiler kiln's CPU target uses")
def test_the_lane_forms_give_the_sequential_forms_bits(tmp_path):
    (tmp_path / "check.cpp").write_text(PROGRAM)
    binary = tmp_path / "check"
    flags = [f for f in CXX_FLAGS if f not in ("-shared", "-fPIC")]  # the kernels' flags, for a program
    subprocess.run(["g++", *flags, f"-I{PRELUDE.parent}", str(tmp_path / "check.cpp"), "-o", str(binary), *LIBS],
                   check=True, timeout=120)
    done = subprocess.run([str(binary)], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["0", "0", "0"], done.stdout  # mismatching pairs: float, double, int32

"""Which CPython runs a benchmark, in the terms that move its figures (the hack/bench*
scripts print it).

Pure, reads only ``/proc/self/maps``. Neighbours: :mod:`hack.bench_extender`,
:mod:`hack.bench_instructions`.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path


def describe() -> str:
    """``<executable> (CPython <version>, shared libpython | libpython linked in)``: whether
    libpython is a shared library or linked into the executable. The two builds on the
    project's VM differ by 7–8 % in the extender's handler CPU (12 % in instructions, 23 % on
    a pure-Python loop): pyenv's default build (``--enable-shared``, no
    ``--enable-optimizations``) and Debian's ``python3.11``, the interpreter of the images
    (``hack/build-images.sh``), which Debian links statically and builds with profile-guided
    optimization (docs/results/benchmarks.md, round 10)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        linked = "libpython: unknown"
    else:
        linked = "shared libpython" if "libpython" in maps else "libpython linked in"
    return f"{sys.executable} (CPython {platform.python_version()}, {linked})"

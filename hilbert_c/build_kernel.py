"""cffi build scripts (API / out-of-line mode) for the compiled modules of `hilbert_c`.

Run by setuptools at install (`cffi_modules` in setup.py). The default build is portable
`-O3` (no `-march=native`): GEOFENCE_KERNEL_CFLAGS adds flags for a local build.

Two modules from the same C sources, because of one trade-off:
- `hilbert_c._kernel`: batch calls and the covering. cffi releases the GIL around each call,
  so batches run in parallel with other Python threads.
- `hilbert_c._scalar`: the scalar encode/decode, a ~5 ns computation. Releasing the GIL and
  saving errno around it (what cffi emits for every call) costs ~190 ns on this machine, 3x
  the call itself, so this module keeps the GIL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

# The C signatures are written once, in hilbert.h: the cdefs are read from it. cffi's cdef
# takes declarations and `#define NAME ...` constants, so comments, the include guard and the
# #includes are dropped, and each integer #define becomes `#define NAME ...` (its value comes
# from the compiler). The scalar calls go to `_scalar` only, everything else to `_kernel`.
SCALAR_CALLS = ("hk_encode", "hk_decode", "axes_to_line_2D_26b")


def cdefs(header: str) -> tuple[str, str]:
    """(the `_kernel` cdef, the `_scalar` cdef) from hilbert.h's text."""
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    defines = [f"#define {m.group(1)} ..." for m in re.finditer(r"^#define\s+(HK_\w+)\s+\S+", text, re.M)]
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    types = [m.group(0) for m in re.finditer(r"typedef\s+struct\s*\{[^}]*\}\s*\w+\s*;", body)]
    body = re.sub(r"typedef\s+struct\s*\{[^}]*\}\s*\w+\s*;", "", body)
    calls = [" ".join(m.group(0).split()) for m in re.finditer(r"[^;{}]+\([^;{}]*\)\s*;", body)]

    def name(decl: str) -> str:
        found = re.search(r"(\w+)\s*\(", decl)
        assert found is not None, decl
        return found.group(1)

    kernel = [c for c in calls if name(c) not in SCALAR_CALLS]
    scalar = [c for c in calls if name(c) in SCALAR_CALLS]
    if len(scalar) != len(SCALAR_CALLS):
        raise RuntimeError(f"hilbert.h does not declare every scalar call {SCALAR_CALLS}")
    return "\n".join([*types, *kernel, *defines]), "\n".join(scalar)


CDEF, SCALAR_CDEF = cdefs((HERE / "hilbert.h").read_text())

# Appended after cffi's own helper macros and before the wrappers it generates: the
# wrappers of this module then neither drop the GIL nor touch errno.
KEEP_GIL = """
#undef Py_BEGIN_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#undef Py_END_ALLOW_THREADS
#define Py_END_ALLOW_THREADS }
#undef _cffi_restore_errno
#define _cffi_restore_errno() ((void)0)
#undef _cffi_save_errno
#define _cffi_save_errno() ((void)0)
"""


def _options() -> dict[str, object]:
    return {
        "include_dirs": ["hilbert_c"],
        "extra_compile_args": ["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-math-errno",
                               "-ffp-contract=off",
                               # declared in exchanges/settings_registry.py; read here, the one
                               # read outside it, as setup.py builds this before the package exists
                               *os.environ.get("GEOFENCE_KERNEL_CFLAGS", "").split()],
        "libraries": ["m"],
    }


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "hilbert_c._kernel",
    '#include "hilbert.h"',
    sources=[str(Path("hilbert_c") / name)
             for name in ("curve.c", "covering.c", "contains.c", "search.c", "proximity.c")],
    **_options(),
)

scalar_builder = FFI()
scalar_builder.cdef(SCALAR_CDEF)
scalar_builder.set_source(
    "hilbert_c._scalar",
    '#include "hilbert.h"\n' + KEEP_GIL,
    sources=[str(Path("hilbert_c") / "curve.c")],
    **_options(),
)

if __name__ == "__main__":
    os.chdir(HERE.parent)
    ffibuilder.compile(verbose=True)
    scalar_builder.compile(verbose=True)

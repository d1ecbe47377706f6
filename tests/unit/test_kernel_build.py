"""The C signatures are written once (hilbert_c/hilbert.h); the cffi cdefs are read from it
(hilbert_c/build_kernel.py), and what they declare is what the compiled modules offer."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from hilbert_c import _kernel, _scalar

HERE = Path(__file__).resolve().parents[2] / "hilbert_c"


def build_kernel():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("build_kernel", HERE / "build_kernel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_call_and_constant_of_the_header_is_in_a_compiled_module() -> None:
    header = re.sub(r"/\*.*?\*/", "", (HERE / "hilbert.h").read_text(), flags=re.S)
    calls = set(re.findall(r"(\w+)\s*\([^;{}()]*\)\s*;", header))
    constants = set(re.findall(r"^#define\s+(HK_\w+)\s+\S", header, re.M))
    assert {"hk_cover_many", "hk_encode", "hk_points_in_polygons"} <= calls and "HK_E_BUDGET" in constants
    kernel, scalar = set(dir(_kernel.lib)), set(dir(_scalar.lib))
    assert calls <= kernel | scalar and constants <= kernel
    assert scalar == set(build_kernel().SCALAR_CALLS)  # the scalar module keeps the GIL: only those
    assert not scalar & kernel


def test_a_header_without_the_scalar_calls_is_refused() -> None:
    bk = build_kernel()
    with pytest.raises(RuntimeError, match="scalar call"):
        bk.cdefs("int64_t hk_encode_many(const uint32_t *xs, size_t n);\n")
    kernel, scalar = bk.cdefs("/* x */\n#define HK_A 1\nuint64_t hk_encode(int64_t x, int64_t y, int bits);\n"
                              "uint64_t hk_decode(uint64_t h, int bits);\n"
                              "uint64_t axes_to_line_2D_26b(uint32_t x,\n   uint32_t y);\nint f(int a);\n")
    assert kernel == "int f(int a);\n#define HK_A ..."
    assert scalar.splitlines()[-1] == "uint64_t axes_to_line_2D_26b(uint32_t x, uint32_t y);"

# The C kernel is compiled at install time by cffi in API (out-of-line) mode:
# hilbert_c/build_kernel.py declares the C interface and sources.
from setuptools import setup

setup(
    cffi_modules=[
        "hilbert_c/build_kernel.py:ffibuilder",
        "hilbert_c/build_kernel.py:scalar_builder",
    ]
)

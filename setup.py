"""Build the optional C kernels: the rounding engine's and the analyzer's histograms; fpsim works without them
(numpy and torch paths)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fpsim._fastround",
            sources=["fpsim/_fastround.c"],
            extra_compile_args=["-O3"],
            optional=True,  # no compiler: install anyway and use the numpy engine
        ),
        Extension(
            "fpsim._fasthist",
            sources=["fpsim/_fasthist.c"],
            extra_compile_args=["-O3"],
            optional=True,  # no compiler: install anyway and count with torch operations
        ),
    ]
)

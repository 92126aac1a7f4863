"""Build the optional C kernel of the rounding engine; fpsim works without it (numpy path)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fpsim._fastround",
            sources=["fpsim/_fastround.c"],
            depends=["fpsim/_fastround_width.h"],
            extra_compile_args=["-O3"],
            optional=True,  # no compiler: install anyway and use the numpy engine
        )
    ]
)

"""Packages, the study scripts and the optional C kernels (the rounding engine's, MX block
quantisation's and the analyzer's histograms); fpsim works without them (numpy and torch paths).

The study scripts live in the top-level studies/ folder (they regenerate docs/) and ship
inside the wheel as the package fpsim.study_scripts, so that `fpsim study` runs from an install.
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=find_packages(include=["fpsim", "fpsim.*"]) + ["fpsim.study_scripts"],
    package_dir={"fpsim.study_scripts": "studies"},
    ext_modules=[
        Extension(
            "fpsim._fastround",
            sources=["fpsim/_fastround.c"],
            depends=["fpsim/_fastround_width.h", "fpsim/_fastcompile.h"],
            extra_compile_args=["-O3"],
            optional=True,  # no compiler: install anyway and use the numpy engine
        ),
        Extension(
            "fpsim._fastblocks",
            sources=["fpsim/_fastblocks.c"],
            depends=["fpsim/_fastcompile.h"],
            # -fno-trapping-math: its element loops select between integer-to-float conversions, which
            # gcc vectorises only when it may assume that no floating-point exception traps (none is
            # ever enabled; no result changes)
            extra_compile_args=["-O3", "-fno-trapping-math"],
            optional=True,  # no compiler: install anyway and quantise MX blocks through the general path
        ),
        Extension(
            "fpsim._fasthist",
            sources=["fpsim/_fasthist.c"],
            depends=["fpsim/_fastcompile.h"],
            extra_compile_args=["-O3"],
            optional=True,  # no compiler: install anyway and count with torch operations
        ),
    ],
)

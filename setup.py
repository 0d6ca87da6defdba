"""The one thing pyproject.toml cannot say: the optional native box kernel.

``boxwatch.agent._boxkernel`` speeds up box tests; when no C compiler is available the build
skips it (``optional=True``) and ``boxwatch.agent.boxes`` does the same work with numpy.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "boxwatch.agent._boxkernel",
            sources=["agent/_boxkernel.c"],
            # No fused multiply-add: distances must round exactly like the numpy path.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"],
            optional=True,
        )
    ]
)

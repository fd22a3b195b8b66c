"""The package's version: one place, read by the build (pyproject) and by the code."""

__version__ = "0.1.0"

"""Finds the packages, so a new sub-package or plugin folder can never be left out of the wheel; the rest of
the metadata is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hwplace", "hwplace.*"]),
                "hwplace_plugins", *(f"hwplace_plugins.{name}" for name in find_packages("plugins"))])

"""The version of hwplace."""

__version__ = "0.1.0"

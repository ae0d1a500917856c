"""Layer 1, foundation: the error hierarchy, every ``HWPLACE_*`` setting, message wording, frozen containers
and the version. Imports nothing of hwplace outside this layer."""

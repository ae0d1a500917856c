"""Layer 7, runtime: workers (``worker``, which reaches what a worker may never use through ``deferred``, on first
use), their hosting inside a process (``hosting``) and worker groups (``group``), and the RL primitives in rooms
of their own: ``messaging`` (send, recv, broadcast between any two workers), ``weight_sync`` (versioned weights
from a source to its targets, one class per transport) and ``turns`` (taking turns on shared accelerators).
Imports the layers below; the rooms import each other only as their docstrings say."""

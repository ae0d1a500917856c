"""The checks of ``benchmarks/gpu_check.py``: hwplace's CUDA paths (NVML detection, CUDA IPC device slots, the
device digest, NCCL pairs, weight-sync planning) exercised on a real GPU, each in a process of its own.

:mod:`.harness` makes hwplace importable without installing it, runs each check in a fresh interpreter with a
time limit and writes the JSON report; :mod:`.peers` holds what the checks' spawned processes share (a
key-value stand-in for an executor, a messaging pair without one); the checks live in :mod:`.nvml_checks`,
:mod:`.slot_checks`, :mod:`.nccl_checks` and :mod:`.e2e_checks`. Importing this package imports neither torch
nor hwplace.
"""

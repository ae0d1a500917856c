"""Layer 2, contracts and records: what a hardware backend and an executor implement, the hook specs, and the
records passed between layers (``Device``, ``Node``, ``Placement``, ``WorkerContext``). Imports the foundation."""

"""Layer 4, configuration: reading a config (YAML, mapping, OmegaConf), the placement-string grammar, and the
whole job file parsed once into a ``JobConfig`` (``cluster:`` and ``weight_sync:`` as records) that is passed
on. Imports the layers below."""

"""Layer 4, configuration: reading a config (YAML, mapping, OmegaConf), the placement-string grammar, and the
``cluster:`` section validated once into records. Imports the layers below."""

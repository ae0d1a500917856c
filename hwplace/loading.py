"""Reading a whole configuration: a YAML file path, a mapping, or an OmegaConf container, into plain data.

Validation of the ``cluster:`` section lives in :mod:`hwplace.config`; this module only turns what the user
gave into plain dicts, lists and scalars, or raises :class:`~hwplace.ConfigError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hwplace.errors import ConfigError

# -- YAML ----------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2 integers: ``1:30`` stays a string (not the base-60 ``90``)."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
)


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | Any) -> dict[str, Any]:
    """A whole configuration as plain dicts and lists, from a YAML path, a mapping or an OmegaConf object."""
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError("", f"cannot read config file {str(path)!r}: {exc.strerror}") from None
        try:
            loaded = yaml.load(text, Loader=_YamlLoader)
        except yaml.YAMLError as exc:
            raise ConfigError("", f"{path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError("", f"{path} must hold a mapping at the top level",
                              value=type(loaded).__name__)
        return loaded
    plain = to_plain(source)
    if not isinstance(plain, dict):
        raise ConfigError("", "a config is a YAML file path, a mapping or an OmegaConf DictConfig",
                          value=type(source).__name__)
    return plain


def to_plain(value: Any) -> Any:
    """Turn OmegaConf containers (without importing OmegaConf otherwise) and mappings into dicts/lists."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # only reached when the caller already uses OmegaConf

        try:
            return OmegaConf.to_container(value, resolve=True)
        except Exception as exc:
            raise ConfigError("", f"cannot resolve the OmegaConf config: {exc}") from None
    if isinstance(value, Mapping):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(item) for item in value]
    return value

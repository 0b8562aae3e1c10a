"""``${NAME}`` references in source configs, so secrets live in the environment, not the catalog."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from flight_gateway.errors import InvalidArgument

_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_config(config: Any, env: Mapping[str, str] | None = None, *, where: str = "") -> Any:
    """Return ``config`` with every ``${NAME}`` in its strings replaced from ``env``.

    A reference to an unset variable is an error naming the variable, never an empty string.
    """
    env = os.environ if env is None else env

    def sub(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                raise InvalidArgument(
                    f"{where or 'config'} references ${{{name}}}, which is not set"
                )
            return env[name]

        return _REF.sub(one, text)

    if isinstance(config, str):
        return sub(config)
    if isinstance(config, Mapping):
        return {k: resolve_config(v, env, where=where) for k, v in config.items()}
    if isinstance(config, list):
        return [resolve_config(v, env, where=where) for v in config]
    return config

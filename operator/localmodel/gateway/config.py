"""Gateway settings: flags, each also readable from LOCALMODEL_GATEWAY_<FLAG>.

Pure: `parse_config` takes the argument list and an environment mapping and
returns a frozen `GatewayConfig`, or raises `ConfigError` naming the flag.
Flags win over the environment; the environment wins over the defaults.
Each setting is written once, in `GatewayConfig` (localmodel.gateway_contract,
where the renderer reads the variables' names too): default, help and parser
(`localmodel.settings.setting`); the flag table and `USAGE` are read from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from localmodel.gateway_contract import (
    ENV_PREFIX,
    FLAGS,
    OVERFLOW_API_KEY_ENV,
    GatewayConfig,
    env_name,
)
from localmodel.settings import ConfigError, field_values, parse_argv, usage_lines

__all__ = ["DOORMAN_FLAG", "USAGE", "ConfigError", "parse_config"]

DOORMAN_FLAG = "--doorman"  # the doorman's mode (gateway/doorman.py): a switch, no value

USAGE = f"""usage: localmodel gateway [{DOORMAN_FLAG}] [--FLAG VALUE ...]

{DOORMAN_FLAG}: answer as a released model's doorman (no engine; docs/idle.md).

flags (each also read from {ENV_PREFIX}<FLAG>, e.g. {env_name("max-queue")}):
{usage_lines(FLAGS)}

The overflow endpoint's API key is read from {OVERFLOW_API_KEY_ENV} only.
"""


def _collect(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """Raw values by flag: the environment's (empty: not set), then the flags'."""
    raw = {name: env[env_name(name)] for name in FLAGS if env.get(env_name(name))}
    raw.update(parse_argv(FLAGS, argv))
    return raw


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> GatewayConfig:
    """Build the settings from flags and environment; raise ConfigError on a bad value."""
    raw = _collect(argv, env)
    kwargs = field_values(FLAGS, raw)
    key = env.get(OVERFLOW_API_KEY_ENV, "").strip()
    if key:
        kwargs["overflow_api_key"] = key
    config = GatewayConfig(**kwargs)
    if config.overflow and not config.overflow_model:
        raise ConfigError("overflow-model", "required with --overflow-url")
    if not config.overflow and (config.overflow_model or "overflow-after" in raw):
        raise ConfigError("overflow-url", "required with --overflow-model and --overflow-after")
    return config

"""The full configuration schema with RAGEN-2's defaults, as a config file (`--config=configs/base.py`); the schema
lives in the library, `ragen_jax/defaults.py`, so that the library never imports `configs`."""
from ragen_jax.defaults import get_config

__all__ = ["get_config"]

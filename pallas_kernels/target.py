"""The platform a call is traced for, which picks the kernels (GPU or TPU) and their checks."""

from __future__ import annotations

import jax


def platform() -> str:
    """"gpu", "tpu" or "cpu": the device of the current abstract mesh where it names one (a
    mesh in use, or `jax.sharding.use_abstract_mesh` with an `AbstractDevice`: how a CPU host
    lowers for a TPU, `tests/helpers.lower_for_tpu`), else the default backend's."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    platform = jax.default_backend() if device is None else device.platform
    return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)

"""Multi-process (multi-host) start-up: `jax.distributed.initialize` from flags or environment.

Every process of a job runs the same command; each reads its own slice of every global batch
(`hybrid_jax.data.pipeline.train_iterator`) and `to_device` assembles the global arrays with
`jax.make_array_from_process_local_data`. Orbax checkpoints are written by all processes
together and restore onto any number of processes and devices; only process 0 writes logs,
metrics and results.

Settings, from the arguments or else the environment:

    coordinator        HYBRID_JAX_COORDINATOR       host:port of process 0
    num_processes      HYBRID_JAX_NUM_PROCESSES
    process_id         HYBRID_JAX_PROCESS_ID
    local_device_ids   HYBRID_JAX_LOCAL_DEVICE_IDS  e.g. 0,1 (default: all of the host's)

With none of them the job is a single process, unless `auto` asks JAX to detect the cluster
(SLURM, Open MPI, TPU pods, ...). Only `auto` lets that detection fill in what is unset (under
SLURM / Open MPI it gives each process one device, that of its local rank).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

ENVIRONMENT = {"coordinator": "HYBRID_JAX_COORDINATOR",
               "num_processes": "HYBRID_JAX_NUM_PROCESSES",
               "process_id": "HYBRID_JAX_PROCESS_ID",
               "local_device_ids": "HYBRID_JAX_LOCAL_DEVICE_IDS"}


def _from_env(name: str, value):
    if value is not None:
        return value
    text = os.environ.get(ENVIRONMENT[name], "").strip()
    if not text:
        return None
    try:
        if name == "coordinator":
            return text
        if name == "local_device_ids":
            return [int(i) for i in text.split(",")]
        return int(text)
    except ValueError:
        expected = "comma-separated integers" if name == "local_device_ids" else "an integer"
        raise ValueError(f"{ENVIRONMENT[name]}={text!r}: expected {expected}") from None


def _check_coordinator(address: str | None) -> None:
    """HOST:PORT (JAX's own parse of a port-less address is an IndexError)."""
    if address is None:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 2**16:
        raise ValueError(f"coordinator={address!r}: expected HOST:PORT of process 0, e.g. "
                         "10.0.0.1:1234")


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
               *, auto: bool = False) -> bool:
    """Joins the multi-process job described by the arguments or the environment; returns
    False (and does nothing) for a single-process run. Call before any other JAX work."""
    import jax

    settings = {name: _from_env(name, value) for name, value in (
        ("coordinator", coordinator), ("num_processes", num_processes),
        ("process_id", process_id), ("local_device_ids", local_device_ids))}
    required = ("coordinator", "num_processes", "process_id")
    given = [name for name in required if settings[name] is not None]
    if not given and settings["local_device_ids"] is None and not auto:
        return False
    missing = [name for name in required if settings[name] is None]
    if missing and not auto:
        raise ValueError(f"a multi-process run needs {', '.join(required)} (flags or "
                         f"{', '.join(ENVIRONMENT[n] for n in required)}); missing: "
                         f"{', '.join(missing)}")
    _check_coordinator(settings["coordinator"])
    ids = settings["local_device_ids"]
    if ids is not None and (not ids or min(ids) < 0 or len(set(ids)) < len(ids)):
        raise ValueError(f"local_device_ids={list(ids)}: expected distinct device indices >= 0")
    if settings["num_processes"] is not None and settings["num_processes"] < 1:
        raise ValueError(f"num_processes={settings['num_processes']}: expected at least 1")
    process_id, count = settings["process_id"], settings["num_processes"]
    if process_id is not None and not 0 <= process_id < (math.inf if count is None else count):
        raise ValueError(f"process_id={process_id} is not in [0, num_processes="
                         f"{'?' if count is None else count})")
    # Without `auto` the job is as given: JAX's cluster detection (SLURM, Open MPI) would
    # otherwise still set unset local_device_ids to the local rank, one device a process.
    detection = {} if auto else {"cluster_detection_method": "deactivate"}
    jax.distributed.initialize(coordinator_address=settings["coordinator"],
                               num_processes=settings["num_processes"],
                               process_id=settings["process_id"],
                               local_device_ids=settings["local_device_ids"], **detection)
    return True


def is_main_process() -> bool:
    """Process 0 writes the run's logs, metrics and results."""
    import jax

    return jax.process_index() == 0

"""What launched this process, as a session records it: the engine whose worker it is, and the job array task.

A session is one process; when that process is a worker of an engine (a Ray worker or
actor, a Dask worker, a multiprocessing child such as a pool's or loky's) or a task of a
batch scheduler's job array (Slurm, PBS/Torque, PBS Pro, LSF, SGE), the session says so,
so a user can tell which of a sweep's sessions is which task. Each engine is looked at
only if the process imported it already: nothing here imports an engine, and each look
costs microseconds, once per session.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from casmon.view.display import session_where  # how a session is shown is the view's job

__all__ = ["engine", "job_array", "in_ray_worker", "session_where"]

#: Longest id kept from the environment (a scheduler's job id), so a record stays small.
_ID_MAX = 100


def _ray() -> dict[str, Any] | None:
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        if ctx.worker.mode != ray.WORKER_MODE:  # the driver is a main process, not a worker
            return None
        return {"name": "ray", "worker": ctx.get_worker_id(), "node": ctx.get_node_id(), "job": ctx.get_job_id(),
                "actor": ctx.get_actor_id()}
    except Exception:  # noqa: BLE001 - a Ray too old or too new to ask: the session just does not say
        return None


def _dask() -> dict[str, Any] | None:
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        w = distributed.get_worker()  # raises ValueError outside a worker
        return {"name": "dask", "worker": str(w.name)[:_ID_MAX], "address": str(w.address)[:_ID_MAX]}
    except Exception:  # noqa: BLE001
        return None


def _multiprocessing() -> dict[str, Any] | None:
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return None
    try:
        parent = mp.parent_process()
        if parent is None:
            return None
        name = str(mp.current_process().name)[:_ID_MAX]
        # joblib's default backend runs its workers as loky processes, on multiprocessing's machinery
        return {"name": "joblib-loky" if name.startswith("Loky") else "multiprocessing", "process": name,
                "parent": parent.pid}
    except Exception:  # noqa: BLE001 - an odd multiprocessing (a stub, a frozen app)
        return None


def engine() -> dict[str, Any] | None:
    """The engine whose worker this process is, as ``{"name": "ray" | "dask" | "multiprocessing", ids...}``, or None.

    Ray: the worker, node and job ids, and the actor's id in an actor's process (else None).
    Dask: the worker's name and address. multiprocessing (pools, ``ProcessPoolExecutor``,
    joblib's loky): the process's name and its parent's pid. Dask's workers are
    multiprocessing children too: the more specific engine is named.
    """
    return _ray() or _dask() or _multiprocessing()


def in_ray_worker(found: dict[str, Any] | None) -> bool:
    """Whether the engine ``found`` is Ray's, whose workers end without running exit hooks: flush every call there.

    ``CASMON_FLUSH_EACH_CALL=0`` turns that off, as it does for pool workers.
    """
    if not found or found.get("name") != "ray":
        return False
    return os.environ.get("CASMON_FLUSH_EACH_CALL", "").strip().lower() not in ("0", "false", "no", "off")


def _task(v: str) -> int | str:
    return int(v) if v.isdigit() else v[:_ID_MAX]


def _job(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v[:_ID_MAX]
    return None


def job_array() -> dict[str, Any] | None:
    """This process's task in a batch scheduler's job array, as ``{"scheduler", "job", "task"}``, or None.

    Slurm (``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``), PBS/Torque (``PBS_JOBID``,
    ``PBS_ARRAYID``), PBS Pro (``PBS_ARRAY_ID``, ``PBS_ARRAY_INDEX``), LSF (``LSB_JOBID``,
    ``LSB_JOBINDEX``, which is 0 outside an array) and SGE (``JOB_ID``, ``SGE_TASK_ID``,
    "undefined" outside an array). A task number is an int; the job id is the scheduler's text.
    """
    env = os.environ
    t = env.get("SLURM_ARRAY_TASK_ID")
    if t:
        return {"scheduler": "slurm", "job": _job("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"), "task": _task(t)}
    t = env.get("PBS_ARRAYID")
    if t:
        return {"scheduler": "pbs", "job": _job("PBS_JOBID"), "task": _task(t)}
    t = env.get("PBS_ARRAY_INDEX")
    if t:
        return {"scheduler": "pbs", "job": _job("PBS_ARRAY_ID", "PBS_JOBID"), "task": _task(t)}
    t = env.get("LSB_JOBINDEX")
    if t and t != "0":
        return {"scheduler": "lsf", "job": _job("LSB_JOBID"), "task": _task(t)}
    t = env.get("SGE_TASK_ID")
    if t and t != "undefined":
        return {"scheduler": "sge", "job": _job("JOB_ID"), "task": _task(t)}
    return None

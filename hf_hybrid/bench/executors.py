"""Who runs the arena's specs: this process (`InProcess`), local worker processes (`LocalPool`: each run
forked fresh, a GPU or a share of the cores each) or a Ray cluster (`RayExecutor`). Each has `workers`,
`submit(spec)` (the worker's name), `wait()` (the runs finished since: `Measured` or error) and `close()`.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import DataError
from .execute import Measured, run_spec
from .recipe import build_task
from .runner import quiet_libraries
from .spec import RunSpec
from .task import BenchTask

logger = logging.getLogger(__name__)


@dataclass
class Finished:
    spec: RunSpec
    worker: str
    measured: Measured | None
    error: str | None = None


class InProcess:
    """Runs each spec here, when `wait` is called."""

    workers = 1

    def __init__(self, task: BenchTask) -> None:
        self.task = task
        self.pending: list[RunSpec] = []

    def submit(self, spec: RunSpec) -> str:
        self.pending.append(spec)
        return "here"

    def wait(self) -> list[Finished]:
        spec = self.pending.pop(0)
        try:
            return [Finished(spec, "here", run_spec(self.task, spec))]
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # a run that raises is reported; the others go on
            logger.debug("run failed", exc_info=True)
            return [Finished(spec, "here", None, _error_text(exc))]

    def close(self) -> None:
        self.pending.clear()


def _check_recipe(task: BenchTask, where: str) -> None:
    if task.recipe is None:
        raise DataError(
            f"{where} from its recipe; a task built in code has none: pass it with --task_factory "
            "module:function"
        )


def _error_text(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _child(spec: dict[str, Any], recipe: dict[str, Any], result: str, env: dict[str, str]) -> None:
    """One run in a fresh process, on its device or cores, its task built from the recipe."""
    os.environ.update(env)
    cores = env.get("HF_HYBRID_CORES")
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    try:
        payload = {"measured": _ray_run(spec, recipe)}  # its torch threads: OMP_NUM_THREADS, now the slot's
    except Exception as exc:
        payload = {"error": _error_text(exc)}
    tmp = result + ".tmp"
    Path(tmp).write_text(json.dumps(payload))
    os.replace(tmp, result)


@dataclass
class _Slot:
    name: str
    env: dict[str, str]
    process: Any = None
    spec: RunSpec | None = None
    result: str = ""


class LocalPool:
    """`n` runs at a time, each in a fresh process (forked from a server with the libraries loaded)."""

    def __init__(self, task: BenchTask, workers: int, cuda_devices: int) -> None:
        if workers < 1:
            raise DataError(f"`--workers` must be >= 1, got {workers}")
        _check_recipe(task, "`--workers` runs each run in its own process, which builds the task")
        if cuda_devices and workers > cuda_devices:
            raise DataError(
                f"`--workers` {workers} is more than the {cuda_devices} CUDA device(s) here: one run per "
                f"GPU; use --workers <= {cuda_devices}"
            )
        self.recipe = task.recipe
        self.workers = workers
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["torch", "transformers", "hf_hybrid.bench.execute"])
        self.folder = tempfile.mkdtemp(prefix="hf-hybrid-workers-")
        self.slots = [_Slot(f"w{i + 1}", self._env(i, workers, cuda_devices)) for i in range(workers)]

    @staticmethod
    def _env(index: int, workers: int, cuda_devices: int) -> dict[str, str]:
        if cuda_devices:
            return {"CUDA_VISIBLE_DEVICES": str(index), "OMP_NUM_THREADS": "1"}
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        cores = cores or list(range(os.cpu_count() or 1))
        share = max(1, len(cores) // workers)
        mine = cores[index * share : (index + 1) * share] if len(cores) >= workers else cores
        asked = os.environ.get("OMP_NUM_THREADS", "")
        if asked.isdigit() and int(asked) >= 1:  # the user's threads per process, where fewer than the share
            mine = mine[: int(asked)]
        return {
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": str(len(mine)),
            "HF_HYBRID_CORES": ",".join(str(c) for c in mine),
        }

    def submit(self, spec: RunSpec) -> str:
        slot = next(s for s in self.slots if s.spec is None)
        slot.spec = spec
        slot.result = os.path.join(self.folder, f"{slot.name}-{time.monotonic_ns()}.json")
        env = {**os.environ, **slot.env}  # the coordinator's environment now, and the slot's device or cores
        slot.process = self.context.Process(
            target=_child, args=(spec.to_dict(), self.recipe, slot.result, env), daemon=True
        )
        slot.process.start()
        return slot.name

    def wait(self) -> list[Finished]:
        busy = [s for s in self.slots if s.spec is not None]
        if not busy:
            return []
        while True:
            done = [s for s in busy if s.process.exitcode is not None]
            if done:
                return [self._collect(s) for s in done]
            time.sleep(0.2)

    def _collect(self, slot: _Slot) -> Finished:
        spec, process = slot.spec, slot.process
        process.join()
        finished = Finished(spec, slot.name, None, f"the worker process died (exit code {process.exitcode})")
        if os.path.exists(slot.result):
            payload = json.loads(Path(slot.result).read_text())
            os.remove(slot.result)
            measured = Measured.from_dict(payload["measured"]) if "measured" in payload else None
            finished = Finished(spec, slot.name, measured, payload.get("error"))
        slot.spec = slot.process = None
        return finished

    def close(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
                slot.process.join()
            slot.spec = slot.process = None


def _ray_run(spec: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    """One run from its recipe, in a fresh process (a worker's, or Ray's with `max_calls=1`)."""
    quiet_libraries()
    return run_spec(build_task(recipe), RunSpec.from_dict(spec)).to_dict()


RAY_INSTALL = 'pip install "hf-hybrid[ray]"'


def check_ray_address(address: str) -> None:
    """Fail fast when a `host:port` cannot be reached (Ray would retry for minutes)."""
    if address in ("auto", "local") or address.startswith("ray://") and ":" not in address[6:]:
        return
    target = address[6:] if address.startswith("ray://") else address
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise DataError(f"`--ray` {address!r} must be auto, local, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise DataError(f"`--ray` {address}: cannot reach the Ray cluster ({exc})") from None


class RayExecutor:
    """Each spec a Ray task on the cluster at `address` (`local`: started here; None: the session's)."""

    def __init__(self, task: BenchTask, address: str | None, cuda_devices: int) -> None:
        try:
            import ray
        except ImportError:
            raise DataError(f"`--ray` needs Ray: {RAY_INSTALL}") from None
        _check_recipe(task, "`--ray` builds the task on the cluster")
        if not ray.is_initialized():
            local = address in (None, "local")
            if not local:
                check_ray_address(address)
            try:
                ray.init(**({} if local else {"address": address}), log_to_driver=False)
            except ConnectionError as exc:
                raise DataError(f"`--ray` {address}: cannot connect ({exc})") from None
        self.ray = ray
        self.recipe = task.recipe
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        options = {"num_gpus": 1, "num_cpus": 1} if gpus and cuda_devices else {"num_cpus": 1}
        self.workers = gpus if "num_gpus" in options else int(resources.get("CPU", 1))
        self.remote = ray.remote(max_calls=1, max_retries=0, **options)(_ray_run)
        self.refs: dict[Any, RunSpec] = {}

    def submit(self, spec: RunSpec) -> str:
        ref = self.remote.remote(spec.to_dict(), self.recipe)
        self.refs[ref] = spec
        return "ray"

    def wait(self) -> list[Finished]:
        if not self.refs:
            return []
        ready, _ = self.ray.wait(list(self.refs), num_returns=1)
        out = []
        for ref in ready:
            spec = self.refs.pop(ref)
            try:
                out.append(Finished(spec, "ray", Measured.from_dict(self.ray.get(ref))))
            except Exception as exc:  # a task that raised or whose worker died
                cause = getattr(exc, "cause", None) or exc
                out.append(Finished(spec, "ray", None, _error_text(cause).splitlines()[0]))
        return out

    def close(self) -> None:
        for ref in list(self.refs):
            self.ray.cancel(ref, force=True)
        self.refs.clear()


def make_executor(
    task: BenchTask, workers: int | None, ray_address: str | None, use_ray: bool = False
) -> InProcess | LocalPool | RayExecutor:
    """The executor the flags ask for (`--workers N`, `--ray [ADDRESS]`)."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if use_ray:
        if workers is not None:
            raise DataError("give either `--workers` or `--ray`, not both")
        return RayExecutor(task, ray_address, cuda)
    if workers is None:
        return InProcess(task)
    return LocalPool(task, workers, cuda)


def describe(executor: Any) -> str:
    kind = type(executor).__name__
    return {"InProcess": "this process", "LocalPool": f"{executor.workers} local worker processes"}.get(
        kind, f"Ray ({executor.workers} slots)"
    )

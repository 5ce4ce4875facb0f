"""The arena's runs on local worker processes and on Ray give the in-process record run by run; a killed
worker costs one retry, a killed coordinator nothing; bad flags are refused before anything trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hf_hybrid.bench import Protocol, run_arena
from hf_hybrid.bench.executors import LocalPool, RayExecutor, check_ray_address, make_executor
from hf_hybrid.bench.recipe import build_task, preset_recipe
from hf_hybrid.data import DataError

METHODS = ["plain", "freeze:1"]
# two seeds (plain's other seed runs beside the methods' races), one first rate: the executors are the
# subject here, the protocol's decisions are tested on runs that train nothing (test_plan.py)
PROTOCOL = Protocol(
    seeds=(0, 1), lr_multipliers=(1.0,), widen=0, schedule_check=False, warm_steps=1, timed_steps=2
)


def tiny_task():
    return build_task(preset_recipe("clm_stdlib", "tiny"))


def _facts(data):
    runs = {r["key"]: (r["eval_loss"], r["step_counts"], r["losses"]) for r in data["runs"]}
    verdicts = [(v["method"], v["verdict"], v["seeds"], v["speedup_units"]) for v in data["verdicts"]]
    return runs, verdicts


def _seeded(out, reference):
    """A record that starts with `reference`'s calibration: the same machine's prices, so units agree."""
    out.mkdir(parents=True, exist_ok=True)
    empty = {**reference, "runs": [], "decisions": {}, "plain": {}, "verdicts": [], "unused": [], "notes": []}
    (out / "results.json").write_text(json.dumps(empty))
    return out


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("in-process")
    run_arena(tiny_task(), METHODS, PROTOCOL, out, echo=lambda line: None)
    return json.loads((out / "results.json").read_text())


def test_two_local_workers_give_the_in_process_record_run_by_run(in_process, tmp_path):
    out = _seeded(tmp_path / "pool", in_process)
    lines: list[str] = []
    run_arena(tiny_task(), METHODS, PROTOCOL, out, echo=lines.append, workers=2)
    assert _facts(json.loads((out / "results.json").read_text())) == _facts(in_process)
    printed = "\n".join(lines)
    assert "[w1]" in printed and "[w2]" in printed and "2 local worker processes" in printed


def test_a_local_ray_cluster_gives_the_in_process_record_run_by_run(tmp_path):
    """Plain alone at one rate and seed, no schedule check: each Ray task starts a fresh process (the
    executor does not care which method a spec names; the local pool's test runs a method too)."""
    import ray

    small = Protocol(
        seeds=(0,), lr_multipliers=(1.0,), widen=0, schedule_check=False, warm_steps=1, timed_steps=2
    )
    run_arena(tiny_task(), ["plain"], small, tmp_path / "here", echo=lambda line: None)
    here = json.loads((tmp_path / "here" / "results.json").read_text())
    assert len(here["runs"]) >= 8 and {r["method"] for r in here["runs"]} == {"plain"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = _seeded(tmp_path / "ray", here)
        run_arena(tiny_task(), ["plain"], small, out, echo=lambda line: None, use_ray=True)
    finally:
        ray.shutdown()
    assert _facts(json.loads((out / "results.json").read_text())) == _facts(here)


def test_a_worker_killed_mid_run_is_retried_and_the_record_completes(tmp_path, monkeypatch):
    marker = tmp_path / "died"
    monkeypatch.setenv("HF_HYBRID_TEST_DIES_ONCE", str(marker))
    lines: list[str] = []
    run_arena(
        tiny_task(),
        ["plain", "bench_plugins:DiesOnce"],
        PROTOCOL,
        tmp_path / "out",
        echo=lines.append,
        workers=2,
    )
    assert marker.exists()
    printed = "\n".join(lines)
    assert "failed (the worker process died (exit code -9)); trying once more" in printed, printed
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert not any(r.get("error") for r in data["runs"])
    assert any(v["method"] == "bench_plugins:DiesOnce" for v in data["verdicts"])


def test_a_killed_coordinator_loses_no_run_and_counts_none_twice(in_process, tmp_path):
    out = _seeded(tmp_path / "killed", in_process)
    script = (
        "from hf_hybrid.bench import Protocol, run_arena\n"
        "from hf_hybrid.bench.recipe import build_task, preset_recipe\n"
        f"run_arena(build_task(preset_recipe('clm_stdlib', 'tiny')), {METHODS!r}, {PROTOCOL!r}, "
        f"{str(out)!r}, workers=2)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = json.loads((out / "results.json").read_text())["runs"]
        if len(runs) >= 6:
            break
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)  # the coordinator and its workers, mid-run
    process.wait()
    killed_at = len(json.loads((out / "results.json").read_text())["runs"])
    assert 6 <= killed_at < len(in_process["runs"])
    run_arena(tiny_task(), METHODS, PROTOCOL, out, echo=lambda line: None)
    data = json.loads((out / "results.json").read_text())
    assert len({r["key"] for r in data["runs"]}) == len(data["runs"])
    assert _facts(data) == _facts(in_process)


def test_bad_scaling_flags_are_refused_before_anything_trains(monkeypatch):
    task = tiny_task()
    with pytest.raises(DataError, match=r"`--workers` must be >= 1, got 0"):
        make_executor(task, 0, None)
    with pytest.raises(DataError, match=r"`--workers` 3 is more than the 2 CUDA device\(s\) here.*<= 2"):
        LocalPool(task, 3, cuda_devices=2)
    with pytest.raises(DataError, match="give either `--workers` or `--ray`, not both"):
        make_executor(task, 2, "auto", use_ray=True)
    began = time.monotonic()
    with pytest.raises(DataError, match=r"`--ray` 127.0.0.1:9: cannot reach the Ray cluster"):
        check_ray_address("127.0.0.1:9")
    assert time.monotonic() - began < 30
    with pytest.raises(DataError, match=r"`--ray` 'nowhere' must be auto, local, HOST:PORT"):
        check_ray_address("nowhere")
    built = task.recipe
    task.recipe = None
    with pytest.raises(DataError, match="a task built in code has none: pass it with --task_factory"):
        LocalPool(task, 2, cuda_devices=0)
    task.recipe = built
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(DataError, match=r"`--ray` needs Ray: pip install \"hf-hybrid\[ray\]\""):
        RayExecutor(task, "auto", 0)

"""Shared fixtures: a tiny model built once per session, and the location of shared data."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# vLLM's CPU sampler helpers would be compiled with torch.compile on the first request (8-9 s
# a process); eager is as exact. memrl itself never compiles.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

# One torch thread in every test process: several xdist workers share few cores (more threads
# slow the tiny-model tests several-fold on a 2-core machine), and the tests that compare an
# in-process run with a subprocess run (which gets OMP_NUM_THREADS=1) need the same float
# reduction order on both sides, with or without xdist.
import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--all", action="store_true", dest="memrl_all",
        help="also run the pipeline tier (tests marked `pipeline`: whole training pipelines, "
             "multi-process and compile set-ups); without it, and without -m, they are deselected")


def deselect_pipeline_tier(config, items) -> None:
    """Two tiers: the default run leaves out the tests marked `pipeline` (shown as
    deselected); `--all` (`scripts/test.sh --all`, CI) runs them too, and so does any `-m`
    expression, which then decides alone."""
    if config.getoption("memrl_all") or config.getoption("markexpr"):
        return
    kept = [item for item in items if item.get_closest_marker("pipeline") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    deselect_pipeline_tier(config, items)
    name_xdist_groups(config, items)


def name_xdist_groups(config, items) -> None:
    """`--dist loadgroup` (scripts/test.sh): the tests of one `xdist_group` on one worker.
    pytest-xdist names a test's group in its node id (`ID@group`) by setting `item._nodeid`,
    which pytest 9 no longer reads (its node ids live in `item._id`): the groups were ignored,
    and a module's vLLM server started on both workers. Done here where xdist's did not take."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        node_id = getattr(item, "_id", None)
        if not names or item.nodeid.endswith(suffix) or node_id is None:
            continue
        try:  # pytest's internals: if they change, the groups are ignored (slower), no more
            renamed = dataclasses.replace(node_id)
            object.__setattr__(renamed, "_str_cache", item.nodeid + suffix)  # what str() gives
            item._id = renamed
        except (TypeError, AttributeError, ValueError):
            return


def shared_data_dir() -> Path | None:
    """`$MEMRL_SHARED_DATA` or `../shared/data` beside the project root, if present."""
    env = os.environ.get("MEMRL_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(PROJECT_ROOT.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("shared data not found: set MEMRL_SHARED_DATA or place it at ../shared/data")
    return d


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 model + tokenizer, built once for the whole test session."""
    from memrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for a test module (skipped without memrl[ray]); its
    workers import memrl and the tests' helper modules. Shut down (raylet and all) at the end
    of the module: a fresh cluster per module, so one module's Ray Train runs leave nothing
    behind for the next (in the whole suite on 2 cores, a named-actor lookup on a cluster that
    had run Ray Train jobs once never returned)."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.train.torch", exc_type=ImportError)  # ray[train]: pandas too
    path = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), str(PROJECT_ROOT / "tests"), os.environ.get("PYTHONPATH"))
        if p
    )
    # A named actor's lookup waits 60 s for the GCS by default; on a 2-core CI machine busy
    # with vLLM servers on the other worker that was not always enough.
    os.environ.setdefault("RAY_gcs_server_request_timeout_seconds", "300")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    try:
        yield ray
    finally:
        ray.shutdown()

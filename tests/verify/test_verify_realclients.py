"""autopar verify's torchtitan jobs through torchtitan 0.2.2's own configuration code (marker
``realclients``; skipped, saying why, where torchtitan is not installed: see test_realclients)."""

from __future__ import annotations

import pytest
from test_realclients import TT_CONFIGS, _effective, _python

from autopar.search import search
from autopar.search.grid import for_target
from autopar.verify.jobs import write_jobs
from conftest import make_problem

pytestmark = pytest.mark.realclients


def test_torchtitan_accepts_the_verify_jobs(tmp_path):
    python = _python("torchtitan", "torchtitan")
    base = TT_CONFIGS / "torchtitan" / "models" / "llama3" / "train_configs" / "llama3_8b.toml"
    p = for_target(make_problem("llama3-8b", gbs=64, seq=8192), "torchtitan")
    layouts = list(enumerate(search(p, 3, target="torchtitan").layouts, 1))
    jobs = write_jobs(p, layouts, tmp_path / "verify", "torchtitan", toml=base, iters=10)
    results = _effective(python, "torchtitan_check.py", [[f"{j.folder}/job.toml", "8", str(base)] for j in jobs],
                         tmp_path, {"TT_CONFIGS": str(TT_CONFIGS)})
    for job in jobs:
        ok, msg, e = results[f"{job.folder}/job.toml"]
        assert ok, f"{job.name}: {msg}"
        assert (e["dp_shard"], e["tp"], e["pp"]) == (job.layout["dp"], job.layout["tp"], job.layout["pp"])

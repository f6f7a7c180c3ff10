"""Log parsers of autopar verify on published log excerpts (sources: tests/data/logs/README.md)."""

from __future__ import annotations

import pytest

from autopar.verify.logs import GIB, MIB, parse_log, parse_megatron, parse_torchtitan
from conftest import TESTS_DATA

LOGS = TESTS_DATA / "logs"


def _text(name: str) -> str:
    return (LOGS / name).read_text()


def test_megatron_throughput_lines():
    r = parse_megatron(_text("megatron_mixtral_16xh100.log"), seq_len=4096)
    assert r.steps == 3 and r.step_times_s == pytest.approx([5.3616, 5.4707, 5.8299])
    assert r.step_time_s == pytest.approx(5.4707)  # median of the three
    assert r.tokens_per_s == pytest.approx(128 * 4096 / 5.4707)
    assert r.tflops_per_device == pytest.approx(238.7)
    assert r.peak_allocated_bytes is None  # no memory report in the excerpt


def test_megatron_memory_report():
    r = parse_megatron(_text("megatron_memory_report.log"), seq_len=2048)
    assert r.step_time_s == pytest.approx(0.744) and r.tokens_per_s == pytest.approx(16 * 2048 / 0.744)
    assert r.peak_allocated_bytes == pytest.approx(5670.39 * MIB)
    assert r.peak_reserved_bytes == pytest.approx(6406.00 * MIB)


def test_megatron_old_format_and_warmup():
    r = parse_megatron(_text("megatron_v100_old_format.log"), seq_len=1024, warmup=5)
    assert r.steps == 3 and r.step_time_s == pytest.approx((1.9939 + 1.9781) / 2)  # iterations 10 and 15
    assert r.tokens_per_s is None  # this release did not print the global batch size
    assert r.peak_allocated_bytes == pytest.approx(12606.06201171875 * MIB)
    assert r.peak_reserved_bytes == pytest.approx(17482.0 * MIB)


def test_torchtitan_rank0_lines():
    tokens = 8 * 2048
    r = parse_torchtitan(_text("torchtitan_rank0.log"), tokens_per_step=tokens, world_size=2)
    assert r.steps == 5
    assert r.step_time_s == pytest.approx(tokens / (7313 * 2))  # median tps of steps 14-18
    assert r.tokens_per_s == pytest.approx(7313 * 2)
    assert r.peak_reserved_bytes == pytest.approx(9.46 * GIB) and r.peak_allocated_bytes is None
    assert r.tflops_per_device == pytest.approx(0.52)


def test_torchtitan_every_rank_keeps_the_slowest():
    tokens = 64 * 8192
    r = parse_torchtitan(_text("torchtitan_all_ranks.log"), tokens_per_step=tokens, world_size=8)
    assert r.steps == 2
    assert r.step_times_s == pytest.approx([tokens / (10049 * 8), tokens / (10007 * 8)])
    assert r.peak_reserved_bytes == pytest.approx(66.91 * GIB)


@pytest.mark.parametrize("name, kind, says", [
    ("nccl_timeout.log", "nccl_timeout", "OpType=ALLREDUCE"),
    ("cuda_oom.log", "out_of_memory", "Tried to allocate 172.00 MiB"),
])
def test_failures_with_their_cause(name, kind, says):
    r = parse_log(_text(name), "megatron", seq_len=4096, global_batch_size=64, world_size=8, exit_code=1)
    assert not r.ok and r.failure == kind and says in r.cause


def test_exit_without_message_and_timeout_and_no_steps():
    kw = dict(seq_len=4096, global_batch_size=64, world_size=8)
    assert parse_log("", "megatron", exit_code=3, **kw).failure == "exit_code"
    # bash's exit 127: the launcher is not on PATH, named in the cause
    missing = parse_log("job.sh: line 4: torchrun: command not found\n", "megatron", exit_code=127, **kw)
    assert missing.failure == "command_not_found" and missing.cause == "torchrun: command not found"
    assert parse_log("starting\n", "torchtitan", exit_code=None, timed_out=True, **kw).failure == "timeout"
    assert parse_log("done\n", "megatron", exit_code=0, **kw).failure == "no_steps"
    ok = parse_log(_text("megatron_memory_report.log"), "megatron", exit_code=0, **kw)
    assert ok.ok and ok.cause is None
    # an OOM message wins over the time-out that followed it
    assert parse_log(_text("cuda_oom.log"), "megatron", exit_code=None, timed_out=True, **kw).failure == "out_of_memory"

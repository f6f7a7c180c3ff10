"""Fuzz the layout and cluster options of ``autopar estimate``, ``export`` and ``balance``: a few
of ``--tp --pp --dp --cp --vpp --ep --etp --mbs --zero --recompute ...`` (and the batch, cluster
and precision options) with odd values (zero, negative, huge, 5,000 digits, floats, words, empty,
lists), on a dense and a MoE preset. The run must give valid JSON (estimate), the config on stdout
or in ``--out`` (export), the table and ``--plot`` file (balance), or one ``error:`` line naming
an option given (see :mod:`fuzz_support`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_support import ODD_OPTION_TEXT, check_outcome, fuzz_settings, module_workdir, option_needles, run_cli

pytestmark = pytest.mark.fuzz

#: Options taking a value, shared by estimate, export and balance.
LAYOUT = ["--tp", "--pp", "--dp", "--cp", "--vpp", "--ep", "--etp", "--mbs", "--zero", "--recompute",
          "--recompute-layers", "--schedule", "--gbs", "--seq-len", "--nodes", "--devices-per-node", "--precision",
          "--moe-token-imbalance", "--recompute-modules", "--make-vocab-size-divisible-by", "--vocab-size"]
SWITCHES = ["--sp", "--no-sp", "--no-flash-attention", "--fp8-param-storage"]
ONLY = {
    "estimate": ["--layers-per-stage", "--recompute-per-stage", "--memory-margin"],
    "export": ["--layers-per-stage", "--recompute-per-stage"],
    "balance": ["--form", "--options", "--memory-limit-gib"],
}
ONLY_SWITCHES = {"estimate": ["--embedding-loss-split"], "export": ["--embedding-loss-split"], "balance": []}
#: How the messages name some options besides their own spelling (README: the layout's fields).
ALIASES = {"--gbs": ["global batch size", "num_microbatches"], "--nodes": ["world size", "mbs*dp"],
           "--devices-per-node": ["world size", "mbs*dp"], "--mbs": ["num_microbatches"], "--dp": ["num_microbatches"],
           "--vpp": ["interleaved"], "--schedule": ["vpp"], "--layers-per-stage": ["layers_per_stage"],
           "--recompute-per-stage": ["recompute_per_stage"], "--zero": ["ZeRO"], "--recompute-layers": ["full"]}
FORMATS = ["megatron", "mindspeed", "torchtitan", "deepspeed", "galvatron", "sapp"]
#: Values that keep balance's simulation small (it simulates every micro-batch: gbs / (mbs x dp)).
BALANCE_GBS = st.sampled_from(["0", "-1", "1", "7", "64", "256", "abc", ""])


@st.composite
def options(draw, command: str) -> tuple[list[str], list[str]]:
    """(arguments, options given) for ``command``."""
    names = draw(st.lists(st.sampled_from(LAYOUT + ONLY[command]), min_size=1, max_size=4, unique=True))
    args: list[str] = []
    for name in names:
        value = draw(BALANCE_GBS if command == "balance" and name == "--gbs" else ODD_OPTION_TEXT)
        args += [name, value]
    switches = draw(st.lists(st.sampled_from(SWITCHES + ONLY_SWITCHES[command]), max_size=2, unique=True))
    return args + switches, names + switches


def needles_for(given: list[str]) -> list:
    return [n for name in given for n in [*option_needles(name.replace("--no-", "--")), *ALIASES.get(name, [])]]


workdir = module_workdir("fuzz_layout")


MODELS = st.sampled_from(["llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])


@fuzz_settings(150)
@given(model=MODELS, opts=options("estimate"))
def test_estimate_options(model, opts):
    args, given_names = opts
    out = run_cli(["estimate", "-m", model, "--device", "h100-80gb", *args, "--json"])
    check_outcome(out, needles_for(given_names), json_stdout=True)


@fuzz_settings(60)
@given(model=MODELS, fmt=st.sampled_from(FORMATS), opts=options("export"), to_file=st.booleans())
def test_export_options(workdir, model, fmt, opts, to_file):
    args, given_names = opts
    target = workdir / ("cfg" if fmt == "deepspeed" else "cfg.txt")
    extra = ["--out", target] if to_file else []
    device = "ascend-910b" if fmt in ("mindspeed", "sapp") else "h100-80gb"  # the formats run on these vendors
    out = run_cli(["export", "--format", fmt, "-m", model, "--device", device, *args, *extra])
    # the format's own refusals ("Galvatron cannot express this layout: zero=1 ...") name the --format
    check_outcome(out, [*needles_for(given_names), f"{fmt} cannot express"], files=[target] if to_file else [])
    if out.exit_code == 0 and not to_file:
        assert out.stdout.strip(), "export printed nothing"


@fuzz_settings(40)
@given(opts=options("balance"), plot=st.booleans())
def test_balance_options(workdir, opts, plot):
    args, given_names = opts
    if "--pp" not in given_names:
        args += ["--pp", "2"]
    figure = workdir / "plan.png"
    figure.unlink(missing_ok=True)
    extra = ["--plot", figure] if plot else []
    out = run_cli(["balance", "-m", "llama3-8b", "--device", "h100-80gb", *args, *extra])
    needles = needles_for(given_names)
    if "--pp" not in given_names:
        needles += option_needles("--pp")
    check_outcome(out, needles, files=[figure] if plot else [])


def test_unmutated_options_succeed():
    """A sanity anchor for the properties above: the unmutated inputs succeed."""
    out = run_cli(["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--tp", "2", "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["strategy"]["tp"] == 2


SEARCH = ["--top", "--memory-margin", "--target", "--gbs", "--seq-len", "--nodes", "--devices-per-node",
          "--precision", "--recompute-modules", "--moe-token-imbalance", "--make-vocab-size-divisible-by"]


@fuzz_settings(30)
@given(names=st.lists(st.sampled_from(SEARCH), min_size=1, max_size=3, unique=True), data=st.data())
def test_search_options(names, data):
    """On a dense model: a MoE search over a large --nodes takes seconds (qwen3-30b-a3b on 4,096
    nodes: 7 s CPU, 1.7 GB), beyond the per-example deadline."""
    args = [a for name in names for a in (name, data.draw(ODD_OPTION_TEXT, label=name))]
    out = run_cli(["search", "-m", "llama3-8b", "--device", "h100-80gb", *args, "--json"])
    check_outcome(out, [*needles_for(names), "no layout fits", "no valid layout"], json_stdout=True)

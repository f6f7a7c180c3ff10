"""The ``autopar`` command line (typer + rich): ``search``, ``estimate``, ``devices``.

User errors print one line (``error: ...``) on stderr and exit with code 2; they never show a
traceback. ``--json`` prints one stable JSON document (see the README) on stdout.
"""

from __future__ import annotations

import json
import sys
from functools import wraps
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.specs import TrainSpec, device_names, load_device, load_model, make_cluster

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan the parallel layout of LLM training before spending GPU hours.")
# Pipes and CI logs get a wide console so the tables are not squeezed to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

# Options shared by every command that needs a problem (model, cluster, batch).
Model = Annotated[str, typer.Option("--model", "-m", help="HF config.json path or preset name (see README)")]
Device = Annotated[Optional[str], typer.Option(help=f"device preset: {', '.join(device_names())}")]
Nodes = Annotated[int, typer.Option(help="number of nodes")]
PerNode = Annotated[Optional[int], typer.Option("--devices-per-node", help="devices per node (default: the device's)")]
Gbs = Annotated[int, typer.Option("--gbs", help="global batch size (sequences per step)")]
SeqLen = Annotated[int, typer.Option("--seq-len", help="sequence length (tokens)")]
Precision = Annotated[str, typer.Option(help="bf16 | fp16 | fp8")]
DeviceFile = Annotated[Optional[str], typer.Option(help="YAML/JSON with device fields (and optional 'base: <preset>')")]
DeviceSet = Annotated[Optional[list[str]], typer.Option(help="override a device field, KEY=VALUE (repeatable)")]
Flash = Annotated[bool, typer.Option("--flash-attention/--no-flash-attention", help="fused attention (no s^2 memory)")]
VocabPad = Annotated[int, typer.Option("--make-vocab-size-divisible-by", help="Megatron vocab padding unit")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON document instead of tables")]
Margin = Annotated[float, typer.Option(help="memory margin: above (1-margin) x device memory is 'marginal'")]


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn :class:`AutoparError` into one red line on stderr and exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AutoparError as err:
            err_console.print(f"[red]error:[/] {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None

    return wrapper


def _positive(name: str, value: int) -> int:
    if value <= 0:
        raise AutoparError(f"{name}={value}: must be a positive integer")
    return value


def _problem(model: str, device: str | None, nodes: int, devices_per_node: int | None, gbs: int, seq_len: int,
             precision: str, device_file: str | None, device_set: list[str] | None, flash: bool,
             vocab_pad: int) -> Problem:
    if precision not in ("bf16", "fp16", "fp8"):
        raise AutoparError(f"--precision={precision!r}: allowed bf16, fp16, fp8")
    _positive("--gbs", gbs)
    _positive("--seq-len", seq_len)
    _positive("--make-vocab-size-divisible-by", vocab_pad)
    spec = load_model(model)
    dev = load_device(device, device_file, device_set)
    dev.peak(precision)  # unknown precision for this device: one clear error now
    cluster = make_cluster(dev, nodes, devices_per_node)
    train = TrainSpec(global_batch_size=gbs, seq_len=seq_len, precision=precision, flash_attention=flash,
                      make_vocab_size_divisible_by=vocab_pad)
    if spec.max_position_embeddings and seq_len > spec.max_position_embeddings:
        err_console.print(f"[yellow]warning:[/] --seq-len {seq_len} exceeds the model's max_position_embeddings "
                          f"{spec.max_position_embeddings}; planning anyway (Megatron needs it raised)")
    return Problem(spec, cluster, train)


@app.command()
@_user_errors
def search(
    model: Model, device: Device = None, nodes: Nodes = 1, devices_per_node: PerNode = None, gbs: Gbs = 1024,
    seq_len: SeqLen = 4096, precision: Precision = "bf16", device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = True, vocab_pad: VocabPad = 128,
    top: Annotated[int, typer.Option(help="how many layouts to show")] = 10,
    memory_margin: Margin = 0.10, as_json: Json = False,
) -> None:
    """Search every valid layout, drop those that do not fit, rank the rest by step time."""
    from autopar.export.megatron import megatron_args
    from autopar.report.table import search_summary, search_table
    from autopar.search import search as run_search

    p = _problem(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                 flash_attention, vocab_pad)
    if not 0 <= memory_margin < 1:
        raise AutoparError(f"--memory-margin={memory_margin}: must be in [0, 1)")
    result = run_search(p, _positive("--top", top), memory_margin)
    best = result.layouts[0]
    if as_json:
        doc = result.to_dict()
        doc["megatron_args"] = megatron_args(p, best.strategy)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    console.print(f"[bold]{p.model.name}[/] ({p.model.num_params / 1e9:.1f} B params) on {p.cluster.num_nodes} x "
                  f"{p.cluster.devices_per_node} {p.cluster.device.name}, gbs {gbs}, seq {seq_len}, {precision}")
    console.print(search_table(result))
    console.print(search_summary(result), highlight=False)
    console.print("\n[bold]Megatron-LM arguments for #1:[/]")
    console.print(megatron_args(p, best.strategy), highlight=False, soft_wrap=True)


@app.command()
@_user_errors
def estimate(
    model: Model, device: Device = None, nodes: Nodes = 1, devices_per_node: PerNode = None, gbs: Gbs = 1024,
    seq_len: SeqLen = 4096, precision: Precision = "bf16", device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = True, vocab_pad: VocabPad = 128,
    tp: int = 1, pp: int = 1, dp: Annotated[Optional[int], typer.Option(help="default: world/(tp*pp*cp)")] = None,
    cp: int = 1, vpp: int = 1, ep: int = 1,
    etp: Annotated[Optional[int], typer.Option(help="expert TP (default: tp)")] = None,
    mbs: int = 1, zero: Annotated[int, typer.Option(help="0-3; 1 = Megatron distributed optimizer")] = 1,
    sp: Annotated[bool, typer.Option("--sp/--no-sp", help="Megatron sequence parallelism")] = False,
    recompute: Annotated[str, typer.Option(help="none | selective | full")] = "none",
    recompute_layers: Annotated[Optional[int], typer.Option(help="full recompute: layers per chunk")] = None,
    schedule: Annotated[Optional[str], typer.Option(help="1f1b | interleaved (default from vpp)")] = None,
    layers_per_stage: Annotated[Optional[str], typer.Option(help="explicit split, e.g. 7,8,8,7")] = None,
    memory_margin: Margin = 0.10, as_json: Json = False,
) -> None:
    """Estimate memory (per stage) and step time (with breakdown) of one explicit layout."""
    from pydantic import ValidationError

    from autopar.errors import from_validation_error
    from autopar.estimate import estimate as run_estimate
    from autopar.report.table import print_estimate
    from autopar.strategy import Strategy

    p = _problem(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                 flash_attention, vocab_pad)
    for name, value in [("--tp", tp), ("--pp", pp), ("--cp", cp), ("--vpp", vpp), ("--ep", ep), ("--mbs", mbs)]:
        _positive(name, value)
    if dp is None:
        if p.world_size % (tp * pp * cp):
            raise AutoparError(f"tp*pp*cp = {tp * pp * cp} does not divide the world size {p.world_size}")
        dp = p.world_size // (tp * pp * cp)
    split = None
    if layers_per_stage:
        try:
            split = tuple(int(x) for x in layers_per_stage.split(","))
        except ValueError:
            raise AutoparError(f"--layers-per-stage={layers_per_stage!r}: expected integers like 7,8,8,7") from None
    try:
        strategy = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp, mbs=mbs, sp=sp, zero=zero,
                            recompute=recompute, recompute_layers=recompute_layers,
                            schedule=schedule or ("interleaved" if vpp > 1 else "1f1b"), layers_per_stage=split)
    except ValidationError as err:
        raise from_validation_error(err, "layout") from None
    result = run_estimate(p, strategy, memory_margin)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(gbs), indent=2) + "\n")
        return
    print_estimate(console, result)


@app.command()
@_user_errors
def devices(as_json: Json = False) -> None:
    """List the device presets and their numbers."""
    from autopar.report.table import devices_table

    specs = [load_device(name) for name in device_names()]
    if as_json:
        sys.stdout.write(json.dumps([d.model_dump() for d in specs], indent=2) + "\n")
        return
    console.print(devices_table(specs))



@app.command()
@_user_errors
def validate(
    csv_path: Annotated[Optional[str], typer.Option("--csv", help="measurements CSV (default: "
                                                    "../shared/validation/measurements.csv from the repo)")] = None,
    out: Annotated[str, typer.Option("--out", help="report directory")] = "out/validation",
) -> None:
    """Score autopar against published measurements; write accuracy.md, rows.md, scatter.png."""
    from autopar.validate import DEFAULT_CSV, run_validation

    results, paths = run_validation(csv_path or DEFAULT_CSV.resolve(), out)
    console.print(paths["accuracy"].read_text(), highlight=False, markup=False)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False)

"""``autopar profile ops|layer|comm`` (typer sub-app) and the ``--profile-db`` helpers.

torch and transformers are imported inside the commands only, so ``autopar search`` never
loads them. Progress shows on stderr (autopar.progress); every measurement is committed as it finishes, so Ctrl-C
loses at most the one in flight and a rerun measures only what is missing.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from autopar.cli.app import app, console, err_console, progress_shown, user_errors
from autopar.cli.json_output import print_json
from autopar.cli.options import (Device, DeviceFile, DeviceSet, Flash, Gbs, Json, Model, Nodes, PerNode, Precision, Quiet,
                                 SeqLen, VocabPad)
from autopar.cli.inputs import positive, problem_from_options
from autopar.errors import AutoparError
from autopar.progress import advance, phase

if TYPE_CHECKING:
    from autopar.profile.opdb import OpDB  # sqlite3: imported by the commands that open a database

profile_app = typer.Typer(no_args_is_help=True, help="Measure operators, layers and collectives into a profile DB.")
app.add_typer(profile_app, name="profile")  # `autopar profile ops|layer|comm`
Db = Annotated[str, typer.Option("--db", help="SQLite profile database (created if missing)")]
COVERAGE_THRESHOLD = 0.8  # below this share of measured compute time the output lists what to profile


def choose_device(db: OpDB, device: str | None, planned: str) -> str:
    """The database device to cost with: ``device`` (``--profile-device``) if given, else the
    only device in the file, else the only one recorded as the ``planned`` preset.

    Raises:
        AutoparError: an empty file, ``device`` not in it, or several devices and none chosen.
    """
    from autopar.profile.provenance import device_preset

    devices = db.devices()
    if not devices:
        raise AutoparError(f"{db.option}={str(db.path)!r}: holds no measurements yet (fill it with 'autopar profile "
                           "ops'; runs stored by 'autopar verify --record' count once 'autopar calibrate' has fitted "
                           "factors from successful ones)")
    if device is not None:
        if device not in devices:
            raise AutoparError(f"--profile-device={device!r}: not in the database; it holds {devices}")
        return device
    if len(devices) == 1:
        return devices[0]
    planned_ones = [d for d in devices if device_preset(*db.measured_on(d)) == planned]
    if len(planned_ones) == 1:
        return planned_ones[0]
    raise AutoparError(f"--profile-device: the database holds {devices}; name one")


def open_times(path: str, device: str | None, dtype: str, planned: str, stands_for: str | None = None):
    """(:class:`~autopar.profile.provider.ProfileTimes` over ``path`` for ``device`` in
    ``dtype``, its provenance for the JSON output: ``{"planned_device", "accepted",
    "measured_on": [record per software version], "unrecorded_versions", "unused_rows": {dtype:
    rows}}``). The file is opened read-only.

    Rows measured on another device than ``planned`` are used only with ``stands_for``
    (``--profile-stands-for``) naming ``planned`` (:func:`autopar.profile.provenance.accept`);
    rows in another precision than ``dtype`` are never used (``unused_rows`` counts them).

    Raises:
        AutoparError: a directory, missing or malformed file, several devices and none chosen,
            impossible rows, or another device's rows without ``stands_for``.
    """
    from autopar.profile.provenance import accept, device_preset
    from autopar.profile.opdb import OpDB
    from autopar.profile.provider import ProfileTimes

    db = OpDB(path, write=False)
    try:
        device = choose_device(db, device, planned)
        db.check(device)
        records, unrecorded = db.measured_on(device)
        accepted = accept("--profile-db", path, device, device_preset(records, unrecorded), planned, stands_for)
    except AutoparError:
        db.close()
        raise
    provenance = {"planned_device": planned, "accepted": accepted, "measured_on": [r.to_dict() for r in records],
                  "unrecorded_versions": unrecorded,
                  "unused_rows": {d: n for d, n in db.dtypes(device).items() if d != dtype}}
    return ProfileTimes(db, device, dtype), provenance


@contextmanager
def profiled(p, path: str | None, device: str | None, stands_for: str | None = None):
    """Cost with the measured operator/layer times and collective fits of ``path`` inside the
    block; yields a function that maps the shown layouts to :func:`coverage_doc`, or None
    without a database. ``stands_for``: ``--profile-stands-for`` (see :func:`open_times`)."""
    if path is None:
        for option, value, what in (("--profile-device", device, "the database it names a device of"),
                                    ("--profile-stands-for", stands_for, "the database whose times it vouches for")):
            if value is not None:
                raise AutoparError(f"{option}={value!r} needs --profile-db ({what})")
        yield None
        return
    from autopar.cost.comm import use_link_fits
    from autopar.cost.compute import use_op_times
    from autopar.profile.linkfit import LinkFits

    dtype = "bf16" if p.train.precision == "fp8" else p.train.precision
    times, provenance = open_times(path, device, dtype, p.cluster.device.name, stands_for)
    fits = LinkFits(times.db.comm_fits(times.device))
    with use_op_times(times), use_link_fits(fits if fits.fits else None):
        yield lambda strategies: {**coverage_doc(p, strategies, times, fits), **provenance}
    times.db.close()


def coverage_doc(p, strategies, times, fits) -> dict:
    """``{"db", "device", "dtype", "coverage": [share per layout], "sources": [{part: source}
    per layout], "threshold", "missing": [{"op", "dims"}], "collectives": {link: [fitted
    collectives]}}`` for the JSON output and for ``profile ops --missing-from``. Every measured
    source and fitted collective comes from database device ``device``; the rest is the
    planned device's spec."""
    from autopar.profile.coverage import coverage
    from autopar.profile.shapes import unique

    found = [coverage(p, s, times) for s in strategies]
    missing = unique([op for c in found for op in c.missing])
    return {"db": str(times.db.path), "device": times.device, "dtype": times.dtype,
            "coverage": [c.share for c in found], "sources": [c.sources for c in found],
            "threshold": COVERAGE_THRESHOLD, "missing": [{"op": o, "dims": d} for o, d in missing],
            "collectives": fits.summary()}


def print_coverage(doc: dict) -> None:
    """Coverage and sources of the lowest layout, the collective fits used, and the shapes to
    profile when the coverage is below the threshold."""
    worst = min(range(len(doc["coverage"])), key=doc["coverage"].__getitem__)
    standing = "" if doc["accepted"] == "same device" else f", standing for {doc['planned_device']} by " \
        f"{doc['accepted'].split()[0]}"
    console.print(f"profile {doc['db']} ({doc['device']}{standing}): {doc['coverage'][worst]:.0%} of the predicted compute "
                  f"time of the shown layouts is measured (lowest layout: "
                  f"{'; '.join(f'{k}: {v}' for k, v in doc['sources'][worst].items())})", highlight=False)
    links = [f"{link} {', '.join(c) if c else 'device spec'}" for link, c in doc["collectives"].items()]
    console.print(f"collectives: measured fits {'; '.join(links)}", highlight=False)
    if doc["unused_rows"]:
        other = ", ".join(f"{n} in {dtype}" for dtype, n in doc["unused_rows"].items())
        console.print(f"[yellow]not used:[/] rows measured in another precision than this {doc['dtype']} plan "
                      f"({other})", highlight=False)
    worst = doc["coverage"][worst]
    if worst < COVERAGE_THRESHOLD and doc["missing"]:
        console.print(f"[yellow]below {COVERAGE_THRESHOLD:.0%}:[/] profile these {len(doc['missing'])} shapes "
                      "(save this output with --json and run 'autopar profile ops --missing-from FILE'):",
                      highlight=False)
        for m in doc["missing"][:20]:
            console.print(f"  {m['op']} {json.dumps(m['dims'])}", highlight=False)


def _require(*modules: str) -> None:
    """Raises AutoparError naming the install command when torch/transformers are missing."""
    import importlib.util

    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        raise AutoparError(f"profile: needs {', '.join(absent)}; install autopar's 'profile' extra (pip install torch transformers)")


def _measure_all(db: OpDB, ops: list, dtype: str, repeats: int, given_device: str | None, out=console) -> dict:
    """Measure the (op, dims) of ``ops`` missing from ``db`` in ``dtype`` and record this machine
    (:func:`autopar.profile.ops.measured_on`, with the run's ``--device``); progress and notes go
    to the rich console ``out``. Returns the ``profile ops --json`` content: ``{"db", "device"
    (this machine's name), "dtype", "shapes", "already_measured", "measured": [{"op", "dims",
    "fwd_s", "bwd_s"}]}``."""
    _require("torch")
    from autopar.profile import ops as O

    device, name = O.local_device()
    versions = O.library_versions()
    record = O.measured_on(given_device, versions)
    db.put_measured_on(record)
    if given_device is not None and record.preset != given_device:
        out.print(f"[yellow]note:[/] measuring on {name!r}, not on a {given_device}: search --device "
                      f"{given_device} uses these rows only with --profile-stands-for {given_device}", highlight=False)
    todo = [(op, dims) for op, dims in ops if not db.has(name, op, dims, dtype, versions)]
    out.print(f"{name}: {len(ops)} shapes, {len(ops) - len(todo)} already measured, {len(todo)} to go",
              highlight=False)
    measured = []
    with phase("profile ops", total=len(todo), description="profiling ops"):
        for op, dims in todo:
            advance(0, description=f"{op} {dims}")
            fwd, bwd, moved = O.measure(op, dims, dtype, device, repeats=repeats)
            db.put(name, op, dims, dtype, versions, fwd, bwd, moved, repeats)
            measured.append({"op": op, "dims": dims, "fwd_s": fwd[0], "bwd_s": bwd[0]})
            advance()
    return {"db": str(db.path), "device": name, "dtype": dtype, "shapes": len(ops),
            "already_measured": len(ops) - len(todo), "measured": measured}


@profile_app.command()
@user_errors
def ops(
    db: Db, model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    top: Annotated[int, typer.Option(help="profile the shapes of the top-N layouts of a search")] = 3,
    tp: Annotated[Optional[int], typer.Option(help="profile one layout instead (with --cp/--ep/--mbs/--sp)")] = None,
    cp: int = 1, ep: int = 1, etp: Optional[int] = None, mbs: int = 1,
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="sequence parallelism [default: on with tp > 1]")] = None,
    missing_from: Annotated[Optional[str], typer.Option(help="a --json result of search/estimate --profile-db")] = None,
    repeats: int = 5, as_json: Json = False, quiet: Quiet = False,
) -> None:
    """Measure the operator shapes a search needs (only those missing from the database)."""
    positive("--repeats", repeats, upper=1000)
    if missing_from:
        try:
            doc = json.loads(Path(missing_from).read_text())
            wanted = [(m["op"], m["dims"]) for m in doc["profile"]["missing"]]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: [[[...]]]
            raise AutoparError(f"--missing-from={missing_from!r}: not a result with profile.missing ({err})") from None
        dtype, planned = doc["profile"]["dtype"], doc["profile"].get("planned_device")
        if dtype not in ("bf16", "fp16", "fp32"):
            raise AutoparError(f"--missing-from={missing_from!r}: profile.dtype={dtype!r}; expected bf16, fp16 or fp32")
        planned = planned if isinstance(planned, str) else None
    else:
        from autopar.profile.shapes import strategy_ops, unique
        from autopar.search import search as run_search
        from autopar.strategy import Strategy

        if not model:
            raise AutoparError("--model: required unless --missing-from is given")
        p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                     flash_attention, vocab_pad)
        if tp is not None:
            from autopar.rules import check_strategy

            for name, value in (("--tp", tp), ("--cp", cp), ("--ep", ep), ("--etp", etp or 1), ("--mbs", mbs)):
                positive(name, value)
            dp = p.world_size // (tp * cp)
            from autopar.specs.script_cli import sequence_parallel_default

            sp = sequence_parallel_default(tp) if sp is None else sp
            layouts = [Strategy(dp=max(dp, 1), tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs, sp=sp)]
            check_strategy(p, layouts[0])  # a layout Megatron refuses has no shapes worth measuring
        else:
            layouts = [e.strategy for e in run_search(p, positive("--top", top, upper=1000)).layouts]
        wanted = unique([op for s in layouts for op in strategy_ops(p, s)])
        dtype = "bf16" if p.train.precision == "fp8" else p.train.precision
        planned = p.cluster.device.name
    from autopar.profile.opdb import OpDB, make_folder

    make_folder(db, "--db")
    _require("torch")  # after the options are checked, before OpDB creates an empty --db file
    with progress_shown(quiet):
        doc = _measure_all(OpDB(db, "--db"), wanted, dtype, repeats, planned, err_console if as_json else console)
    if as_json:
        print_json("profile-ops", doc)


@profile_app.command()
@user_errors
def layer(
    db: Db, model: Model, tp: int = 1, cp: int = 1, ep: int = 1, etp: Optional[int] = None, mbs: int = 1,
    seq_len: Annotated[int, typer.Option("--seq-len", help="sequence length (tokens)")] = 4096,
    recompute: Annotated[Optional[list[str]], typer.Option(help="none | selective | full (repeatable)")] = None,
    moe: Annotated[bool, typer.Option("--moe/--dense", help="profile a MoE layer (else a dense one)")] = False,
    fused: Annotated[bool, typer.Option("--fused/--hf", help="Megatron-equivalent kernels (saved bytes), or HF's "
                                        "as they are (real SDPA: the times --profile-db uses)")] = True,
    repeats: int = 3, as_json: Json = False,
) -> None:
    """Profile the model's own decoder layer at one shard's width (time, saved bytes, CUDA peak)."""
    _require("torch", "transformers")
    import torch

    from autopar.profile import ops as O
    from autopar.profile.layer import Shard, analytic_layer_bytes, build_layer, profile_layer, raw_config
    from autopar.profile.shapes import layer_dims
    from autopar.specs import model_from_hf_dict

    if not model:
        raise AutoparError("--model: required")
    for flag, value in (("--tp", tp), ("--cp", cp), ("--ep", ep), ("--etp", etp or 1), ("--mbs", mbs),
                        ("--repeats", repeats)):
        positive(flag, value, upper=1000)
    positive("--seq-len", seq_len, upper=2**24)
    raw = raw_config(model)
    shard = Shard(tp=tp, cp=cp, ep=ep, etp=etp or tp, mbs=mbs, seq=seq_len)
    device, name = O.local_device()
    layer_mod, rotary = build_layer(raw, shard, moe, device, torch.bfloat16, fused=fused)
    from autopar.profile.opdb import OpDB

    store = OpDB(db, "--db")
    versions = O.library_versions()
    store.put_measured_on(O.measured_on(None, versions))
    rows = []
    for option in recompute or ["none", "selective", "full"]:
        prof = profile_layer(layer_mod, rotary, shard, option, device, torch.bfloat16, repeats=repeats)
        dims = layer_dims(model_from_hf_dict(raw, name=Path(model).stem), tp, cp, ep, shard.etp, mbs, seq_len, moe,
                          option, fused)
        store.put(name, "layer", dims, "bf16", versions, (prof.fwd_s, prof.fwd_spread_s),
                  (prof.bwd_s, prof.bwd_spread_s), 0.0, repeats, prof.saved_bytes, prof.peak_bytes)
        analytic = analytic_layer_bytes(raw, shard, option, moe)
        rows.append({"recompute": option, "fwd_s": prof.fwd_s, "bwd_s": prof.bwd_s, "saved_bytes": prof.saved_bytes,
                     "analytic_saved_bytes": analytic, "peak_bytes": prof.peak_bytes})
        if as_json:
            continue
        peak = f", CUDA peak {prof.peak_bytes / 2**20:.1f} MiB" if prof.peak_bytes is not None else ""
        console.print(f"{option:9s} fwd {prof.fwd_s * 1e3:.2f} ms  bwd {prof.bwd_s * 1e3:.2f} ms  saved "
                      f"{prof.saved_bytes / 2**20:.2f} MiB (analytic {analytic / 2**20:.2f}){peak}", highlight=False)
    if as_json:
        print_json("profile-layer", {"db": db, "device": name, "model": model, "moe": moe, "fused": fused,
                                     "shard": {"tp": tp, "cp": cp, "ep": ep, "etp": shard.etp, "mbs": mbs,
                                               "seq_len": seq_len}, "layers": rows})


@profile_app.command()
@user_errors
def comm(
    db: Db, sizes: Annotated[str, typer.Option(help="message sizes in bytes, comma-separated")] = "65536,1048576,8388608",
    repeats: int = 5, as_json: Json = False,
) -> None:
    """Sweep collectives (run under torchrun) and fit latency + bus bandwidth per link class."""
    _require("torch")
    import torch
    import torch.distributed as dist

    from autopar.profile import ops as O
    from autopar.profile.comm import COLLECTIVES, fit, sweep

    from autopar.integers import is_integer_text

    if not all(is_integer_text(s) for s in sizes.split(",")):
        raise AutoparError(f"--sizes={sizes!r}: expected byte counts like 65536,1048576")
    message_bytes = [int(s) for s in sizes.split(",")]
    for size in message_bytes:
        positive("--sizes", size, upper=2**34)
    positive("--repeats", repeats, upper=1000)
    if "RANK" not in os.environ:
        raise AutoparError("profile comm: launch it with torchrun, e.g. 'torchrun --nproc-per-node 8 "
                           "-m autopar.profile comm --db FILE'")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        samples = sweep(message_bytes, repeats)
    finally:
        dist.destroy_process_group()
    if not samples:  # a rank other than 0: rank 0 reports
        return
    out = err_console if as_json else console
    _, name = O.local_device()
    versions = O.library_versions() + f" backend={backend}"
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    from autopar.profile.opdb import OpDB

    store = OpDB(db, "--db")
    store.put_measured_on(O.measured_on(None, versions))
    for row in samples:
        store.put_comm(name, *row, versions)
    fits = []
    for collective in COLLECTIVES:
        for link in sorted({s[1] for s in samples}):
            points = [(g, b, t) for c, lk, g, b, t in samples if c == collective and lk == link]
            try:
                alpha, bw = fit(points, collective)
            except ValueError as err:
                out.print(f"[yellow]skip[/] {link} {err}", highlight=False)
                continue
            store.put_comm_fit(name, collective, link, alpha, bw, len(points), ranks_per_node, versions)
            fits.append({"collective": collective, "link": link, "alpha_s": alpha, "bus_bandwidth_bytes_per_s": bw,
                         "samples": len(points)})
            out.print(f"{link:5s} {collective:14s} alpha {alpha * 1e6:8.2f} us/step  bus bandwidth "
                          f"{bw / 1e9:8.3f} GB/s  ({len(points)} samples)", highlight=False)
    if as_json:
        print_json("profile-comm", {"db": db, "device": name, "backend": backend, "ranks_per_node": ranks_per_node,
                                    "samples": len(samples), "fits": fits})

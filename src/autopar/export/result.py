"""Read one layout back from a search result JSON (the README's stable schema)."""

from __future__ import annotations

from typing import Any, Callable

from pydantic import ValidationError

from autopar.errors import AutoparError, from_validation_error, read_text
from autopar.problem import Problem
from autopar.schemas import schema_version
from autopar.specs.long_numbers import json_loads, too_large
from autopar.specs.model import MAX_SIZE
from autopar.strategy import RECOMPUTE_MODULES, Strategy

FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "sp", "recompute", "recompute_layers",
           "schedule", "layers_per_stage", "recompute_per_stage", "recompute_modules", "account_for_embedding",
           "account_for_loss", "pipeline_layout", "tp_comm_overlap", "cp_comm_type", "cp_a2a", "vocab_tp", "vocab_sp",
           "tp_consecutive", "moe_dispatcher", "moe_ep_overlap")


def _modules(value: object, path: str, rank: int) -> tuple[str, ...]:
    """The ``recompute_modules`` entry of layout ``rank`` as a tuple of Megatron module names.

    Raises:
        AutoparError: not a non-empty list of names from :data:`~autopar.strategy.RECOMPUTE_MODULES`
            (one line, instead of pydantic's per-item errors).
    """
    if not (isinstance(value, list) and value and all(isinstance(n, str) and n in RECOMPUTE_MODULES for n in value)):
        shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
        raise AutoparError(f"--from={path!r}: layout {rank} recompute_modules={shown}: expected a list of one or "
                           f"more of {', '.join(RECOMPUTE_MODULES)} (e.g. [\"core_attn\"])")
    return tuple(value)


def _read(path: str) -> dict[str, Any]:
    """The search result JSON at ``path`` (an object with ``layouts``; a ``document`` other than
    ``search`` or a ``schema_version`` other than this autopar's is refused, a result written
    before documents carried them is read).

    Raises:
        AutoparError: unreadable, not JSON, without ``layouts``, another document or version.
    """
    text = read_text(path, "--from", "expected a search result JSON")  # a FIFO would block the read
    try:
        doc = json_loads(text)
        doc["layouts"]
    except (ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: [[[...]]]
        raise AutoparError(f"--from={path!r}: not a readable search result ({err})") from None
    name, version = doc.get("document", "search"), doc.get("schema_version", schema_version("search"))
    if name != "search":
        raise AutoparError(f"--from={path!r}: document={name!r}; expected a search result (autopar search --json or "
                           "--report's result.json)")
    if version != schema_version("search"):
        raise AutoparError(f"--from={path!r}: schema_version={version!r}; this autopar reads search documents of "
                           f"version {schema_version('search')}: re-run the search")
    return doc


def strategy_from_result(path: str, rank: int, p: Problem) -> Strategy:
    """Layout number ``rank`` (1 = best) of the search result at ``path``.

    Raises:
        AutoparError: a path that is not a regular file, unreadable file, not a search result, rank out of range, a layout whose
            world size or global batch differs from the problem's.
    """
    layouts = _read(path)["layouts"]
    if not isinstance(layouts, list):
        raise AutoparError(f"--from={path!r}: 'layouts' is a {type(layouts).__name__}, expected the list a search "
                           "result holds")
    if not layouts:  # was "--rank=1: the result holds layouts 1..0"
        raise AutoparError(f"--from={path!r}: the result holds no layouts (its search found none that fit)")
    if not 1 <= rank <= len(layouts):
        raise AutoparError(f"--rank={rank}: the result holds layouts 1..{len(layouts)}")
    raw = layouts[rank - 1].get("strategy") if isinstance(layouts[rank - 1], dict) else None
    if not isinstance(raw, dict):
        raise AutoparError(f"--from={path!r}: layouts[{rank - 1}] has no 'strategy' object")
    fields = {k: raw[k] for k in FIELDS if k in raw}
    if fields.get("pipeline_layout") is not None:  # the layout's stage sums, written for reading (Estimate.to_dict)
        fields.pop("layers_per_stage", None)
    for key in ("gbs", *fields):
        why = too_large(key, raw.get(key), f"sizes are at most {MAX_SIZE}")
        if why:
            raise AutoparError(f"--from={path!r}: layout {rank} {why}")
    for key in ("layers_per_stage", "recompute_per_stage"):
        value = fields.get(key)
        if value is not None and not isinstance(value, list):
            raise AutoparError(f"--from={path!r}: layout {rank} {key}={value!r}: expected a list (one entry per "
                               "pipeline stage) or null")
        fields[key] = tuple(value or ()) or None
    if "recompute_modules" in fields:
        fields["recompute_modules"] = _modules(fields["recompute_modules"], path, rank)
    try:
        s = Strategy.model_validate(fields, strict=True)  # a JSON true or "8" is not a size
    except ValidationError as err:
        raise from_validation_error(err, f"{path} layout {rank}") from None
    gbs = raw.get("gbs", p.train.global_batch_size)
    if isinstance(gbs, bool) or not isinstance(gbs, int):
        raise AutoparError(f"--from={path!r}: layout {rank} gbs={gbs!r}: expected an integer")
    if s.world_size != p.world_size or gbs != p.train.global_batch_size:
        raise AutoparError(f"--from={path!r}: layout {rank} is for {s.world_size} devices and gbs {raw.get('gbs')}, "
                           f"the problem has {p.world_size} and gbs {p.train.global_batch_size}; pass the same "
                           "--nodes/--gbs as the search")
    return s


# Problem options of ``autopar export`` -> (option name, how the recorded problem holds it).
_SCALAR_OPTIONS: dict[str, tuple[str, Callable[[Problem], object]]] = {
    "nodes": ("--nodes", lambda p: p.cluster.num_nodes),
    "devices_per_node": ("--devices-per-node", lambda p: p.cluster.devices_per_node),
    "gbs": ("--gbs", lambda p: p.train.global_batch_size),
    "seq_len": ("--seq-len", lambda p: p.train.seq_len),
    "precision": ("--precision", lambda p: p.train.precision),
    "flash": ("--flash-attention", lambda p: p.train.flash_attention),
    "vocab_pad": ("--make-vocab-size-divisible-by", lambda p: p.train.make_vocab_size_divisible_by),
    "moe_token_imbalance": ("--moe-token-imbalance", lambda p: p.train.moe_token_imbalance),
    "fp8_param_storage": ("--fp8-param-storage", lambda p: p.train.fp8_param_storage),
    "fp8_recipe": ("--fp8-recipe", lambda p: p.train.fp8_recipe),
    "cuda_graph_impl": ("--cuda-graph-impl", lambda p: p.train.cuda_graph_impl),
    "cuda_graph_scope": ("--cuda-graph-scope", lambda p: p.train.cuda_graph_scope),
    "activation_offload_layers": ("--activation-offload-layers", lambda p: p.train.activation_offload_layers),
    "fp8_bf16_layers": ("--fp8-bf16-layers", lambda p: p.train.fp8_bf16_layers),
}


def result_problem(path: str, model: str | None = None, script: str | None = None, vocab_size: int | None = None,
                   device: str | None = None, device_file: str | None = None, device_set: list[str] | None = None,
                   **given: Any) -> Problem:
    """The problem the search result at ``path`` was made for (its ``"problem"`` record,
    :mod:`autopar.problem_record`), checked against what the command line also says.

    Options left out take the result's values, so ``export --from R.json --format F`` needs no
    model or cluster options. Each option given (``given``: the keys of :data:`_SCALAR_OPTIONS`,
    None = not given; a ``--script``'s batch, sequence, precision and launcher values count as
    given) must equal the result's; ``--model`` / ``--script`` / ``--vocab-size`` must give a
    model of the same :func:`~autopar.problem_record.model_sha256`, and ``--device`` /
    ``--device-file`` / ``--device-set`` a device of the same
    :func:`~autopar.problem_record.device_sha256`.

    Raises:
        AutoparError: unreadable result; a result without a ``"problem"`` record (written before
            results carried their problem: re-run the search, its layouts' costs cannot be
            checked against this command line); a malformed record; or one line naming the first
            option that differs, the result's value and the given one.
    """
    from autopar.problem_record import device_sha256, model_sha256, problem_from_record
    from autopar.specs import load_device
    from autopar.specs.script import read_script
    from autopar.specs.script_cli import cli_defaults, model_for

    doc = _read(path)
    if "problem" not in doc or doc["problem"] is None:
        raise AutoparError(f"--from={path!r}: the result has no 'problem' record (it was written by an autopar "
                           "that did not record the model, device, cluster and batch searched); re-run the search "
                           "and export from its new result")
    recorded = problem_from_record(doc["problem"], path)
    plan = read_script(script) if script else None
    values = cli_defaults(plan, {k: given.get(k) for k in _SCALAR_OPTIONS}) if plan else given
    for key, (option, held) in _SCALAR_OPTIONS.items():
        value, want = values.get(key), held(recorded)
        if value is not None and value != want:
            where = "" if given.get(key) is not None else f" (from --script {script!r})"
            raise AutoparError(f"{option}={value!r}{where}: the result at {path!r} was searched with {option}="
                               f"{want!r}; drop the option or pass the same value (or re-run the search)")
    spec = recorded.model
    if model is not None or plan is not None:
        spec = model_for(model, plan, vocab_size)
    elif vocab_size is not None:
        spec = recorded.model.model_copy(update={"vocab_size": vocab_size})
    if model_sha256(spec) != model_sha256(recorded.model):
        option = (f"--model={model!r}" if model is not None else f"--script={script!r}" if plan is not None
                  else f"--vocab-size={vocab_size}")
        raise AutoparError(f"{option}: model {spec.name} (config sha256 {model_sha256(spec)[:12]}) is not the model "
                           f"the result at {path!r} was searched for, {recorded.model.name} (sha256 "
                           f"{model_sha256(recorded.model)[:12]}); pass that model or re-run the search")
    if device is not None or device_file is not None or device_set:
        dev = load_device(device, device_file, device_set)
        if device_sha256(dev) != device_sha256(recorded.cluster.device):
            shown = " ".join([f"{o}={v!r}" for o, v in (("--device", device), ("--device-file", device_file)) if v]
                             + [f"--device-set {item}" for item in device_set or ()])
            raise AutoparError(f"{shown}: device {dev.name} (sha256 {device_sha256(dev)[:12]}) is not the device "
                               f"the result at {path!r} was searched on, {recorded.cluster.device.name} (sha256 "
                               f"{device_sha256(recorded.cluster.device)[:12]}, --device-set overrides included); "
                               "pass the same device options or re-run the search")
    return recorded

"""``autopar export``: one layout written as a framework's config."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from autopar.cli.app import app, err_console, user_errors
from autopar.cli.config import Config
from autopar.cli.inputs import layout_options, problem_from_options, strategy_from_options
from autopar.cli.json_output import print_json
from autopar.cli.knob_options import given_knobs
from autopar.cli.options import (
    ActivationOffload,
    CudaGraphImpl,
    CudaGraphScope,
    Fp8Bf16Layers,
    Cp,
    CpA2a,
    CpCommType,
    Device,
    DeviceFile,
    DeviceSet,
    Dp,
    EmbeddingLoss,
    Ep,
    Etp,
    Flash,
    Fp8ParamStorage,
    Fp8Recipe,
    Gbs,
    Json,
    LayersPerStage,
    Mbs,
    Model,
    MoeDispatcherOpt,
    MoeEpOverlap,
    MoeImbalance,
    Nodes,
    PerNode,
    PipelineLayoutOpt,
    Pp,
    Precision,
    RecomputeLayers,
    RecomputeModules,
    RecomputeOpt,
    RecomputePerStage,
    ScheduleOpt,
    Script,
    SeqLen,
    Sp,
    Tp,
    TpCommOverlap,
    TpConsecutive,
    VocabPad,
    VocabSize,
    VocabSp,
    VocabTp,
    Vpp,
    Zero,
)
from autopar.cli.paths import refuse_overwriting_inputs
from autopar.errors import AutoparError


@app.command()
@user_errors
def export(
    fmt: Annotated[str, typer.Option("--format", help="megatron | megatron-bridge | mindspeed | torchtitan | "
                                                 "deepspeed | galvatron | sapp")],
    from_result: Annotated[Optional[str], typer.Option("--from", help="search result JSON (autopar search --json "
                                                       "or --report's result.json)")] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", help="which layout of --from, 1 = best [default: 1]")] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="write here instead of stdout (deepspeed: a directory or "
                                               "FILE.json; megatron_deepspeed_args.sh goes next to it)")] = None,
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    tp: Tp = None, pp: Pp = None, dp: Dp = None, cp: Cp = None, vpp: Vpp = None, ep: Ep = None, etp: Etp = None,
    mbs: Mbs = None, zero: Zero = None, sp: Sp = None, recompute: RecomputeOpt = None,
    tp_comm_overlap: TpCommOverlap = None, cp_comm_type: CpCommType = None, cp_a2a: CpA2a = None,
    moe_dispatcher: MoeDispatcherOpt = None, moe_ep_overlap: MoeEpOverlap = None,
    vocab_tp: VocabTp = None, vocab_sp: VocabSp = None, tp_consecutive: TpConsecutive = None,
    recompute_layers: RecomputeLayers = None, schedule: ScheduleOpt = None, layers_per_stage: LayersPerStage = None,
    recompute_per_stage: RecomputePerStage = None, embedding_loss_split: EmbeddingLoss = None,
    pipeline_layout: PipelineLayoutOpt = None,
    script: Script = None, vocab_size: VocabSize = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    fp8_recipe: Fp8Recipe = None,
    cuda_graph_impl: CudaGraphImpl = None, cuda_graph_scope: CudaGraphScope = None,
    activation_offload_layers: ActivationOffload = None, fp8_bf16_layers: Fp8Bf16Layers = None,
    recompute_modules: RecomputeModules = None, config: Config = None, as_json: Json = False,
) -> None:
    """Write one layout as a framework config: a search result's (--from, --rank) or an explicit one."""
    from pathlib import Path

    from autopar.export import FILE_PATHS, FILE_WRITERS, WRITERS
    from autopar.export.result import strategy_from_result
    from autopar.rules import check_strategy

    if fmt not in WRITERS:
        raise AutoparError(f"--format={fmt!r}: allowed {', '.join(WRITERS)}")
    if rank is not None and not from_result:
        raise AutoparError(f"--rank={rank} picks a layout of a search result; add --from RESULT.json or give the "
                           "layout options (--tp, --pp, ...)")
    if out is not None:
        refuse_overwriting_inputs(
            {"--from": from_result, "--model": model, "--script": script, "--device-file": device_file},
            {"--out": (out, FILE_PATHS[fmt](Path(out)) if fmt in FILE_PATHS else [Path(out)])})
    from autopar.search.grid import for_target

    knobs = given_knobs(cuda_graph_impl, cuda_graph_scope, activation_offload_layers, fp8_bf16_layers)
    if from_result:  # the result's own problem; options given must agree with it
        from autopar.export.result import result_problem

        p = for_target(result_problem(from_result, model, script, vocab_size, device, device_file, device_set,
                                      nodes=nodes, devices_per_node=devices_per_node, gbs=gbs, seq_len=seq_len,
                                      precision=precision, flash=flash_attention, vocab_pad=vocab_pad,
                                      moe_token_imbalance=moe_token_imbalance,
                                      fp8_param_storage=fp8_param_storage, fp8_recipe=fp8_recipe, **knobs), fmt)
    else:
        p = for_target(problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision,
                                            device_file, device_set, flash_attention, vocab_pad, script, vocab_size,
                                            moe_token_imbalance, fp8_param_storage,
                                 fp8_recipe=fp8_recipe, knobs=knobs), fmt)
    from autopar.specs.targets import check_target

    check_target(p.cluster.device, fmt, "--format")
    layout = layout_options(p, locals())
    if from_result:
        given = sorted(k for k, v in {**layout, "dp": dp, "schedule": schedule}.items() if v is not None)
        if given:
            raise AutoparError(f"--from with --{', --'.join(g.replace('_', '-') for g in given)}: the layout comes "
                               "from the search result; drop the layout options or --from")
        strategy = strategy_from_result(from_result, 1 if rank is None else rank, p)
    else:
        strategy = strategy_from_options(p, script, layout, dp, schedule, target=fmt)
    check_strategy(p, strategy)
    try:
        text = WRITERS[fmt](p, strategy)
    except AutoparError as err:
        if not from_result:
            raise
        # the layout options the writer names cannot be given with --from: say what can be done
        raise AutoparError(f"{err}; the layout is --from {from_result}'s: search again with --target {fmt} to rank "
                           f"the layouts {fmt} runs unchanged, then export that result") from None
    written: list = []
    if out and fmt in FILE_WRITERS:  # several files (deepspeed: the JSON and the script that reads it)
        written = FILE_WRITERS[fmt](p, strategy, Path(out))
        err_console.print(f"wrote {', '.join(map(str, written))}", highlight=False)
    elif out:
        try:
            Path(out).write_text(text)
        except OSError as err:
            raise AutoparError(f"--out={out!r}: cannot write ({err.strerror})") from None
        written = [Path(out)]
        err_console.print(f"wrote {out}", highlight=False)
    elif not as_json:
        sys.stdout.write(text)
    if fmt == "galvatron":
        from autopar.export.galvatron import runtime_flags

        if flags := runtime_flags(strategy):  # not a JSON key: say it wherever the JSON went
            err_console.print(f"note: launch Galvatron with {' '.join(flags)}: the plan shards activations over "
                              f"tp={strategy.tp} (Megatron sequence parallelism), a runtime flag that no JSON key "
                              "sets and Galvatron leaves off", highlight=False)
    if as_json:
        from autopar.estimate import estimate

        print_json("export", {"format": fmt, "text": text,
                              "files": [{"path": str(f), "text": Path(f).read_text()} for f in written],
                              "layout": estimate(p, strategy).to_dict(p.train.global_batch_size)})

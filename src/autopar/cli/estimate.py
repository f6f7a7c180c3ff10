"""``autopar estimate``: memory per stage and step time (with its breakdown) of one explicit layout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from autopar.cli.app import app, console, err_console, user_errors
from autopar.cli.config import Config
from autopar.cli.inputs import layout_options, problem_from_options, strategy_from_options
from autopar.cli.json_output import print_json
from autopar.cli.knob_options import given_knobs
from autopar.cli.options import (
    ActivationOffload,
    Cp,
    CpA2a,
    CpCommType,
    CudaGraphImpl,
    CudaGraphScope,
    Device,
    DeviceFile,
    DeviceSet,
    Dp,
    EmbeddingLoss,
    Ep,
    Etp,
    Flash,
    Fp8Bf16Layers,
    Fp8ParamStorage,
    Fp8Recipe,
    Gbs,
    Json,
    LayersPerStage,
    Margin,
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
    ProfileDb,
    ProfileDevice,
    ProfileStandsFor,
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
from autopar.cli.paths import refuse_overwriting_inputs, refuse_unwritable_figure
from autopar.errors import AutoparError

if TYPE_CHECKING:
    from autopar.problem import Problem
    from autopar.strategy import Strategy

EstimateTarget = Annotated[Optional[str], typer.Option(
    "--target", help="cost the layout as this export format runs it (search --target's mechanism): megatron | "
    "megatron-bridge | mindspeed | torchtitan | deepspeed | sapp | galvatron (e.g. FSDP's gradient reduced once per "
    "step); a layout the format's writer refuses, or a format that does not run on --device, is refused "
    "[default: costed as megatron (mindspeed on Ascend) without refusing what its writer cannot write]")]
EstimatePlot = Annotated[Optional[str], typer.Option(
    "--plot", help="also write this layout's simulated pipeline timeline and memory per stage (.png, .svg or .pdf)")]


@app.command()
@user_errors
def estimate(
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
    memory_margin: Margin = 0.10, as_json: Json = False, script: Script = None, vocab_size: VocabSize = None,
    profile_db: ProfileDb = None, profile_device: ProfileDevice = None, profile_stands_for: ProfileStandsFor = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    fp8_recipe: Fp8Recipe = None,
    cuda_graph_impl: CudaGraphImpl = None, cuda_graph_scope: CudaGraphScope = None,
    activation_offload_layers: ActivationOffload = None, fp8_bf16_layers: Fp8Bf16Layers = None,
    recompute_modules: RecomputeModules = None, config: Config = None, plot: EstimatePlot = None,
    target: EstimateTarget = None,
    detail: Annotated[bool, typer.Option("--detail", help="also each pipeline stage's forward, backward, recompute "
                                         "and communication time and its memory (Tinker's --detail); with --json: "
                                         "time_per_stage")] = False,
) -> None:
    """Estimate memory (per stage) and step time (with breakdown) of one explicit layout."""
    from autopar.estimate import estimate as run_estimate
    from autopar.report.table import print_estimate, problem_title

    refuse_overwriting_inputs({"--model": model, "--script": script, "--device-file": device_file,
                               "--profile-db": profile_db}, {"--plot": (plot, [Path(plot)] if plot else [])})
    refuse_unwritable_figure("--plot", plot)
    p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                 flash_attention, vocab_pad, script, vocab_size, moe_token_imbalance, fp8_param_storage,
                                 fp8_recipe=fp8_recipe, knobs=given_knobs(
                                     cuda_graph_impl, cuda_graph_scope, activation_offload_layers, fp8_bf16_layers))
    layout = layout_options(p, locals())
    given = target is not None
    p, target = as_target(p, target)
    from autopar.cli.profile import print_coverage, profiled

    with profiled(p, profile_db, profile_device, profile_stands_for) as coverage:
        if not 0 <= memory_margin < 1:
            raise AutoparError(f"--memory-margin={memory_margin}: must be in [0, 1)")
        strategy = strategy_from_options(p, script, layout, dp, schedule, target)
        if given:  # without --target: the layout as modelled, whatever format runs it
            refuse_unrunnable(p, target, strategy)
        result = run_estimate(p, strategy, memory_margin)
        measured = coverage and coverage([result.strategy])
    if as_json:
        from autopar.cost.step import mfu_peak_flops_per_s
        from autopar.report.ties import problem_certainty, with_ranges

        bands = problem_certainty(p)
        doc = {**with_ranges(result.to_dict(p.train.global_batch_size, detail=detail), bands),
               "mfu_peak_flops_per_s": mfu_peak_flops_per_s(p), "certainty": bands.to_dict(), "target": target}
        if measured:
            doc["profile"] = measured
        print_json("estimate", doc)
        return
    console.print(problem_title(p))
    print_estimate(console, result, p)
    if detail:
        from autopar.report.stage_detail import print_stage_detail

        print_stage_detail(console, result)
    if measured:
        print_coverage(measured)
    if plot:
        from autopar.report.layout_plot import plot_layout

        err_console.print(f"wrote {plot_layout(p, result, plot)}", highlight=False)


def as_target(p: Problem, target: str | None) -> tuple[Problem, str]:
    """(``p`` costed as ``target`` runs it, the target's name): :func:`autopar.search.grid.for_target`,
    the mechanism of ``search --target``; the device's default format where ``target`` is None.

    Raises:
        AutoparError: an unknown format, or one that does not run on the device (naming ``--target``).
    """
    from autopar.export import WRITERS
    from autopar.search.grid import for_target
    from autopar.specs.targets import check_target, default_target

    target = target or default_target(p.cluster.device)
    if target not in WRITERS:
        raise AutoparError(f"--target={target}: not an export format; allowed: {', '.join(sorted(WRITERS))}")
    check_target(p.cluster.device, target, "--target")
    return for_target(p, target), target


def refuse_unrunnable(p: Problem, target: str, strategy: Strategy) -> None:
    """Refuse a layout ``target``'s writer cannot write unchanged (its cost would be of a run that
    cannot happen).

    Raises:
        AutoparError: ``--target=NAME cannot run this layout: <the writer's reason>``.
    """
    from autopar.search.grid import refusal

    why = refusal(p, target, strategy)
    if why:
        raise AutoparError(f"--target={target} cannot run this layout: {why}")

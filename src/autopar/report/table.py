"""Rich tables for search results, one layout's estimate, and the device presets."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autopar.estimate import Estimate
from autopar.problem import Problem
from autopar.report.ties import model_note, rank_marks, sharding_note, ties_note
from autopar.search import SearchResult
from autopar.specs import DeviceSpec
from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES, Strategy, default_layers_per_stage
from autopar.validate.bands import Certainty

GIB = 2**30


SPLIT_MARKS = {"+": "+el (+e, +l): embedding and loss counted as pipeline layers (Megatron "
                    "--account-for-embedding/loss-in-pipeline-split)",
               "~": "~: a balanced split of the layers, not the default one (even; when pp does not divide the "
                    "layers, ceil(L/pp) per middle stage and the rest on the first and last); layers_per_stage in "
                    "the JSON",
               "*": "*: a flexible Megatron --pipeline-model-parallel-layout (unequal chunks; the layers do not "
                    "split evenly over pp x vpp); pipeline_layout in the JSON and under the estimate"}


def split_mark(e: Estimate) -> str:
    """``*`` for a flexible ``pipeline_layout``, ``+el`` (``+e``, ``+l``) when the split counts the embedding (loss) as a layer, ``~`` when
    ``layers_per_stage`` differs from :func:`~autopar.strategy.default_layers_per_stage` for the
    layout's pp and switches (the balancer's split), else ``""``."""
    s = e.strategy
    if s.pipeline_layout is not None:
        return "*"
    mark = ("+" + "e" * s.account_for_embedding + "l" * s.account_for_loss
            if s.account_for_embedding or s.account_for_loss else "")
    if s.pp > 1 and s.layers_per_stage:
        default = default_layers_per_stage(sum(s.layers_per_stage), s.pp, s.account_for_embedding,
                                           s.account_for_loss)
        mark += "~" if tuple(s.layers_per_stage) != default else ""
    return mark


def split_legend(layouts: list[Estimate]) -> str | None:
    """What the :func:`split_mark` marks used by ``layouts`` mean (one line), or None if none is."""
    marks = "".join(split_mark(e) for e in layouts)
    return "; ".join(text for mark, text in SPLIT_MARKS.items() if mark in marks) or None


def recompute_notes(layouts: list[Estimate]) -> list[str]:
    """What the short :func:`recompute_label` forms used by ``layouts`` mean, one note per form
    (empty when every row is a plain ``none`` / ``selective`` / ``full``): the modules behind
    ``sel a+b`` (Megatron ``--recompute-modules``), ``full xN`` (``--recompute-method block
    --recompute-num-layers N``: the first N layers of each pipeline chunk, the others keep their
    activations; :class:`~autopar.strategy.Strategy`) and the ``per stage`` letters."""
    labels = [recompute_label(e) for e in layouts]
    notes = []
    used = {m for e in layouts if e.strategy.recompute_modules != DEFAULT_RECOMPUTE_MODULES
            for m in e.strategy.recompute_modules}
    if used:
        notes.append("sel a+b: selective recompute of Megatron --recompute-modules: "
                     + ", ".join(f"{_MODULE_SHORT[m]} = {m}" for m in RECOMPUTE_MODULES if m in used))
    if any(label.startswith("full x") for label in labels):
        notes.append("full xN: full recompute of the first N layers of each pipeline chunk "
                     "(--recompute-method block --recompute-num-layers N); full: every layer")
    if any(label.startswith("per stage") for label in labels):
        notes.append("per stage f2 s1 n1: full / selective / none on that many consecutive stages")
    return notes


_CP_ALGORITHMS = {"a2a": "cpN:a2a Ulysses all-to-all", "allgather": "cpN:allgather K/V all-gather",
                  "a2a+p2p": "cpN:a2aK+p2p all-to-all within groups of K, ring across them"}
_DISPATCHERS = ("allgather", "deepep", "hybridep")


#: The setting each target writes for TP communication overlap (:mod:`autopar.export.comm_knobs`).
TP_OVERLAP_FLAGS = {"mindspeed": "--use-ascend-mc2", "torchtitan": "parallelism.enable_async_tensor_parallel"}


def label_legend(layouts: list[Estimate], target: str = "megatron") -> str | None:
    """What the :func:`layout_label` suffixes used by ``layouts`` mean, in one line (only those
    that appear; the split marks are :func:`split_legend`'s), or None when no label has one:
    ``+sp`` Megatron sequence parallelism, ``+ov`` TP communication overlap, ``ppPxV`` V virtual
    stages per rank, a context-parallel algorithm other than the ring, ``epE/etpT`` with a MoE
    dispatcher other than alltoall (``:deepep``) and the EP all-to-all overlap (``+a2a``), and
    Galvatron's and torchtitan's marks (:func:`galvatron_marks`, ``zbv``, ``dualpipev``). The
    ``+ov`` text names ``target``'s setting (:data:`TP_OVERLAP_FLAGS`; Megatron's ``--tp-comm-overlap``)."""
    ss = [e.strategy for e in layouts]
    parts = []
    if any(s.sp for s in ss):
        parts.append("+sp sequence parallelism")
    if any(s.tp_comm_overlap for s in ss):
        flag = TP_OVERLAP_FLAGS.get(target, "--tp-comm-overlap")
        parts.append(f"+ov TP communication overlapped with the GEMMs ({flag})")
    if any(s.vpp > 1 for s in ss):
        parts.append("ppPxV V virtual stages (model chunks) per pipeline rank, interleaved")
    parts += [text for algo, text in _CP_ALGORITHMS.items() if any(s.cp > 1 and s.cp_comm_type == algo for s in ss)]
    if any(s.cp > 1 and s.cp_comm_type != "p2p" for s in ss):
        parts[-1] += " (the p2p ring is unmarked)"
    if any(s.ep > 1 for s in ss):
        parts.append("epE/etpT expert-parallel and expert tensor-parallel sizes")
    used = [d for d in _DISPATCHERS if any(s.ep > 1 and s.moe_dispatcher == d for s in ss)]
    if used:
        parts.append(f"{', '.join(':' + d for d in used)} MoE token dispatcher (alltoall is unmarked)")
    if any(s.ep > 1 and s.moe_ep_overlap for s in ss):
        parts.append("+a2a EP all-to-all overlapped with another micro-batch's compute "
                     "(--overlap-moe-expert-parallel-comm)")
    marks = {m.rstrip("0123456789") for s in ss for m in galvatron_marks(s)}
    parts += [text for mark, text in (("vtp", "vtpN vocabulary layers at tp N"),
                                      ("vsp", "vspN vocabulary layers sequence-split over N"),
                                      ("gpipe", "gpipe GPipe schedule"),
                                      ("tp-nc", "tp-nc TP groups strided over the data-parallel ranks"))
              if mark in marks]
    parts += [f"{v} torchtitan's {name} schedule" for v, name in (("zbv", "ZB-V"), ("dualpipev", "DualPipeV"))
              if any(s.schedule == v for s in ss)]
    return "layout: " + "; ".join(parts) if parts else None


BUBBLE_NOTE = ("bubble: pp_bubble / step, the time the pipeline's fill and drain add to the slowest stage's work "
               "(a timeline's 'ranks idle' also counts faster stages waiting for slower ones)")


def no_tp_overlap_note(layouts: list[Estimate], target: str) -> str | None:
    """For a target whose writer cannot write TP communication overlap
    (:data:`autopar.export.comm_knobs.TP_OVERLAP_TARGETS`) and a ranking with a tp > 1 row: that its
    TP collectives are costed exposed, so tp > 1 ranks lower than with an overlapping target."""
    from autopar.export.comm_knobs import TP_OVERLAP_TARGETS

    if target in TP_OVERLAP_TARGETS or not any(e.strategy.tp > 1 for e in layouts):
        return None
    others = sorted(TP_OVERLAP_TARGETS)
    return (f"--target {target} cannot write TP communication overlap: its tp > 1 layouts are costed with their TP "
            f"collectives exposed (with --target {', '.join(others[:-1])} or {others[-1]} they overlap)")


def table_notes(layouts: list[Estimate], target: str = "megatron") -> str | None:
    """The legends a ranking table needs (:func:`label_legend`, :func:`split_legend`, :func:`recompute_notes`,
    :data:`BUBBLE_NOTE` when a row is pipelined, :func:`no_tp_overlap_note`), one per line, or None when no row
    uses a mark, a short form or a pipeline."""
    bubble = [BUBBLE_NOTE] if any(e.strategy.pp > 1 for e in layouts) else []
    legends = [n for n in (label_legend(layouts, target), split_legend(layouts)) if n]
    overlap = [n for n in (no_tp_overlap_note(layouts, target),) if n]
    return "\n".join(legends + recompute_notes(layouts) + bubble + overlap) or None


def layout_label(e: Estimate) -> str:
    """Compact one-line description of a layout, e.g. ``tp8+sp pp4x5 cp1 dp2`` (x5 = vpp), with
    :func:`split_mark` after the pipeline part (``pp32x2+el``, ``pp4~``); ``+ov`` marks TP
    communication overlap, ``cp4:a2a`` / ``cp8:a2a2+p2p`` a context-parallel algorithm other than the ring,
    ``ep8/etp1:deepep`` a MoE dispatcher other than alltoall and ``+a2a`` the EP all-to-all overlap;
    Galvatron's knobs follow (:func:`galvatron_marks`)."""
    s = e.strategy
    parts = [f"tp{s.tp}" + ("+sp" if s.sp else "") + ("+ov" if s.tp_comm_overlap else ""),
             f"pp{s.pp}" + (f"x{s.vpp}" if s.vpp > 1 else "") + split_mark(e)]
    cp_algo = {"p2p": "", "a2a+p2p": f":a2a{s.cp_a2a_size}+p2p"}.get(s.cp_comm_type, f":{s.cp_comm_type}")
    parts += [f"cp{s.cp}" + (cp_algo if s.cp > 1 else ""), f"dp{s.dp}"]
    if s.ep > 1:
        parts.append(f"ep{s.ep}/etp{s.expert_tp}" + ("" if s.moe_dispatcher == "alltoall" else f":{s.moe_dispatcher}")
                     + ("+a2a" if s.moe_ep_overlap else ""))
    return " ".join(parts + galvatron_marks(s) + ([s.schedule] if s.schedule in ("zbv", "dualpipev") else []))


def galvatron_marks(s) -> list[str]:
    """Label parts of Galvatron's own knobs (:class:`~autopar.strategy.Strategy`): ``vtp4`` (vocabulary
    TP 4), ``vsp4`` (vocabulary layers sequence-split over 4), ``gpipe``, ``tp-nc`` (non-consecutive
    TP groups); none for a Megatron-style layout. (torchtitan's V schedules add ``zbv`` /
    ``dualpipev`` after them.)"""
    marks = [f"vsp{s.vocab_tp_size}"] if s.vocab_sp else [f"vtp{s.vocab_tp_size}"] if s.vocab_tp_size != s.tp else []
    return marks + (["gpipe"] if s.schedule == "gpipe" else []) + ([] if s.tp_consecutive else ["tp-nc"])


_SHORT = {"none": "n", "selective": "s", "full": "f"}
_MODULE_SHORT = {"core_attn": "attn", "layernorm": "norm", "mla_up_proj": "mla", "moe_act": "act", "mlp": "mlp",
                 "moe": "moe", "shared_experts": "shared"}


def recompute_label(e: Estimate) -> str:
    """``selective``, ``sel attn+norm+mla+act`` (selective with other modules than core_attn:
    attn/norm/mla/act/mlp/moe/shared = core_attn/layernorm/mla_up_proj/moe_act/mlp/moe/
    shared_experts), ``full x2`` (layers per chunk), or per stage runs such as ``f,f,s,n,n`` as
    ``f2 s1 n2`` (f/s/n = full/selective/none, counts of consecutive stages)."""
    s = e.strategy
    if s.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        modules = "sel " + "+".join(_MODULE_SHORT[m] for m in s.recompute_modules)
        return modules if not s.recompute_per_stage else f"{_per_stage_label(s)} ({modules})"
    if s.recompute_per_stage:
        return _per_stage_label(s)
    if s.recompute == "full" and s.recompute_layers:
        return f"full x{s.recompute_layers}"
    return s.recompute


def _per_stage_label(s: Strategy) -> str:
    runs: list[list] = []
    for name in s.recompute_per_stage or ():
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return "per stage " + " ".join(f"{_SHORT[name]}{count}" for name, count in runs)


def mfu_note(p: Problem) -> str | None:
    """The peak MFU is taken against when it is not the bf16 one (:func:`autopar.cost.step.mfu_peak_flops_per_s`):
    ``MFU: of the h100-80gb's dense fp8 peak, 1,979 TFLOP/s per device (bf16: 989)``; None for bf16."""
    from autopar.cost.step import mfu_peak_flops_per_s

    if p.train.precision == "bf16":
        return None
    bf16 = p.cluster.device.peak_flops.get("bf16")
    return (f"MFU: of the {p.cluster.device.name}'s dense {p.train.precision} peak, "
            f"{mfu_peak_flops_per_s(p) / 1e12:,.0f} TFLOP/s per device"
            + (f" (bf16: {bf16 / 1e12:,.0f})" if bf16 else ""))


#: The note column's mark on a ZeRO 2/3 layout whose framework's sharding few measured rows back
#: (:func:`autopar.report.ties.sharding_note`); the caption explains it.
FEW_ROWS_MARK = "few rows"


def search_table(result: SearchResult, certainty: Certainty | None = None, p: Problem | None = None) -> Table:
    """Ranked layouts with memory, time, throughput and MFU; with ``certainty`` (the problem's
    error bands) a layout within the step-time band of #1 is ranked ``≈1``
    (:func:`autopar.report.ties.rank_marks`) and the caption names the band; with ``p`` the
    caption also says which peak MFU is of where it is not bf16's (:func:`mfu_note`)."""
    marks = (rank_marks([e.step_time_s for e in result.layouts], certainty.step_time.band_pct) if certainty
             else [str(i) for i in range(1, len(result.layouts) + 1)])
    table = Table(title="Best layouts (ranked by predicted step time; GiB = peak per device)", header_style="bold")
    for name, justify in [("#", "right"), ("layout", "left"), ("mbs", "right"), ("zero", "right"),
                          ("recompute", "left"), ("GiB", "right"), ("step s", "right"),
                          ("tok/s/dev", "right"), ("MFU", "right"), ("bubble", "right"), ("note", "left")]:
        table.add_column(name, justify=justify, no_wrap=True)
    sharded = p and sharding_note(p, result)
    same = p and model_note(p)
    notes = [n for n in (table_notes(result.layouts, getattr(result, "target", "megatron")), p and mfu_note(p),
                         certainty and ties_note(certainty, marks), same, sharded and f"{FEW_ROWS_MARK}: {sharded}")
             if n]
    table.caption, table.caption_justify = "\n".join(notes) or None, "left"
    for mark, e in zip(marks, result.layouts):
        bubble = e.time_breakdown_s["pp_bubble"] / e.step_time_s
        note = ["[yellow]marginal[/]"] * e.marginal + [FEW_ROWS_MARK] * bool(sharded and e.strategy.zero >= 2)
        table.add_row(
            mark, layout_label(e), str(e.strategy.mbs), str(e.strategy.zero), recompute_label(e),
            f"{e.peak_memory_bytes / GIB:.1f}", f"{e.step_time_s:.2f}", f"{e.tokens_per_s_per_device:,.0f}",
            f"{e.mfu:.1%}", f"{bubble:.1%}", " ".join(note),
        )
    return table


def precision_label(p: Problem) -> str:
    """The numeric recipe of ``p`` as the headers print it: ``bf16``, ``fp16``, or fp8 training
    with the recipe costed (:attr:`~autopar.specs.train.TrainSpec.effective_fp8_recipe`: the
    script's ``--fp8-recipe``, ``--fp4-recipe``, the option's, else the framework's default) and
    what else it keeps in fp8 or bf16: ``fp8 (tensorwise recipe, fp8 weights only, first 1 and last 1
    layers in bf16)``; nvfp4 reads ``fp4 (nvfp4 recipe, fp4 linear layers)``."""
    t = p.train
    if t.precision != "fp8":
        return t.precision
    recipe = t.effective_fp8_recipe
    parts = [f"{recipe} recipe"] + (["fp4 linear layers"] if recipe == "nvfp4" else [])
    if t.fp8_param_storage:
        parts.append("fp8 weights only")
    first, last = t.bf16_end_layers
    if first or last:
        parts.append(f"first {first} and last {last} layers in bf16")
    return f"{'fp4' if recipe == 'nvfp4' else 'fp8'} ({', '.join(parts)})"


def problem_title(p: Problem) -> str:
    """``llama3-70b (70.6 B params) on 8 x 8 h100-80gb, gbs 1024, seq 8192, bf16``: the model
    (its name escaped for rich markup, in bold), the cluster, the batch and
    :func:`precision_label`, the first line of ``search``, ``estimate`` and ``plan``; a model with
    dropout adds its rates (``, dropout 0.05 attention / 0.02 hidden``: costed as masks kept, and what
    the exports write, :func:`autopar.specs.script_attention.dropout_rates`)."""
    from autopar.specs.script_attention import dropout_rates

    attention, hidden = dropout_rates(p.model)
    dropout = f", dropout {attention:g} attention / {hidden:g} hidden" if p.model.dropout else ""
    return (f"[bold]{escape(p.model.name)}[/] ({p.model.num_params / 1e9:.1f} B params) on {p.cluster.num_nodes} x "
            f"{p.cluster.devices_per_node} {p.cluster.device.name}, gbs {p.train.global_batch_size}, "
            f"seq {p.train.seq_len}, {precision_label(p)}{dropout}")


def search_summary(result: SearchResult) -> str:
    """One paragraph: what was enumerated, removed by the constraints (each layout under the first
    it fails; a constraint the enumeration was built with, e.g. ``--moe-dispatcher``, removes 0 and
    says so), rejected (by rule) and dropped for memory."""
    rejected = ", ".join(f"{k} {v:,}" for k, v in sorted(result.rejected.items(), key=lambda kv: -kv[1]))
    removed = ", ".join(f"{k} {v:,}" if v else f"{k} 0 (the space was enumerated with it: every layout has it)"
                        for k, v in result.constraints.items())
    in_all = f" ({sum(result.constraints.values()):,} in all)"
    return (
        f"{result.enumerated:,} layouts enumerated in {result.search_time_s:.2f} s; "
        + (f"removed by constraints: {removed}{in_all}; " if removed else "")
        + f"rejected by rule: {rejected or 'none'}; out of memory: {result.out_of_memory:,}; "
        f"marginal (near the memory limit): {result.marginal:,}"
        + (f"; skipped, --target {result.target} cannot write them: {result.not_writable:,}"
           if result.not_writable else "")
    )


def memory_table(e: Estimate) -> Table:
    """Per-stage memory breakdown of one layout (GiB)."""
    table = Table(title=f"Memory per device by pipeline stage (GiB; device {e.device_memory_bytes / GIB:.1f})",
                  header_style="bold")
    for col in ["stage", "layers", "recompute", "params (M)", "weights", "grads", "optimizer", "activations", "other",
                "total"]:
        table.add_column(col, justify="left" if col == "recompute" else "right")
    peak = max(m.total_bytes for m in e.memory_per_stage)
    for m in e.memory_per_stage:
        style = "bold" if m.total_bytes == peak else ""
        table.add_row(str(m.stage), str(m.layers), m.recompute, f"{m.params / 1e6:,.1f}",
                      *(f"{v / GIB:.2f}" for v in (m.weights_bytes, m.grads_bytes, m.optimizer_bytes,
                                                   m.activations_bytes, m.other_bytes, m.total_bytes)),
                      style=style)
    return table


def time_table(e: Estimate) -> Table:
    """Step-time breakdown of one layout."""
    table = Table(title="Step time breakdown", header_style="bold")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, value in e.time_breakdown_s.items():
        table.add_row(key, f"{value:.3f}", f"{value / e.step_time_s:.1%}")
    table.add_row("[bold]step[/]", f"[bold]{e.step_time_s:.3f}[/]", "100%")
    return table


def devices_table(devices: list[DeviceSpec]) -> Table:
    """The device presets with their headline numbers (``domain``: devices per NVLink domain)."""
    table = Table(title="Device presets", header_style="bold")
    for col in ["name", "bf16 TF/s", "fp8 TF/s", "GiB", "HBM TB/s", "intra GB/s", "net GB/s", "domain"]:
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for d in devices:
        fp8 = d.peak_flops.get("fp8")
        table.add_row(
            d.name, f"{d.peak_flops['bf16'] / 1e12:,.0f}", f"{fp8 / 1e12:,.0f}" if fp8 else "-",
            f"{d.memory_bytes / GIB:.1f}", f"{d.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
            f"{d.intra_node_bandwidth_bytes_per_s / 1e9:.0f}", f"{d.inter_node_bandwidth_bytes_per_s / 1e9:.0f}",
            str(d.nvlink_domain_size or d.default_devices_per_node),
        )
    return table


def print_estimate(console: Console, e: Estimate, p: Problem) -> None:
    """Headline numbers, then the memory and time tables; MFU says ``(of the fp8 peak)`` where
    the training precision is not bf16 (:func:`autopar.cost.step.mfu_peak_flops_per_s`). The step
    time and the peak carry the problem's ``±`` error bands (:func:`autopar.report.ties.problem_certainty`),
    a fitting layout whose peak plus its band exceeds the device says it may not fit, and the measured
    runs of the model on its class of device say how far off autopar was there
    (:func:`autopar.validate.bands.model_rows_note`)."""
    from autopar.report.ties import problem_certainty

    precision, certainty = p.train.precision, problem_certainty(p)
    fit = "fits" if e.fits else "[red]does NOT fit[/]"
    if e.marginal:
        fit = "[yellow]fits, marginal[/]"
    step_band, memory_band = certainty.step_time.band_pct, certainty.memory.band_pct
    console.print(
        f"[bold]{layout_label(e)}[/] mbs {e.strategy.mbs}, {e.num_microbatches} micro-batches, zero "
        f"{e.strategy.zero}, recompute {recompute_label(e)}, schedule {e.strategy.schedule}\n"
        f"step {e.step_time_s:.3f} s{f' ±{step_band:g}%' if step_band else ''}, "
        f"{e.tokens_per_s_per_device:,.0f} tokens/s/device, MFU {e.mfu:.1%}"
        f"{'' if precision == 'bf16' else f' (of the {precision} peak)'}, "
        f"peak {e.peak_memory_bytes / GIB:.2f} GiB{f' ±{memory_band:g}%' if memory_band else ''} of "
        f"{e.device_memory_bytes / GIB:.1f} GiB: {fit}"
    )
    if e.fits and memory_band and e.peak_memory_bytes * (1 + memory_band / 100) > e.device_memory_bytes:
        console.print(f"[yellow]may not fit[/]: the peak plus autopar's ±{memory_band:g}% memory band is "
                      f"{e.peak_memory_bytes * (1 + memory_band / 100) / GIB:.2f} GiB, above the device's "
                      f"{e.device_memory_bytes / GIB:.1f} GiB", highlight=False, soft_wrap=True)
    if step_band or memory_band:
        console.print(f"±: autopar's mean error (MAPE) on similar measured rows: step time on "
                      f"{len(certainty.step_time.rows)} {certainty.step_time.group}"
                      + (f"; memory on {len(certainty.memory.rows)} {certainty.memory.group}" if memory_band else ""),
                      highlight=False, soft_wrap=True)
    if (same := model_note(p)) is not None:
        console.print(same, highlight=False, soft_wrap=True)
    for note in recompute_notes([e]):
        console.print(note, highlight=False, soft_wrap=True)
    if e.strategy.pipeline_layout is not None:
        from autopar.pipeline.layout import PipelineLayout

        chunks = PipelineLayout.parse(e.strategy.pipeline_layout, e.strategy.pp).describe()
        console.print(f"pipeline layout {e.strategy.pipeline_layout} (decoder layers per rank, chunk by chunk: "
                      f"{chunks})", highlight=False, soft_wrap=True)
    console.print(memory_table(e))
    console.print(time_table(e))

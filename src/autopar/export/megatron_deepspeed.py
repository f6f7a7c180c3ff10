"""The ``deepspeed`` export format: the DeepSpeed JSON plus the Megatron-DeepSpeed launch that reads it.

DeepSpeed's JSON (:mod:`autopar.export.deepspeed`) holds batch, ZeRO and precision only; the
parallel layout of Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed ``pretrain_gpt.py``) lives in
its command-line flags, so the export is both, in one of two forms:

* stdout (:func:`write`): one runnable bash script that first writes ``ds_config.json`` next to
  itself (a quoted here-document), then runs ``torchrun ... pretrain_gpt.py`` with
  ``--deepspeed_config`` pointing at that file;
* files (:func:`write_files`, ``--out DIR`` or ``--out FILE.json``): the pure JSON and
  :data:`SCRIPT_NAME` next to it, whose ``--deepspeed_config`` names the JSON relative to the
  script's own directory.

There is no JSON-only form: even tp = pp = 1 needs ``--no-pipeline-parallel``, the batch and the
model shape on the command line. Flag spellings (Megatron-DeepSpeed, which differ from
Megatron-LM): ``megatron/arguments.py`` and ``examples_deepspeed/pretrain_llama2_distributed.sh``
(``--num-key-value-heads``, ``--normalization rmsnorm``, ``--use-rotary-position-embeddings``,
``--no-query-key-layer-scaling``, ``--deepspeed_config``, ``--zero-stage``), ecosystem.md 4.2
(``--no-pipeline-parallel``: the DeepSpeed engine without its pipeline, which asserts pp == 1;
``--deepspeed-activation-checkpointing``). Full recompute is the legacy ``--checkpoint-activations``
with ``--checkpoint-num-layers 1``: the form ``GPTModelPipe`` turns into the pipeline engine's
``activation_checkpoint_interval`` (``megatron/model/gpt_model.py``; the fork keeps the flag
because "DeepSpeed still relies on the old activation checkpointing mechanism"). Full recompute
of the first N layers (``recompute_layers``, pp = 1 only) is ``--recompute-granularity full
--recompute-method block --recompute-num-layers N``, which ``ParallelTransformer`` runs without
DeepSpeed's checkpointing (``megatron/model/transformer.py`` ``_checkpointed_forward``).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from autopar.errors import AutoparError
from autopar.export.deepspeed import config
from autopar.problem import Problem
from autopar.specs.script_attention import dropout_args
from autopar.strategy import Strategy

CONFIG_NAME = "ds_config.json"
SCRIPT_NAME = "megatron_deepspeed_args.sh"
_HERE = '"$(dirname "$0")"'  # the script's directory, so the pair runs from any working directory


def layout_args(p: Problem, s: Strategy) -> list[str]:
    """Parallel, batch, sequence, recompute and precision flags of ``pretrain_gpt.py``.

    ``--global-batch-size`` equals the JSON's ``train_batch_size`` and ``--micro-batch-size`` its
    ``train_micro_batch_size_per_gpu`` (both count sequences).
    """
    args = [f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {s.pp}"]
    if s.pp == 1:
        args.append("--no-pipeline-parallel")
    if s.sp:
        args.append("--sequence-parallel")
    if s.cp > 1:  # DeepSpeed Ulysses (cp_comm_type a2a; autopar.cost.cp_comm), checked by deepspeed.refusal_reason
        args.append(f"--ds-sequence-parallel-size {s.cp}")
    args += [f"--micro-batch-size {s.mbs}", f"--global-batch-size {p.train.global_batch_size}",
             f"--seq-length {p.train.seq_len}"]
    if s.recompute == "full" and s.recompute_layers:  # pp = 1 only (refusal_reason): Megatron's own block recompute
        args.append(f"--recompute-granularity full --recompute-method block --recompute-num-layers {s.recompute_layers}")
    elif s.recompute == "full":
        args.append("--checkpoint-activations --checkpoint-num-layers 1 --deepspeed-activation-checkpointing")
    elif s.recompute == "selective":
        args.append("--recompute-granularity selective")
    args.append("--" + p.train.precision)
    if p.train.flash_attention:
        args.append("--use-flash-attn-v2")
    return args


def model_args(p: Problem) -> list[str]:
    """Model shape flags in Megatron-DeepSpeed's spelling (defaults differ from the HF configs,
    so every shape flag is explicit). Features without a flag are refused earlier
    (:func:`autopar.export.deepspeed.refusal_reason`)."""
    m = p.model
    args = [f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
            f"--ffn-hidden-size {m.ffn_hidden_size}", f"--num-attention-heads {m.num_attention_heads}",
            f"--kv-channels {m.head_dim}"]
    if m.num_kv_heads < m.num_attention_heads:
        args.append(f"--num-key-value-heads {m.num_kv_heads}")
    if m.gated_mlp:
        args.append("--swiglu")
    if m.norm == "rmsnorm":
        args.append("--normalization rmsnorm")
    if m.position_embedding == "rope":
        args.append("--use-rotary-position-embeddings")
    args.append(f"--max-position-embeddings {max(m.max_position_embeddings or 0, p.train.seq_len)}")
    if not m.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    args.append(f"--make-vocab-size-divisible-by {p.train.make_vocab_size_divisible_by} --no-query-key-layer-scaling")
    # both rates always (ModelSpec.dropout is both masks), at the script's rates, else Megatron's 0.1 each
    args.append(dropout_args(m))
    return args


def needs_max_connections_env(s: Strategy) -> bool:
    """Megatron-DeepSpeed raises "Using sequence parallelism requires setting the environment
    variable CUDA_DEVICE_MAX_CONNECTIONS to 1" on CUDA (``megatron/arguments.py``
    ``validate_args``; its async TP all-reduce is off under DeepSpeed, so sequence parallelism is
    the one trigger). ZeRO here is DeepSpeed's, which asserts nothing about the variable; tp > 1
    sets it too (the setting Megatron's TP overlap expects)."""
    return s.sp or s.tp > 1


def deepspeed_args(s: Strategy, config_path: str) -> list[str]:
    """``--deepspeed``, the config file and ``--zero-stage`` (the stage the JSON names)."""
    return [f"--deepspeed --deepspeed_config {config_path}", f"--zero-stage {s.zero}"]


def _script(p: Problem, s: Strategy, config_name: str, embedded_json: str | None) -> str:
    """The launch script; with ``embedded_json`` it first writes that JSON to ``config_name``."""
    path = f"{_HERE}/{shlex.quote(config_name)}"
    lines = layout_args(p, s) + model_args(p) + deepspeed_args(s, path)
    head = ["#!/bin/bash",
            "# Megatron-DeepSpeed launch written by autopar export --format deepspeed: run it from a",
            "# Megatron-DeepSpeed checkout on every node (add --node_rank/--master_addr for several nodes).",
            "# Yours to add: data, tokenizer, optimizer and training-length flags (--data-path,",
            "# --tokenizer-type, --lr, --train-iters, ...).",
            "set -e"]
    if embedded_json is not None:
        head += [f"# --- DeepSpeed config: {config_name} (written next to this script) ---",
                 f"cat > {path} <<'EOF'", embedded_json.rstrip("\n"), "EOF",
                 "# --- Megatron-DeepSpeed arguments (pretrain_gpt.py) ---"]
    if needs_max_connections_env(s):
        head.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    body = " \\\n    ".join(lines)
    return ("\n".join(head) + f"\ntorchrun --nnodes {p.cluster.num_nodes} --nproc_per_node "
            f"{p.cluster.devices_per_node} pretrain_gpt.py \\\n    {body}\n")


def config_json(p: Problem, s: Strategy) -> str:
    """The DeepSpeed JSON text (:func:`autopar.export.deepspeed.config`)."""
    return json.dumps(config(p, s), indent=2) + "\n"


def write(p: Problem, s: Strategy) -> str:
    """The ``deepspeed`` export format on stdout: one script holding the JSON and the launch.

    Raises:
        AutoparError: a layout DeepSpeed or Megatron-DeepSpeed cannot run (the reason is named).
    """
    return _script(p, s, CONFIG_NAME, config_json(p, s))


def out_paths(out: Path) -> list[Path]:
    """The files :func:`write_files` writes for ``--out``: the JSON (``out`` itself when it ends in
    ``.json``, else ``out/ds_config.json``), then :data:`SCRIPT_NAME` beside it.

    Raises:
        AutoparError: ``out`` has another suffix and is not a directory.
    """
    if out.suffix == ".json":
        json_path = out
    elif out.suffix and not out.is_dir():
        raise AutoparError(f"--out={str(out)!r}: --format deepspeed writes {CONFIG_NAME} and {SCRIPT_NAME}; "
                           "give a directory or a .json path")
    else:
        json_path = out / CONFIG_NAME
    return [json_path, json_path.parent / SCRIPT_NAME]


def write_files(p: Problem, s: Strategy, out: Path) -> list[Path]:
    """Write the JSON and :data:`SCRIPT_NAME` (which references it) for ``--out``.

    Args:
        out: a directory (created if missing; the JSON is ``out/ds_config.json``) or a ``.json``
            file path (the script goes next to it).
    Returns:
        The paths written: JSON, then script (made executable).
    Raises:
        AutoparError: the layout is refused, ``out`` is another kind of file, or cannot be written.
    """
    text = config_json(p, s)
    json_path, script_path = out_paths(out)
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)
        script_path.write_text(_script(p, s, json_path.name, None))
        script_path.chmod(0o755)
    except OSError as err:
        raise AutoparError(f"--out={str(out)!r}: cannot write ({err.strerror})") from None
    return [json_path, script_path]

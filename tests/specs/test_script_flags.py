"""The launch-script flag table (``autopar/data/script_flags.json``): every Megatron-LM and
MindSpeed-LLM/MindSpeed argument classified, the modelled ones read by the reader (changing one
changes the parsed model, job or layout), refused and unknown flags stopped with one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import ROOT
from test_bad_input import one_line_error

from autopar.errors import AutoparError
from autopar.specs.script import read_script
from autopar.specs.script_flags import flag_table, reader_flags

TABLE = flag_table()
FLAGS = TABLE["flags"]

# A pp 2, tp 2 job on 8 devices; each case below appends its own flags (a precision flag is added
# unless the case names one).
BASE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")
MOE = "--num-experts 8 "
MLA = "--multi-latent-attention "
AWARE = "--use-precision-aware-optimizer "
OFFLOAD = AWARE + "--optimizer-cpu-offload "
SP = "--sequence-parallel "
CP2, CP4 = "--context-parallel-size 2 ", "--context-parallel-size 4 "
MINDSPEED = "--use-fused-swiglu "  # a MindSpeed-only flag: the script is read in MindSpeed's dialect
HYBRID = MINDSPEED + CP4 + "--context-parallel-algo hybrid_cp_algo "
# What Megatron-LM's validate_args needs beside --use-torch-fsdp2 (autopar.specs.script_fsdp).
FSDP2_OK = "--pipeline-model-parallel-size 1 --no-gradient-accumulation-fusion --untie-embeddings-and-output-weights "
# flag -> (flags before, flags after): the parsed model, job or layout must differ.
CHANGES = {
    # 8 layers over pp 2: one account flag alone makes 9 (Megatron asserts an even split); the other makes 10
    "--account-for-embedding-in-pipeline-split": ("--account-for-loss-in-pipeline-split --num-layers 7",
                                                  "--account-for-loss-in-pipeline-split --num-layers 7 "
                                                  "--account-for-embedding-in-pipeline-split --num-layers 8"),
    "--account-for-loss-in-pipeline-split": ("--account-for-embedding-in-pipeline-split --num-layers 7",
                                             "--account-for-embedding-in-pipeline-split --num-layers 7 "
                                             "--account-for-loss-in-pipeline-split --num-layers 8"),
    "--add-qkv-bias": ("", "--add-qkv-bias"),
    "--attention-backend": ("", "--attention-backend unfused"),
    # MindSpeed runs Megatron's unfused attention without it (autopar.specs.script.flash_attention)
    "--use-flash-attn": (MINDSPEED, MINDSPEED + "--use-flash-attn"),
    # autopar.specs.script_attention.dropout_fields: one 0 and the other > 0 is refused
    "--attention-dropout": ("", "--hidden-dropout 0 --attention-dropout 0"),
    "--hidden-dropout": ("", "--attention-dropout 0 --hidden-dropout 0"),
    "--bf16": ("--fp16", "--bf16"),
    "--fp16": ("--bf16", "--fp16"),
    "--fp8-format": ("--bf16", "--bf16 --fp8-format e4m3"),
    "--fp8-param-gather": ("--bf16 --fp8-format hybrid", "--bf16 --fp8-format hybrid --fp8-param-gather"),
    "--first-last-layers-bf16": ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise",
                                 "--bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16"),
    "--num-layers-at-start-in-bf16": ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16",
                                      "--bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 "
                                      "--num-layers-at-start-in-bf16 2"),
    "--num-layers-at-end-in-bf16": ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16",
                                    "--bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 "
                                    "--num-layers-at-end-in-bf16 2"),
    "--fp8-recipe": ("--bf16 --fp8-format hybrid", "--bf16 --fp8-format hybrid --fp8-recipe tensorwise"),
    "--fp4-format": ("--bf16", "--bf16 --fp4-format e2m1"),
    "--cuda-graph-impl": ("", "--cuda-graph-impl transformer_engine"),
    "--cuda-graph-scope": ("--cuda-graph-impl transformer_engine",
                           "--cuda-graph-impl transformer_engine --cuda-graph-scope attn"),
    "--enable-cuda-graph": ("", "--enable-cuda-graph"),
    "--external-cuda-graph": ("", "--external-cuda-graph"),
    "--context-parallel-size": ("", "--context-parallel-size 2"),
    "--data-parallel-sharding-strategy": ("--use-megatron-fsdp", "--use-megatron-fsdp --data-parallel-sharding-strategy optim"),
    "--decoder-first-pipeline-num-layers": ("", "--decoder-first-pipeline-num-layers 3"),
    "--decoder-last-pipeline-num-layers": ("", "--decoder-last-pipeline-num-layers 3"),
    "--disable-bias-linear": ("", "--disable-bias-linear"),
    "--exp-avg-dtype": (AWARE, AWARE + "--exp-avg-dtype bf16"),
    "--exp-avg-sq-dtype": (AWARE, AWARE + "--exp-avg-sq-dtype bf16"),
    "--main-grads-dtype": (AWARE, AWARE + "--main-grads-dtype bf16"),
    "--main-params-dtype": (AWARE, AWARE + "--main-params-dtype fp16"),
    "--optimizer-cpu-offload": (AWARE, OFFLOAD),
    "--optimizer-offload-fraction": (OFFLOAD, OFFLOAD + "--optimizer-offload-fraction 0.5"),
    "--overlap-cpu-optimizer-d2h-h2d": (OFFLOAD, OFFLOAD + "--overlap-cpu-optimizer-d2h-h2d"),
    "--grad-reduce-in-bf16": ("", "--grad-reduce-in-bf16"),
    "--expert-model-parallel-size": (MOE, MOE + "--expert-model-parallel-size 2"),
    "--expert-tensor-parallel-size": (MOE, MOE + "--expert-tensor-parallel-size 1"),
    "--ffn-hidden-size": ("", "--ffn-hidden-size 2048"),
    "--first-k-dense-replace": (MOE, MOE + "--first-k-dense-replace 2"),
    "--global-batch-size": ("", "--global-batch-size 128"),
    "--group-query-attention": ("--num-query-groups 4", "--num-query-groups 4 --group-query-attention"),
    "--num-query-groups": ("--group-query-attention --num-query-groups 4", "--group-query-attention --num-query-groups 8"),
    "--hidden-size": ("", "--hidden-size 2048"),
    "--kv-channels": ("", "--kv-channels 128"),
    "--multi-latent-attention": ("", MLA),
    "--kv-lora-rank": (MLA, MLA + "--kv-lora-rank 64"),
    "--q-lora-rank": (MLA, MLA + "--q-lora-rank 256"),
    "--qk-head-dim": (MLA, MLA + "--qk-head-dim 64"),
    "--qk-pos-emb-head-dim": (MLA, MLA + "--qk-pos-emb-head-dim 32"),
    "--v-head-dim": (MLA, MLA + "--v-head-dim 64"),
    "--make-vocab-size-divisible-by": ("", "--make-vocab-size-divisible-by 64"),
    "--max-position-embeddings": ("", "--max-position-embeddings 4096"),
    "--micro-batch-size": ("", "--micro-batch-size 2"),
    "--num-experts": ("", MOE),
    "--moe-aux-loss-coeff": (MOE, MOE + "--moe-aux-loss-coeff 0.01"),
    "--moe-ffn-hidden-size": (MOE, MOE + "--moe-ffn-hidden-size 512"),
    "--moe-intermediate-size": (MOE, MOE + "--moe-intermediate-size 512"),
    "--moe-layer-freq": (MOE, MOE + "--moe-layer-freq 2"),
    "--moe-router-enable-expert-bias": (MOE, MOE + "--moe-router-enable-expert-bias"),
    "--moe-router-group-topk": (MOE, MOE + "--moe-router-group-topk 2"),
    "--moe-router-num-groups": (MOE, MOE + "--moe-router-num-groups 4"),
    "--moe-router-score-function": (MOE, MOE + "--moe-router-score-function sigmoid"),
    "--moe-router-topk": (MOE, MOE + "--moe-router-topk 4"),
    "--moe-router-topk-scaling-factor": (MOE, MOE + "--moe-router-topk-scaling-factor 2.5"),
    "--moe-shared-expert-intermediate-size": (MOE, MOE + "--moe-shared-expert-intermediate-size 1024"),
    "--n-shared-experts": (MOE, MOE + "--n-shared-experts 1"),
    "--moe-expert-capacity-factor": (MOE + "--moe-expert-capacity-factor -1",
                                     MOE + "--moe-expert-capacity-factor 1.5 --moe-pad-expert-input-to-capacity"),
    "--moe-token-dispatcher-type": (MOE, MOE + "--moe-token-dispatcher-type alltoall"),  # default allgather
    "--moe-flex-dispatcher-backend": (MOE + "--moe-token-dispatcher-type flex",
                                      MOE + "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"),
    "--moe-enable-deepep": (MOE, MOE + "--moe-token-dispatcher-type flex --moe-enable-deepep"),
    "--moe-permute-fusion": (MOE, MOE + "--moe-permute-fusion"),
    "--moe-router-fusion": (MOE, MOE + "--moe-router-fusion"),
    "--moe-shared-expert-overlap": (MOE, MOE + "--moe-shared-expert-overlap"),
    "--overlap-moe-expert-parallel-comm": (MOE, MOE + "--overlap-moe-expert-parallel-comm"),
    "--delay-wgrad-compute": (MOE + "--overlap-moe-expert-parallel-comm",
                              MOE + "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"),
    "--overlap-grad-reduce": ("", "--overlap-grad-reduce"),
    "--moe-router-force-load-balancing": (MOE, MOE + "--moe-router-force-load-balancing"),
    "--moe-router-padding-for-fp8": (MOE + "--bf16 --fp8-format hybrid",
                                     MOE + "--bf16 --fp8-format hybrid --moe-router-padding-for-fp8"),
    "--mtp-num-layers": ("", "--mtp-num-layers 1"),
    "--noop-layers": ("", "--noop-layers 7"),
    "--norm-epsilon": ("", "--norm-epsilon 1e-6"),
    "--normalization": ("", "--normalization RMSNorm"),
    "--use-fused-rmsnorm": ("", "--use-fused-rmsnorm"),
    "--num-attention-heads": ("", "--num-attention-heads 8"),
    "--num-layer-list": ("", "--num-layer-list 3,5"),
    "--num-layers": ("", "--num-layers 16"),
    "--num-layers-per-virtual-pipeline-stage": ("", "--num-layers-per-virtual-pipeline-stage 2"),
    "--num-virtual-stages-per-pipeline-rank": ("", "--num-virtual-stages-per-pipeline-rank 2"),
    "--pipeline-model-parallel-size": ("", "--pipeline-model-parallel-size 4"),
    "--pipeline-model-parallel-layout": ("", "--pipeline-model-parallel-layout 'Et*3|t*5L'"),
    "--tensor-model-parallel-size": ("", "--tensor-model-parallel-size 4"),
    "--position-embedding-type": ("", "--position-embedding-type rope"),
    "--use-rotary-position-embeddings": ("", "--use-rotary-position-embeddings"),
    "--qk-layernorm": ("", "--qk-layernorm"),
    "--recompute-activations": ("", "--recompute-activations"),
    "--recompute-granularity": ("--recompute-method uniform --recompute-num-layers 1",
                                "--recompute-method uniform --recompute-num-layers 1 --recompute-granularity full"),
    "--recompute-method": ("--recompute-granularity full --recompute-num-layers 1 --recompute-method uniform",
                           "--recompute-granularity full --recompute-num-layers 1 --recompute-method block"),
    "--recompute-num-layers": ("--recompute-granularity full --recompute-method block --recompute-num-layers 1",
                               "--recompute-granularity full --recompute-method block --recompute-num-layers 2"),
    "--recompute-modules": ("--recompute-granularity selective",
                            "--recompute-granularity selective --recompute-modules core_attn mlp"),
    "--rotary-base": ("", "--rotary-base 500000"),
    "--seq-length": ("", "--seq-length 4096"),
    "--sequence-parallel": ("", "--sequence-parallel"),
    "--softmax-type": ("", "--softmax-type learnable"),
    "--swiglu": ("", "--swiglu"),
    "--untie-embeddings-and-output-weights": ("", "--untie-embeddings-and-output-weights"),
    "--use-distributed-optimizer": ("", "--use-distributed-optimizer"),
    "--use-megatron-fsdp": ("", "--use-megatron-fsdp"),
    "--use-torch-fsdp2": (FSDP2_OK, FSDP2_OK + "--use-torch-fsdp2"),
    "--vocab-size": ("", "--vocab-size 50000"),
    "--padded-vocab-size": ("", "--padded-vocab-size 65536"),
    "--window-size": ("", "--window-size 128,0"),
    "--window-attn-skip-freq": ("--window-size 128,0", "--window-size 128,0 --window-attn-skip-freq 2"),
    "--tp-comm-overlap": (SP, SP + "--tp-comm-overlap"),
    "--use-ascend-mc2": (MINDSPEED + SP, MINDSPEED + SP + "--use-ascend-mc2"),
    "--use-mc2": (MINDSPEED + SP, MINDSPEED + SP + "--use-mc2"),
    "--cp-comm-type": (CP2, CP2 + "--cp-comm-type a2a"),
    "--hierarchical-context-parallel-sizes": (CP4 + "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 1 4",
                                              CP4 + "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2"),
    "--context-parallel-algo": (MINDSPEED + CP2, MINDSPEED + CP2 + "--context-parallel-algo ulysses_cp_algo"),
    "--ulysses-degree-in-cp": (HYBRID + "--ulysses-degree-in-cp 1", HYBRID + "--ulysses-degree-in-cp 2"),
}
# Read by the reader only to check a value or a combination (each named with what it checks),
# so changing it alone changes nothing parsed.
VALUE_CHECKED = {
    "--accumulate-allreduce-grads-in-fp32": "refused with bf16 main gradients (Megatron asserts it)",
    "--use-precision-aware-optimizer": "required by the optimizer dtype and offload flags",
    "--fp4-recipe": "must be nvfp4, its default (a custom recipe is refused)",
    "--moe-pad-expert-input-to-capacity": "required with a capacity factor >= 1",
    "--moe-token-drop-policy": "which tokens drop (probs or position), not how many: the value is checked",
    "--no-gradient-accumulation-fusion": "required with --use-torch-fsdp2 (Megatron asserts it)",
    "--ckpt-format": "torch_dist or torch_dcp with --use-torch-fsdp2 (Megatron asserts it)",
    "--overlap-param-gather": "needs --overlap-grad-reduce and the distributed optimizer (Megatron asserts it)",
    "--moe-grouped-gemm": "bf16 only (Megatron v0.15.3 asserts it)",
    "--rampup-batch-size": "not with --train-iters (Megatron v0.15.3 asserts it)",
    "--train-iters": "no --rampup-batch-size with it (Megatron v0.15.3 asserts it)",
    "--transformer-impl": "local refused in a Megatron-LM script (its unfused, TE-less layers are not modelled)",
    "--tokenizer-type": "named when the vocabulary size is unknown",
    "--tokenizer-model": "read for the vocabulary size without --vocab-size",
    "--tokenizer-name-or-path": "read for the vocabulary size without --vocab-size",
    "--vocab-file": "read for the vocabulary size without --vocab-size",
}


def script(tmp_path: Path, extra: str) -> Path:
    """A torchrun launch of BASE plus ``extra`` (with ``--bf16`` unless it sets a precision)."""
    if not any(p in extra for p in ("--bf16", "--fp16")):
        extra += " --bf16"
    path = tmp_path / f"job{abs(hash(extra))}.sh"
    path.write_text(f"torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py {BASE} {extra}\n")
    return path


def parsed(path: Path) -> tuple:
    """The parsed model (but its name, the file's), job and layout."""
    plan = read_script(path)
    return {k: v for k, v in plan.model_fields.items() if k != "name"}, plan.train_fields, plan.layout


def test_every_entry_is_classified_with_a_reason():
    assert FLAGS
    for flag, entry in FLAGS.items():
        assert entry["class"] in ("modelled", "no_effect", "refused"), flag
        assert entry["reason"].strip() and entry["frameworks"], flag
        assert set(entry["frameworks"]) <= set(TABLE["sources"]), flag


def test_table_covers_each_recorded_argument_list():
    """Each source's recorded argument count is the number of its flags in the table, and each
    records the commit it was read from."""
    for key, source in TABLE["sources"].items():
        assert len(source["commit"]) == 40 and source["count"] > 0
        assert sum(1 for e in FLAGS.values() if key in e["frameworks"]) == source["count"], key


def test_modelled_is_what_the_reader_reads():
    """The table's ``modelled`` class and the reader's own flags cannot disagree."""
    modelled = {f for f, e in FLAGS.items() if e["class"] == "modelled"}
    assert modelled == reader_flags() & set(FLAGS), "rerun: python tools/script_flags.py --from-table"


def test_every_read_flag_has_an_effect_case():
    """Each flag the reader reads is walked below: one that changes the parse, or a value check."""
    read, walked = reader_flags(), set(CHANGES) | set(VALUE_CHECKED)
    assert not read - walked, f"read but without a case in CHANGES or VALUE_CHECKED: {sorted(read - walked)}"
    assert not walked - read, f"a case for a flag the reader no longer reads: {sorted(walked - read)}"
    assert not set(CHANGES) & set(VALUE_CHECKED)


@pytest.mark.parametrize("flag", sorted(CHANGES))
def test_a_modelled_flag_changes_the_parse(tmp_path, flag):
    before, after = CHANGES[flag]
    assert flag in after
    assert parsed(script(tmp_path, before)) != parsed(script(tmp_path, after))


def test_refused_flag_is_one_error_line(tmp_path):
    flag, entry = next((f, e) for f, e in FLAGS.items() if e["class"] == "refused")
    err = one_line_error(["estimate", "--script", str(script(tmp_path, flag)), "--device", "h100-80gb"])
    assert f"{flag} is not modelled by autopar: {entry['reason']}" in err


def test_unknown_flag_names_the_table_versions(tmp_path):
    err = one_line_error(["estimate", "--script", str(script(tmp_path, "--no-such-flag-yet 3")), "--device", "h100-80gb"])
    assert "--no-such-flag-yet is unknown to autopar's table of Megatron-LM v0.15.3" in err
    assert "its effect cannot be costed" in err


def test_no_effect_flags_leave_the_parse_unchanged(tmp_path):
    """Data, logging and checkpoint flags are accepted and change nothing."""
    extra = "--data-path /d/x --save /ckpt --load /ckpt --log-interval 1 --seed 7 --lr 3e-4 --optimizer adam"
    assert parsed(script(tmp_path, extra)) == parsed(script(tmp_path, ""))


def test_softmax_in_fp32_is_accepted_without_effect(tmp_path):
    """Common in MindSpeed-LLM scripts; it had been refused with the reason for fp32 residuals."""
    assert FLAGS["--attention-softmax-in-fp32"]["class"] == "no_effect"
    assert parsed(script(tmp_path, "--attention-softmax-in-fp32")) == parsed(script(tmp_path, ""))


def test_only_values_are_checked(tmp_path):
    assert FLAGS["--optimizer"].get("only") == ["adam"]
    with pytest.raises(AutoparError, match=r"--optimizer='sgd': autopar costs only adam"):
        read_script(script(tmp_path, "--optimizer sgd"))


def test_capacity_factor_with_the_flex_dispatcher_is_refused(tmp_path):
    """Megatron-Core's flex (DeepEP/HybridEP) dispatcher is dropless: a capacity factor is one error line."""
    with pytest.raises(AutoparError, match="--moe-expert-capacity-factor=1.25 with the flex dispatcher"):
        read_script(script(tmp_path, MOE + "--moe-token-dispatcher-type flex --moe-expert-capacity-factor 1.25"))


def test_docs_page_is_the_table():
    """docs/script_flags.md is what tools/script_flags.py writes from the packaged table."""
    spec = importlib.util.spec_from_file_location("script_flags_tool_md", ROOT / "tools" / "script_flags_md.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert (ROOT / "docs" / "script_flags.md").read_text() == tool.markdown(json.loads(
        (ROOT / "src/autopar/data/script_flags.json").read_text()))


def test_table_equals_the_frameworks_argument_code():
    """Re-read the frameworks' argument code at the recorded commits (where a fetched copy is on
    this machine) and compare flag by flag: nothing added upstream is missing from the table."""
    import sys
    sys.path.insert(0, str(ROOT / "tools"))
    from script_flags_extract import Source, read_source
    dirs = {"megatron": "NVIDIA+Megatron-LM", "mindspeed_llm": "Ascend+MindSpeed-LLM", "mindspeed": "Ascend+MindSpeed"}
    for key, source in TABLE["sources"].items():
        git_dir = Path("/work/.mirror") / dirs[key] / "repo"
        if not git_dir.is_dir():
            pytest.skip(f"no fetched copy of {source['name']} at {git_dir}")
        try:
            names = read_source(Source(key, str(git_dir), source["commit"], tuple(source["files"])))
        except Exception as err:  # the recorded commit is not in this copy
            pytest.skip(f"{source['name']} {source['commit']}: {err}")
        assert set(names) == {f for f, e in FLAGS.items() if key in e["frameworks"]}, key

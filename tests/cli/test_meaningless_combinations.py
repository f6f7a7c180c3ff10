"""Option combinations that change nothing are refused, one line naming them (they exited 0 and
were costed as if absent): a MoE CUDA-graph scope on a dense model (option or script), and
``--recompute-modules`` where no layout recomputes selectively (estimate and search)."""

from __future__ import annotations

from conftest import SCRIPTS
from test_bad_input import LLAMA, one_line_error, runner

from autopar.cli import app


def test_moe_cuda_graph_scope_on_a_dense_model():
    for scope in ("moe", "attn,moe_router"):
        err = one_line_error(["estimate", *LLAMA, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope",
                              scope])
        assert "captures MoE layers and the model has none; use attn or mlp" in err
    ok = runner.invoke(app, ["estimate", *LLAMA, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn"])
    assert ok.exit_code == 0, ok.output


def test_moe_cuda_graph_scope_in_a_dense_script(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text((SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace(
        "--bf16\n", "--bf16 --vocab-size 32000 --cuda-graph-impl transformer_engine --cuda-graph-scope moe\n"))
    err = one_line_error(["estimate", "--script", str(path), "--device", "h100-80gb"])
    assert "job.sh: --cuda-graph-scope moe captures MoE layers and the model has none (no --num-experts)" in err


def test_recompute_modules_without_selective_recompute():
    err = one_line_error(["estimate", *LLAMA, "--recompute", "full", "--recompute-modules", "core_attn"])
    assert err.startswith("error: --recompute-modules=core_attn with --recompute=full: the modules are what selective "
                          "recompute recomputes")
    err = one_line_error(["search", *LLAMA, "--recompute", "none,full", "--recompute-modules", "core_attn"])
    assert "--recompute-modules=core_attn with --recompute=none,full" in err
    ok = runner.invoke(app, ["estimate", *LLAMA, "--recompute", "selective", "--recompute-modules", "core_attn"])
    assert ok.exit_code == 0, ok.output

"""Reading launch scripts: the bash subset, both shared scripts, and the errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.specs.bash import ShellScript, unknown_reason
from autopar.specs.script import read_script
from conftest import SCRIPTS

LLAMA = SCRIPTS / "pretrain_llama2_7b.sh"
MIXTRAL = SCRIPTS / "pretrain_mixtral_8x7b.sh"


def test_bash_expansions():
    sh = ShellScript('A=3\nB=$((A*2+1))\nC="${B}x" # note\nD=${E:-7}\nF=$(hostname)\n'
                     'arr=(a "b c" $C)\necho "${arr[@]}" $((B/2)) ${#arr[@]} \\\n  $F\n')
    assert sh.variables["B"] == "7" and sh.variables["C"] == "7x" and sh.variables["D"] == "7"
    assert sh.variables["arr"] == ["a", "b c", "7x"]
    argv = sh.commands[0][1]
    assert argv[:6] == ["echo", "a", "b c", "7x", "3", "3"]
    assert unknown_reason(argv[6]) == "a $(command) substitution"


def test_llama2_script_values():
    plan = read_script(LLAMA)
    assert (plan.framework, plan.num_nodes, plan.devices_per_node) == ("megatron", 2, 8)
    assert plan.layout == dict(tp=2, pp=4, vpp=1, cp=1, ep=1, etp=2, mbs=1, sp=True, zero=1, recompute="full",
                               recompute_layers=None, layers_per_stage=None, account_for_embedding=False,
                               account_for_loss=False, recompute_modules=("core_attn",), pipeline_layout=None,
                               tp_comm_overlap=False, cp_comm_type="p2p", cp_a2a=None)
    assert plan.train_fields == dict(global_batch_size=256, seq_len=4096, precision="bf16", flash_attention=True,
                                     make_vocab_size_divisible_by=1, overlap_grad_reduce=False,
                                     grad_accumulation_fusion=False)
    with pytest.raises(AutoparError, match="add --vocab-size N"):
        plan.model_spec()
    m = plan.model_spec(32000)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_kv_heads, m.head_dim) == (32, 4096, 11008, 32, 128)
    assert m.gated_mlp and not m.tie_word_embeddings and m.norm == "rmsnorm" and not m.dropout
    assert m.num_params == 6_738_415_616  # ecosystem.md 5.2: 6.74 B
    assert plan.strategy(16, 32).dp == 2


def test_mixtral_script_values():
    plan = read_script(MIXTRAL)
    m = plan.model_spec()
    assert (m.num_experts, m.num_experts_per_tok, m.moe_ffn_hidden_size, m.num_kv_heads) == (8, 2, 14336, 8)
    assert m.moe_layers == tuple(range(32)) and m.vocab_size == 32000 and m.max_position_embeddings == 32768
    assert round(m.num_params / 1e9, 2) == 46.70
    assert (plan.num_nodes, plan.devices_per_node) == (4, 8)
    assert plan.layout["ep"] == 4 and plan.layout["tp"] == 2 and plan.layout["sp"]
    assert plan.train_fields["global_batch_size"] == 512


def test_mindspeed_moe_and_mla_flags(tmp_path):
    text = ("N=4\npython -m torch.distributed.run --nnodes=$N --nproc-per-node 8 pretrain_gpt.py "
            "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --multi-latent-attention --kv-lora-rank 64 "
            "--q-lora-rank 128 --num-experts 16 --moe-intermediate-size 256 --n-shared-experts 2 "
            "--first-k-dense-replace 2 --moe-router-topk 4 --seq-length 2048 --vocab-size 1000 --bf16 "
            "--pipeline-model-parallel-size 2 --num-layer-list 3,5 --attention-dropout 0 --hidden-dropout 0\n")
    plan = read_script(tmp_path / "ms.sh", text)
    m = plan.model_spec()
    assert plan.framework == "mindspeed" and plan.num_nodes == 4 and plan.devices_per_node == 8
    assert m.mla and (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.v_head_dim) == (64, 128, 128, 128)
    assert m.moe_layers == (2, 3, 4, 5, 6, 7) and m.shared_expert_ffn_hidden_size == 512
    assert plan.layout["layers_per_stage"] == (3, 5)


@pytest.mark.parametrize("text, message", [
    ("torchrun --nnodes 1 --nproc_per_node 8 train.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
     "--vocab-size 10 --bf16\n", "add --seq-length N"),
    ("torchrun --nnodes $SLURM_NNODES train.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
     "--seq-length 8 --vocab-size 10 --bf16\n", "SLURM_NNODES is not set"),
    ("torchrun --nproc_per_node 8 train.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
     "--seq-length 8 --vocab-size 10 --bf16 --hidden-dropout $UNSETVAR\n",
     r"--hidden-dropout cannot be read \(\$UNSETVAR is not set"),  # no backslash before the $ (was '\$UNSETVAR')
    ("torchrun train.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 10\n",
     "add --bf16"),
    ("echo hello\n", "no launch command"),
])
def test_script_errors(tmp_path, text, message):
    with pytest.raises(AutoparError, match=message):
        read_script(tmp_path / "bad.sh", text)


def test_cli_bad_script_exits_2(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --hidden-size 64\n")
    result = CliRunner().invoke(app, ["search", "--script", str(bad), "--device", "h100-80gb"])
    assert result.exit_code == 2
    assert "--num-attention-heads is missing; add --num-attention-heads N" in result.output and "Traceback" not in result.output


def test_cli_script_defaults_and_overrides():
    args = ["estimate", "--script", str(LLAMA), "--vocab-size", "32000", "--device", "h100-80gb", "--json"]
    import json

    doc = json.loads(CliRunner().invoke(app, args).stdout)
    assert doc["strategy"]["tp"] == 2 and doc["strategy"]["pp"] == 4 and doc["strategy"]["dp"] == 2
    assert doc["strategy"]["gbs"] == 256 and doc["strategy"]["recompute"] == "full"
    doc = json.loads(CliRunner().invoke(app, args + ["--nodes", "4", "--gbs", "512", "--tp", "4"]).stdout)
    assert (doc["strategy"]["tp"], doc["strategy"]["dp"], doc["strategy"]["gbs"]) == (4, 2, 512)

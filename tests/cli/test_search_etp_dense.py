"""``search --etp`` on a dense model is refused as ``estimate --etp`` is (one line, the same message);
it exited 0 and kept only the tp = etp layouts (the expert tp rule tied etp to tp on a dense model)."""

from __future__ import annotations

from test_bad_input import LLAMA, one_line_error

MESSAGE = ("--etp=2: model llama3-8b has no routed experts; expert tensor parallelism applies to MoE models only "
           "(leave --etp unset)")


def test_search_refuses_etp_on_a_dense_model_as_estimate_does():
    assert MESSAGE in one_line_error(["search", *LLAMA, "--etp", "2"])
    assert MESSAGE in one_line_error(["estimate", *LLAMA, "--etp", "2"])

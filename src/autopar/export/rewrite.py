"""Rewrite a launch script for a new layout, keeping every other byte.

Only the flags of :func:`autopar.export.layout_flags.layout_flags` (parallel sizes, SP,
VPP and uneven split, optimizer sharding and DP overlap, recompute, micro and global batch),
the launcher's ``--nnodes`` / ``--nproc_per_node``, ``--seq-length`` and the
``CUDA_DEVICE_MAX_CONNECTIONS`` export (Megatron asserts 1 for tp > 1 or cp > 1 and refuses 1
under Megatron-FSDP, ecosystem.md 1.3 rule 10) are touched. How each is edited:

* a flag whose value is ``$X`` / ``${X}``, where ``X`` is assigned once to a literal integer,
  gets its *assignment* rewritten (``TP=2`` -> ``TP=8``), so paths and arithmetic built from
  ``X`` follow; otherwise the value itself is replaced;
* a flag that must go is deleted with its value (its line, when it stands alone on it; a line
  without a continuation backslash is emptied rather than joined);
* a missing flag is inserted next to the first parallel flag found (a new line with the same
  indentation and continuation style), or after the training script name.

The result is read back with :func:`autopar.specs.script.read_script`; if it does not read as
the requested layout (a flag set in a way this editor cannot follow), that is an error, never a
silently wrong script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError
from autopar.export.layout_flags import (KEEP, SWITCHES, FlagValue, forbids_max_connections_one, layout_flags,
                                        needs_max_connections_env, stage_layers)
from autopar.problem import Problem
from autopar.search import SearchResult
from autopar.specs.bash import ShellScript
from autopar.specs.script import ScriptPlan, read_script
from autopar.strategy import Strategy

_ANCHORS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
            "--global-batch-size", "--num-layers", "--seq-length")
# What Megatron assumes when a flag is absent: no need to insert it with that value.
_ABSENT_MEANS = {"--tensor-model-parallel-size": "1", "--pipeline-model-parallel-size": "1",
                 "--context-parallel-size": "1", "--expert-model-parallel-size": "1", "--micro-batch-size": "1"}
_MULTI_VALUE = frozenset({"--recompute-modules"})
_VALUE = r"""("[^"]*"|'[^']*'|[^\s"'()]+)"""
_VAR = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")
ENV = "CUDA_DEVICE_MAX_CONNECTIONS"


@dataclass(frozen=True)
class _Hit:
    """One occurrence of a flag: spans of the flag word and of its value word (if any)."""

    start: int
    end: int
    value_start: int
    value_end: int

    @property
    def has_value(self) -> bool:
        return self.value_end > self.value_start


def _hits(clean: str, flag: str, takes_value: bool) -> list[_Hit]:
    hits = []
    for m in re.finditer(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", clean):
        end = m.end()
        if clean.startswith("=", end):
            v = re.match(_VALUE, clean[end + 1:])
            stop = end + 1 + (v.end() if v else 0)
            hits.append(_Hit(m.start(), stop, end + 1, stop))
            continue
        if not takes_value:
            hits.append(_Hit(m.start(), end, end, end))
            continue
        pattern = rf"(?:[ \t]+(?!-){_VALUE})+" if flag in _MULTI_VALUE else rf"[ \t]+{_VALUE}"
        v = re.match(pattern, clean[end:])
        if v and not v.group(1).startswith("-"):
            hits.append(_Hit(m.start(), end + v.end(), end + v.start(1) if flag not in _MULTI_VALUE else end, end + v.end()))
        else:
            hits.append(_Hit(m.start(), end, end, end))
    return hits


class _Editor:
    """Collects non-overlapping text edits against the original script and applies them."""

    def __init__(self, plan: ScriptPlan):
        self.text = plan.text
        self.sh = ShellScript(plan.text)
        self.edits: list[tuple[int, int, str]] = []
        self.claimed: dict[str, str] = {}
        self.inserts: list[str] = []
        self.changes: list[tuple[str, str, str]] = []  # (flag or variable, old, new), in edit order

    def set_value(self, hit: _Hit, value: str, flag: str) -> None:
        raw = self.text[hit.value_start:hit.value_end]
        if raw.strip("\"'") == value:
            return
        m = _VAR.fullmatch(raw.strip('"'))
        spans = self.sh.assignments.get(m.group(1), []) if m else []
        if m and len(spans) == 1 and self.claimed.get(m.group(1), value) == value:
            a, b = spans[0]
            old = self.text[a:b].strip("\"'")
            if old.isdigit():
                if m.group(1) not in self.claimed:
                    self.claimed[m.group(1)] = value
                    self.edits.append((a, b, value))
                    if old != value:
                        self.changes.append((f"{flag} (via {m.group(1)}=)", old, value))
                return
        self.edits.append((hit.value_start, hit.value_end, value))
        self.changes.append((flag, raw or "(no value)", value))

    def remove(self, hit: _Hit, flag: str) -> None:
        self.changes.append((flag, self.text[hit.value_start:hit.value_end] if hit.has_value else "on", "(removed)"))
        line_start = self.text.rfind("\n", 0, hit.start) + 1
        line_end = self.text.find("\n", hit.end)
        line_end = len(self.text) if line_end < 0 else line_end
        before, after = self.text[line_start:hit.start], self.text[hit.end:line_end]
        if before.strip() == "" and after.strip() in ("", "\\"):
            in_command = any(st.start <= hit.start < st.end for st, _ in self.sh.commands)
            whole = (after.strip() == "\\" or not in_command) and line_end < len(self.text)
            self.edits.append((line_start, line_end + 1 if whole else line_end, ""))
            return
        end = hit.end + (len(after) - len(after.lstrip(" \t")))
        self.edits.append((hit.start, end, ""))

    def insert_block(self) -> None:
        if not self.inserts:
            return
        clean = self.sh.clean
        for anchor in _ANCHORS:
            hits = _hits(clean, anchor, True)
            if hits:
                self._insert_at(hits[0].start)
                return
        for st, _ in self.sh.commands:
            m = re.search(r"\S+\.py(?=\s|$)", clean[st.start:st.end])
            if m:
                self.edits.append((st.start + m.end(), st.start + m.end(), " " + " ".join(self.inserts)))
                return
        raise AutoparError("cannot place new flags: the script has no parallel flag and no training script name")

    def _insert_at(self, pos: int) -> None:
        line_start = self.text.rfind("\n", 0, pos) + 1
        indent = self.text[line_start:pos]
        if indent.strip():
            self.edits.append((pos, pos, " ".join(self.inserts) + " "))
            return
        line_end = self.text.find("\n", pos)
        line = self.text[line_start:len(self.text) if line_end < 0 else line_end]
        in_command = any(st.start <= pos < st.end for st, _ in self.sh.commands)
        tail = " \\" if line.rstrip().endswith("\\") or in_command else ""
        block = "".join(f"{indent}{flag}{tail}\n" for flag in self.inserts)
        self.edits.append((line_start, line_start, block))

    def apply(self) -> str:
        out = self.text
        for start, end, new in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            out = out[:start] + new + out[end:]
        return out


def _target_flags(plan: ScriptPlan, p: Problem, s: Strategy) -> dict[str, FlagValue]:
    """The flags the rewrite sets (:func:`layout_flags` of the script's framework and the sequence
    length). MindSpeed's MC2 keeps the script's spelling: a script that runs ``--use-mc2`` (older
    MindSpeed-LLM's name, :data:`autopar.specs.script_comm.MC2_FLAGS`) keeps it where the layout
    keeps MC2 on, rather than having it replaced by ``--use-ascend-mc2``."""
    flags = layout_flags(p, s, plan.framework)  # type: ignore[arg-type]
    flags["--seq-length"] = str(p.train.seq_len)
    if flags.get("--use-ascend-mc2") is True and plan.args.has("--use-mc2") and not plan.args.has("--use-ascend-mc2"):
        flags["--use-mc2"], flags["--use-ascend-mc2"] = True, None
    return flags


# What an ``export CUDA_DEVICE_MAX_CONNECTIONS=1`` becomes under Megatron-FSDP, which refuses 1:
# CUDA's own default number of connections (CUDA C Programming Guide, environment variables).
FSDP_MAX_CONNECTIONS = "8"


def _env_edits(ed: _Editor, s: Strategy) -> None:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS`` to what Megatron-LM asserts for ``s``: 1 where it
    needs it (inserted when missing), :data:`FSDP_MAX_CONNECTIONS` where the script sets 1 and
    Megatron-FSDP refuses it; each edit is listed in ``ed.changes`` like a flag's."""
    spans = ed.sh.assignments.get(ENV)
    if forbids_max_connections_one(s):
        for a, b in spans or ():
            if ed.text[a:b].strip("\"'") == "1":
                ed.edits.append((a, b, FSDP_MAX_CONNECTIONS))
                ed.changes.append((ENV, ed.text[a:b], FSDP_MAX_CONNECTIONS))
        return
    if not needs_max_connections_env(s):
        return
    if spans:
        for a, b in spans:
            if ed.text[a:b].strip("\"'") != "1":
                ed.edits.append((a, b, "1"))
                ed.changes.append((ENV, ed.text[a:b], "1"))
        return
    pos = ed.text.find("\n") + 1 if ed.text.startswith("#!") else 0
    ed.edits.append((pos, pos, f"export {ENV}=1\n"))
    ed.changes.append((ENV, "(unset)", "1"))


def rewrite_script(plan: ScriptPlan, p: Problem, s: Strategy) -> str:
    """The script of ``plan`` with its layout replaced by ``s`` (see the module docstring).

    Raises:
        AutoparError: the layout cannot be expressed in the script's framework, or the edited
            script does not read back as ``s`` on ``p``'s cluster.
    """
    return rewrite_with_changes(plan, p, s)[0]


def rewrite_with_changes(plan: ScriptPlan, p: Problem, s: Strategy) -> tuple[str, list[tuple[str, str, str]]]:
    """:func:`rewrite_script` and what it changed: ``(flag, old, new)`` per edit (a flag set
    through a variable is named with it, ``--tensor-model-parallel-size (via TP=)``; ``(absent)``
    / ``(removed)`` / ``on`` for flags inserted, deleted or switched on).

    Raises:
        AutoparError: as :func:`rewrite_script`.
    """
    ed = _Editor(plan)
    clean = ed.sh.clean
    for flag, value in _target_flags(plan, p, s).items():
        if value == KEEP:
            continue
        hits = _hits(clean, flag, flag not in SWITCHES)
        if value is None:
            for hit in hits:
                ed.remove(hit, flag)
        elif value is True:
            if not hits:
                ed.inserts.append(flag)
                ed.changes.append((flag, "(absent)", "on"))
        elif hits:
            for hit in hits:
                ed.set_value(hit, value, flag)
        elif value != _ABSENT_MEANS.get(flag, str(s.tp) if flag == "--expert-tensor-parallel-size" else None):
            ed.inserts.append(f"{flag} {value}")
            ed.changes.append((flag, "(absent)", value))
    for names, value in ((("--nnodes",), p.cluster.num_nodes),
                         (("--nproc_per_node", "--nproc-per-node"), p.cluster.devices_per_node)):
        for name in names:
            for hit in _hits(clean, name, True):
                ed.set_value(hit, str(value), name)
    _env_edits(ed, s)
    ed.insert_block()
    new = ed.apply()
    _verify(plan, new, p, s)
    return new, ed.changes


def _layout_key(p: Problem, s: Strategy) -> dict[str, object]:
    return dict(tp=s.tp, pp=s.pp, vpp=s.vpp, cp=s.cp, ep=s.ep, etp=s.expert_tp if p.model.is_moe else None,
                sp=s.sp, zero=s.zero, recompute=s.recompute, recompute_layers=s.recompute_layers, mbs=s.mbs,
                split=stage_layers(p, s), accounted=(s.account_for_embedding, s.account_for_loss))


def _verify(plan: ScriptPlan, new: str, p: Problem, s: Strategy) -> None:
    back = read_script(plan.path, new)
    world = back.num_nodes * back.devices_per_node
    got = back.strategy(world, p.model.num_layers)
    want_key, got_key = _layout_key(p, s), _layout_key(p, got)
    want_key.update(world=p.world_size, gbs=p.train.global_batch_size, seq=p.train.seq_len)
    got_key.update(world=world, gbs=back.train_fields["global_batch_size"], seq=back.train_fields["seq_len"])
    diff = {k: (got_key[k], v) for k, v in want_key.items() if got_key[k] != v}
    if diff:
        shown = ", ".join(f"{k} reads {g} (wanted {w})" for k, (g, w) in diff.items())
        raise AutoparError(f"{plan.path.name}: cannot rewrite the layout in place: {shown}; edit these flags by hand")


def script_paths(out: str | Path, count: int) -> list[Path]:
    """``OUT.sh``, ``OUT.2.sh``, ``OUT.3.sh``, ... (``count`` names; ``OUT``'s suffix, if any, is kept:
    ``OUT``, ``OUT.2``, ...)."""
    out = Path(out)
    stem = out.with_suffix("")
    return [out] + [stem.with_name(f"{stem.name}.{i}{out.suffix}") for i in range(2, count + 1)]


def _band_aside(p: Problem, threshold_pct: float) -> str:
    """Where the table's step-time band (:func:`autopar.report.ties.problem_certainty`, the MAPE
    on the validation rows most like ``p``: same family, precision and device generation) is
    another figure than the default threshold (the MAPE on every row of ``p``'s family), the
    aside that says which is which; else empty. E.g. Mixtral on H100: the threshold 16.3 (all MoE
    rows), the band ±9.9 (6 MoE bf16/fp16 rows on Hopper)."""
    from autopar.report.ties import problem_certainty

    step = problem_certainty(p).step_time
    if step.band_pct is None or f"{step.band_pct:g}" == f"{threshold_pct:g}":
        return ""
    return (f" (the table's ±{step.band_pct:g}% band is the MAPE on the {len(step.rows)} {step.group}, the rows "
            "most like this problem)")


def write_scripts(script: str | Path, p: Problem, result: SearchResult, out: str | Path,
                  min_gain_pct: float | None = None, count: int | None = None) -> list[str]:
    """Rewrite ``script`` for the first ``count`` ranked layouts of ``result`` (None: all) worth it,
    into :func:`script_paths` (layout #k into the k-th name), and say what changed.

    A file already at one of those names is replaced, as ``export --out`` and ``search --report``
    replace theirs, and its ``wrote`` line says so; the command's inputs are never written
    (:func:`autopar.cli.paths.refuse_overwriting_inputs`).

    A layout is written only when its predicted step time beats the script's own layout on the
    same problem by at least ``min_gain_pct`` percent (default
    :func:`~autopar.export.rewrite_checks.default_min_gain_pct`: autopar's step-time MAPE on
    similar validation rows), or when the script's layout cannot run there (a rule, or memory).
    A ``--load`` checkpoint saved under another tp/pp/ep or format queues one ``warning:`` line
    (:func:`~autopar.export.rewrite_checks.checkpoint_warning`, via
    :func:`autopar.notices.warn_on_success`).

    Returns:
        Lines for stderr: per file written, ``wrote PATH (#k, ...)`` then one ``  FLAG: old -> new``
        line per change; when no layout is predicted to gain enough, one ``not written: OUT: ...``
        line instead (the best gain, both step times, the threshold and where it comes from; the
        script is left alone and nothing is written: a small gain is an outcome, not bad input).
    Raises:
        AutoparError: ``min_gain_pct`` outside 0..100; a layout the script's framework cannot
            express (its rank is named); an output path that is ``script`` itself; or a file that
            cannot be written.
    """
    from autopar.notices import warn_on_success
    from autopar.export.rewrite_checks import (MEGATRON_DEFAULT_CKPT_FORMAT, checkpoint_warning, default_min_gain_pct,
                                               gain_pct, script_baseline, target_set)

    if min_gain_pct is not None and not 0 <= min_gain_pct <= 100:
        raise AutoparError(f"--min-gain-pct={min_gain_pct}: must be a percentage in 0..100")
    plan = read_script(script)
    layouts = result.layouts if count is None else result.layouts[:count]
    paths = script_paths(out, len(layouts))
    source = Path(script).resolve()
    if any(path.resolve() == source for path in paths):
        raise AutoparError(f"--write-script={str(out)!r}: would overwrite the --script it rewrites; "
                           "name another file")
    threshold = default_min_gain_pct(p) if min_gain_pct is None else min_gain_pct
    why = (f"--min-gain-pct {threshold:g}" if min_gain_pct is not None else
           f"the default --min-gain-pct {threshold:g}, autopar's step-time MAPE on all {target_set(p)} validation "
           f"rows{_band_aside(p, threshold)}")
    baseline = script_baseline(plan, p)
    chosen = []
    for rank, (path, e) in enumerate(zip(paths, layouts), 1):
        gain = gain_pct(baseline, e.step_time_s)
        if gain is None or gain >= threshold:
            chosen.append((rank, path, e, gain))
    if not chosen:  # an outcome of the search, not bad input: said, nothing written, exit 0
        best = gain_pct(baseline, result.layouts[0].step_time_s)
        than = f"{best:.1f}% faster" if best >= 0 else f"{-best:.1f}% slower"
        return [f"not written: {out}: the best layout is predicted {than} than the script's own "
                f"({result.layouts[0].step_time_s:.3f} s vs {baseline.step_time_s:.3f} s per step), below {why}; "
                f"{Path(script).name} is left as it is (pass a lower --min-gain-pct to rewrite anyway)"]
    lines, texts = [], []
    for rank, path, e, gain in chosen:
        try:
            text, changes = rewrite_with_changes(plan, p, e.strategy)
        except AutoparError as err:
            raise AutoparError(f"layout #{rank}: {err}") from None
        texts.append((path, text))
        said = (baseline.reason if gain is None else f"predicted {gain:.1f}% faster than the script's layout: "
                f"{e.step_time_s:.3f} s vs {baseline.step_time_s:.3f} s per step, {gain:.1f}% less time")
        lines.append(f"wrote {path}{' over the file there' if path.exists() else ''} (#{rank}, {said}):")
        lines += [f"  {flag}: {old} -> {new}" for flag, old, new in changes] or ["  (no flag changed)"]
    for _, path, e, _ in chosen:
        s = e.strategy
        fmt = layout_flags(p, s, plan.framework).get("--ckpt-format", KEEP)  # type: ignore[arg-type]
        fmt = plan.args.text("--ckpt-format") or MEGATRON_DEFAULT_CKPT_FORMAT if fmt == KEEP else fmt
        warning = checkpoint_warning(plan, {"tp": s.tp, "pp": s.pp, "ep": s.ep}, str(fmt))
        if warning:
            warn_on_success(f"{path.name}: {warning}")
    skipped = [str(rank) for rank in range(1, len(layouts) + 1) if rank not in {c[0] for c in chosen}]
    if skipped:
        lines.append(f"not written: #{', #'.join(skipped)} (predicted gain below {why})")
    try:
        for path, text in texts:
            path.write_text(text)
    except OSError as err:
        raise AutoparError(f"--write-script={str(out)!r}: cannot write ({err.strerror})") from None
    return lines


def edit_flags(plan: ScriptPlan, values: dict[str, str | bool | None]) -> str:
    """``plan``'s script with other (non-layout) flags edited, by the same rules as
    :func:`rewrite_script` (a ``$X`` value rewrites ``X``'s assignment; new flags go next to the
    first parallel flag).

    Args:
        plan: the script, as :func:`autopar.specs.script.read_script` read it.
        values: flag -> a value to set (inserted when absent), ``True`` for a switch to add when
            absent, ``False`` for a switch to delete, ``None`` for a valued flag to delete with
            its value.
    Raises:
        AutoparError: no place to insert a missing flag.
    """
    ed = _Editor(plan)
    for flag, value in values.items():
        hits = _hits(ed.sh.clean, flag, not isinstance(value, bool))
        if value is None or value is False:
            for hit in hits:
                ed.remove(hit, flag)
        elif value is True:
            ed.inserts += [] if hits else [flag]
        elif hits:
            for hit in hits:
                ed.set_value(hit, value, flag)
        else:
            ed.inserts.append(f"{flag} {value}")
    ed.insert_block()
    return ed.apply()

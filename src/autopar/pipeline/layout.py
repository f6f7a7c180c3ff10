"""``PipelineLayout``: what each pipeline chunk holds (embedding, decoder layers, MTP layers, loss).

One type for every split autopar reads, costs and writes: Megatron-LM's default even split,
``--decoder-first/last-pipeline-num-layers``, ``--account-for-embedding/loss-in-pipeline-split``,
MindSpeed's ``--num-layer-list``, ``estimate --layers-per-stage`` and Megatron-LM's
``--pipeline-model-parallel-layout`` string (which can express all of them) are constructors of it
(:func:`layout_of` picks the one a :class:`~autopar.strategy.Strategy` asks for).

The layout is held as Megatron-LM holds it: ``pp * vpp`` virtual stages in layer order (virtual
stage ``j = v * pp + r`` is chunk ``v`` of pipeline rank ``r``), each a string over the layer
characters ``E`` (embedding), ``t`` (decoder layer), ``m`` (MTP layer), ``L`` (output layer and loss).

Source of the string syntax and the validity rules: Megatron-LM
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (``parse_str_to_list``: commas are
cosmetic, ``(...)*n`` and ``x*n`` unroll, ``|`` separates virtual stages;
``PipelineParallelLayerLayout.__init__``: the stage count is a multiple of pp, vpp = count / pp;
``validate_layer_layout``: embedding first and loss last in layer order, each exactly once,
``num_layers`` decoder layers, ``mtp_num_layers`` MTP layers after every decoder layer, only in the
last chunk of a rank and all in one chunk) and ``megatron/training/arguments.py`` /
``transformer_config.py`` (the layout cannot be combined with the first/last stage counts or
the account-for-embedding/loss flags). autopar further refuses, as not modelled, an embedding
off pipeline rank 0 or a loss off rank pp-1 (possible in Megatron only behind empty stages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autopar.errors import AutoparError

if TYPE_CHECKING:
    from autopar.problem import Problem
    from autopar.strategy import Strategy

LAYER_CHARS = "EtmL"
_UNROLL = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")  # Megatron parse_str_to_list, in its order
MAX_STAGES = 100_000  # virtual stages one layout string may expand to


@dataclass(frozen=True)
class PipelineLayout:
    """Layers of each of the ``pp * vpp`` virtual stages, in Megatron's layer order.

    Attributes:
        pp: pipeline ranks.
        stages: ``pp * vpp`` strings over :data:`LAYER_CHARS`; ``stages[v * pp + r]`` is chunk
            ``v`` of rank ``r`` (an empty string is an empty chunk).
    """

    pp: int
    stages: tuple[str, ...]

    @property
    def vpp(self) -> int:
        """Model chunks per pipeline rank."""
        return len(self.stages) // self.pp

    def chunk(self, rank: int, v: int) -> str:
        """Layer characters of chunk ``v`` of pipeline rank ``rank``."""
        return self.stages[v * self.pp + rank]

    def _count(self, char: str) -> np.ndarray:
        return np.array([[self.chunk(r, v).count(char) for v in range(self.vpp)] for r in range(self.pp)],
                        dtype=np.int64)

    @property
    def decoder(self) -> np.ndarray:
        """Decoder layers per chunk, shape ``(pp, vpp)`` (``[rank, chunk]``)."""
        return self._count("t")

    @property
    def mtp(self) -> np.ndarray:
        """MTP layers per chunk, shape ``(pp, vpp)``."""
        return self._count("m")

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Decoder layers per pipeline rank (its chunks summed), length pp."""
        return tuple(int(n) for n in self.decoder.sum(axis=1))

    @property
    def mtp_rank(self) -> int:
        """Pipeline rank that holds the MTP layers (pp - 1 when there are none)."""
        ranks = np.nonzero(self.mtp.sum(axis=1))[0]
        return int(ranks[0]) if len(ranks) else self.pp - 1

    @property
    def num_layers(self) -> int:
        return int(self.decoder.sum())

    # ----- reading -----------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, pp: int, source: str = "--pipeline-layout") -> "PipelineLayout":
        """A Megatron ``--pipeline-model-parallel-layout`` string for ``pp`` ranks (syntax only;
        :meth:`validate` checks it against a model).

        Raises:
            AutoparError: an unknown layer character, unbalanced parentheses, an expansion over
                :data:`MAX_STAGES` stages, or a stage count that pp does not divide (``source``
                names the option in the message).
        """
        flat = text.replace(",", "").replace(" ", "")
        for pattern in _UNROLL:
            for match in re.finditer(pattern, flat):
                if int(match.group(2)) * len(match.group(1)) > MAX_STAGES * 64:
                    raise AutoparError(f"{source}={text!r}: {match.group(0)!r} expands past {MAX_STAGES:,} stages")
            flat = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), flat)
        bad = sorted(set(flat) - set(LAYER_CHARS) - {"|"})
        if bad:
            raise AutoparError(f"{source}={text!r}: {''.join(bad)!r} is not a layer character; Megatron-LM knows "
                               "E (embedding), t (decoder layer), m (MTP layer), L (loss), | between virtual "
                               "stages, (...)*n and x*n repeats")
        stages = tuple(flat.split("|"))
        if len(stages) > MAX_STAGES:
            raise AutoparError(f"{source}={text!r}: {len(stages):,} virtual stages, more than {MAX_STAGES:,}")
        if len(stages) % pp:
            raise AutoparError(f"{source}={text!r}: {len(stages)} virtual stages is not a multiple of pp={pp} "
                               "(Megatron-LM: 'The length of pipeline_model_parallel_layout must be divisible by "
                               "pipeline_model_parallel_size')")
        return cls(pp=pp, stages=stages)

    def validate(self, num_layers: int, mtp_num_layers: int, source: str = "--pipeline-layout") -> None:
        """Megatron-LM's ``validate_layer_layout`` rules for a model, plus autopar's placement limits
        (module docstring).

        Raises:
            AutoparError: the first rule broken, with the layout written out.
        """
        flat = "".join(self.stages)
        text = self.megatron()
        why = None
        if flat.count("E") != 1 or flat.count("L") != 1:
            why = "the embedding E and the loss L must each appear exactly once"
        elif not flat.startswith("E") or not flat.endswith("L"):
            why = "the first layer must be the embedding E and the last the loss L"
        elif flat.count("t") != num_layers:
            why = f"it has {flat.count('t')} decoder layers t; the model has num_layers={num_layers}"
        elif flat.count("m") != mtp_num_layers:
            why = f"it has {flat.count('m')} MTP layers m; the model has mtp_num_layers={mtp_num_layers}"
        elif "m" in flat and "t" in flat[flat.index("m"):]:
            why = "decoder layers must be placed before MTP layers"
        elif any("m" in self.chunk(r, v) for r in range(self.pp) for v in range(self.vpp - 1)):
            why = "MTP layers must be in the last virtual stage of a rank"
        elif mtp_num_layers and max(self.chunk(r, self.vpp - 1).count("m") for r in range(self.pp)) != mtp_num_layers:
            why = "all MTP layers must be in one virtual stage"
        elif "E" not in self.chunk(0, 0) and self.pp > 1:
            why = "autopar models the embedding on pipeline rank 0's first chunk only"
        elif "L" not in self.chunk(self.pp - 1, self.vpp - 1) and self.pp > 1:
            why = "autopar models the loss on the last pipeline rank's last chunk only"
        elif self.pp > 1 and self.decoder.sum(axis=1).min() < 1:
            why = "autopar needs every pipeline rank to hold at least one decoder layer"
        if why:
            raise AutoparError(f"{source}={text!r} (pp={self.pp}, vpp={self.vpp}): {why} "
                               "(Megatron-LM pipeline_parallel_layer_layout.py validate_layer_layout)")

    # ----- constructors of the classic splits --------------------------------------------------

    @classmethod
    def from_chunks(cls, decoder: np.ndarray, mtp_num_layers: int = 0, mtp_rank: int | None = None) -> "PipelineLayout":
        """Embedding on chunk [0, 0], loss on the last chunk of the last rank, ``decoder[r, v]``
        decoder layers on chunk v of rank r, the MTP layers before the loss at the end of rank
        ``mtp_rank``'s last chunk (default the last rank; Megatron's default placement)."""
        decoder = np.asarray(decoder, dtype=np.int64)
        pp, vpp = decoder.shape
        mtp_rank = pp - 1 if mtp_rank is None else mtp_rank
        stages = []
        for v in range(vpp):
            for r in range(pp):
                text = "E" * (r == 0 and v == 0) + "t" * int(decoder[r, v])
                text += "m" * mtp_num_layers * (r == mtp_rank and v == vpp - 1)
                stages.append(text + "L" * (r == pp - 1 and v == vpp - 1))
        return cls(pp=pp, stages=tuple(stages))

    @classmethod
    def from_stage_split(cls, layers_per_stage: tuple[int, ...], vpp: int = 1, mtp_num_layers: int = 0) -> "PipelineLayout":
        """Each rank's decoder layers spread over its ``vpp`` chunks as evenly as possible (the
        earlier chunks take the remainder); with stage counts that vpp divides, Megatron's split."""
        split = np.asarray(layers_per_stage, dtype=np.int64)
        chunks = split[:, None] // vpp + (np.arange(vpp)[None, :] < (split % vpp)[:, None])
        return cls.from_chunks(chunks, mtp_num_layers)

    @classmethod
    def accounted(cls, num_layers: int, pp: int, vpp: int, embedding: bool, loss: bool,
                  mtp_num_layers: int = 0) -> "PipelineLayout":
        """Megatron's ``--account-for-embedding/loss-in-pipeline-split``: every chunk gets
        ``(L + e + l) / (pp * vpp)`` slots and the embedding (loss) takes one of chunk [0, 0]
        ([pp-1, vpp-1]); Megatron-Core ``transformer_block.get_num_layers_to_build``. E.g. 126
        layers, pp 8, vpp 8, both: chunks [0, 0] and [7, 7] hold 1 layer, every other chunk 2.

        Raises:
            AutoparError: ``L + e + l`` is not a multiple of ``pp * vpp``.
        """
        total = num_layers + int(embedding) + int(loss)
        if total % (pp * vpp):
            raise AutoparError(f"num_layers={num_layers} (+{int(embedding)} embedding +{int(loss)} loss) = {total} "
                               f"is not a multiple of pp*vpp = {pp * vpp}")
        chunks = np.full((pp, vpp), total // (pp * vpp), dtype=np.int64)
        chunks[0, 0] -= int(embedding)
        chunks[-1, -1] -= int(loss)
        return cls.from_chunks(chunks, mtp_num_layers)

    @classmethod
    def balanced(cls, num_layers: int, pp: int, vpp: int, mtp_num_layers: int = 0) -> "PipelineLayout":
        """A flexible layout for layer counts that do not interleave evenly: each rank keeps the
        decoder layers of Megatron's default split (:func:`autopar.strategy.default_layers_per_stage`:
        even, or ``ceil(L/pp)`` per middle rank and the rest on the first and last), and its
        chunks share them as evenly as possible with the embedding, each MTP layer and the loss
        counted as one slot each in their chunks (rank 0's first, the last rank's last), the later
        chunks taking the remainder. NVIDIA's DeepSeek-V3 recipe (Megatron-Bridge, pp 16 x vpp 2:
        ``"Et|(tt|)*30mL"``) is this rule: 61 layers -> ranks of 4 with 3 on the first and 2 on
        the last, chunks of 2 slots.

        Raises:
            AutoparError: no default split, or a chunk with fewer slots than the embedding (the MTP
                layers and the loss) it must hold.
        """
        from autopar.strategy import default_layers_per_stage

        split = default_layers_per_stage(num_layers, pp)
        if split is None:
            raise AutoparError(f"num_layers={num_layers} has no default split over pp={pp} stages")
        per_rank = np.asarray(split, dtype=np.int64)
        per_rank[0] += 1
        per_rank[-1] += 1 + mtp_num_layers
        slots = per_rank[:, None] // vpp + (np.arange(vpp)[None, ::-1] < (per_rank % vpp)[:, None])
        decoder = slots.copy()
        decoder[0, 0] -= 1
        decoder[-1, -1] -= 1 + mtp_num_layers
        if decoder.min() < 0:
            raise AutoparError(f"num_layers={num_layers} with {mtp_num_layers} MTP layers has no balanced layout "
                               f"over pp={pp} x vpp={vpp} chunks (too few slots for the embedding, MTP and loss)")
        return cls.from_chunks(decoder, mtp_num_layers)

    # ----- writing ------------------------------------------------------------------------------

    def megatron(self) -> str:
        """The ``--pipeline-model-parallel-layout`` string, runs of equal stages written
        ``(stage|)*n`` and six or more decoder layers ``t*n``;
        ``PipelineLayout.parse(x.megatron(), pp) == x``."""
        runs: list[list] = []
        for stage in (re.sub(r"t{6,}", lambda x: f"t*{len(x.group(0))}", text) for text in self.stages):
            if runs and runs[-1][0] == stage:
                runs[-1][1] += 1
            else:
                runs.append([stage, 1])
        parts = []
        for i, (stage, n) in enumerate(runs):
            last = i == len(runs) - 1
            if n >= 3 or (n == 2 and not last and stage):
                reps = n - 1 if last else n
                parts.append(f"({stage}|)*{reps}" + (stage if last else ""))
            else:
                parts.append("|".join([stage] * n) + ("" if last else "|"))
        return "".join(parts)

    def first_last(self) -> tuple[int | None, int | None] | None:
        """Megatron's ``--decoder-first/last-pipeline-num-layers`` values (None = flag not needed)
        that give this layout without the layout string, or None when they cannot: the MTP layers
        must sit on the last rank's last chunk, each rank's layers split evenly over its chunks,
        the middle ranks equal, and first/last a multiple of vpp (transformer_config.py)."""
        if self.mtp_rank != self.pp - 1 or self.mtp[-1, -1] != self.mtp.sum():
            return None
        split = self.layers_per_stage
        if PipelineLayout.from_stage_split(split, self.vpp, int(self.mtp.sum())) != self:
            return None
        if any(n % self.vpp for n in split) or self.pp == 1:
            return (None, None) if self.pp == 1 and not any(n % self.vpp for n in split) else None
        middle = split[1:-1]
        if len(set(middle)) > 1:
            return None
        if len(set(split)) == 1:
            return None, None
        mid = middle[0] if middle else None
        first = None if split[0] == mid else split[0]
        last = None if split[-1] == mid else split[-1]
        if mid is None:  # pp 2: Megatron needs each given side, the other inferred is not allowed
            return split[0], split[-1]
        return first, last

    def sapp_offsets(self) -> list[list[int]] | list[int]:
        """MindFormers/SAPP ``offset``: each chunk's decoder layers minus the even share
        ``L // (pp * vpp)``, shape ``[vpp][pp]`` (a flat list of pp with vpp 1). MindFormers
        ``pipeline_stage`` docs: the remainder ``L % (pp * vpp)`` goes by offsets too."""
        base = self.num_layers // (self.pp * self.vpp)
        rows = (self.decoder - base).T.tolist()
        return rows[0] if self.vpp == 1 else rows

    def describe(self) -> str:
        """Short human form: decoder layers per chunk, e.g. ``1+2,2+2,...``."""
        return ",".join("+".join(str(int(n)) for n in row) for row in self.decoder)


def chunk_in_flight(pp: int, vpp: int, rank: int, num_microbatches: int) -> np.ndarray:
    """Micro-batches each chunk of ``rank`` holds at the rank's activation peak, shape ``(vpp,)``.

    1F1B (vpp 1): ``min(pp - rank, m)``. Interleaved 1F1B (Megatron-Core
    ``get_forward_backward_func`` interleaved schedule; Narayanan et al., SC'21, sec. 2.2):
    rank ``r`` runs ``W = 2 * (pp - r - 1) + (vpp - 1) * pp + 1`` warm-up forwards (at most
    ``m * vpp``) before its first backward, in groups of pp micro-batches per chunk (chunk 0 for
    micro-batches 0..pp-1, chunk 1 for the same, ..., then chunk 0 again), and the steady state
    keeps that count. Forward ``i`` goes to chunk ``(i // pp) % vpp``. E.g. pp 4, vpp 4, rank
    0: W = 19 = 7 + 4 + 4 + 4 (chunk 0 holds 7). Summed over chunks this is ``W``, so with equal
    chunks the peak is ``W / vpp`` micro-batches of the rank's layers, as before.
    """
    if vpp == 1:
        return np.array([min(pp - rank, num_microbatches)], dtype=np.float64)
    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, num_microbatches * vpp)
    return np.bincount((np.arange(warmup) // pp) % vpp, minlength=vpp).astype(np.float64)


def layout_of(p: "Problem", s: "Strategy") -> PipelineLayout:
    """The one :class:`PipelineLayout` of layout ``s`` for ``p``'s model, whichever form gave it:
    ``pipeline_layout`` (parsed and validated), the embedding/loss account flags
    (:meth:`PipelineLayout.accounted`; a ``layers_per_stage`` beside them is their stage sums),
    ``layers_per_stage`` (each rank's layers spread over its chunks), or the default
    (:func:`default_layout`).

    Raises:
        AutoparError: a layout string that does not parse, breaks Megatron-LM's rules, or whose
            virtual stages give a vpp other than ``s.vpp``; a default split that leaves a stage
            empty.
    """
    m = p.model
    if s.pipeline_layout is not None:
        layout = PipelineLayout.parse(s.pipeline_layout, s.pp, "pipeline_layout")
        if layout.vpp != s.vpp:
            raise AutoparError(f"pipeline_layout={s.pipeline_layout!r}: {len(layout.stages)} virtual stages over "
                               f"pp={s.pp} give vpp={layout.vpp}, not vpp={s.vpp}")
        layout.validate(m.num_layers, m.mtp_num_layers, "pipeline_layout")
        return layout
    if s.account_for_embedding or s.account_for_loss:
        return PipelineLayout.accounted(m.num_layers, s.pp, s.vpp, s.account_for_embedding, s.account_for_loss,
                                        m.mtp_num_layers)
    if s.layers_per_stage is not None:
        return PipelineLayout.from_stage_split(s.layers_per_stage, s.vpp, m.mtp_num_layers)
    return default_layout(m.num_layers, s.pp, s.vpp, m.mtp_num_layers)


def needs_flexible(num_layers: int | np.ndarray, pp: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """Where Megatron's default split cannot interleave: ``vpp > 1`` and ``L / pp`` not a whole
    multiple of vpp (``arguments.py``: layers per virtual stage must be whole); bool array."""
    pp, vpp = np.maximum(np.asarray(pp), 1), np.asarray(vpp)
    return (vpp > 1) & ~((num_layers % pp == 0) & ((num_layers // pp) % np.maximum(vpp, 1) == 0))


def default_layout(num_layers: int, pp: int, vpp: int, mtp_num_layers: int = 0) -> PipelineLayout:
    """The layout autopar assumes when none is given: Megatron's default split (even, or
    ``ceil(L/pp)`` per middle stage and the rest on the first and last,
    :func:`autopar.strategy.default_layers_per_stage`), or :meth:`PipelineLayout.balanced` where
    that split cannot interleave (:func:`needs_flexible`, e.g. DeepSeek-V3's 61 layers on pp 4 x
    vpp 4), as NVIDIA's recipes then give a ``--pipeline-model-parallel-layout``.

    Raises:
        AutoparError: neither exists (too many stages for the layers).
    """
    from autopar.strategy import default_layers_per_stage

    if needs_flexible(num_layers, np.asarray(pp), np.asarray(vpp)):
        return PipelineLayout.balanced(num_layers, pp, vpp, mtp_num_layers)
    split = default_layers_per_stage(num_layers, pp)
    if split is None:
        raise AutoparError(f"num_layers={num_layers} has no default split over pp={pp} stages")
    return PipelineLayout.from_stage_split(split, vpp, mtp_num_layers)


def split_fields(layout: PipelineLayout) -> dict:
    """The :class:`~autopar.strategy.Strategy` fields that state ``layout``: ``layers_per_stage``
    when each rank's layers split evenly over its chunks with the MTP layers on the last rank
    (what the per-stage forms and Megatron's first/last flags express), else ``pipeline_layout``."""
    split = layout.layers_per_stage
    plain = PipelineLayout.from_stage_split(split, layout.vpp, int(layout.mtp.sum())) == layout
    if plain and not any(n % layout.vpp for n in split):
        return {"layers_per_stage": split, "pipeline_layout": None}
    return {"layers_per_stage": None, "pipeline_layout": layout.megatron()}

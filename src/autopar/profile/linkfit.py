"""Measured collective fits in the planner: the provider behind ``cost.comm.use_link_fits``.

``autopar profile comm`` stores, per collective and link class, the per-step latency
``alpha_s`` and bus bandwidth of the fit ``t = steps * alpha + volume / busbw``
(:mod:`autopar.profile.comm`, the same step and volume terms as :mod:`autopar.cost.comm`).
:meth:`LinkFits.link_params` maps them onto the four link parameters the cost model uses:

* ``intra`` fit -> intra bus bandwidth and latency (the fit is the achieved value, so the
  device's ``intra_node_comm_efficiency`` does not apply);
* ``inter`` fit -> inter latency, and per-rank NIC bandwidth = fitted bus bandwidth / ranks
  per node of the fitted groups (contiguous ranks: every GPU of a node drives its own NIC, the
  ``min(intra, m * nic)`` model of :func:`autopar.cost.comm.group_bus_bandwidth`); a
  send/recv fit is already one NIC's bandwidth.

A collective or link class without a fit keeps the device spec's values. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

LINKS = ("intra", "inter")


@dataclass(frozen=True)
class LinkFits:
    """Fits of one device: ``{(collective, link): (alpha_s, bus bandwidth bytes/s, ranks per node)}``."""

    fits: dict[tuple[str, str], tuple[float, float, int]]

    def link_params(self, collective: str, spec: tuple[float, ...]) -> tuple[float, float, float, float]:
        """(intra bus bandwidth bytes/s, intra latency s, per-rank NIC bandwidth bytes/s, inter
        latency s) of ``collective``: measured where fitted, else ``spec``'s entry."""
        intra_bw, intra_s, nic_bw, inter_s = spec
        if (fit := self.fits.get((collective, "intra"))) is not None:
            intra_s, intra_bw = fit[0], fit[1]
        if (fit := self.fits.get((collective, "inter"))) is not None:
            inter_s = fit[0]
            nic_bw = fit[1] if collective == "send_recv" else fit[1] / max(fit[2], 1)
        return intra_bw, intra_s, nic_bw, inter_s

    def summary(self) -> dict[str, list[str]]:
        """``{link: [fitted collectives]}`` for the coverage report (empty lists: device spec)."""
        return {link: sorted(c for c, lk in self.fits if lk == link) for link in LINKS}

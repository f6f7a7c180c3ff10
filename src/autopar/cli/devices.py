"""``autopar devices``: the device presets and their numbers."""

from __future__ import annotations

from autopar.cli.app import app, console, user_errors
from autopar.cli.json_output import print_json
from autopar.cli.options import Json
from autopar.specs import device_names, load_device


@app.command()
@user_errors
def devices(as_json: Json = False) -> None:
    """List the device presets and their numbers (--json: every field, the names each preset
    answers to, the export formats that run on it and the fp8 recipes it runs)."""
    from autopar.cost.fp8_recipe import supported
    from autopar.report.table import devices_table
    from autopar.specs.cluster import preset_aliases
    from autopar.specs.targets import TARGETS_BY_VENDOR

    specs = [load_device(name) for name in device_names()]
    if as_json:
        from autopar.specs.train import FP8_RECIPES

        docs = [{**d.model_dump(), "aliases": preset_aliases(d.name), "targets": list(TARGETS_BY_VENDOR[d.vendor]),
                 "fp8_recipes": [r for r in FP8_RECIPES if supported(d, r) is None]} for d in specs]
        print_json("devices", {"devices": docs})
        return
    console.print(devices_table(specs))

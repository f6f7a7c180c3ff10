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
    answers to and the export formats that run on it)."""
    from autopar.report.table import devices_table
    from autopar.specs.cluster import preset_aliases
    from autopar.specs.targets import TARGETS_BY_VENDOR

    specs = [load_device(name) for name in device_names()]
    if as_json:
        docs = [{**d.model_dump(), "aliases": preset_aliases(d.name), "targets": list(TARGETS_BY_VENDOR[d.vendor])}
                for d in specs]
        print_json("devices", {"devices": docs})
        return
    console.print(devices_table(specs))

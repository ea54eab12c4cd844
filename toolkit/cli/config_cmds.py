"""`toolkit config` (validate, show, schema, reference, presets) and `toolkit data prepare`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from toolkit.cli.common import ConfigArg, JsonOpt, SetOpt, app, emit_json, err, group, load, out, status

config_app = group("Check, show and describe configs.")
data_app = group("Prepare training data.")
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")


@config_app.command("validate")
def config_validate(
    files: Annotated[list[str], typer.Argument(metavar="CONFIG...", help="Files or preset names.")],
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate configs as `train` checks them before launch (the schema, the model's chat template, a prepared
    dataset's seal, the first rows rendered where the model is on this machine); exit 2 on the first problem, naming
    the file and field. Nothing is built or downloaded."""
    from toolkit import sdk

    results = []
    for source in files:
        cfg = load(source, set_)
        sdk.check(cfg)
        results.append({"source": source, "name": cfg.name, "model": cfg.model.id, "target": cfg.target,
                        "not_checked": cfg.skipped_checks()})  # fmt: skip
        if as_json:
            continue
        out.print(f"[green]ok[/] {source}: {cfg.name} ({cfg.model.id}, target {cfg.target})", highlight=False)
        if cfg.skipped_checks():
            err.print(f"not checked (no GPU on this machine to size them by): {'; '.join(cfg.skipped_checks())}",
                      highlight=False, markup=False)  # fmt: skip
    if as_json:
        emit_json(results)


@config_app.command("show")
def config_show(source: ConfigArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Print the resolved config (base, ${ENV} and --set applied, defaults filled in) as YAML, and what one
    optimizer step averages over on its target (as comments)."""
    import yaml

    cfg = load(source, set_)
    if as_json:
        emit_json({"config": cfg.model_dump(mode="json"), "optimizer_step": cfg.optimizer_step()})
        return
    sys.stdout.write(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
    sys.stdout.write("".join(f"# {line}\n" for line in cfg.optimizer_step()))  # comments: still valid YAML


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of config files (with base: and ${ENV}); point your editor's YAML plugin at it."""
    from toolkit.config.schema import file_schema

    sys.stdout.write(json.dumps(file_schema(), indent=2) + "\n")


@config_app.command("reference")
def config_reference() -> None:
    """Print the config reference as Markdown (docs/config-reference.md embeds this output)."""
    from toolkit.config.reference import markdown

    sys.stdout.write(markdown())


@config_app.command("presets")
def config_presets(as_json: JsonOpt = False) -> None:
    """List the presets shipped with the toolkit."""
    from toolkit.config import preset_names

    if as_json:
        emit_json(preset_names())
        return
    for name in preset_names():
        out.print(name, highlight=False)


@data_app.command("prepare")
def data_prepare(
    source: ConfigArg,
    output: Annotated[
        str | None,
        typer.Option(help="Directory or s3:// prefix for the Arrow dataset (default: runs/<name>/prepared)."),
    ] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate, render and tokenize the data once; print token statistics (`toolkit plan` reads them); save it."""
    from rich.table import Table

    from toolkit.sdk import prepare_data

    cfg = load(source, set_)
    with status(f"preparing {cfg.data.source} ..."):  # cloud: an s3:// output
        report = prepare_data(cfg, output)
    if as_json:
        emit_json(report)
        return
    table = Table("statistic", "value", title=f"{cfg.data.source} ({cfg.data.format})")
    for key, value in report.items():
        if key not in ("output", "bad_rows"):
            table.add_row(key, str(value))
    out.print(table)
    for _, reason in report["bad_rows"][:10]:
        err.print(f"[yellow]skipped[/] {reason}", highlight=False)  # the reason names file and line
    out.print(f"saved to {report['output']} (set data.source to it to train on it)", highlight=False)

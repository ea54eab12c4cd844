"""`toolkit deploy` (a SageMaker endpoint, or vLLM on this machine) and `toolkit invoke` (ask the served model)."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Annotated, Any

import typer

from toolkit.cli.common import (
    ConfigArg,
    Effort,
    JsonOpt,
    ServeTarget,
    SetOpt,
    app,
    emit_json,
    err,
    fail,
    load,
    note,
    out,
    status,
)

DeployTarget = Annotated[
    ServeTarget | None,
    typer.Option(
        "--target",
        help="endpoint: a SageMaker endpoint; local: vLLM on this machine (default: local when the config's target "
        "is local, else endpoint).",
    ),
]


@app.command("deploy")
def deploy(
    source: ConfigArg,
    target: DeployTarget = None,
    image_uri: Annotated[str | None, typer.Option(help="Serve this image; skip the build.")] = None,
    model_data: Annotated[str | None, typer.Option(help="S3 URI of model.tar.gz (default: latest job's).")] = None,
    model_dir: Annotated[
        str | None, typer.Option(help="local: the model directory (default: training output).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="local: port (default: serving.local_port).")] = None,
    model_package: Annotated[
        str | None,
        typer.Option(metavar="ARN|VERSION", help="Serve this registered version (only an Approved one)."),
    ] = None,
    allow_unapproved: Annotated[
        bool, typer.Option("--allow-unapproved", help="Deploy a --model-package version that is not Approved.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every request; create nothing.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Serve the trained model: a SageMaker endpoint (created, or updated blue/green) or vLLM on this machine."""
    from toolkit import sdk

    cfg = load(source, set_)
    endpoint_only = model_package is not None or image_uri is not None or model_data is not None
    target = sdk.serve_target(cfg, target or ("endpoint" if endpoint_only else None))
    if model_package is not None and (target == "local" or image_uri or model_data):
        fail("--model-package: the registered version brings its image and model; it deploys to --target endpoint "
             "without --image-uri or --model-data")  # fmt: skip
    if allow_unapproved and model_package is None:
        fail("--allow-unapproved applies to --model-package only: name the registered version to deploy")
    if target == "local":
        return _deploy_local(cfg, model_dir, port, dry_run)
    sent: list[str] = []  # endpoint requests already made: what Ctrl-C leaves behind
    if model_package is not None:  # refused before anything is shown or made when it is not Approved
        package = sdk.registered_version(cfg, model_package, allow_unapproved)
        if package.note:
            err.print(package.note, highlight=False, markup=False)
    try:
        if dry_run:
            requests = sdk.render_deploy(cfg, image_uri, model_data, model_package=model_package,
                                         allow_unapproved=allow_unapproved)  # fmt: skip
            shown = [{r.operation if r.service == "sagemaker" else f"{r.service}.{r.operation}": r.params}
                     for r in requests]  # fmt: skip
            sys.stdout.write(json.dumps(shown, indent=2, default=str) + "\n")
            if not requests:
                err.print("the endpoint already serves this image and model: nothing to do")
            return

        def on_status(line: str) -> None:
            if line.split(" ", 1)[0] in {f"{verb}_{kind}" for verb in ("create", "update", "delete")
                                         for kind in ("endpoint", "inference_component")}:  # fmt: skip
                sent.append(line)
            update(line[-160:])

        with status(f"deploying {cfg.name} ...") as update:
            state = sdk.deploy(cfg, image_uri, model_data, on_status=on_status, model_package=model_package,
                               allow_unapproved=allow_unapproved)  # fmt: skip
    except KeyboardInterrupt:
        if sent:
            err.print(
                "detached: SageMaker goes on creating/updating the endpoint (a failed update rolls back by itself). "
                f"Check it with: toolkit endpoint describe {source}"
            )
        else:
            err.print("interrupted before the endpoint was touched; re-run the same command to deploy")
        raise typer.Exit(130) from None
    if as_json:
        emit_json(state)
        return
    done = "up to date" if not state.actions else "deployed"
    out.print(f"[green]{done}:[/] endpoint {state.name} serves {state.config_name}", highlight=False)
    out.print(f"try it: toolkit invoke {source} 'Wie viele Planeten hat das Sonnensystem?' --reasoning-language French",
              highlight=False, markup=False)  # fmt: skip


def _deploy_local(cfg, model_dir: str | None, port: int | None, dry_run: bool) -> None:
    """vLLM here, in the foreground: the SDK runs its life (start, ready, prompt parity, serve, stop); this shows it.
    A served prompt that is not training's and a server that dies are the SDK's errors (exit 1); Ctrl-C (or SIGTERM)
    before it serves or while it serves stops it and exits 130."""
    import signal

    from toolkit import sdk

    if dry_run:
        plan = sdk.render_serve_local(cfg, model_dir, port)
        sys.stdout.write(json.dumps(plan, indent=2) + "\n")
        return

    def interrupt(*_):
        raise KeyboardInterrupt

    # SIGINT and SIGTERM both stop vLLM: a shell starts background jobs with SIGINT ignored
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)

    def serving(server) -> None:
        out.print(f"[green]serving[/] {server.model} at {server.url} (/ping, /invocations, /v1/chat/completions); "
                  f"log: {server.log}. Ctrl-C stops it.", highlight=False)  # fmt: skip

    # interrupted before it served: the SDK stopped the server, and the interrupt went on; while serving, it returns
    with contextlib.suppress(KeyboardInterrupt):
        sdk.serve_local_until_stopped(cfg, model_dir, port, phase=status, on_note=note, on_serving=serving)
    err.print("stopped: the server and its engine are down; the same command serves again")
    raise typer.Exit(130)  # only an interrupt ends serving: the README's exit code for one


@app.command("invoke")
def invoke(
    source: ConfigArg,
    question: Annotated[str, typer.Argument(help="The user message.")],
    reasoning_language: Annotated[
        str | None, typer.Option(help="System prompt 'reasoning language: X' (the model reasons in X).")
    ] = None,
    system: Annotated[str | None, typer.Option(help="More system instructions.")] = None,
    tools: Annotated[str | None, typer.Option(help="A JSON file: a list of OpenAI function tools.")] = None,
    reasoning_effort: Annotated[
        Effort | None, typer.Option(help="The system message's reasoning level (default: the model's).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 512,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.7,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Print tokens as they arrive.")] = True,
    target: DeployTarget = None,
    url: Annotated[str | None, typer.Option(help="A server's base URL (implies a local/HTTP target).")] = None,
    wait: Annotated[float, typer.Option(help="local/url: wait up to this many seconds for the server.")] = 0,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Exit 1 unless the reply has an answer (and a reasoning part, where the model writes one) and no "
            "special tokens.",
        ),
    ] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the served model: its reasoning (analysis channel, or a template's <think>) and answer are shown apart."""
    from toolkit import sdk
    from toolkit.sdk import (
        before_markup,
        cut_off,
        markup_note,
        messages_for,
        read_tools,
        reply_problems,
        show_tool_calls,
        wait_for,
    )

    cfg = load(source, set_)
    if tools and cfg.served_parser("tool-call-parser") is None:  # vLLM refuses tools without one (a 400 otherwise)
        fail(f"--tools: {cfg.name} ({cfg.model.id}) is served without a tool-call parser, and vLLM refuses requests "
             "with tools then: name one in serving.vllm_args (e.g. {tool-call-parser: hermes}) and deploy again, or "
             "ask without --tools", code=2)  # fmt: skip
    target = sdk.serve_target(cfg, target)
    messages = messages_for(question, reasoning_language, system)
    try:
        extra: dict[str, Any] = {"tools": read_tools(tools) if tools else None, "reasoning_effort": reasoning_effort}
        client = sdk.chat_client(cfg, target, url)
        if wait and (url or target == "local"):
            with status("waiting for the server ..."):
                wait_for(url or f"http://127.0.0.1:{cfg.serving.local_port}", wait)
        if as_json:  # the whole reply at once: content, reasoning, tool_calls, finish_reason, usage, model
            reply = client.chat(messages, max_tokens, temperature, **extra)
            emit_json(reply)
        elif not stream:
            reply = client.chat(messages, max_tokens, temperature, **extra)
            if before_markup(reply.reasoning):  # model text is never read as rich markup
                err.print("[dim]reasoning:[/] ", end="")
                err.print(before_markup(reply.reasoning), highlight=False, markup=False)
            for line in show_tool_calls(reply.tool_calls):
                out.print(line, highlight=False, markup=False)
            if before_markup(reply.content) or not reply.tool_calls:
                out.print("[dim]answer:[/] ", end="")
                out.print(before_markup(reply.content), highlight=False, markup=False)
        else:  # the SDK puts the deltas together and says what to show; tool calls come whole at the end
            streamed = client.stream_reply(messages, max_tokens, temperature, **extra)
            last = None
            for piece in streamed:
                console = err if piece.kind == "reasoning" else out
                if piece.opens:
                    label = "reasoning: " if piece.kind == "reasoning" else "\nanswer: "
                    console.print(f"[dim]{label}[/]", end="")
                console.print(piece.text, end="", highlight=False, markup=False)
                last = piece.kind
            if last == "reasoning":  # no answer came: end the reasoning's line before any note
                err.print()
            out.print()
            reply = streamed.reply()
            for line in show_tool_calls(reply.tool_calls):
                out.print(line, highlight=False, markup=False)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    ended_early = cut_off(reply.finish_reason, max_tokens)
    harmony = cfg.model.family.chat_format == "harmony"
    notes = (markup_note(reply, harmony), None if check else ended_early)  # --check says a cut-off as its error
    for said in notes if not as_json else ():  # the JSON carries both itself
        if said:
            err.print(said, style="yellow", highlight=False, markup=False)
    problems = reply_problems(reply, harmony=harmony, reasoning=cfg.writes_reasoning) if check else []
    if check and ended_early:
        problems.insert(0, f"was {ended_early}")
    if problems:
        fail("the reply " + "; ".join(problems), code=1)

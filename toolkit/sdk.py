"""The public Python API. The CLI is a thin layer over these calls; CI scripts call them directly.

Nothing here parses flags or prints tables: results come back as values, failures as exceptions
(`ConfigError`, `DataError`, `TargetError`).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolkit import errors
from toolkit.config import Config, load_config
from toolkit.config.loader import validate
from toolkit.config.targets import run_home
from toolkit.deploy.client import (
    ChatReply,
    before_markup,
    cut_off,
    markup_note,
    messages_for,
    read_tools,
    reply_problems,
    show_tool_calls,
    wait_for,
)
from toolkit.errors import BadInput
from toolkit.infra import ExportRole
from toolkit.limits import parse_price_overrides
from toolkit.targets.base import Job, JobDetached, JobInterrupted, Run, Target, get_target

# The chat vocabulary (a reply, the messages of a question, what is wrong with a reply, waiting for a server) and
# the stack's export role are part of the SDK: the CLI and CI scripts use them from here, never from below.
__all__ = [
    "ChatReply",
    "ExportRole",
    "JobDetached",
    "JobInterrupted",
    "before_markup",
    "cut_off",
    "markup_note",
    "messages_for",
    "parse_price_overrides",
    "read_tools",
    "reply_problems",
    "show_tool_calls",
    "wait_for",
]

if TYPE_CHECKING:
    from toolkit.config.models import AwsSettings
    from toolkit.deploy.client import ChatClient
    from toolkit.deploy.endpoint import Endpoints, EndpointState, Package, Request
    from toolkit.deploy.local import LocalServer
    from toolkit.infra import Plan
    from toolkit.plan import Plan as RunPlan
    from toolkit.registry import Registration


@dataclass
class JobSummary:
    """One row of `list_jobs`."""

    name: str
    status: str
    created: str  # ISO 8601


@dataclass
class EndpointSummary:
    """One row of `list_endpoints`."""

    name: str
    status: str
    modified: str  # ISO 8601


def _iso(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _as_config(config: Config | str | Path, overrides: Sequence[str] = (), target: str | None = None) -> Config:
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    if target is not None and target != cfg.target:  # re-validate: targets have rules of their own
        cfg = validate({**cfg.model_dump(), "target": target}, f"{cfg.name} with target {target}")
    return cfg


def _target(cfg: Config, name: str | None = None) -> Target:
    """The target a command runs on (default: the config's), once the extras it needs are known to be installed."""
    chosen = get_target(name or cfg.target)
    for extra in chosen.extras:
        errors.require_extra(extra, f"target {name or cfg.target}")
    return chosen


def prepare_data(
    config: Config | str | Path, output: str | Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Load, validate, render and tokenize the config's data once; save it as a sealed Arrow dataset.

    Returns the token statistics and where the dataset went: a directory (written beside it and renamed into place
    once complete: a kill leaves the previous dataset or the new one), or an s3:// prefix (uploaded with the
    config's AWS settings). Point `data.source` at it to train on it without re-tokenizing.
    """
    import tempfile

    from toolkit_train.data import PrepareReport, chat_format_of, load_rows, prepare
    from toolkit_train.run import prepared
    from toolkit_train.run.model import load_tokenizer

    from toolkit import aws

    cfg = _as_config(config, overrides)
    destination = str(output) if output is not None else str(run_home(cfg.name) / "prepared")
    if not destination.strip() or (destination.startswith("s3:") and not destination.startswith("s3://")):
        raise errors.CannotWrite(f"--output: {destination!r} is neither a directory nor an s3:// URI: name one")
    require_trainable(cfg)
    report = PrepareReport()
    tokenizer = _tokenizer(cfg, load_tokenizer)
    prepared.check(Path(cfg.data.source), cfg.data, cfg.model)  # a prepared source: complete, of these settings
    rows = load_rows(cfg.data.source, cfg.data.split)
    chat_format = chat_format_of(cfg.model)  # the family's (toolkit_train/families/formats.py)
    dataset = prepare(rows, tokenizer, cfg.data, report, chat_format)  # every row: training holds data.eval's out
    summary = {**report.summary(), **_held_out_apart(cfg, rows, tokenizer, report)}
    made = prepared.record(cfg.data.source, cfg.data.split, cfg.data, cfg.model, summary)
    try:
        if destination.startswith("s3://"):
            with tempfile.TemporaryDirectory(prefix="toolkit-prepared-") as staging:
                prepared.save(dataset, Path(staging) / "dataset", made)
                bucket, _, prefix = destination[len("s3://") :].partition("/")
                aws.upload_tree(aws.client(cfg.aws, "s3"), Path(staging) / "dataset", bucket, prefix)
        else:
            prepared.save(dataset, Path(destination), made)
    except OSError as exc:
        raise errors.unwritable(exc, destination, "--output") from None
    return {"output": destination, **summary, "bad_rows": report.bad_rows}


def require_trainable(cfg: Config) -> None:
    """Training renders conversations in the family's chat format (toolkit_train/families/formats.py): a model rendered
    through its own chat template whose files here ship none (a base model, not a chat one) is refused before
    anything is read or launched. A model not on this machine is checked where its tokenizer loads."""
    from toolkit_train.families import has_chat_template

    family = cfg.model.known_family
    if family is not None and family.chat_format == "template" and has_chat_template(cfg.model.id) is False:
        raise errors.BadInput(
            f"model.id {cfg.model.id}: its tokenizer has no chat template, and training renders conversations with "
            "the model's own template (a base model rather than its instruct/chat variant?): use a chat model, or "
            "add a chat_template to its tokenizer_config.json"
        )


def trained_rendering(cfg: Config) -> tuple[Any, Any] | None:
    """How training rendered the model's conversations, for the served-prompt check (toolkit/deploy/parity.py): its
    family's chat format and the tokenizer a chat template renders with (harmony needs none); None for a causal LM of
    no family (an adapter trained elsewhere: no trained prompt to compare with). Read before any server starts, so
    that a tokenizer that cannot be loaded stops there in one line."""
    from toolkit_train.families.formats import rendering
    from toolkit_train.run.model import load_tokenizer

    return rendering(cfg.model.family, lambda: _tokenizer(cfg, load_tokenizer))


def _tokenizer(cfg: Config, load: Callable[[Any], Any]) -> Any:
    """The model's tokenizer, or one line saying why it cannot be read (a hub id not cached, the hub unreachable)."""
    try:
        return load(cfg.model)
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise errors.BadInput(
            f"model.id {cfg.model.id}: its tokenizer cannot be loaded here ({reason}): download the model "
            "(`hf download`, or set HF_HOME to a cache that has it) or point model.id at a local checkpoint directory"
        ) from None


def _held_out_apart(cfg: Config, rows: Any, tokenizer: Any, report: Any) -> dict[str, int]:
    """With data.eval.fraction, the rows and tokens training will hold out and the tokens it trains on (what
    `toolkit plan` counts), apart from the whole source's."""
    from toolkit_train.data import PrepareReport, chat_format_of, prepare, split_rows

    if cfg.data.eval is None or cfg.data.eval.fraction is None:
        return {}
    held = PrepareReport()
    prepare(split_rows(rows, cfg.data)[1], tokenizer, cfg.data, held, chat_format_of(cfg.model))
    tokens = held.summary()["tokens"]
    return {"held_out_rows": held.summary()["rows_out"], "held_out_tokens": tokens,
            "training_tokens": report.summary()["tokens"] - tokens}  # fmt: skip


def train(
    config: Config | str | Path,
    target: str | None = None,
    overrides: Sequence[str] = (),
    fresh: bool = False,
    preflight: bool = True,
    on_note: Callable[[str], None] | None = None,
) -> Job:
    """Submit training to a target (default: the config's `target`); returns a job handle.

    A target whose jobs launch instances (a training job) first checks the account's Service Quota for them
    (`QuotaError`, nothing submitted, when it is below the instance count) and prices them; `on_note` gets that one
    line. `preflight=False` skips both. Call `job.wait()` to block until it ends; `job.stop()` checkpoints and
    stops it.
    """
    cfg = _as_config(config, overrides, target)
    chosen = _target(cfg)
    _before_launch(cfg)
    if preflight:
        chosen.preflight(cfg, on_note)
    return chosen.submit(cfg, fresh=fresh)


def plan(
    config: Config | str | Path,
    target: str | None = None,
    overrides: Sequence[str] = (),
    tokens: int | None = None,
    prices: dict[str, float] | None = None,
    online: bool = True,
    all_types: bool = False,
) -> RunPlan:
    """Before a run: per candidate (the configured target first, then the training-job instance types and
    HyperPod node counts that fit) whether it fits in GPU memory, expected tokens/s and wall-clock, on-demand
    cost and the spot range, and the account's Service Quota for it. Every figure names its source; `online=False`
    reads the shipped price file and checks no quota. `prices`: USD per instance-hour by type ("*": all)."""
    from toolkit.plan import plan as make_plan

    return make_plan(_as_config(config, overrides, target), tokens, prices, online, all_types)


def render_train(config: Config | str | Path, target: str | None = None, overrides: Sequence[str] = ()) -> str:
    """What `train` would submit (the dry run): nothing is created or launched; every check `train` makes before
    it launches (but the quota and price preflight, which asks AWS) refuses here alike."""
    cfg = _as_config(config, overrides, target)
    chosen = _target(cfg)
    _before_launch(cfg)
    return chosen.render(cfg)


def _before_launch(cfg: Config, only_what_is_here: bool = False) -> None:
    """The checks `train` and its dry run make before anything launches: the model can be rendered, and a prepared
    dataset here can train with these settings (complete, sealed with the same data settings and tokenizer).
    only_what_is_here (`toolkit config validate`): no tiny model built and no hub tokenizer read for them."""
    from toolkit_train.run import prepared

    require_trainable(cfg)
    remote = cfg.data.source.startswith(("s3://", "fsx://"))
    # a prepared dataset that cannot train, or rows the model's template cannot render: nothing launched
    if not remote and prepared.check(Path(cfg.data.source), cfg.data, cfg.model) is None:
        _first_rows_render(cfg, only_what_is_here)


def check(config: Config | str | Path, overrides: Sequence[str] = ()) -> Config:
    """`toolkit config validate`: the config, checked as `train` checks it before launch (the schema, the model's
    chat template, a prepared dataset's seal, the first rows rendered as the job will where the model's tokenizer is
    on this machine), building and downloading nothing. Raises BadInput naming what is wrong."""
    cfg = _as_config(config, overrides)
    _before_launch(cfg, only_what_is_here=True)
    return cfg


FIRST_ROWS = 32  # training rows rendered before launch: a template's whole-dataset refusals show on any of them


def _first_rows_render(cfg: Config, only_what_is_here: bool = False) -> None:
    """A model rendered through its own chat template, whose tokenizer is on this machine (a builtin, a checkpoint
    directory) with data here (a bundled sample, a local file): its first training rows are rendered as the job
    will, so that what the template cannot render (reasoning it has no field for, tools it does not read, roles it
    refuses, pairs left alike) is refused in one line before anything launches, in the dry run too. A hub model or
    remote data is checked where the job runs (a dry run reaches no network)."""
    if importlib.util.find_spec("transformers") is None:  # `pip install .` without the train extra: the job checks
        return
    from toolkit_train.builtin.tiny_model import NotBuilt, without_building
    from toolkit_train.data import (
        SAMPLE_PATH,
        DataError,
        PrepareReport,
        chat_format_of,
        data_files,
        prepare,
        prompt_dataset,
        read_json_rows,
        take,
    )
    from toolkit_train.run.model import load_tokenizer
    from toolkit_train.settings import BUILTIN_MODELS, SAMPLES

    family, source = cfg.model.known_family, cfg.data.source
    local = get_target(cfg.target).model_is_here and not only_what_is_here  # the run happens on this machine
    if family is None or family.chat_format != "template":
        return
    # a local run reads a hub model's tokenizer now, as its job would (offline and not cached: one line here)
    model_here = cfg.model.id in BUILTIN_MODELS or (cfg.model.is_path and Path(cfg.model.id).expanduser().is_dir())
    if not (model_here or local):
        return
    try:  # a tiny builtin not built yet is built here only for a local run, which builds it anyway
        with contextlib.nullcontext() if local else without_building():
            tokenizer = _tokenizer(cfg, load_tokenizer)
    except NotBuilt:
        return
    path = Path(source).expanduser()
    if source in SAMPLES:
        files = [SAMPLE_PATH.parent / SAMPLES[source]]
    else:
        files = ([path] if path.is_file() else data_files(path)) if "://" not in source and path.exists() else []
    files = [file for file in files if file.suffix in (".jsonl", ".json")]  # parquet: read through datasets' cache
    if not files:
        return
    rows = read_json_rows(source, files)
    first = take(rows, list(range(min(FIRST_ROWS, len(rows)))))
    try:
        if cfg.training.method_record.samples:  # GRPO: prompts, rendered as requests
            prompt_dataset(first, tokenizer, cfg.data, PrepareReport(), chat_format_of(cfg.model))
        else:
            prepare(first, tokenizer, cfg.data, chat_format=chat_format_of(cfg.model))
    except DataError as exc:
        raise errors.BadInput(
            f"data.source {source} (its first {len(first)} rows, rendered as the job will): {exc}"
        ) from None


def _image(cfg: Config, image_uri: str | None, on_progress=None, dry_run: bool = False) -> str:
    from toolkit.deploy.image import ensure_image

    return image_uri or cfg.serving.image_uri or ensure_image(cfg, on_progress, dry_run=dry_run)


def build_image(
    config: Config | str | Path,
    on_progress=None,
    overrides: Sequence[str] = (),
    kind: Literal["serving", "training"] = "serving",
    dry_run: bool = False,
) -> str:
    """Build containers/serving or containers/training and push it to ECR (skipped when the registry has this
    content's tag); returns the image URI. dry_run: the URI only, nothing built."""
    from toolkit.deploy.image import ensure_image

    return ensure_image(_as_config(config, overrides), on_progress, dry_run=dry_run, kind=kind)


def job(config: Config | str | Path, name: str, target: str | None = None, overrides: Sequence[str] = ()) -> Job:
    """A handle on a job started earlier (from any machine): `status()`, `logs()`, `stop()`, `wait()`.

    Raises `TargetError` ("no such job") when the target does not know it.
    """
    cfg = _as_config(config, overrides)
    return _target(cfg, target).attach(cfg, name)


def job_status(config: Config | str | Path, name: str, target: str | None = None) -> Run:
    """The state of a job started earlier: status, detail (failure reason) and artifacts."""
    return job(config, name, target).status()


def list_jobs(config: Config | str | Path, target: str | None = None) -> list[JobSummary]:
    """Recent jobs of a target that keeps a list (training-job), newest first; `TargetError` for one that does not."""
    from toolkit.targets.base import TargetError

    cfg = _as_config(config)
    chosen = _target(cfg, target)
    if not hasattr(chosen, "list"):
        raise TargetError(f"target {chosen.name} keeps no job list; its jobs are directories (local.output_dir)")
    return [JobSummary(job["TrainingJobName"], job["TrainingJobStatus"], _iso(job["CreationTime"]))
            for job in chosen.list(cfg)]  # fmt: skip


def list_endpoints(config: Config | str | Path, overrides: Sequence[str] = ()) -> list[EndpointSummary]:
    """The endpoints in the config's account and region, newest first."""
    return [EndpointSummary(e["EndpointName"], e["EndpointStatus"], _iso(e["LastModifiedTime"]))
            for e in endpoints(config, overrides).list_endpoints()]  # fmt: skip


def infra_plan(settings: AwsSettings, stack: str, parameters: dict[str, str]) -> Plan:
    """What `infra_apply` would change in the stack (a change set for an existing stack, else every resource)."""
    from toolkit import infra

    return infra.plan(settings, stack, parameters)


def infra_apply(settings: AwsSettings, planned: Plan, on_event: Callable[[str], None] | None = None) -> dict[str, str]:
    """Create or update the stack as planned and wait; returns its outputs (aws.role, aws.bucket, ...)."""
    from toolkit import infra

    return infra.apply(settings, planned, on_event or (lambda _: None))


def infra_parameters(
    settings: AwsSettings,
    name_prefix: str,
    kms: bool,
    hf_token_secret: str,
    data_buckets: list[str],
    vpc: bool,
    mlflow_tracking_server: str,
    export: ExportRole,
) -> dict[str, str]:
    """The stack's parameters for these choices (validated: bucket names, ARNs)."""
    from toolkit import infra

    return infra.parameters(settings, name_prefix, kms, hf_token_secret, data_buckets, vpc, mlflow_tracking_server,
                            export)  # fmt: skip


def infra_config_overlay(base: str, values: dict[str, str], region: str) -> str:
    """A config file's text that takes `base` and fills the AWS fields from the stack outputs."""
    from toolkit import infra

    return infra.config_overlay(base, values, region)


def infra_outputs(settings: AwsSettings, stack: str = "toolkit") -> dict[str, str]:
    from toolkit import infra

    return infra.outputs(settings, stack)


def infra_destroy(
    settings: AwsSettings, stack: str = "toolkit", force: bool = False, on_event: Callable[[str], None] | None = None
) -> None:
    """Delete the stack; refuses while its bucket holds data unless `force`."""
    from toolkit import infra

    infra.destroy(settings, stack, force, on_event or (lambda _: None))


def render_deploy(
    config: Config | str | Path,
    image_uri: str | None = None,
    model_data: str | None = None,
    overrides: Sequence[str] = (),
    model_package: str | None = None,
    allow_unapproved: bool = False,
) -> list[Request]:
    """Every request `deploy` would make, given what exists now (the dry run: reads only, creates nothing)."""
    from toolkit.deploy import endpoint
    from toolkit.deploy.serving_endpoint import for_config

    cfg = _as_config(config, overrides)
    if model_package is not None:  # refused as deploy refuses it (UnapprovedModel) when it is not Approved
        endpoints, package = endpoint.for_package(cfg, model_package, allow_unapproved)
        planned = endpoints.requests(package.image, package.model_data)
        return [*planned, *(endpoints.autoscaling_requests() if planned else [])]
    endpoints = for_config(cfg)
    planned = endpoints.requests(_image(cfg, image_uri, dry_run=True), endpoint.model_data(cfg, model_data, True))
    return [*planned, *(endpoints.autoscaling_requests() if planned else [])]


def deploy(
    config: Config | str | Path,
    image_uri: str | None = None,
    model_data: str | None = None,
    on_status=None,
    overrides: Sequence[str] = (),
    poll_seconds: float = 30,
    model_package: str | None = None,
    allow_unapproved: bool = False,
) -> EndpointState:
    """Create or update the SageMaker endpoint (blue/green, rolled back on failure) and wait until it serves.

    The image is built and pushed unless given; the model is the latest completed training job's unless given.
    `model_package` (a version number of the config's Model Package Group, or an ARN): serve that registered
    version instead; one that is not Approved is refused (`UnapprovedModel`, nothing created) unless
    `allow_unapproved`. Raises `DeployError` when the endpoint does not serve the new model (the old one keeps
    serving). Once it serves, a gpt-oss model's prompt parity is checked through the endpoint (`prompt_drift`);
    on drift, `PromptDrift` (a new endpoint is deleted, an update rolled back to the config that served before).
    """
    from toolkit.deploy import endpoint, parity
    from toolkit.deploy.serving_endpoint import for_config

    cfg = _as_config(config, overrides)
    rendering = trained_rendering(cfg)

    def verify() -> None:
        assert rendering is not None
        (on_status or (lambda _: None))("checking that the endpoint renders prompts as training did")
        client = chat_client(cfg)
        parity.check(client.send, client.model, *rendering, date=cfg.data.conversation_date)

    check = verify if rendering is not None else None
    if model_package is not None:
        endpoints, package = endpoint.for_package(cfg, model_package, allow_unapproved)
        if package.note and on_status:
            on_status(package.note)
        return endpoints.deploy(package.image, package.model_data, on_status, poll_seconds=poll_seconds, verify=check)
    data = endpoint.model_data(cfg, model_data)
    image = _image(cfg, image_uri, on_status)
    return for_config(cfg).deploy(image, data, on_status, poll_seconds=poll_seconds, verify=check)


def registered_version(config: Config | str | Path, ref: str, allow_unapproved: bool = False) -> Package:
    """A version of the config's Model Package Group (its number or ARN) as `deploy(model_package=...)` serves it:
    `UnapprovedModel` when it is not Approved, unless `allow_unapproved` (then `note` says so)."""
    from toolkit.deploy.endpoint import for_package

    return for_package(_as_config(config), ref, allow_unapproved)[1]


def endpoints(config: Config | str | Path, overrides: Sequence[str] = ()) -> Endpoints:
    """The config's endpoint: `describe()`, `list_endpoints()`, `delete()` (with serving.weights: adapter also
    `components()`: the base and adapter inference components; `delete()` removes this config's adapter)."""
    from toolkit.deploy.serving_endpoint import for_config

    return for_config(_as_config(config, overrides))


def serve_local(
    config: Config | str | Path, model_dir: str | Path | None = None, port: int | None = None, overrides=()
) -> LocalServer:
    """Start the serving entry script with vLLM on this machine on the local training output; returns the
    server (`url`, `wait_ready()`, `stop()`; a context manager)."""
    from toolkit.deploy.local import LocalServer
    from toolkit.deploy.local import model_dir as local_model_dir

    cfg = _as_config(config, overrides)
    return LocalServer(cfg, local_model_dir(cfg, model_dir), port).start()


def render_serve_local(
    config: Config | str | Path, model_dir: str | Path | None = None, port: int | None = None, overrides=()
) -> dict[str, Any]:
    """What `serve_local` would start (the dry run): the command, its settings, the URL; nothing is started."""
    from toolkit.deploy.local import LocalServer, configured_python, has_vllm
    from toolkit.deploy.local import model_dir as local_model_dir

    cfg = _as_config(config, overrides)
    server = LocalServer(cfg, local_model_dir(cfg, model_dir), port)
    plan = server.plan()
    return {**plan, "vllm_command": server.vllm_command(plan["environment"]),
            "vllm_installed": has_vllm(configured_python(cfg))}  # fmt: skip


def serve_target(config: Config, target: str | None = None) -> Literal["endpoint", "local"]:
    """Where deploy and invoke go when not told: this machine for a config whose training target is local (its model
    is here), else the config's SageMaker endpoint."""
    if target is None:
        return "local" if get_target(config.target).model_is_here else "endpoint"
    if target not in ("endpoint", "local"):
        raise BadInput(f"target {target!r}: serve on 'endpoint' (SageMaker) or 'local' (vLLM on this machine)")
    return "local" if target == "local" else "endpoint"


def chat_client(
    config: Config | str | Path, target: str = "endpoint", url: str | None = None, overrides=()
) -> ChatClient:
    """A chat client for the config's endpoint (`target="endpoint"`) or a local server (`"local"` or `url`)."""
    from toolkit import aws
    from toolkit.deploy import ADAPTER_NAME, served_name
    from toolkit.deploy.client import ChatClient
    from toolkit.deploy.endpoint import endpoint_name

    cfg = _as_config(config, overrides)
    if url or target == "local":
        local = url or f"http://127.0.0.1:{cfg.serving.local_port}"
        # the server must serve this config's model (its base under the config's name): another config's server
        # would answer in its place
        if cfg.serving.weights == "adapter":  # the base model plus the adapter: address the adapter
            return ChatClient.for_url(local, ADAPTER_NAME, adapter=True, serves=served_name(cfg))
        return ChatClient.for_url(local, cfg.name, serves=served_name(cfg))
    runtime = aws.client(cfg.aws, "sagemaker-runtime")
    if cfg.serving.weights == "adapter":  # the adapter's inference component, picked by name on the shared endpoint
        from toolkit.deploy.adapters import adapter_component_name

        component = adapter_component_name(cfg)
        return ChatClient.for_endpoint(endpoint_name(cfg), runtime, component, component=component)
    return ChatClient.for_endpoint(endpoint_name(cfg), runtime, cfg.name)


def register(
    config: Config | str | Path,
    job_name: str | None = None,
    image_uri: str | None = None,
    approve: bool = False,
    overrides: Sequence[str] = (),
    report: str | Path | None = None,
) -> Registration:
    """Record a completed run's model in the config's Model Package Group, with its eval report (`report`,
    default runs/<name>/eval/report.json when there is one) attached and the approval status from `registry.gate`:
    passes -> Approved, fails -> Rejected, no report -> PendingManualApproval; `approve` is the manual override. A
    report that scored another model is refused (`ReportError`). The run is the one the config's target finds: the
    newest completed training job (or `job_name`) for a local or training-job config, the newest HyperPod run (its
    model brought to S3 once) for a HyperPod config; `NothingToRegister` (exit 2) says why when there is none."""
    from toolkit.registry import register as register_model

    cfg = _as_config(config, overrides)
    return register_model(cfg, _image(cfg, image_uri), job_name, approve, report)


def evaluate(
    config: Config | str | Path,
    target: str = "local",
    model_dir: str | Path | None = None,
    limit: int | None = None,
    max_tokens: int = 256,
    concurrency: int = 4,
    on_row: Callable[[str, Any, int], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    overrides: Sequence[str] = (),
    candidate_endpoint: str | None = None,
    tasks: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """Generate on the held-out rows (data.eval) with a baseline and the fine-tuned model and score both; for a
    preference-tuned run (training.method dpo), score the held-out pairs instead: per pair whether each model finds
    the chosen reply more likely than the rejected one (preference_accuracy) and by how much (local only).

    `target="local"`: vLLM on this machine serves the base and the fine-tuned model in turn (toolkit/evaluate). The
    fine-tuned model: `model_dir`, else the newest completed run of the config's target, fetched by the target
    when it is elsewhere (a training job's model from S3, once, into runs/<name>/models/<job>/).
    `target="endpoint"`: through SageMaker: the baseline is what the config's endpoint serves now, the candidate
    what `candidate_endpoint` serves. Writes runs/<name>/eval/ (report.json, report.md, metrics.png, loss.png) and
    returns the report with `written` (those paths). `tasks` ("a,b" or a list, local only): lm-evaluation-harness
    tasks run against each server too (report["benchmarks"]); a name the harness does not know raises
    EvalInputError before any server starts.
    """
    from toolkit.evaluate.flow import evaluate as evaluate_run

    cfg = _as_config(config, overrides)
    require_trainable(cfg)  # the held-out rows (and a DPO run's pairs) are what training rendered and held out
    return evaluate_run(cfg, target, model_dir, limit, max_tokens, concurrency, on_row, on_status,
                        candidate_endpoint, tasks)  # fmt: skip


def download_model(config: Config | str | Path, model_uri: str, destination: str | Path | None = None) -> Path:
    """A trained model's S3 prefix (a training job's `artifacts["model"]`: adapter/, merged/, run.json) into a
    directory (default runs/<name>/models/<digest of the URI>/), e.g. to `evaluate(model_dir=...)` it."""
    from toolkit import aws, digest

    cfg = _as_config(config)
    if not model_uri.startswith("s3://") or not model_uri.endswith("/"):
        raise aws.AwsError(f"{model_uri!r}: give the model's S3 prefix (s3://.../output/model/), not an archive")
    target = Path(destination) if destination else run_home(cfg.name) / "models" / digest.of_value(model_uri)
    return aws.download_tree(aws.client(cfg.aws, "s3"), model_uri, target)


def evaluation_table(report: dict[str, Any]) -> str:
    """An evaluation report (`evaluate`'s result) as the Markdown table report.md holds."""
    from toolkit.evaluate.report import markdown

    return markdown(report, report.get("validation"))


def prompt_drift(config: Config | str | Path, url: str | None = None, target: str = "local") -> list[str]:
    """Where the served model's prompts differ from training's for the parity corpus (tools, multi-turn, reasoning,
    each effort, developer prompt present and absent), in the model family's chat format; [] when they agree, or
    when the model is of no family training renders (toolkit/deploy/parity.py)."""
    cfg = _as_config(config)
    rendering = trained_rendering(cfg)
    return [] if rendering is None else _drift(cfg, rendering, url, target)


def _drift(cfg: Config, rendering: tuple[Any, Any], url: str | None, target: str = "local") -> list[str]:
    from toolkit.deploy.parity import drift

    client = chat_client(cfg, target, url)
    return drift(client.send, client.model, *rendering, date=cfg.data.conversation_date)


def serve_local_until_stopped(
    config: Config | str | Path,
    model_dir: str | Path | None = None,
    port: int | None = None,
    overrides: Sequence[str] = (),
    phase: Callable[[str], Any] | None = None,
    on_note: Callable[[str], None] | None = None,
    on_serving: Callable[[LocalServer], None] | None = None,
) -> None:
    """`toolkit deploy --target local`: `serve_local`'s server for its whole life, in the foreground. Starts it,
    waits until it answers, refuses a served prompt that is not training's (`prompt_drift`: the server is stopped,
    `PromptDrift`, exit 1) and replies its parsers do not split as the model writes them (a chat-template family's
    parse probe, toolkit/deploy/probe.py: `ParsedWrong`, exit 1, naming the serving.vllm_args to set), calls
    `on_serving(server)` and serves until interrupted (KeyboardInterrupt: stopped, returns). A server that dies is
    stopped and raises `DeployError` naming how it ended and why; an interrupt before it serves stops it and goes
    on. `phase(what)`: a context manager around each wait (a status display)
    that yields a callback for progress lines; `on_note`: what starting did besides starting (LocalServer.serve)."""
    from toolkit.deploy.local import LocalServer, quietly
    from toolkit.deploy.local import model_dir as local_model_dir

    cfg = _as_config(config, overrides)
    served = local_model_dir(
        cfg, model_dir
    )  # no trained model: said at once, before a tokenizer (a tiny base) is built
    rendering = trained_rendering(cfg)  # before vLLM starts: a tokenizer that cannot be loaded is said first
    server = LocalServer(cfg, served, port)
    drift = None if rendering is None else lambda url: _drift(cfg, rendering, url)
    server.serve(drift, phase or quietly, on_note, on_serving, probe=_parse_probe(cfg))


def _parse_probe(cfg: Config) -> Callable[[str], None] | None:
    """Deploy's parse probe for the config's model (toolkit/deploy/probe.py); None for harmony, whose parsers are
    gpt-oss's own."""
    from toolkit.deploy import probe

    if cfg.model.family.chat_format == "harmony":
        return None

    def check(url: str) -> None:
        client = chat_client(cfg, "local", url)
        probe.check(client.send, client.model, tools=cfg.served_parser("tool-call-parser") is not None)

    return check

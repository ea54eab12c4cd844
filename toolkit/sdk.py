"""The public Python API. The CLI is a thin layer over these calls; CI scripts call them directly.

Nothing here parses flags or prints tables: results come back as values, failures as exceptions
(`ConfigError`, `DataError`, `TargetError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolkit.config import Config, load_config
from toolkit.config.loader import validate
from toolkit.targets.base import Job, JobState, get_target

if TYPE_CHECKING:
    from toolkit.config.models import AwsSettings
    from toolkit.deploy.client import ChatClient
    from toolkit.deploy.endpoint import Endpoints, EndpointState, Request
    from toolkit.deploy.local import LocalServer
    from toolkit.deploy.registry import Registration
    from toolkit.infra import Plan


def _as_config(config: Config | str | Path, overrides: Sequence[str] = (), target: str | None = None) -> Config:
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    if target is not None and target != cfg.target:  # re-validate: targets have rules of their own
        cfg = validate({**cfg.model_dump(), "target": target}, f"{cfg.name} with target {target}")
    return cfg


def prepare_data(
    config: Config | str | Path, output: str | Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Load, validate, render and tokenize the config's data once; save it as an Arrow dataset.

    Returns the token statistics and where the dataset went: a directory, or an s3:// prefix (uploaded with
    the config's AWS settings). Point `data.source` at it to train on it without re-tokenizing.
    """
    import tempfile

    from toolkit import aws
    from toolkit.entrypoints.data import PrepareReport, load_rows, prepare
    from toolkit.entrypoints.model import load_tokenizer

    cfg = _as_config(config, overrides)
    destination = str(output) if output else str(Path("runs") / cfg.name / "prepared")
    report = PrepareReport()
    tokenizer = load_tokenizer(cfg.model)
    dataset = prepare(load_rows(cfg.data.source, cfg.data.split), tokenizer, cfg.data, report)
    if destination.startswith("s3://"):
        with tempfile.TemporaryDirectory(prefix="toolkit-prepared-") as staging:
            dataset.save_to_disk(staging)
            bucket, _, prefix = destination[len("s3://") :].partition("/")
            aws.upload_tree(aws.client(cfg.aws, "s3"), Path(staging), bucket, prefix)
    else:
        dataset.save_to_disk(destination)
    return {"output": destination, **report.summary(), "bad_rows": report.bad_rows}


def train(
    config: Config | str | Path,
    target: str | None = None,
    overrides: Sequence[str] = (),
    fresh: bool = False,
) -> Job:
    """Submit training to a target (default: the config's `target`); returns a job handle.

    Call `job.wait()` to block until it ends; `job.stop()` checkpoints and stops it.
    """
    cfg = _as_config(config, overrides, target)
    return get_target(cfg.target).submit(cfg, fresh=fresh)


def render_train(config: Config | str | Path, target: str | None = None, overrides: Sequence[str] = ()) -> str:
    """What `train` would submit (the dry run): nothing is created or launched."""
    cfg = _as_config(config, overrides, target)
    return get_target(cfg.target).render(cfg)


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
    return get_target(target or cfg.target).attach(cfg, name)


def job_status(config: Config | str | Path, name: str, target: str | None = None) -> JobState:
    """The state of a job started earlier: status, detail (failure reason) and artifacts."""
    return job(config, name, target).status()


def list_jobs(config: Config | str | Path, target: str | None = None) -> list[dict[str, Any]]:
    """Recent jobs of a target that keeps a list (training-job); `TargetError` for one that does not."""
    from toolkit.targets.base import TargetError

    cfg = _as_config(config)
    chosen = get_target(target or cfg.target)
    if not hasattr(chosen, "list"):
        raise TargetError(f"target {chosen.name} keeps no job list; its jobs are directories (local.output_dir)")
    return chosen.list(cfg)


def infra_plan(settings: AwsSettings, stack: str, parameters: dict[str, str]) -> Plan:
    """What `infra_apply` would change in the stack (a change set for an existing stack, else every resource)."""
    from toolkit import infra

    return infra.plan(settings, stack, parameters)


def infra_apply(settings: AwsSettings, planned: Plan, on_event: Callable[[str], None] | None = None) -> dict[str, str]:
    """Create or update the stack as planned and wait; returns its outputs (aws.role, aws.bucket, ...)."""
    from toolkit import infra

    return infra.apply(settings, planned, on_event or (lambda _: None))


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
) -> list[Request]:
    """Every request `deploy` would make, given what exists now (the dry run: reads only, creates nothing)."""
    from toolkit.deploy import endpoint

    cfg = _as_config(config, overrides)
    endpoints = endpoint.for_config(cfg)
    planned = endpoints.requests(_image(cfg, image_uri, dry_run=True), endpoint.model_data(cfg, model_data, True))
    return [*planned, *(endpoints.autoscaling_requests() if planned else [])]


def deploy(
    config: Config | str | Path,
    image_uri: str | None = None,
    model_data: str | None = None,
    on_status=None,
    overrides: Sequence[str] = (),
    poll_seconds: float = 30,
) -> EndpointState:
    """Create or update the SageMaker endpoint (blue/green, rolled back on failure) and wait until it serves.

    The image is built and pushed unless given; the model is the latest completed training job's unless given.
    Raises `DeployError` when the endpoint does not serve the new model (the old one keeps serving).
    """
    from toolkit.deploy import endpoint

    cfg = _as_config(config, overrides)
    data = endpoint.model_data(cfg, model_data)
    image = _image(cfg, image_uri, on_status)
    return endpoint.for_config(cfg).deploy(image, data, on_status, poll_seconds=poll_seconds)


def endpoints(config: Config | str | Path, overrides: Sequence[str] = ()) -> Endpoints:
    """The config's endpoint: `describe()`, `list_endpoints()`, `delete()` (with serving.weights: adapter also
    `components()`: the base and adapter inference components; `delete()` removes this config's adapter)."""
    from toolkit.deploy.endpoint import for_config

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
    plan = LocalServer(cfg, local_model_dir(cfg, model_dir), port).plan()
    return {**plan, "vllm_installed": has_vllm(configured_python(cfg))}


def chat_client(
    config: Config | str | Path, target: str = "endpoint", url: str | None = None, overrides=()
) -> ChatClient:
    """A chat client for the config's endpoint (`target="endpoint"`) or a local server (`"local"` or `url`)."""
    from toolkit import aws
    from toolkit.deploy import ADAPTER_NAME
    from toolkit.deploy.client import ChatClient
    from toolkit.deploy.endpoint import endpoint_name

    cfg = _as_config(config, overrides)
    if url or target == "local":
        local = url or f"http://127.0.0.1:{cfg.serving.local_port}"
        if cfg.serving.weights == "adapter":  # the base model plus the adapter: address the adapter
            return ChatClient.for_url(local, ADAPTER_NAME, adapter=True)
        return ChatClient.for_url(local, cfg.name)
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
) -> Registration:
    """Record a completed training job's model in the config's Model Package Group."""
    from toolkit.deploy.registry import register as register_model

    cfg = _as_config(config, overrides)
    return register_model(cfg, _image(cfg, image_uri), job_name, approve)

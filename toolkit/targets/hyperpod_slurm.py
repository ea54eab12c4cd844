"""HyperPod on Slurm: an sbatch script that runs the entrypoint under torchrun on every node.

Submitted with `sbatch` from the head node (or any node that mounts the shared filesystem), followed
with squeue/scontrol and the job's output file, cancelled with scancel (the entrypoint checkpoints on
SIGTERM). On HyperPod's Slurm, `srun --auto-resume=1` replaces a failed node and restarts in place; elsewhere
`--requeue` lets Slurm restart the job. Either way the entrypoint resumes from its newest checkpoint in the job
directory. The script carries the recipes launcher's settings: whole nodes with all their memory, the EFA/NCCL
environment on EFA instances, and a step that installs the locked training stack on every node.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from toolkit_train.layout import ML_ROOT_ENV, RunTree
from toolkit_train.settings import TORCHRUN_SHUTDOWN_ENV

from toolkit.config import Config
from toolkit.config.instances import instance
from toolkit.resources import ENTRY_SCRIPT
from toolkit.targets.base import (
    Job,
    Run,
    Status,
    Target,
    TargetError,
    TargetFailed,
    complete_lines,
    tail,
)
from toolkit.targets.hyperpod import job_dir, stage
from toolkit.targets.jobtree import completed_run, upload_run_model

RENDEZVOUS_PORT = 29500
DRY_RUN_NOTE = (
    "# dry run (no cluster asked): written for plain Slurm (--requeue, not HyperPod's srun --auto-resume), GPU request "
    "kept; the submit asks the cluster for both"
)
QUERY_RETRIES = 5  # consecutive failed scontrol queries a wait rides out before giving up
STATES = {
    "PENDING": Status.PENDING,
    "CONFIGURING": Status.PENDING,
    "RUNNING": Status.RUNNING,
    "COMPLETING": Status.RUNNING,
    "COMPLETED": Status.COMPLETED,
    "FAILED": Status.FAILED,
    "NODE_FAIL": Status.FAILED,
    "OUT_OF_MEMORY": Status.FAILED,
    "TIMEOUT": Status.FAILED,
    "CANCELLED": Status.STOPPED,
    "PREEMPTED": Status.STOPPED,
    "REQUEUED": Status.PENDING,
}


class SlurmQueryError(TargetError):
    """scontrol could not answer (controller unreachable or busy); says nothing about the job itself."""


def enroot_image(image: str) -> str:
    """The image as pyxis/enroot names it: `registry#repository:tag` (a docker-style `registry/repository:tag`,
    e.g. an ECR URI, would be read as a Docker Hub repository)."""
    registry, slash, rest = image.partition("/")
    if slash and ("." in registry or ":" in registry or registry == "localhost") and "#" not in image:
        return f"{registry}#{rest}"
    return image


# What the HyperPod recipes launcher exports for EFA clusters (NCCL over libfabric's EFA provider)
EFA_ENVIRONMENT = {
    "FI_PROVIDER": "efa",
    "NCCL_DEBUG": "WARN",
    "NCCL_SOCKET_IFNAME": "^lo,docker0,veth_def_agent",
    "NCCL_IGNORE_DISABLED_P2P": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_DIST_INIT_BARRIER": "1",
}


def supports_auto_resume() -> bool:
    """HyperPod's Slurm plugin adds `srun --auto-resume`: it replaces a faulty node and restarts the step in
    place. Plain Slurm lacks it; there the job is requeued instead."""
    if not shutil.which("srun"):
        return False
    shown = subprocess.run(["srun", "--help"], capture_output=True, text=True)
    return "--auto-resume" in shown.stdout + shown.stderr


def has_gpu_gres(sinfo_gres: str | None = None) -> bool:
    """Whether the cluster's nodes have GPU GRES configured (sinfo's %G column: `gpu:8`, `gpu:h100:8(S:0-1)`,
    `(null)`, ...). A GPU request to a cluster without it is refused at sbatch ("Invalid generic resource (gres)
    specification"); there, whole nodes (--exclusive) give the job its GPUs. Without the Slurm tools (a dry run
    elsewhere) the request is kept."""
    if sinfo_gres is None:
        if not shutil.which("sinfo"):
            return True
        shown = subprocess.run(["sinfo", "--noheader", "--format=%G"], capture_output=True, text=True)
        if shown.returncode != 0:
            return True
        sinfo_gres = shown.stdout
    return any(item.split(":")[0] == "gpu" for line in sinfo_gres.split() for item in line.split(","))


def sbatch_script(config: Config, auto_resume: bool | None = None, gpu_gres: bool | None = None) -> str:
    hp = config.hyperpod
    root = job_dir(config)
    procs = max(hp.gpus_per_node or 0, 1)
    auto_resume = supports_auto_resume() if auto_resume is None else auto_resume
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={config.name}",
        f"#SBATCH --nodes={hp.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={root}/output/slurm-%j.out",
    ]
    if not auto_resume:  # a failed node ends the job; Slurm starts it again and the entrypoint resumes
        lines.append("#SBATCH --requeue")
    if hp.gpus_per_node and (has_gpu_gres() if gpu_gres is None else gpu_gres):
        lines.append(f"#SBATCH --gpus-per-node={hp.gpus_per_node}")
    if hp.exclusive:  # whole nodes, and all of their memory (the recipes launcher does the same)
        lines += ["#SBATCH --exclusive", "#SBATCH --mem=0"]
    python = shlex.quote(hp.python)
    container = ""
    if hp.image:  # pyxis/enroot: the same image as on EKS, the shared filesystem mounted in; one named
        # container per job, so what the install step adds is there for the launch step
        mount = shlex.quote(f"{hp.fsx.mount_path}:{hp.fsx.mount_path}")
        container = (
            f"--container-image={shlex.quote(enroot_image(hp.image))} --container-mounts={mount} "
            f"--container-name={shlex.quote(config.name)} "
        )
        python = "python"
    lines += ["set -euo pipefail", f"export {ML_ROOT_ENV}={shlex.quote(str(root))}", "export PYTHONUNBUFFERED=1"]
    lines += [f"export {name}={value}" for name, value in TORCHRUN_SHUTDOWN_ENV.items()]  # the stop window
    if hp.gpus_per_node and instance(hp.instance_type, "hyperpod.instance_type").efa:
        lines += [f"export {name}={shlex.quote(value)}" for name, value in EFA_ENVIRONMENT.items()]
    if hp.install:
        requirements = shlex.quote(str(root / "code" / "requirements.txt"))
        lines.append(f"srun --ntasks-per-node=1 {container}{python} -m pip install -q -r {requirements}")
    resume = "--auto-resume=1 " if auto_resume else ""
    lines += [
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"srun {resume}--kill-on-bad-exit=1 {container}{python} -m torch.distributed.run \\",
        f'  --nnodes="$SLURM_NNODES" --nproc-per-node={procs} \\',
        f'  --rdzv-backend=c10d --rdzv-endpoint="$head:{RENDEZVOUS_PORT}" --rdzv-id="$SLURM_JOB_ID" \\',
        f"  {shlex.quote(str(root / 'code' / ENTRY_SCRIPT))}",
    ]
    return "\n".join(lines) + "\n"


def _live_job_of(config: Config) -> tuple[str, str] | None:
    """(job id, state) of a pending or running job of this run (jobs are named after their config)."""
    listed = _run("squeue", "--noheader", f"--name={config.name}", "--states=PENDING,RUNNING,CONFIGURING,COMPLETING",
                  "--format=%i %T")  # fmt: skip
    if listed.returncode != 0:
        raise TargetError(f"squeue failed: {listed.stderr.strip()}; is the Slurm controller reachable?")
    jobs = [line.split() for line in listed.stdout.splitlines() if line.strip()]
    return (jobs[0][0], jobs[0][1]) if jobs else None


def _run(*command: str) -> subprocess.CompletedProcess:
    if not shutil.which(command[0]):
        raise TargetError(f"{command[0]} not found: run this on the cluster's head node (Slurm client tools)")
    return subprocess.run(command, capture_output=True, text=True)


@dataclass
class SlurmJob(Job):
    name: str  # the Slurm job id
    root: Path
    stops_on_interrupt = False  # Ctrl-C detaches; `toolkit jobs stop` cancels
    _offset: int = 0

    @property
    def output(self) -> Path:
        return RunTree(self.root).output / f"slurm-{self.name}.out"

    def status(self) -> Run:
        shown = _run("scontrol", "show", "job", self.name, "--oneliner")
        if shown.returncode != 0 and "invalid job id" not in shown.stderr.lower():
            # the query failed, not the job: never report a running job as failed
            raise SlurmQueryError(
                f"cannot query Slurm job {self.name} (scontrol: {shown.stderr.strip() or shown.returncode}): "
                "check that slurmctld is reachable from this node (`scontrol ping`), then retry"
            )
        state = "UNKNOWN"
        for field in shown.stdout.split():
            if field.startswith("JobState="):
                state = field.split("=", 1)[1]
        status = STATES.get(state, Status.PENDING)
        failure = RunTree(self.root).failure
        if state == "UNKNOWN":  # aged out of slurmctld: the job directory tells
            status = Status.COMPLETED if RunTree(self.root).completed() else Status.FAILED
        detail = failure.read_text().strip() if failure.exists() and status is Status.FAILED else state
        if status is Status.COMPLETED:
            return Run.completed_in(self.name, self.root, detail)
        return Run(self.name, status, detail)

    def logs(self, follow: bool = False) -> Iterator[str]:
        return tail(self._new_lines, lambda: self.status().status.finished, follow, poll=2)

    def _new_lines(self) -> Iterator[str]:
        """Complete lines written since the last call; the offset counts bytes (the log holds multi-byte text)."""
        lines, self._offset = complete_lines(self.output, self._offset)
        yield from lines

    def stop(self, now: bool = False) -> None:  # `now` is not offered: Slurm's KillWait applies
        # SIGTERM now, SIGKILL after KillWait: the entrypoint checkpoints. scancel exits 0 even when it cancels
        # nothing (an unknown job id); only --verbose prints why
        cancelled = _run("scancel", "--verbose", self.name)
        errors = [line for line in cancelled.stderr.splitlines() if "error:" in line]
        if any("already completing or completed" in line for line in errors):
            return
        if cancelled.returncode != 0 or errors:
            reason = "; ".join(errors) or cancelled.stderr.strip()
            raise TargetFailed(f"scancel {self.name} failed: {reason}; see `squeue -j {self.name}`")

    def wait(self, on_line: Callable[[str], None] | None = None, poll_seconds: float = 2) -> Run:
        emit = on_line or (lambda line: None)
        seen, failed_queries = "", 0
        while True:
            try:
                state = self.status()
            except SlurmQueryError as exc:  # slurmctld restarting or busy: the job runs on; give it a few polls
                failed_queries += 1
                if failed_queries > QUERY_RETRIES:
                    raise
                emit(f"[toolkit] {exc} (attempt {failed_queries} of {QUERY_RETRIES}, retrying)")
                time.sleep(poll_seconds * failed_queries)
                continue
            failed_queries = 0
            if state.detail != seen:
                seen = state.detail
                emit(f"[toolkit] slurm job {self.name}: {state.status.value} ({state.detail})")
            for line in self._new_lines():
                emit(line)
            if state.status.finished:
                for line in self._new_lines():
                    emit(line)
                return state
            time.sleep(poll_seconds)


class SlurmOrchestrator(Target):
    name = "hyperpod (slurm)"

    def render(self, config: Config) -> str:
        # A dry run asks no cluster: sinfo calls slurmctld, and without a readable slurm.conf even `srun --help` looks
        # for a controller over DNS for about a minute. The submit asks the cluster; the rendering says what it assumed.
        script = sbatch_script(config, auto_resume=False, gpu_gres=True)
        return script.replace("#!/bin/bash\n", f"#!/bin/bash\n{DRY_RUN_NOTE}\n", 1)

    def submit(self, config: Config, fresh: bool = False) -> SlurmJob:
        root = job_dir(config)
        live = _live_job_of(config)  # before the shared run directory is touched: one writer per run
        if live:
            raise TargetError(
                f"run {config.name} ({root}) is already Slurm job {live[0]} ({live[1]}): follow it with `toolkit "
                f"jobs logs CONFIG {live[0]} --follow`, stop it with `toolkit jobs stop CONFIG {live[0]}`"
            )
        stage(config, root, fresh)
        script = root / "submit.sbatch"
        script.write_text(sbatch_script(config))
        submitted = _run("sbatch", "--parsable", str(script))
        if submitted.returncode != 0:
            raise TargetError(f"sbatch refused the job: {submitted.stderr.strip()}")
        return SlurmJob(submitted.stdout.strip().split(";")[0], root)

    def latest(self, config: Config) -> Run | None:
        return completed_run(config.name, job_dir(config))

    def servable_model(self, config: Config, dry_run: bool = False) -> str:
        where = (f": run `toolkit deploy` on the cluster's head node after `toolkit train {config.name} --target "
                 "hyperpod` completes")  # fmt: skip
        return upload_run_model(config, job_dir(config), where, dry_run)

    def attach(self, config: Config, job_name: str) -> SlurmJob:
        shown = _run("scontrol", "show", "job", job_name, "--oneliner")
        if shown.returncode != 0 and "invalid job id" in shown.stderr.lower():
            raise TargetError(f"no such Slurm job {job_name!r} (scontrol: {shown.stderr.strip()}); see `squeue`")
        job = SlurmJob(job_name, job_dir(config))
        job.status()  # a failed query is an error here too, not a handle on a job nobody could see
        return job


ORCHESTRATOR = SlurmOrchestrator()

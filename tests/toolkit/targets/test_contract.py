"""One contract, every target: local, SageMaker training jobs, HyperPod on Slurm and HyperPod on EKS.

Structure: each target and job class implements the whole abstract interface (toolkit/targets/base.py) with its
signatures. Behaviour, against each target's real engine or emulator (the local machine, moto server, a real
two-node Slurm cluster, the Kubernetes API emulator): a dry rendering needs no credentials and creates nothing,
and a job the target does not know is "no such job", never a handle on nothing. Each target's own test module
runs the rest of the life cycle (submit, follow, status with artifacts, logs, stop, fresh) on the same engine.
"""

from __future__ import annotations

import inspect
import os
import sys

import pytest

from tests import slurm_cluster
from tests.k8s_emulator import KubeApi
from toolkit.config import load_config
from toolkit.config.targets import TARGET_SETTINGS
from toolkit.targets.base import Job, Target, TargetError, get_target
from toolkit.targets.hyperpod import HyperPodTarget
from toolkit.targets.hyperpod_eks import EksJob, EksOrchestrator
from toolkit.targets.hyperpod_slurm import SlurmJob, SlurmOrchestrator
from toolkit.targets.local import LocalJob, LocalTarget
from toolkit.targets.training_job import TrainingJob, TrainingJobTarget

JOBS = [LocalJob, TrainingJob, SlurmJob, EksJob]
TARGETS = [LocalTarget, TrainingJobTarget, HyperPodTarget, SlurmOrchestrator, EksOrchestrator]


def _contract(base: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(getattr(base, name)) for name in base.__abstractmethods__}


@pytest.mark.parametrize("cls", JOBS + TARGETS, ids=lambda c: c.__name__)
def test_every_class_implements_the_whole_contract(cls):
    base = Job if cls in JOBS else Target
    assert issubclass(cls, base) and not inspect.isabstract(cls), f"{cls.__name__} leaves {cls.__abstractmethods__}"
    for name, expected in _contract(base).items():
        actual = inspect.signature(getattr(cls, name))
        assert list(actual.parameters) == list(expected.parameters), f"{cls.__name__}.{name}{actual} vs {expected}"
        for parameter, declared in expected.parameters.items():  # same defaults where the base has one
            if declared.default is not inspect.Parameter.empty and parameter != "poll_seconds":
                assert actual.parameters[parameter].default == declared.default, f"{cls.__name__}.{name}"
    assert isinstance(cls.name if cls in TARGETS else cls.stops_on_interrupt, (str, bool))


def _hyperpod(orchestrator: str, *overrides: str):
    return load_config(
        "tiny-gpt-oss-local",
        ["target=hyperpod", f"hyperpod.orchestrator={orchestrator}", "hyperpod.nodes=2",
         "hyperpod.gpus_per_node=0", "hyperpod.image=acct.dkr.ecr.us-east-1.amazonaws.com/train:1", *overrides],
    )  # fmt: skip


@pytest.fixture(params=["local", "training-job", "hyperpod-slurm", "hyperpod-eks"])
def engine(request, tmp_path, monkeypatch):
    """(target, config) with the target's engine up and reachable, as a user would have it."""
    kind = request.param
    if kind == "local":
        yield LocalTarget(), load_config("tiny-gpt-oss-local", [f"local.output_dir={tmp_path}/{{name}}"])
    elif kind == "training-job":
        aws = request.getfixturevalue("aws_env")
        overrides = [f"aws.role={aws['role']}", f"aws.bucket={aws['bucket']}", "target=training-job"]
        yield TrainingJobTarget(), load_config("gpt-oss-20b-lora", overrides)
    elif kind == "hyperpod-slurm":
        if not slurm_cluster.available():
            pytest.skip("slurm-wlm not installed") if not os.environ.get("CI") else pytest.fail("no Slurm")
        cluster = slurm_cluster.SlurmCluster(tmp_path / "slurm").start()
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield HyperPodTarget(), _hyperpod("slurm", f"hyperpod.fsx.mount_path={tmp_path}",
                                          f"hyperpod.python={sys.executable}", "hyperpod.image=null")  # fmt: skip
        cluster.stop()
    else:
        with KubeApi(installed={"sagemaker.amazonaws.com/v1/hyperpodpytorchjobs": None}, missing=[]) as api:
            monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig", "ctx")))
            yield HyperPodTarget(), _hyperpod("eks")


@pytest.mark.integration
def test_the_same_behaviour_on_every_target(engine, monkeypatch, tmp_path):
    target, config = engine
    # a dry rendering: no credentials, no kubeconfig, no controller, nothing created
    with monkeypatch.context() as offline:
        for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
            offline.delenv(variable, raising=False)
        offline.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))
        offline.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
        rendered = target.render(config)
    assert config.name in rendered
    with pytest.raises(TargetError, match="no such"):
        target.attach(config, "no-such-job-4242")
    # the hand-over (deploy and the registry ask only this): a config that never ran has no latest run
    assert target.latest(config) is None


@pytest.mark.parametrize("name", list(TARGET_SETTINGS))
def test_every_target_answers_what_plan_and_preflight_ask(name):
    """Plan, preflight and serving ask the record, never the name: a target that rents instances offers the sizes
    plan compares (its configured one among them, each with its GPUs and the quota and price usage it draws on);
    one that rents none says so in plan's note and checks nothing before a submit."""
    from toolkit import limits

    target = get_target(name)
    cfg = load_config("gpt-oss-20b-lora", [f"target={name}"])
    configured, sizes = target.configured_size(cfg), target.sizes(cfg)
    assert target.name == name
    if configured is None:
        assert sizes == [] and target.unrented and target.preflight(cfg, online=False) is None
        return
    assert configured in sizes and len(set(sizes)) == len(sizes)
    assert all(s.nodes >= 1 and s.gpus >= s.nodes and isinstance(s.usage, limits.Usage) for s in sizes)


def test_the_records_say_what_the_names_used_to():
    """What plan, preflight and serving branched on by name before: spot and a per-job quota check for training
    jobs (spot counted against its own quota), HyperPod's cluster usage at 1, 2, 4 and the configured node count,
    and a local run's model on this machine."""
    from toolkit import limits

    spot = load_config("gpt-oss-20b-lora", ["target=training-job", "training_job.spot=true",
                                            "training_job.instance_count=2"])  # fmt: skip
    job = get_target("training-job")
    assert job.offers_spot and job.configured_size(spot).usage == limits.SPOT_TRAINING_JOB
    assert job.configured_size(spot).gpus == 16 and {s.nodes for s in job.sizes(spot)} == {2}
    pod = load_config("gpt-oss-20b-lora", ["target=hyperpod", "hyperpod.nodes=3", "hyperpod.gpus_per_node=4"])
    cluster = get_target("hyperpod")
    assert [(s.nodes, s.gpus) for s in cluster.sizes(pod)] == [(1, 4), (2, 8), (3, 12), (4, 16)]
    assert cluster.configured_size(pod).usage == limits.CLUSTER and not cluster.offers_spot
    assert cluster.preflight(pod, online=False) is None  # the cluster's instances run already: no quota drawn
    assert get_target("local").model_is_here and not job.model_is_here and not cluster.model_is_here

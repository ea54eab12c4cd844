"""EKS manifests, checked offline. Not covered here: a Kubernetes API server (none can run on this machine)
and the HyperPod / Kubeflow operators themselves; submission is not exercised by these tests."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.config import load_config
from toolkit.targets.hyperpod_eks import manifests


def config(*overrides):
    return load_config(
        "gpt-oss-120b-lora",
        ["target=hyperpod", "hyperpod.cluster=ml-cluster", "hyperpod.nodes=2", "hyperpod.image=acct.dkr.ecr/img:1",
         "hyperpod.queue=team-a", *overrides],
    )  # fmt: skip


def test_hyperpod_pytorch_job_has_the_cluster_shape():
    config_map, job = manifests(config())
    assert job["apiVersion"] == "sagemaker.amazonaws.com/v1" and job["kind"] == "HyperPodPyTorchJob"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["nprocPerNode"] == "8" and job["spec"]["runPolicy"]["jobMaxRetryCount"] == 3
    (replicas,) = job["spec"]["replicaSpecs"]
    assert replicas["replicas"] == 2
    pod = replicas["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    assert {"name": "TOOLKIT_ML_ROOT", "value": "/fsx/toolkit/gpt-oss-120b-lora"} in container["env"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert "hyperpodrun --nnodes=2 --nproc-per-node=8" in container["command"][2]
    settings = json.loads(config_map["data"]["hyperparameters.json"])
    assert settings["training.distributed"] == '"fsdp"' and "train.py" in config_map["data"]


def test_kubeflow_pytorch_job_splits_master_and_workers():
    _, job = manifests(config("hyperpod.eks_job_kind=PyTorchJob", "hyperpod.nodes=4"))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 3
    assert job["spec"]["runPolicy"]["backoffLimit"] == 3


def test_dry_run_prints_yaml_and_needs_an_image():
    result = CliRunner().invoke(
        app, ["train", "gpt-oss-120b-lora", "--target", "hyperpod", "--dry-run", "--set", "hyperpod.cluster=c",
              "--set", "hyperpod.image=img:1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["ConfigMap", "HyperPodPyTorchJob"]
    missing = CliRunner().invoke(
        app, ["train", "gpt-oss-120b-lora", "--target", "hyperpod", "--dry-run", "--set", "hyperpod.cluster=c"]
    )
    assert missing.exit_code == 2 and "hyperpod.image is required" in missing.output

"""Values that reach AWS or a cluster are checked by the rule of the request member they land in
(toolkit.config.members): every row names a real member of botocore's service model, of the rendered EKS manifests,
of the sbatch script or of the image build, every field of the AWS- and cluster-bound sections has a row (or says
where it is checked instead), every default passes, and a value each rule refuses is refused by the config check
with the field named, in one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from toolkit.config import ConfigError, load_config
from toolkit.config.applicability import default_at, value_at
from toolkit.config.members import CHECKED_ELSEWHERE, MEMBERS, RECEIVERS, member_problem, member_shape
from toolkit.config.models import Config

# A value the member's rule refuses, per row (a new row without one fails here).
REFUSED = {
    "aws.role": "arn:aws:iam::123:role/x",  # 3 digits where the account has 12
    "aws.prefix": "team//runs",
    "training_job.instance_count": None,  # botocore's model allows 0 (min 0); the schema refuses it (ge=1)
    "training_job.volume_size_gb": "-1",
    "training_job.max_run_seconds": str(29 * 24 * 3600),
    "training_job.max_wait_seconds": None,  # its schema refuses first (>= max_run_seconds): the rule is min 1
    "training_job.kms_key_id": "'key id with spaces'",
    "training_job.subnets": "[subnet_1]",
    "training_job.security_group_ids": "[sg_1]",
    "training_job.image_uri": "x" * 300,
    "training_job.hf_token_secret": None,  # any text is a valid environment value
    "training_job.tags": "{aws:owner: me}",
    "serving.endpoint_name": "ends-with-hyphen-",
    "serving.image_uri": "x" * 300,
    "serving.model_data": None,  # its schema refuses first (an s3:// URI)
    "serving.base_model_data": None,  # its schema refuses first (an s3:// prefix)
    "serving.instance_count": "0",
    "serving.volume_size_gb": "513",
    "serving.startup_timeout_seconds": None,  # its schema (60-3600) refuses first: the same bounds
    "serving.download_timeout_seconds": None,
    "serving.inference_ami_version": None,  # a Literal of the enum's values
    "serving.routing": None,
    "serving.rollback_alarms": "['   ']",
    "serving.component_memory_mb": "64",
    "serving.hf_token_secret": "x" * 1100,  # an environment value holds 1,024 characters
    "serving.vllm_args": "{max.model-len: 4096}",  # SM_VLLM_MAX.MODEL_LEN: not an environment variable name
    "serving.repository": "Team_Images",
    "hyperpod.image_repository": "-images",
    "hyperpod.cluster": "ml_cluster",  # DescribeCluster's ClusterName: letters, digits and hyphens
    "hyperpod.namespace": "Team_A",  # a DNS-1123 label: lowercase
    "hyperpod.fsx.claim": "fsx_claim",  # a DNS-1123 subdomain: no '_'
    "hyperpod.queue": "q" * 64,  # a valid object name, but no label value (63 at most)
    "hyperpod.priority": "high.",  # ends with '.'
    "hyperpod.image": "Registry.example/Train:1",  # a repository path is lowercase
    "hyperpod.service_account": "model export",
    "hyperpod.job_dir": "'{mount_path}/runs/%u/{name}'",  # sbatch would fill in %u
    "hyperpod.fsx.mount_path": "/fsx%",
    "serving.base_image": "vllm/vllm-openai:v0.32.0:latest",  # two tags
    "hyperpod.base_image": "dlc@sha256:short",  # a digest of 32 hex digits at least
}
NEEDS = {  # what else a value needs to be checked at all (its section's other settings)
    "training_job.subnets": ["training_job.security_group_ids=[sg-1]"],
    "training_job.security_group_ids": ["training_job.subnets=[subnet-1]"],
    "serving.component_memory_mb": ["serving.weights=adapter"],
    "serving.hf_token_secret": ["serving.weights=adapter"],
    "serving.base_model_data": ["serving.weights=adapter"],
    "serving.volume_size_gb": ["serving.instance_type=ml.g5.2xlarge"],
    "aws.role": [],
    "hyperpod.job_dir": ["hyperpod.orchestrator=slurm"],
    "hyperpod.fsx.mount_path": ["hyperpod.orchestrator=slurm"],
}
# The rendered requests a cluster's or docker's row lands in: a config with every such row's field set to a valid
# value of its own, and where each must appear (test_every_cluster_row_lands_where_it_says).
LANDS = {
    "hyperpod.namespace": "team-a",
    "hyperpod.fsx.claim": "team-fsx",
    "hyperpod.queue": "team-queue",
    "hyperpod.priority": "high",
    "hyperpod.image": "registry.example/train:1",
    "hyperpod.service_account": "exporter",
    "hyperpod.job_dir": "{mount_path}/runs/{name}",
    "hyperpod.fsx.mount_path": "/lustre",
    "serving.base_image": "registry.example/vllm:1",
    "hyperpod.base_image": "registry.example/dlc:1",
}


def _sections(*names: str) -> list[str]:
    """The settings of these sections, a required sub-section's (hyperpod.fsx) included."""
    from pydantic import BaseModel

    paths = []
    for name in names:
        for field, info in Config.model_fields[name].annotation.model_fields.items():  # type: ignore[union-attr]
            section = info.annotation
            nested = isinstance(section, type) and issubclass(section, BaseModel) and info.default is not None
            paths += _sections_of(f"{name}.{field}", section) if nested else [f"{name}.{field}"]
    return paths


def _sections_of(prefix: str, model) -> list[str]:
    return [f"{prefix}.{field}" for field in model.model_fields]


def test_every_row_is_a_real_member_of_botocores_model_and_a_real_field():
    for path, member in MEMBERS.items():
        default_at(path, Config)  # KeyError for a field the schema does not have
        if member.service not in RECEIVERS:
            member_shape(member)  # KeyError for a member the service model does not have


def _flat(node, prefix: str = ""):
    """(dotted path, value) of every leaf of a rendered object, `[]` for a list's items."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _flat(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for item in node:
            yield from _flat(item, prefix[:-1] + "[].")
    else:
        yield prefix[:-1], node


def test_every_cluster_row_lands_where_it_says():
    """Each cluster row's object and field (or sbatch option, or build flag) is where the rendering puts the value:
    the EKS manifests and the model export's Job, the Slurm script, the image build's flags."""
    from toolkit.deploy.image import build_flags
    from toolkit.targets.hyperpod import job_dir
    from toolkit.targets.hyperpod_eks import export_job, manifests
    from toolkit.targets.hyperpod_slurm import sbatch_script

    rows = {path: member for path, member in MEMBERS.items() if member.service in RECEIVERS}
    assert set(LANDS) == set(rows), "give each cluster row a valid value in LANDS"
    on_slurm = [p for p, m in rows.items() if m.service == "slurm"]
    sets = {p: f"{p}={value}" for p, value in LANDS.items()}
    eks = load_config("tiny-gpt-oss-local", ["target=hyperpod", *(sets[p] for p in rows if p not in on_slurm)])
    slurm = load_config("tiny-gpt-oss-local", ["target=hyperpod", "hyperpod.orchestrator=slurm",
                                               *(sets[p] for p in on_slurm)])  # fmt: skip
    objects = [*manifests(eks), export_job(eks, "run", "bucket", "prefix")]
    for path, member in rows.items():
        value = value_at(eks if member.service != "slurm" else slurm, path)
        if member.service == "kubernetes":
            kinds = [o for o in objects if o["kind"] == member.operation]
            assert (member.path, value) in {leaf for o in kinds for leaf in _flat(o)}, f"{path}: not at {member.path}"
        elif member.service == "slurm":
            option = f"{member.path}={job_dir(slurm)}/"
            assert any(line.startswith(option) for line in sbatch_script(slurm, False, True).splitlines()), path
        else:
            flag, name = member.path.split()
            assert f"{name}={value}" in build_flags(value) and flag in build_flags(value), path


def test_every_field_of_the_aws_bound_sections_has_a_row_or_says_where_it_is_checked():
    missing = [
        p
        for p in _sections("aws", "training_job", "serving", "hyperpod")
        if p not in MEMBERS and p not in CHECKED_ELSEWHERE
    ]
    assert not missing, f"add to toolkit.config.members.MEMBERS (or CHECKED_ELSEWHERE, saying where): {missing}"
    assert not set(MEMBERS) & set(CHECKED_ELSEWHERE)


@pytest.mark.parametrize("path", sorted(MEMBERS))
def test_every_default_is_what_aws_takes(path):
    default = default_at(path, Config)
    if default not in (None, [], {}):  # unset or empty: not sent
        assert member_problem(path, MEMBERS[path], default) is None


@pytest.mark.parametrize("path", sorted(p for p, v in REFUSED.items() if v is not None))
def test_a_value_the_member_refuses_is_refused_with_the_field_named(path):
    overrides = [f"{path}={REFUSED[path]}", *NEEDS.get(path, [])]
    with pytest.raises(ConfigError) as refused:
        load_config("tiny-gpt-oss-local", overrides)
    # named by this table's check (with the request member), or by the schema's own bound where it has one
    assert path in str(refused.value), str(refused.value)


@pytest.mark.parametrize("path", sorted(p for p, v in REFUSED.items() if v is not None))
def test_each_rule_refuses_its_value_by_itself(path):
    """The member's own rule (botocore's shape, or the documented rule beside it) bites, also where the schema has
    a bound of its own that refuses the value first."""
    import yaml

    assert member_problem(path, MEMBERS[path], yaml.safe_load(REFUSED[path])) is not None


def test_every_row_has_a_refused_value_or_says_why_not():
    assert set(REFUSED) == set(MEMBERS)


def test_refused_through_the_cli_in_one_line_with_exit_2():
    result = _validate("tiny-gpt-oss-local", "--set", "training_job.tags={team: 'a|b'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output
    assert "training_job.tags: 'a|b' does not match AWS's pattern" in output and "CreateTrainingJob Tags" in output


@pytest.mark.parametrize("path", [p for p, m in MEMBERS.items() if m.service in RECEIVERS])
def test_a_value_a_cluster_refuses_is_refused_through_the_cli_in_one_line_with_exit_2(path):
    sets = [f"{path}={REFUSED[path]}", *NEEDS.get(path, [])]
    result = _validate("tiny-gpt-oss-local", *[a for s in sets for a in ("--set", s)])
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    named = [line for line in output.splitlines() if f": {path}: " in line]  # error: preset NAME: path: ...
    assert len(named) == 1 and f"({MEMBERS[path].operation} {MEMBERS[path].path})" in named[0], output


def _validate(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "toolkit.cli", "config", "validate", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _text_fields(model: type, prefix: str = ""):
    """(dotted path) of every text setting of the schema, nested sections included."""
    import types
    import typing

    from pydantic import BaseModel

    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        args = typing.get_args(field.annotation) or (field.annotation,)
        nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        for section in nested:
            yield from _text_fields(section, f"{prefix}{name}.")
        is_text = field.annotation is str or (
            typing.get_origin(field.annotation) in (typing.Union, types.UnionType) and str in args
        )
        if is_text and not nested:
            yield f"{prefix}{name}"


def test_every_text_setting_at_a_length_aws_refuses_is_refused_or_reaches_a_valid_training_job_request():
    """The walk, not a list: each text setting of every section set to 3,000 characters. Either the config check
    refuses it (naming the field), or the training job's rendered CreateTrainingJob request (offline, SageMaker SDK
    v3) passes botocore's model with AWS's own maxima and patterns. Training settings travel as hyperparameters
    (2,500 characters each), paths as channels: a value nobody thought of is caught by where it lands."""
    import json

    from tests.botocore_model import assert_valid
    from toolkit.config.loader import validate
    from toolkit.targets.training_job import TrainingJobTarget

    base = load_config("gpt-oss-20b-lora", ["target=training-job", "aws.role=arn:aws:iam::123456789012:role/x",
                                            "aws.bucket=toolkit-b"]).model_dump()  # fmt: skip
    walked, refused = 0, []
    for path in _text_fields(Config):
        raw = json.loads(json.dumps(base))
        *sections, name = path.split(".")
        node = raw
        for section in sections:
            if node.get(section) is None:  # an unset section: set with this one value
                node[section] = {}
            node = node[section]
            if isinstance(node, list):  # a list of sections (training.grpo.rewards): its first item
                node = node[0]
        node[name] = "a" * 3000
        try:
            config = validate(raw, "walk")
        except ConfigError as exc:
            parts = path.split(".")
            named = [".".join(parts[:n]) for n in range(len(parts), min(2, len(parts)) - 1, -1)]  # it, or its section
            assert any(name in str(exc) for name in named), f"{path}: refused without naming it: {exc}"
            refused.append(path)
            continue
        request = json.loads(json.dumps(TrainingJobTarget()._request(config, dry_run=True), default=str))
        assert_valid("sagemaker", "CreateTrainingJob", request)
        walked += 1
    assert walked > 0 and {"model.id", "data.source", "data.split", "training_job.image_uri"} <= set(refused), refused


def test_the_toolkits_own_tag_counts_toward_awss_fifty_and_its_prefix_is_reserved():
    """Every training job also carries toolkit:config (how `jobs` finds a config's jobs): 49 tags of the user's fit,
    50 make 51 in the request, which CreateTrainingJob refuses; a key of the toolkit's prefix would be overwritten."""
    tags = {f"team{i}": "x" for i in range(50)}
    with pytest.raises(ConfigError, match=r"training_job.tags: 51 entries, where AWS takes 0 to 50 .*toolkit:config"):
        load_config("gpt-oss-20b-lora", [f"training_job.tags={tags}"])
    del tags["team49"]
    assert load_config("gpt-oss-20b-lora", [f"training_job.tags={tags}"]).training_job.tags == tags
    with pytest.raises(ConfigError, match="tag key 'toolkit:owner' starts with 'toolkit:', which the toolkit reserves"):
        load_config("gpt-oss-20b-lora", ["training_job.tags={toolkit:owner: me}"])

"""A small IAM policy evaluator for infra/toolkit.yaml's execution role. None was found on PyPI (the maintained
offline simulator is npm's @cloud-copilot/iam-simulate); IAM's SimulatePrincipalPolicy needs AWS, and moto
does not implement it.

It resolves the template's intrinsic functions for concrete parameters, account and region, gathers the role's
statements (inline policies, and the stack's policies attached to it when their conditions hold) and its trust
policy, and decides a request the way
IAM does for the forms the template uses: explicit Deny wins; an Allow matches on Action and Resource wildcards
and on StringEquals / StringLike / Bool conditions (a condition whose key the request lacks does not match).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from toolkit import aws, infra

NO_VALUE = object()


@dataclass
class Role:
    statements: list[dict]
    trust: list[dict] = field(default_factory=list)

    def allows(self, action: str, resource: str, context: dict[str, str] | None = None) -> bool:
        context = context or {}
        matching = [s for s in self.statements if _matches(s, action, resource, context)]
        return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)

    def trusts(self, principal: dict[str, str], action: str, context: dict[str, str] | None = None) -> bool:
        """Whether the trust policy lets `principal` (e.g. {"Service": "pods.eks.amazonaws.com"}) call `action`
        (sts:AssumeRole, sts:TagSession) on the role, with the request's condition keys in `context`."""
        context = context or {}
        matching = [
            s for s in self.trust
            if all(value in _as_list(s["Principal"].get(kind, [])) for kind, value in principal.items())
            and _matches({**s, "Resource": "*"}, action, "*", context)
        ]  # fmt: skip
        return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)


@dataclass
class Stack:
    region: str
    account: str = "111122223333"
    parameters: dict[str, str] = field(default_factory=dict)

    def role(self, logical_id: str = "ExecutionRole") -> Role:
        """The role's statements: its inline policies and every AWS::IAM::Policy of the stack attached to it
        whose condition holds."""
        template = yaml.load(infra.TEMPLATE.read_text(), Loader=infra._CfnLoader)
        self.template = template
        self.values = {k: v.get("Default", "") for k, v in template["Parameters"].items()} | self.parameters
        self.conditions = {name: bool(self.resolve(c)) for name, c in template["Conditions"].items()}
        resources = template["Resources"]
        role = resources[logical_id]
        assert self.conditions.get(role.get("Condition"), True), f"{logical_id} is not created with these parameters"
        documents = [p["PolicyDocument"] for p in role["Properties"].get("Policies", [])]
        for resource in resources.values():
            attached = resource["Type"] == "AWS::IAM::Policy" and {"Ref": logical_id} in resource["Properties"]["Roles"]
            if attached and self.conditions.get(resource.get("Condition"), True):
                documents.append(resource["Properties"]["PolicyDocument"])
        return Role(self._statements(documents), self._statements([role["Properties"]["AssumeRolePolicyDocument"]]))

    def _statements(self, documents: list[dict]) -> list[dict]:
        statements = []
        for document in documents:
            for statement in _as_list(self.resolve(document["Statement"])):
                if statement is not NO_VALUE:
                    statements.append(statement)
        return statements

    # -- intrinsic functions -------------------------------------------------------------------------------------

    def pseudo(self, name: str) -> Any:
        partition = aws.partition(self.region)
        bucket = f"{self.values['NamePrefix']}-{self.account}-{self.region}"
        known = {
            "AWS::Region": self.region, "AWS::AccountId": self.account, "AWS::Partition": partition,
            "AWS::NoValue": NO_VALUE, "ArtifactBucket": bucket,
        }  # fmt: skip
        if name in known:
            return known[name]
        value = self.values[name]
        if self.template["Parameters"][name]["Type"] == "CommaDelimitedList":
            return [item for item in str(value).split(",")] if value != "" else [""]
        return str(value)

    def attribute(self, resource: str, name: str) -> str:
        partition, region, account = aws.partition(self.region), self.region, self.account
        prefix = self.values["NamePrefix"]
        arns = {
            "ArtifactBucket": f"arn:{partition}:s3:::{prefix}-{account}-{region}",
            "Repository": f"arn:{partition}:ecr:{region}:{account}:repository/{prefix}-serving",
            "TrainingRepository": f"arn:{partition}:ecr:{region}:{account}:repository/{prefix}-training",
            "Key": f"arn:{partition}:kms:{region}:{account}:key/0000-key",
            "ExecutionRole": f"arn:{partition}:iam::{account}:role/{prefix}-sagemaker-execution",
            "ExportRole": f"arn:{partition}:iam::{account}:role/{prefix}-eks-model-export",
        }
        assert name == "Arn", (resource, name)
        return arns[resource]

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.resolve(value) for value in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, value),) = node.items()
            if key == "Ref":
                return self.pseudo(value)
            if key == "Fn::GetAtt":
                return self.attribute(*value)
            if key == "Fn::Sub":
                text, variables = (value, {}) if isinstance(value, str) else value
                return self._sub(text, {k: self.resolve(v) for k, v in variables.items()})
            if key == "Fn::FindInMap":
                table, first, second = (self.resolve(v) for v in value)
                return self.template["Mappings"][table][first][second]
            if key == "Fn::If":
                name, then, otherwise = value
                return self.resolve(then if self.conditions[name] else otherwise)
            if key == "Fn::Equals":
                left, right = (self.resolve(v) for v in value)
                return left == right
            if key == "Fn::Not":
                return not self.resolve(value[0])
            if key == "Fn::Join":
                delimiter, items = value
                return delimiter.join(str(i) for i in self.resolve(items))
            if key == "Condition":
                return self.conditions[value]
        return {k: self.resolve(v) for k, v in node.items()}

    def _sub(self, text: str, variables: dict[str, Any]) -> str:
        def replace(match: re.Match) -> str:
            name = match.group(1)
            if name in variables:
                return str(variables[name])
            if "." in name:
                return self.attribute(*name.split(".", 1))
            return str(self.pseudo(name))

        return re.sub(r"\$\{([^}]+)\}", replace, text)


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _matches(statement: dict, action: str, resource: str, context: dict[str, str]) -> bool:
    actions = [a.lower() for a in _as_list(statement["Action"])]
    if not any(fnmatch.fnmatchcase(action.lower(), pattern) for pattern in actions):
        return False
    if not any(fnmatch.fnmatchcase(resource, pattern) for pattern in _as_list(statement["Resource"])):
        return False
    for operator, tests in statement.get("Condition", {}).items():
        for key, expected in tests.items():
            if key not in context:
                return False
            actual, wanted = context[key], [str(e) for e in _as_list(expected)]
            if operator == "StringLike" and not any(fnmatch.fnmatchcase(actual, w) for w in wanted):
                return False
            if operator in ("StringEquals", "Bool") and actual not in wanted:
                return False
            if operator not in ("StringLike", "StringEquals", "Bool"):
                raise NotImplementedError(f"condition operator {operator} (extend tests/infra/policy.py)")
    return True

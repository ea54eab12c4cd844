"""Run by the training image's build before anything is installed, with pip's dry-run report of that install
(`pip install --dry-run --report PLAN ...`). The image must keep its base's torch (the DLC's CUDA build): when the
resolver would install another torch, because the base's is outside the range the elastic agent (or another
package of the stack) accepts, the build stops here with one line naming both versions, instead of replacing the
base's torch with a PyPI build or failing deep in resolution. Standard library only (it runs on the bare base)."""

from __future__ import annotations

import json
import re
import sys
from importlib.metadata import PackageNotFoundError, version


def torch_requirements(plan: dict) -> list[str]:
    """`package version (torch requirement)` of every package in the plan that constrains torch."""
    found = []
    for item in plan.get("install", []):
        metadata = item["metadata"]
        for requirement in metadata.get("requires_dist") or []:
            name = requirement.split(";")[0].strip()
            if re.match(r"torch\s*([<>=!~\[(]|$)", name, re.IGNORECASE):  # torch itself, not torchvision
                found.append(f"{metadata['name']} {metadata['version']} ({name})")
    return found


def problem(plan: dict, base_torch: str | None) -> str | None:
    replacing = [i["metadata"]["version"] for i in plan.get("install", []) if i["metadata"]["name"].lower() == "torch"]
    if not replacing:
        return None
    wanted = ", ".join(torch_requirements(plan)) or "the training stack"
    return (
        f"the base image's torch {base_torch or '(none)'} is outside what {wanted} accepts (pip would install torch "
        f"{replacing[0]}): choose a base image (hyperpod.base_image) whose torch is in that range"
    )


def main(plan_path: str) -> int:
    with open(plan_path) as plan_file:
        plan = json.load(plan_file)
    try:
        base_torch: str | None = version("torch")
    except PackageNotFoundError:
        base_torch = None
    found = problem(plan, base_torch)
    if found:
        print(found, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

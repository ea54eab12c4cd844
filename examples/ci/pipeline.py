"""The whole pipeline as SDK calls: train (SageMaker training job) -> eval -> register (the promotion gate) ->
deploy, only if the gate approved the version -> smoke test.

Run it from CI after assuming the deployment role (see github-actions.yml), or by hand:

    python examples/ci/pipeline.py my-job.yaml --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/toolkit-serving:TAG

The config must declare the gate (`registry.gate`, docs/evaluation.md) and hold rows out (`data.eval`). The eval
step downloads the job's model and serves the base and the fine-tuned model with vLLM on this machine (a GPU
runner for gpt-oss-20b; `pip install vllm`), scores both on the held-out rows, and `register` attaches the report
and sets the version Approved or Rejected from the gate. Only an Approved version is deployed (`deploy
--model-package` refuses any other); a rejected one ends the script with exit 1 after the summary, naming why.

Every step raises on failure (toolkit.errors maps the exceptions to exit codes for the CLI; here they end the
script with a traceback-free message and exit 1 or 2), and the script prints one JSON summary for the next step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import toolkit
import toolkit.errors
from toolkit import sdk
from toolkit.deploy.client import messages_for, reply_problems
from toolkit.errors import classify


def run(config: str, image_uri: str | None, question: str, reasoning_language: str, max_tokens: int = 256) -> dict:
    cfg = toolkit.load_config(config)
    if cfg.registry.gate is None or cfg.data.eval is None:
        raise toolkit.errors.BadInput(
            f"{config}: set registry.gate (the promotion gate) and data.eval (held-out rows): this pipeline deploys "
            "only what the gate approves (docs/evaluation.md)"
        )
    job = sdk.train(cfg, target="training-job")
    print(f"training job {job.name} submitted", file=sys.stderr, flush=True)
    state = job.wait()
    if state.status.value != "Completed":
        raise SystemExit(f"training job {state.name} {state.status.value.lower()}: {state.detail}")
    model_dir = sdk.download_model(cfg, state.artifacts["model"])
    report = sdk.evaluate(cfg, model_dir=model_dir, max_tokens=max_tokens)
    registration = sdk.register(cfg, job_name=state.name, image_uri=image_uri, report=report["written"]["json"])
    print(registration.verdict, file=sys.stderr, flush=True)
    summary: dict = {
        "job": dataclasses.asdict(state),
        "evaluation": {"report": report["written"]["json"], "metrics": report["metrics"]},
        "registration": dataclasses.asdict(registration),
        "endpoint": None,
        "smoke_test": None,
    }
    if registration.status != "Approved":
        return summary  # not deployed: main() exits 1 after printing this
    endpoint = sdk.deploy(cfg, model_package=registration.arn)
    reply = sdk.chat_client(cfg).chat(messages_for(question, reasoning_language), max_tokens=512, temperature=0)
    problems = reply_problems(reply)
    if problems:
        raise SystemExit(f"smoke test: the reply {'; '.join(problems)}")
    return summary | {"endpoint": dataclasses.asdict(endpoint), "smoke_test": dataclasses.asdict(reply)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--image-uri", help="serving image (default: containers/serving built and pushed to ECR)")
    parser.add_argument("--question", default="Wie viele Minuten hat ein Tag?")
    parser.add_argument("--reasoning-language", default="French")
    parser.add_argument("--max-tokens", type=int, default=256, help="new tokens per reply in the eval")
    args = parser.parse_args()
    try:
        summary = run(args.config, args.image_uri, args.question, args.reasoning_language, args.max_tokens)
    except Exception as exc:
        known = classify(exc)
        if known is None:
            raise
        print(f"error: {known[1]}", file=sys.stderr)
        raise SystemExit(known[0]) from None
    json.dump(summary, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    if summary["endpoint"] is None:
        registration = summary["registration"]
        print(f"not deployed: model package {registration['arn']} is {registration['status']}: "
              f"{registration['verdict']}", file=sys.stderr)  # fmt: skip
        raise SystemExit(1)


if __name__ == "__main__":
    main()

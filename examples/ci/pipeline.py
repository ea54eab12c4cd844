"""The whole pipeline as SDK calls: prepare -> train (SageMaker training job) -> register -> deploy -> smoke test.

Run it from CI after assuming the deployment role (see github-actions.yml), or by hand:

    python examples/ci/pipeline.py my-job.yaml --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/toolkit-serving:TAG

Every step raises on failure (toolkit.errors maps the exceptions to exit codes for the CLI; here they end the
script with a traceback-free message and exit 1 or 2), and the script prints one JSON summary for the next step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import toolkit
from toolkit import sdk
from toolkit.deploy.client import messages_for, reply_problems
from toolkit.errors import classify


def run(config: str, image_uri: str | None, question: str, reasoning_language: str, approve: bool) -> dict:
    cfg = toolkit.load_config(config)
    job = sdk.train(cfg, target="training-job")
    print(f"training job {job.name} submitted", file=sys.stderr, flush=True)
    state = job.wait()
    if state.status.value != "Completed":
        raise SystemExit(f"training job {state.name} {state.status.value.lower()}: {state.detail}")
    registration = sdk.register(cfg, job_name=state.name, image_uri=image_uri, approve=approve)
    endpoint = sdk.deploy(cfg, image_uri=image_uri, model_data=state.artifacts["model"])
    reply = sdk.chat_client(cfg).chat(messages_for(question, reasoning_language), max_tokens=512, temperature=0)
    problems = reply_problems(reply)
    if problems:
        raise SystemExit(f"smoke test: the reply {'; '.join(problems)}")
    return {
        "job": dataclasses.asdict(state),
        "registration": dataclasses.asdict(registration),
        "endpoint": dataclasses.asdict(endpoint),
        "smoke_test": dataclasses.asdict(reply),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--image-uri", help="serving image (default: containers/serving built and pushed to ECR)")
    parser.add_argument("--question", default="Wie viele Minuten hat ein Tag?")
    parser.add_argument("--reasoning-language", default="French")
    parser.add_argument("--approve", action="store_true", help="mark the registered model Approved")
    args = parser.parse_args()
    try:
        summary = run(args.config, args.image_uri, args.question, args.reasoning_language, args.approve)
    except Exception as exc:
        known = classify(exc)
        if known is None:
            raise
        print(f"error: {known[1]}", file=sys.stderr)
        raise SystemExit(known[0]) from None
    json.dump(summary, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

"""The training settings: the ONE schema shared by the training container and the toolkit's config.

This module needs only pydantic, so it can run inside a training container without the toolkit
installed. The toolkit composes these models into its own `Config`; the entrypoint rebuilds them from
SageMaker hyperparameters (flattened by `to_hyperparameters`).
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .families import ModelFamily, family_of, known_family
from .methods import METHODS, SFT, TrainingMethod, method_named, method_reading
from .methods.rewards import BUILTIN_REWARDS, USER_REWARD

BUILTIN_PREFIX = "builtin:"
TINY_GPT_OSS = "builtin:tiny-gpt-oss"
TINY_GPT_OSS_MXFP4 = "builtin:tiny-gpt-oss-mxfp4"  # the same model stored as an MXFP4 checkpoint
TINY_GPT_OSS_TOOLS = "builtin:tiny-gpt-oss-tools"  # pre-trained on the tool-calling sample too (its tokens)
TINY_QWEN3 = "builtin:tiny-qwen3"  # a tiny dense Qwen3 with Qwen3's chat template, pre-trained offline (tiny_qwen3.py)
TINY_QWEN3_MOE = "builtin:tiny-qwen3-moe"  # the same as a Qwen3-MoE: a sparse MLP, 4 experts, top-2 (tiny_qwen3.py)
# causal LMs of no family record, each with its own chat template (tiny_generic.py): the generic template path's models
TINY_LLAMA = "builtin:tiny-llama"  # LlamaForCausalLM with Llama 3's chat template
TINY_GEMMA = "builtin:tiny-gemma"  # GemmaForCausalLM with Gemma 3's chat template (the system prompt in the first turn)
TINY_GENERIC = (TINY_LLAMA, TINY_GEMMA)
BUILTIN_MODELS = (TINY_GPT_OSS, TINY_GPT_OSS_MXFP4, TINY_GPT_OSS_TOOLS, TINY_QWEN3, TINY_QWEN3_MOE, *TINY_GENERIC)
SAMPLE_DATASET = "builtin:multilingual-thinking-sample"
TOOL_SAMPLE_DATASET = "builtin:tool-calling-sample"  # OpenAI chat rows with tools (format: messages)
PREFERENCE_SAMPLE_DATASET = "builtin:preference-sample"  # the multilingual sample as pairs (format: preference)
SAMPLES = {
    SAMPLE_DATASET: "multilingual-thinking.jsonl",
    TOOL_SAMPLE_DATASET: "tool-calling.jsonl",
    PREFERENCE_SAMPLE_DATASET: "preference.jsonl",
}  # file names in samples/
# The job's environment names the Hugging Face token's secret (Secrets Manager); the entrypoint reads the value
HF_TOKEN_SECRET_ENV = "TOOLKIT_HF_TOKEN_SECRET"
# ...with a client made for the job's region, which the toolkit passes too (a container need not know its region;
# tests/toolkit_train/test_train.py fails on any boto3 client in the job made without region_name)
AWS_REGION_ENV = "TOOLKIT_AWS_REGION"
# How the entrypoint says why it failed, on its output (read by the local target when output/failure cannot be
# written, e.g. on a full disk)
FAILED_PREFIX = "[toolkit] FAILED: "


def failure_elsewhere(root: Path) -> Path:
    """Where a run's failure is kept when its own output/failure cannot be written (its disk is full): a file
    named by the run directory under this machine's temporary directory, on another disk as a rule. A new attempt
    clears it (toolkit.targets.jobtree.prepare_run_dir); `toolkit jobs status` reads it."""
    import hashlib
    import tempfile

    key = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "toolkit-failures" / key


# The stop window: how long a stopped job's ranks have to checkpoint between SIGTERM and SIGKILL. SageMaker gives
# 120 s on StopTrainingJob and on a spot interruption (fixed); the toolkit gives the same wherever it decides: the
# EKS pod's terminationGracePeriodSeconds, and the launchers' own kill timers inside it (torchrun's
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT, torch >= 2.12; hyperpodrun's --shutdown-timeout, whose default signal is SIGKILL
# after 15 s), a little shorter so that the launcher exits before the pod is killed. Slurm's is the cluster's
# KillWait. torchrun before 2.12 kills ranks 30 s after a SIGTERM to itself: on SageMaker, pid1.py therefore
# signals the ranks alone.
STOP_WINDOW_SECONDS = 120
RANK_SHUTDOWN_SECONDS = STOP_WINDOW_SECONDS - 15
TORCHRUN_SHUTDOWN_ENV = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(RANK_SHUTDOWN_SECONDS)}


def cache_root() -> Path:
    """Where built things are kept between runs (tiny models, the price cache): TOOLKIT_CACHE_DIR, else the user's
    cache directory (XDG_CACHE_HOME, as scripts/env.sh's environments) + toolkit."""
    if os.environ.get("TOOLKIT_CACHE_DIR"):
        return Path(os.environ["TOOLKIT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolkit"


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo like `lora.rnak` must fail before anything is launched. Every number is finite:
    `.inf` or `.nan` passes a range check written with `gt`/`lt` (nan compares false) and would reach the trainer or a
    request; refused for every float field of every section at once, never field by field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


EXPLICIT_PATH = ("/", "./", "../", "~")  # a model or data source spelled so is a local path, never a hub id
NAME_MAX_BYTES = 255  # the longest file name (one path component) Linux file systems and S3 tools take


def source_has_splits(source: str | None) -> bool:
    """Whether a data source may have named splits: a hub dataset or a save_to_disk DatasetDict (a sample, a file or
    a directory of files is read whole). Where this machine cannot look (s3://, a cluster's path): it may."""
    if source is None or source in SAMPLES:
        return source is None
    path = Path(source).expanduser()
    if path.is_file():
        return False
    return not path.is_dir() or (path / "dataset_dict.json").is_file()


def _same_source(one: str, other: str) -> bool:
    """Two spellings of one data source: the same text, or the same local path (./x and x, x/ and x)."""
    if one.strip() == other.strip():
        return True
    if "://" in one or "://" in other or one.startswith("builtin:") or other.startswith("builtin:"):
        return one.strip().rstrip("/") == other.strip().rstrip("/")
    return os.path.abspath(os.path.expanduser(one.strip())) == os.path.abspath(os.path.expanduser(other.strip()))


def _nameable(field: str, value: str) -> str:
    """A path, URI or hub id that could name something: no component longer than a file name may be (the OS
    refuses it before anything is read), no control characters (a pasted newline)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{field}: {value[:60]!r} holds a control character (a pasted newline?): remove it")
    longest = max(value.split("/"), key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX_BYTES:
        raise ValueError(
            f"{field}: a path component of {len(longest.encode())} bytes ({longest[:40]}...) is no file name, "
            f"directory or hub id (at most {NAME_MAX_BYTES} bytes each): give a path, an s3:// URI or a hub id"
        )
    return value


class ModelSettings(StrictModel):
    """The base model to fine-tune."""

    id: str = Field(
        description="Hugging Face hub id or local path of a causal LM: gpt-oss (harmony), Qwen3 dense or MoE (its "
        "own chat template, with the family's serving parsers), or any other causal LM with a chat template (trained "
        "and served through that template, without reasoning or tool parsers unless serving.vllm_args names them). "
        f"`{TINY_GPT_OSS}` builds a tiny random-weight gpt-oss offline ({TINY_GPT_OSS_MXFP4}: "
        f"the same, stored as MXFP4; {TINY_GPT_OSS_TOOLS}: pre-trained on the tool-calling sample too); "
        f"`{TINY_QWEN3}` a tiny dense Qwen3 with Qwen3's chat template, pre-trained offline on generated conversations "
        f"({TINY_QWEN3_MOE}: the same as a Qwen3-MoE, 4 experts, top-2); `{TINY_LLAMA}` and `{TINY_GEMMA}` tiny "
        "Llama and Gemma models with Llama 3's and Gemma 3's chat templates (no family record: the generic path)."
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="Compute dtype; auto = bfloat16 on GPU, float32 on CPU."
    )
    dequantize_mxfp4: bool = Field(
        True, description="Load MXFP4 checkpoints (gpt-oss) with Mxfp4Config(dequantize=True)."
    )
    attn_implementation: Literal["auto", "eager", "flex_attention", "sdpa"] = Field(
        "auto",
        description="Attention kernel; auto = flex_attention on GPU, eager on CPU. gpt-oss supports eager "
        "and flex_attention (not sdpa: it has attention sinks).",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    experts_implementation: Literal["toolkit_fused", "grouped_mm", "eager"] = Field(
        "toolkit_fused",
        description="MoE experts (gpt-oss): toolkit_fused = transformers' grouped GEMMs with the bias, SwiGLU and "
        "top-k combine fused around them (compiled on GPU); grouped_mm = transformers' path; eager = one expert "
        "at a time.",
    )

    experts: Literal["bf16", "mxfp4"] = Field(
        "bf16",
        description="gpt-oss MXFP4 checkpoints: bf16 = experts dequantized at load (trainable with expert LoRA); "
        "mxfp4 = experts kept packed on the GPU and dequantized per layer on the fly (4x less memory: "
        "gpt-oss-120b fits one GPU; ddp; expert LoRA runs beside the packed experts; the merged model stays MXFP4, "
        "and merging an expert LoRA requantizes the experts, which rounds much of its update away: serve the "
        "adapter). "
        "bf16 is the default where it fits (faster: docs/performance.md); where it does not fit a GPU "
        "under ddp, the config check says to use mxfp4.",
    )

    @property
    def family(self) -> ModelFamily:
        """By name, or by the config of a checkpoint directory here (a local copy need not be named like it)."""
        return family_of(self.id)

    @property
    def known_family(self) -> ModelFamily | None:
        """The family where it can be told here; None for a directory that exists only where the job runs (the
        job's load checks it there)."""
        return known_family(self.id, self.is_path)

    @property
    def is_path(self) -> bool:
        """A directory (absolute, relative or ~), not a hub id."""
        return self.id.startswith(EXPLICIT_PATH)

    def missing_here(self) -> str | None:
        """What is wrong when model.id is a directory that this machine does not have; None otherwise."""
        if not self.is_path or Path(self.id).expanduser().is_dir():
            return None
        return (
            f"model.id: {self.id} is not a directory on this machine; a local model.id must be a checkpoint "
            "directory (config.json + *.safetensors) where the job runs (or use a hub id)"
        )

    @model_validator(mode="after")
    def _gpt_oss_attention(self) -> ModelSettings:
        _nameable("model.id", self.id)
        if self.id.startswith(BUILTIN_PREFIX) and self.id not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model {self.id!r}; builtins: {', '.join(BUILTIN_MODELS)}")
        allowed = self.family.attention_kernels
        if allowed is not None and self.attn_implementation not in ("auto", *allowed):
            raise ValueError(
                f"{self.family.attention_reason}: set model.attn_implementation to "
                + " or ".join(f"'{kernel}'" for kernel in allowed)
            )
        return self


class EvalSplit(StrictModel):
    """Held-out rows: validation loss during training, and what `toolkit eval` generates on."""

    fraction: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Hold out this fraction of data.source's rows (at least one), chosen with data.eval.seed; they "
        "never reach training.",
    )
    source: str | None = Field(
        None, description="Or held-out rows of their own: a source of the same kinds and data.format as data.source."
    )
    split: str | None = Field(None, description="Split of data.eval.source (default: data.split), e.g. test.")
    seed: int = Field(1234, description="Which rows data.eval.fraction holds out (the same rows on every run).")
    steps: int = Field(0, ge=0, description="Validation loss every N optimizer steps (0: at the end only).")

    @model_validator(mode="after")
    def _one_source(self) -> EvalSplit:
        if (self.fraction is None) == (self.source is None):
            raise ValueError(
                "data.eval: set either data.eval.fraction (hold out part of data.source) or data.eval.source "
                "(rows of their own), not both and not neither"
            )
        if self.source is not None and not self.source.strip():
            raise ValueError("data.eval.source is empty: name a file, directory or hub dataset of held-out rows")
        if self.source is not None:
            _nameable("data.eval.source", self.source)
        # a setting of one way that the other way ignores: refused, not silently dropped
        if self.fraction is not None and self.split is not None:
            raise ValueError(
                f"data.eval.split: {self.split!r} names a split of data.eval.source, but data.eval.fraction holds out "
                "rows of data.source's data.split: remove data.eval.split, or use data.eval.source"
            )
        if self.source is not None and self.seed != EvalSplit.model_fields["seed"].default:
            raise ValueError(
                f"data.eval.seed: {self.seed} chooses which rows data.eval.fraction holds out, but data.eval.source "
                "names the held-out rows itself: remove data.eval.seed"
            )
        return self


class DataSettings(StrictModel):
    """Where the training rows come from and how they become tokens."""

    source: str = Field(
        description="Hub dataset id, local path (JSONL, Parquet or a save_to_disk directory), s3:// URI, "
        f"fsx://<file-system-id>/<mount-name>/<path> (training jobs), or a sample that ships with the toolkit: "
        f"`{SAMPLE_DATASET}`, `{TOOL_SAMPLE_DATASET}`, `{PREFERENCE_SAMPLE_DATASET}`."
    )
    split: str = Field("train", description="Split to train on.")
    format: Literal["multilingual-thinking", "messages", "preference", "prompts"] = Field(
        "multilingual-thinking",
        description="Row schema: HuggingFaceH4/Multilingual-Thinking, or OpenAI chat `messages` (with `tools`, "
        "assistant `tool_calls` and `reasoning`, `tool` messages, `reasoning_effort` per row), or `preference` "
        "pairs for training.method dpo: the prompt's `messages` and a `chosen` and a `rejected` assistant reply "
        "(each `content`, optional `reasoning`), or `prompts` for training.method grpo: `messages` up to the "
        "user's turn (or the Multilingual-Thinking fields), with an optional reference `answer` (else a closing "
        "assistant reply is the reference).",
    )
    max_length: int = Field(2048, ge=16, description="Longest tokenized row, in tokens.")
    overlong: Literal["drop", "truncate"] = Field("drop", description="What to do with rows longer than max_length.")
    skip_bad_rows: bool = Field(False, description="Skip rows that do not match the schema instead of failing.")
    reasoning: Literal["keep", "drop"] = Field(
        "keep",
        description="The rows' reasoning (the sample's analysis, a message's `reasoning`/`thinking`): keep trains "
        "the model to write it; drop trains the answers alone, for a model whose chat template has no reasoning "
        "field (Llama, Gemma, ...: rows with reasoning are refused for it otherwise). The eval then scores no "
        "reasoning.",
    )
    reasoning_effort: Literal["low", "medium", "high"] = Field(
        "medium",
        description="The system message's `Reasoning:` level for rows without their own `reasoning_effort` "
        "(harmony's default is medium; a request's reasoning_effort sets it at serving).",
    )
    conversation_date: datetime.date | None = Field(
        None,
        description="The `Current date:` harmony renders into every training example and served prompt (gpt-oss; "
        "vLLM's VLLM_SYSTEM_START_DATE at serving): a fixed ISO date (YYYY-MM-DD) makes training and serving render "
        "the same tokens on any day. Default: the day it runs, as vLLM does. A chat template renders no date: "
        "ignored there.",
    )
    loss_on: Literal["assistant", "all"] = Field(
        "assistant",
        description="Tokens the loss trains: the assistant's analysis + final (default), or every token, as the "
        "Databricks recipe does (TRL's default on a messages column).",
    )
    eval: EvalSplit | None = Field(
        None, description="Held-out rows for validation loss and `toolkit eval` (none by default)."
    )

    def channels(self) -> dict[str, str]:
        """Each data source by the channel a job reads it from: 'train', and 'eval' for data.eval.source."""
        held_out = self.eval.source if self.eval is not None else None
        return {"train": self.source, **({"eval": held_out} if held_out else {})}

    @model_validator(mode="after")
    def _held_out_is_not_the_training_data(self) -> DataSettings:
        """data.eval.source naming data.source's own split: every held-out row is trained on, and the eval measures
        memory, not the skill (`toolkit eval`'s interval would look like learning)."""
        held_out = self.eval.source if self.eval is not None else None
        if held_out is None or self.eval is None:
            return self
        if _same_source(held_out, self.source) and (self.eval.split or self.split) == self.split:
            other_split = (
                "set data.eval.split to another split of it (e.g. test), " if source_has_splits(self.source) else ""
            )
            raise ValueError(
                f"data.eval.source is data.source ({self.source}, split {self.split}): its rows are trained on, so "
                f"they are not held out; {other_split}name a source of held-out rows, or hold out part of "
                "data.source with data.eval.fraction instead"
            )
        return self

    @field_validator("source")
    @classmethod
    def _names_something(cls, value: str) -> str:
        if not value.strip():  # an empty path would read the working directory
            raise ValueError(
                f"data.source is empty: name a file, directory, s3:// URI, hub dataset or {SAMPLE_DATASET}"
            )
        return _nameable("data.source", value)


class LoraSettings(StrictModel):
    """The LoRA adapter (PEFT)."""

    r: int = Field(8, ge=1, description="Rank.")
    alpha: int = Field(16, ge=1, description="Scaling numerator (lora_alpha).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="Modules to adapt; all-linear on gpt-oss means q/k/v/o_proj. On Qwen3-MoE peft reads "
        "all-linear as the router and every expert too: there the default is q/k/v/o_proj by name, and all-linear "
        "written out is refused.",
    )
    target_parameters: list[str] = Field(
        default_factory=list,
        description="3-D parameters to adapt, e.g. gpt-oss experts: "
        "['mlp.experts.gate_up_proj', 'mlp.experts.down_proj'].",
    )
    expert_r: int | None = Field(
        None,
        ge=1,
        description="Rank of the expert LoRA (lora.target_parameters); default lora.r. Their scaling stays "
        "alpha / r. Each expert has its own factors, so trainable parameters grow with rank x experts: 120b at r16 "
        "has 1.07 B (too many for an 80 GB GPU); 4 gives 0.27 B.",
    )

    @model_validator(mode="after")
    def _expert_lora_needs_no_dropout(self) -> LoraSettings:
        if self.target_parameters and self.dropout != 0:
            raise ValueError("PEFT rejects dropout on target_parameters (expert LoRA): set lora.dropout to 0")
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise ValueError("lora.target_modules is empty: list module names or use 'all-linear'")
        if self.expert_r is not None and not self.target_parameters:
            raise ValueError("lora.expert_r does nothing without lora.target_parameters (expert LoRA): set those, "
                             "or remove expert_r")  # fmt: skip
        return self

    @property
    def max_rank(self) -> int:
        """The largest rank in the adapter: what a server's --max-lora-rank must hold."""
        return max(self.r, self.expert_r or 0)

    def rank_patterns(self) -> tuple[dict[str, int], dict[str, float]]:
        """peft's rank_pattern and alpha_pattern: lora.expert_r for each target parameter (peft matches patterns
        against `module.parameter` for target_parameters, and so does vLLM's PEFTHelper for MoE LoRA), with alpha
        scaled to keep their scaling at alpha / r."""
        if self.expert_r is None or self.expert_r == self.r:
            return {}, {}
        alpha = self.alpha * self.expert_r / self.r
        return dict.fromkeys(self.target_parameters, self.expert_r), dict.fromkeys(self.target_parameters, alpha)


class MlflowSettings(StrictModel):
    """Where training.report_to: [mlflow] logs (parameters, the metrics of every logged step)."""

    tracking_uri: str = Field(
        ...,
        pattern=r"^(https?://|arn:aws[a-z-]*:sagemaker:|databricks|file:)",
        description="The tracking server: http(s)://host:port, a SageMaker managed MLflow tracking server's ARN "
        "(`toolkit infra deploy --mlflow-tracking-server ARN` lets the execution role log to it), 'databricks', "
        "or file:/path (local runs only).",
    )
    experiment: str = Field("toolkit", min_length=1, description="Experiment the runs are logged under.")


class DpoSettings(StrictModel):
    """Direct preference optimisation (TRL's DPO loss): the reference is the base model with the adapter switched
    off, so no second copy of the model is held."""

    beta: float = Field(0.1, gt=0, description="How far the tuned policy may move from the reference (DPO's beta).")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field(
        "sigmoid", description="sigmoid: DPO's loss; ipo: IPO (beta is its regulariser); hinge: SLiC's."
    )


class RewardSetting(StrictModel):
    """One of GRPO's rewards: a built-in by name, or your function beside the data."""

    name: str = Field(
        description=f"A built-in ({', '.join(BUILTIN_REWARDS)}) or `file.py:function`: a Python file in the "
        "data.source directory (uploaded with the data, loaded in the job) whose function takes (prompts, "
        "completions, **columns) as TRL's reward functions do and returns one float (or None) per completion.",
    )
    weight: float = Field(1.0, description="Its weight in the sum GRPO normalises per prompt's group.")

    @field_validator("name")
    @classmethod
    def _known_reward(cls, value: str) -> str:
        if value in BUILTIN_REWARDS or USER_REWARD.fullmatch(value):
            return value
        import difflib

        close = difflib.get_close_matches(value, list(BUILTIN_REWARDS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"training.grpo.rewards: unknown reward {value[:60]!r}; {hint}use a built-in "
            f"({', '.join(BUILTIN_REWARDS)}) or file.py:function (a Python file in the data.source directory)"
        )

    @field_validator("weight")
    @classmethod
    def _weighs(cls, value: float) -> float:
        if value == 0:
            raise ValueError("training.grpo.rewards: a weight of 0 scores nothing: remove the reward instead")
        return value


class GrpoSettings(StrictModel):
    """Group relative policy optimisation (TRL's GRPOTrainer): each prompt's replies sampled by the model being
    trained, each scored by the rewards, advantages relative to the prompt's group."""

    num_generations: int = Field(4, ge=2, le=64, description="Replies sampled per prompt (the group).")
    max_completion_length: int = Field(256, ge=8, description="Longest sampled reply, in tokens.")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of the replies.")
    beta: float = Field(
        0.04, ge=0, description="The KL term's weight (0: none); the reference is the base, adapter off."
    )
    rewards: list[RewardSetting] = Field(
        default_factory=lambda: [RewardSetting(name="format_valid"), RewardSetting(name="reasoning_language")],
        min_length=1,
        description="The rewards and their weights; each is logged as rewards/<name>/mean.",
    )

    @field_validator("rewards")
    @classmethod
    def _each_once(cls, value: list[RewardSetting]) -> list[RewardSetting]:
        names = [reward.name for reward in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"training.grpo.rewards: {', '.join(twice)} listed twice: give it one weight")
        return value


class TrainingSettings(StrictModel):
    """The optimisation loop (TRL's trainer of training.method: its record in toolkit_train/methods/__init__.py)."""

    method: str = Field(
        SFT.name,
        description="; ".join(f"{m.name}: {m.describes}" for m in METHODS.values()) + ".",
        json_schema_extra={"enum": list(METHODS)},
    )
    dpo: DpoSettings = Field(default_factory=DpoSettings, description="training.method dpo: its loss.")
    grpo: GrpoSettings = Field(default_factory=GrpoSettings, description="training.method grpo: sampling, rewards.")

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in METHODS:
            shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
            import difflib

            close = difflib.get_close_matches(value.lower(), list(METHODS), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"training.method: unknown method {shown}; {hint}choose one of: {', '.join(METHODS)}")
        return value

    @property
    def method_record(self) -> TrainingMethod:
        """training.method's record (toolkit_train/methods/__init__.py): what the code asks instead of its name."""
        return method_named(self.method)

    learning_rate: float = Field(2e-4, gt=0, description="Peak learning rate.")
    num_epochs: float = Field(1, gt=0, description="Epochs; ignored when max_steps is set.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    per_device_batch_size: int = Field(1, ge=1, description="Rows per micro-batch per GPU.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    lr_scheduler: Literal["cosine_with_min_lr", "cosine", "linear", "constant", "constant_with_warmup"] = Field(
        "cosine_with_min_lr", description="Learning-rate schedule after warmup."
    )
    min_lr_rate: float = Field(0.1, ge=0, le=1, description="Floor of cosine_with_min_lr, as a fraction of the peak.")
    warmup_ratio: float = Field(0.03, ge=0, lt=1, description="Fraction of steps spent warming up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_beta2: float = Field(0.999, gt=0, lt=1, description="AdamW beta2 (the HyperPod recipes use 0.95).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="Recompute activations: less memory, ~30% more compute. auto: on for FSDP and for GPUs "
        "under 100 GiB (H100/A100), off on larger ones (H200/B200) and on CPU.",
    )
    compile_layers: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile the decoder layers (faster: docs/performance.md). auto: on for packed ddp "
        "training on a GPU without expert LoRA: whole layers with bf16 experts and no recomputation, the attention "
        "blocks and routers with MXFP4 experts (recomputation or not): the combinations the bench's correctness gate "
        "checks, on gpt-oss; off elsewhere (Qwen3 too: true compiles it unchecked). The first steps are slower "
        "while the layers compile.",
    )
    seed: int = Field(42, description="Seeds LoRA init, data order and dropout (resumes stay identical).")
    save_steps: int = Field(50, ge=0, description="Checkpoint every N steps (0: only at the end and on SIGTERM).")
    save_total_limit: int = Field(2, ge=1, description="Checkpoints kept.")
    logging_steps: int = Field(1, ge=1, description="Print a metrics line every N steps.")
    report_to: list[Literal["mlflow", "tensorboard"]] = Field(
        default_factory=list, description="Also log metrics to these trackers (mlflow: set training.mlflow too)."
    )
    mlflow: MlflowSettings | None = Field(None, description="The MLflow tracking server, for report_to: [mlflow].")
    distributed: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp replicates the model; fsdp shards it (models that do not fit one GPU)."
    )
    fsdp_sharding: Literal["full_shard", "hybrid_shard"] = Field(
        "full_shard",
        description="fsdp: shard over every GPU of every node (full_shard), or within each node and replicate "
        "across nodes (hybrid_shard: less inter-node traffic; the HyperPod recipes' choice).",
    )
    packing: bool = Field(
        True,
        description="Pack rows into token-budget micro-batches with per-document attention masks (no padding, "
        "no attention across rows) and run the LM head only on trained tokens. Off: the recipe's padded batches.",
    )
    tokens_per_micro_batch: int | None = Field(
        None,
        ge=16,
        description="Token budget of a packed micro-batch; default data.max_length x per_device_batch_size.",
    )
    merge_adapter: bool = Field(True, description="Also write the adapter merged into the base weights (for vLLM).")

    @model_validator(mode="after")
    def _mlflow_has_a_server(self) -> TrainingSettings:
        if "mlflow" in self.report_to and self.mlflow is None:
            raise ValueError(
                "training.report_to lists mlflow but training.mlflow.tracking_uri is not set: name the tracking "
                "server (a job's local mlruns directory is lost when the job ends)"
            )
        return self  # where mlflow, min_lr_rate, fsdp_sharding apply: toolkit.config.applicability (checked at submit)


class TrainSettings(StrictModel):
    """Everything the training entrypoint needs: the same object on every target."""

    model: ModelSettings
    data: DataSettings
    lora: LoraSettings = Field(default_factory=LoraSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)

    @model_validator(mode="after")
    def _method_reads_its_rows(self) -> TrainSettings:
        """Each method reads its own rows (DPO pairs, SFT conversations) and refuses another's."""
        method, data_format = self.training.method_record, self.data.format
        if data_format not in method.data_formats:
            owner = method_reading(data_format)
            if owner is not SFT:  # conversations are everyone's rows; pairs and prompts name their method
                raise ValueError(
                    f"data.format {data_format} holds {owner.reads}, which {method.describes.split(' (')[0]} does "
                    f"not read: set training.method: {owner.name}"
                )
            raise ValueError(
                f"training.method {method.name} trains on {method.reads}, not {data_format!r} rows: set "
                f"data.format: {method.data_formats[0]}{method.format_hint}"
            )
        if method.pairs and self.data.overlong == "truncate":
            raise ValueError(
                "data.overlong truncate: a preference pair is not truncated (the cut would fall inside one reply "
                "and not the other): set data.overlong: drop, or raise data.max_length"
            )
        return self

    @model_validator(mode="after")
    def _lora_targets_exist(self) -> TrainSettings:
        """The family's names: a LoRA target the model does not have would be ignored (expert LoRA: silently)."""
        family = self.model.family
        if family.lora_modules is None:
            return self
        if family.all_linear_reaches_experts and self.lora.target_modules == "all-linear":
            if "target_modules" in self.lora.model_fields_set:
                raise ValueError(
                    f"lora.target_modules: all-linear on {family.name} adapts, to peft, the router and every expert "
                    f"too (transformers v4's linear layers; gate_up_proj at twice the rank): list the modules, e.g. "
                    f"[{', '.join(family.lora_modules)}], and the experts in lora.target_parameters if you want them "
                    f"({', '.join(family.expert_parameters)}, with lora.dropout: 0)"
                )
            self.lora.target_modules = list(family.lora_modules)  # the default: the family's modules, by name
        modules = self.lora.target_modules if isinstance(self.lora.target_modules, list) else []
        unknown = sorted(set(modules) - set(family.lora_modules))
        if unknown:
            raise ValueError(
                f"lora.target_modules: {family.name} has no module(s) {', '.join(unknown)}; its LoRA-able modules "
                f"are {', '.join(family.lora_modules)}"
                + (" (the experts are 3-D parameters: lora.target_parameters)" if family.expert_parameters else "")
            )
        unknown = sorted(set(self.lora.target_parameters) - set(family.expert_parameters))
        if unknown:
            raise ValueError(
                f"lora.target_parameters: {family.name} has no parameter(s) {', '.join(unknown)}; use "
                f"{', '.join(family.expert_parameters) or 'none (it has no 3-D expert parameters)'}"
            )
        return self

    @model_validator(mode="after")
    def _packed_experts_fit(self) -> TrainSettings:
        if self.model.experts != "mxfp4":
            return self
        family = self.model.known_family
        if (family is not None and not family.packed_mxfp4) or self.model.id == TINY_GPT_OSS:
            raise ValueError(
                f"model.experts: mxfp4 is for gpt-oss MXFP4 checkpoints; {self.model.id} is not one: set "
                f"model.experts: bf16 (or model.id: {TINY_GPT_OSS_MXFP4} to try it)"
            )
        if self.training.distributed != "ddp":
            raise ValueError(
                "model.experts: mxfp4 trains with training.distributed: ddp (each GPU holds the packed model; "
                "gpt-oss-120b packed is ~65 GB): set ddp, or model.experts: bf16 for fsdp"
            )
        return self

    @model_validator(mode="after")
    def _budget_holds_a_row(self) -> TrainSettings:
        budget = self.training.tokens_per_micro_batch
        if self.training.packing and budget is not None and budget < self.data.max_length:
            raise ValueError(
                f"training.tokens_per_micro_batch ({budget}) is below data.max_length ({self.data.max_length}): "
                "a row that long fits no micro-batch; raise the budget or lower data.max_length"
            )
        return self

    def micro_batch_tokens(self) -> int:
        """A packed micro-batch's token budget: training.tokens_per_micro_batch, by default one full-length row per
        device batch slot."""
        return self.training.tokens_per_micro_batch or self.data.max_length * self.training.per_device_batch_size


TRAIN_SECTIONS = tuple(TrainSettings.model_fields)


# Where a run stops, how often it saves and logs, where it reports, whether it merges: changing these continues the
# same run (raising max_steps trains on from the last checkpoint, the schedule stretched to the new end); every
# other setting defines the run's trajectory, and checkpoints of another trajectory are never resumed from.
NOT_TRAJECTORY = (
    "training.max_steps",
    "training.num_epochs",
    "training.save_steps",
    "training.save_total_limit",
    "training.logging_steps",
    "training.report_to",
    "training.mlflow",
    "training.merge_adapter",
)


def trajectory(hyperparameters: dict[str, str]) -> dict[str, str]:
    """The hyperparameters (to_hyperparameters') that a run's checkpoints belong to: all but NOT_TRAJECTORY."""
    return {key: value for key, value in hyperparameters.items() if key not in NOT_TRAJECTORY}


def to_hyperparameters(settings: TrainSettings) -> dict[str, str]:
    """Flatten to SageMaker hyperparameters: dotted keys, JSON-encoded values."""
    flat: dict[str, str] = {}
    for section in TRAIN_SECTIONS:
        for key, value in getattr(settings, section).model_dump(mode="json").items():
            flat[f"{section}.{key}"] = json.dumps(value)
    return flat


def from_hyperparameters(flat: dict[str, Any]) -> TrainSettings:
    """Inverse of `to_hyperparameters`; tolerates values SageMaker passed through unquoted."""
    nested: dict[str, dict[str, Any]] = {}
    for dotted, raw in flat.items():
        section, _, key = dotted.partition(".")
        if not key:
            raise ValueError(f"hyperparameter {dotted!r} is not of the form section.key")
        nested.setdefault(section, {})[key] = _decode(raw)
    return TrainSettings.model_validate(nested)


def _decode(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw

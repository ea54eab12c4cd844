"""GRPO (training.method grpo) without training: its prompt rows, its settings' refusals, its rewards on replies the
tiny gpt-oss tokenizer renders as the model samples them (harmony's channels), and a user's reward beside the data.
And one run through the entrypoint, killed, stopped and resumed."""

from __future__ import annotations

import json
import signal

import pytest
from pydantic import ValidationError
from toolkit_train.data import DataError, PrepareReport, load_rows, prompt_dataset, to_prompt
from toolkit_train.families import harmony
from toolkit_train.families.formats import HARMONY
from toolkit_train.methods.rewards import (
    RewardError,
    format_valid,
    language_matches,
    parse_reply,
    reward_functions,
)
from toolkit_train.settings import DataSettings, GrpoSettings, RewardSetting

from tests.toolkit_train.helpers import adapter_tensors, entrypoint, lay_out, losses, steps

SAMPLE = "builtin:multilingual-thinking-sample"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def sampled(tokenizer, analysis: str | None, final: str | None, end: str = "<|return|>") -> list[int]:
    """A reply as the model samples it after the prompt's `<|start|>assistant`: harmony's channels and end token."""
    text = ""
    if analysis is not None:
        text += f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant"
    if final is not None:
        text += f"<|channel|>final<|message|>{final}{end}"
    return tokenizer.encode(text, add_special_tokens=False)


def test_the_samples_rows_are_prompts_with_their_final_answer_as_reference_and_the_language_asked():
    rows = load_rows(SAMPLE)
    item = to_prompt(rows[0])
    assert [m["role"] for m in item["conversation"]["messages"]] == ["system", "user"]
    assert item["answer"] == rows[0]["final"] and item["reasoning_language"] == rows[0]["reasoning_language"]
    chat = {"messages": [{"role": "system", "content": "reasoning language: German"},
                         {"role": "user", "content": "Wie spät?"}]}  # fmt: skip
    assert to_prompt(chat) == {**to_prompt(chat), "answer": None, "reasoning_language": "German"}
    assert to_prompt({**chat, "answer": "Zehn."})["answer"] == "Zehn."


@pytest.mark.parametrize(
    ("row", "said"),
    [({"messages": [{"role": "system", "content": "x"}]}, "has no user message"),
     ({"messages": [{"role": "user", "content": "hi"}], "answer": 3}, "'answer' must be the reference"),
     ({"messages": "hi"}, "field 'messages' is missing or not a list"),
     ({"reasoning_language": "French"}, "field 'messages' is missing")],
)  # fmt: skip
def test_a_prompt_row_grpo_cannot_use_is_refused_naming_the_field(row, said):
    with pytest.raises(ValueError, match=said):
        to_prompt(row)


def test_prompts_are_rendered_as_the_server_renders_a_request(tokenizer):
    """Each prompt's ids are harmony's prompt for the next assistant turn, on the configured date: what vLLM renders
    for the same request (training = serving), and what the trainer samples after."""
    data = DataSettings(source=SAMPLE, format="prompts", conversation_date="2026-12-06")
    prompts = prompt_dataset(load_rows(SAMPLE), tokenizer, data, PrepareReport(), HARMONY)
    first = to_prompt(load_rows(SAMPLE)[0])
    assert prompts[0]["prompt_ids"] == harmony.prompt_ids(first["conversation"], "2026-12-06")
    assert prompts[0]["prompt"].endswith("<|start|>assistant") and "2026-12-06" in prompts[0]["prompt"]
    assert len(prompts) == 60 and all(answer for answer in prompts["answer"])


def test_a_dataset_of_bad_prompt_rows_is_one_line():
    data = DataSettings(source=SAMPLE, format="prompts")
    rows = [{"messages": [{"role": "system", "content": "x"}]}] * 3
    with pytest.raises(DataError) as refused:
        prompt_dataset(rows, None, data, PrepareReport(), HARMONY)
    assert "\n" not in str(refused.value) and "has no user message" in str(refused.value)


def test_replies_are_parsed_by_channel_and_format_valid_asks_what_the_eval_asks(tokenizer):
    ends = [tokenizer.eos_token_id]
    whole = parse_reply(sampled(tokenizer, "Der Nutzer fragt.", "Zehn."), tokenizer, True, ends)
    assert (whole.reasoning, whole.content, whole.finished, whole.leaked) == ("Der Nutzer fragt.", "Zehn.", True, False)
    assert format_valid(whole, writes_reasoning=True) == 1.0
    cut = parse_reply(sampled(tokenizer, "Der Nutzer", None)[:-2], tokenizer, True, ends)
    no_answer = parse_reply(sampled(tokenizer, "Der Nutzer fragt.", None) + ends, tokenizer, True, ends)
    no_reasoning = parse_reply(sampled(tokenizer, None, "Zehn."), tokenizer, True, ends)
    leaked = parse_reply(sampled(tokenizer, "x", "Zehn.<|start|>user"), tokenizer, True, ends)
    looping = parse_reply(sampled(tokenizer, "Der Nutzer fragt. " * 2, "zehn und zehn " * 12), tokenizer, True, ends)
    for reply in (cut, no_answer, no_reasoning, leaked, looping):
        assert format_valid(reply, writes_reasoning=True) == 0.0, reply
    assert format_valid(no_reasoning, writes_reasoning=False) == 1.0  # a model trained without reasoning


def test_a_chat_templates_reply_is_parsed_by_its_think_block(tiny_qwen3_path):
    """Qwen3's replies (a chat-template family): the <think> block is the reasoning, what follows the answer, the
    end-of-turn token the end."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("<think>\nDer Nutzer fragt.\n</think>\n\nZehn.<|im_end|>", add_special_tokens=False)
    reply = parse_reply(ids, tokenizer, False, [end])
    assert (reply.reasoning, reply.content, reply.finished, reply.leaked) == ("Der Nutzer fragt.", "Zehn.", True, False)
    unthought = parse_reply(tokenizer.encode("Zehn.", add_special_tokens=False), tokenizer, False, [end])
    assert (unthought.reasoning, unthought.content, unthought.finished) == ("", "Zehn.", False)
    assert format_valid(reply, writes_reasoning=True) == 1.0 and format_valid(unthought, writes_reasoning=False) == 0.0


def test_each_builtin_reward_scores_its_rows_and_leaves_out_rows_it_does_not_apply_to(tokenizer):
    names = ["format_valid", "reasoning_language", "exact_match", "regex_match"]
    rewards = reward_functions(names, None, tokenizer, True, [tokenizer.eos_token_id], True)
    german, english = "Der Nutzer fragt, wie viele Planeten es gibt. Es sind acht.", "The user asks how many there are."
    replies = [sampled(tokenizer, german, "Eight planets."), sampled(tokenizer, english, "eight planets")]
    columns = {"answer": ["Eight planets.", None], "reasoning_language": ["German", None]}
    scores = {
        f.__name__: f(prompts=["p", "p"], completions=["", ""], completion_ids=replies, **columns) for f in rewards
    }
    assert scores == {"format_valid": [1.0, 1.0], "reasoning_language": [1.0, None], "exact_match": [1.0, None],
                      "regex_match": [1.0, None]}  # fmt: skip
    assert language_matches("The user asks how many planets there are.", "German") == 0.0


def test_a_user_reward_beside_the_data_is_loaded_and_its_scores_checked(tokenizer, tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(prompts, completions, reasoning, **columns):\n"
        "    return [1.0 / (1 + len(c)) for c in completions]\n"
        "def broken(prompts, completions, **columns):\n"
        "    return [1.0]\n"
    )
    ids = [sampled(tokenizer, "x", "ok"), sampled(tokenizer, "x", "a longer answer")]
    brevity, broken = reward_functions(["my_rewards.py:brevity", "my_rewards.py:broken"], tmp_path, tokenizer, True,
                                       [tokenizer.eos_token_id], True)  # fmt: skip
    assert brevity(prompts=["p", "p"], completions=["", ""], completion_ids=ids) == [1 / 3, 1 / 16]
    with pytest.raises(RewardError, match="returned 1 values for 2 replies"):
        broken(prompts=["p", "p"], completions=["", ""], completion_ids=ids)
    for name, said in (("missing.py:f", "no file missing.py in the data directory"),
                       ("my_rewards.py:nothing", "defines no function 'nothing'")):  # fmt: skip
        with pytest.raises(RewardError, match=said):
            reward_functions([name], tmp_path, tokenizer, True, [], True)
    with pytest.raises(RewardError, match="data.source is no directory here"):
        reward_functions(["my_rewards.py:brevity"], None, tokenizer, True, [], True)


@pytest.mark.parametrize(
    ("rewards", "said"),
    [([{"name": "format_vaild"}], "did you mean 'format_valid'"),
     ([{"name": "/etc/x.py:f"}], "unknown reward"),
     ([{"name": "../x.py:f"}], "unknown reward"),
     ([{"name": "exact_match", "weight": 0}], "a weight of 0 scores nothing"),
     ([{"name": "exact_match", "weight": float("inf")}], "finite"),
     ([{"name": "exact_match"}, {"name": "exact_match", "weight": 2}], "exact_match listed twice"),
     ([], "at least 1")],
)  # fmt: skip
def test_rewards_grpo_cannot_use_are_refused_in_one_line(rewards, said):
    with pytest.raises(ValidationError, match=said):
        GrpoSettings(rewards=rewards)


def test_the_default_rewards_are_the_eval_metrics_a_user_reads():
    assert [r.name for r in GrpoSettings().rewards] == ["format_valid", "reasoning_language"]
    assert RewardSetting(name="sub/dir/r.py:score").name == "sub/dir/r.py:score"


@pytest.mark.integration
def test_grpo_killed_then_stopped_resumes_to_the_uninterrupted_adapter_and_merges(tmp_path):
    """The one trained GRPO run of the suite (the tiny-gpt-oss-grpo preset, small: 8 prompts, 1 per step, 2 replies
    of up to 24 tokens), 6 steps over three processes of the same command, as the DPO run is tried: SIGKILLed inside
    its step-4 save it resumes from checkpoint-2; stopped there by SIGTERM it checkpoints step 3 and exits 143; the
    third resumes from checkpoint-3, finishes and merges. The kill's half-saved checkpoint-4 holds the adapter of the
    run uninterrupted up to step 4, and the resumed run's checkpoint-4 equals it exactly: the resumes restored the
    adapter, the optimizer, the prompt order and the sampling's random state. Each step logs the mean reward, and
    run.json keeps each reward's mean per step."""
    rows = load_rows(SAMPLE)
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({k: row[k] for k in ("reasoning_language", "developer", "user", "final")})
                              + "\n" for row in list(rows)[:8]))  # fmt: skip
    overrides = [f"data.source={source}", "data.eval=null", "training.max_steps=6", "training.save_steps=2",
                 "training.per_device_batch_size=1", "training.grpo.max_completion_length=24",
                 "training.grpo.num_generations=2",
                 "training.learning_rate=2e-3"]  # fmt: skip
    root = lay_out(tmp_path / "run", overrides, preset="tiny-gpt-oss-grpo")
    saved = root / "checkpoints"
    code, killed = entrypoint(root, fault="checkpoint-save-4")
    assert code == -signal.SIGKILL and "fault point checkpoint-save-4: killing the run" in killed, killed[-3000:]
    assert "GRPO on 8 prompts, 2 replies each (up to 24 tokens, temperature 1.0), rewards format_valid x1, " in killed
    assert len(losses(killed)) == 4 and all(" reward=" in line for line in killed.splitlines()
                                            if line.startswith("[metrics] step="))  # fmt: skip

    code, stopped = entrypoint(root, sigterm_at="resuming from")
    assert code == 143 and "stopped by SIGTERM at step 3" in stopped, stopped[-3000:]
    assert f"resuming from {saved / 'checkpoint-2'}" in stopped

    code, finished = entrypoint(root)
    assert code == 0, finished[-3000:]
    assert f"resuming from {saved / 'checkpoint-3'}" in finished
    before, after = steps(killed), {**steps(stopped), **steps(finished)}
    assert [after[3], after[4]] == [before[3], before[4]], (before, after)
    uninterrupted, ours = adapter_tensors(saved / "checkpoint-4.incomplete"), adapter_tensors(saved / "checkpoint-4")
    assert ours.keys() == uninterrupted.keys()
    assert max(float((ours[k] - uninterrupted[k]).abs().max()) for k in ours) == 0.0

    run = json.loads((root / "model" / "run.json").read_text())
    assert run["global_step"] == 6 and run["trained"]["paths"]["method"] == "grpo"
    logged = [entry for entry in run["log_history"] if "reward" in entry]
    assert logged and logged[-1]["step"] == 6
    for entry in logged:
        assert 0 <= entry["rewards/format_valid/mean"] <= 1 and "kl" in entry
    assert (root / "model" / "adapter" / "adapter_model.safetensors").is_file()
    assert (root / "model" / "merged" / "config.json").is_file()
    # the KL term's reference is the base, adapter off: no frozen "ref" copy of the adapter saved anywhere
    assert not [p for p in [*saved.rglob("ref"), *(root / "model").rglob("ref")] if p.is_dir()]


@pytest.mark.parametrize("experts", ["bf16", "mxfp4"])
def test_grpos_reference_is_the_base_with_the_adapter_off_on_packed_experts_too(experts, tmp_path):
    """TRL, handed the toolkit's PEFT model, would add a frozen "ref" copy of the adapter as the KL term's reference
    (saved beside the adapter, and on packed MXFP4 experts with expert LoRA, a crash: ModuleDict has no attribute
    'ref', found by the GPU bench's CPU smoke). The trainer holds one adapter, the trained one; TRL then scores the
    reference with the adapter off: the base."""
    from toolkit_train.layout import Paths
    from toolkit_train.run.model import load_tokenizer
    from toolkit_train.run.trainer import load_for_training
    from toolkit_train.trainers import build_trainer

    from toolkit.config import load_config

    mxfp4 = ["model.id=builtin:tiny-gpt-oss-mxfp4", "model.experts=mxfp4"] if experts == "mxfp4" else []
    settings = load_config("tiny-gpt-oss-grpo", [*mxfp4, "data.eval=null"]).train_settings()
    tokenizer = load_tokenizer(settings.model)
    rows = list(load_rows(SAMPLE))[:4]
    prompts = prompt_dataset(rows, tokenizer, settings.data, PrepareReport(), HARMONY)
    model, _, _ = load_for_training(settings)
    paths = Paths(root=tmp_path, model_dir=tmp_path / "model", checkpoints=tmp_path / "checkpoints",
                  train_channel=tmp_path / "train", output_data=tmp_path)  # fmt: skip
    trainer = build_trainer(settings, paths, model, tokenizer, prompts)
    assert list(trainer.model.peft_config) == ["default"]
    assert settings.lora.target_parameters  # expert LoRA on the (packed) experts, the preset's


def test_the_check_before_launch_reads_a_template_familys_rows_as_prompts(tiny_qwen3_path, tmp_path):
    """`toolkit config validate` and train's check before launch render a GRPO config's first rows as prompts (a
    prompt without a reference is a prompt, not an SFT row missing its answer), and refuse one with no user turn."""
    from toolkit import sdk
    from toolkit.config import load_config
    from toolkit.errors import BadInput

    prompt = {"messages": [{"role": "system", "content": "reasoning language: German"},
                           {"role": "user", "content": "Wie viele Planeten?"}]}  # fmt: skip
    for name, row in (("good", prompt), ("bad", {"messages": prompt["messages"][:1]})):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    grpo = ["training.method=grpo", "data.format=prompts", "data.eval=null"]
    sdk.check(load_config("tiny-qwen3-local", [*grpo, f"data.source={tmp_path / 'good.jsonl'}"]))
    with pytest.raises(BadInput, match="the prompt has no user message"):
        sdk.check(load_config("tiny-qwen3-local", [*grpo, f"data.source={tmp_path / 'bad.jsonl'}"]))

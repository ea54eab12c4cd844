"""Training methods as records (toolkit_train.methods, issue 69): the code asks a method's record, never its name;
every record's fields reach the code that reads them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from toolkit_train import methods
from toolkit_train.methods import METHODS, SFT, method_reading
from toolkit_train.settings import DataSettings, ModelSettings, TrainSettings

ROOT = Path(__file__).resolve().parents[3]
METHODS_MODULE = ROOT / "entrypoints" / "toolkit_train" / "methods" / "__init__.py"


def test_no_module_compares_a_method_name():
    """A method's name is a literal only in its record (inside longer strings, messages and docs, it is fine): a new
    `training.method == "dpo"`, or ("sft",) in a table, fails here."""
    names = "|".join(re.escape(name) for name in METHODS)
    literal = re.compile(rf"""(["'])({names})\1""")
    compared = re.compile(r"\.method\s*(==|!=|\bin\b)")
    offenders = []
    for folder in ("toolkit", "entrypoints", "containers"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == METHODS_MODULE:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if literal.search(line) or compared.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "use the method's record (toolkit_train/methods/__init__.py):\n" + "\n".join(offenders)


def settings(method: str, data_format: str, **data) -> TrainSettings:
    return TrainSettings(model=ModelSettings(id="builtin:tiny-gpt-oss"),
                         data=DataSettings(source="unused", format=data_format, **data),
                         training={"method": method})  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("method", list(METHODS.values()), ids=list(METHODS))
def test_each_method_reads_its_own_formats_and_refuses_anothers_naming_the_fix(method):
    for data_format in method.data_formats:
        assert settings(method.name, data_format).training.method_record is method
    for other in METHODS.values():
        if other is method:
            continue
        for data_format in other.data_formats:
            with pytest.raises(ValidationError) as refused:
                settings(method.name, data_format)
            said = str(refused.value)
            fix = f"training.method: {other.name}" if other is not SFT else f"data.format: {method.data_formats[0]}"
            assert fix in said, said
            assert method_reading(data_format) is other


def test_an_unknown_method_is_refused_with_the_known_ones():
    known = ", ".join(METHODS)
    with pytest.raises(ValidationError, match=f"training.method: unknown method 'kto'; choose one of: {known}"):
        settings("kto", "messages")


def test_a_method_named_in_capitals_or_a_letter_off_is_refused_with_the_one_meant():
    for typed in ("DPO", "dpp", "Sft"):
        with pytest.raises(ValidationError) as refused:
            settings(typed, "messages")
        assert f"did you mean '{typed.lower()[:2]}" in str(refused.value), str(refused.value)


def test_each_records_trl_config_takes_the_arguments_the_method_adds():
    """The record's TRL config class exists in the pinned TRL and accepts what the method adds to it."""
    import trl

    for method in METHODS.values():
        config_class = getattr(trl, method.trl_config)
        training = settings(method.name, method.data_formats[0]).training
        config = config_class(output_dir="/nonexistent", bf16=False, **method.config_arguments(training))
        for key, value in method.config_arguments(training).items():
            assert getattr(config, key) == value, (method.name, key)
    assert methods.names(pairs=True) == ("dpo",) and methods.names(pairs=False) == ("sft", "grpo")
    assert methods.names(samples=True) == ("grpo",) and methods.names(pairs=False, samples=False) == ("sft",)


SAMPLE_OF = {False: "builtin:multilingual-thinking-sample", True: "builtin:preference-sample"}


@pytest.mark.parametrize("method", list(METHODS.values()), ids=list(METHODS))
@pytest.mark.parametrize("model_id", ["builtin:tiny-gpt-oss", "builtin:tiny-qwen3", "builtin:tiny-qwen3-moe",
                                      "builtin:tiny-llama", "builtin:tiny-gemma"])  # fmt: skip
def test_every_method_prepares_its_sample_for_every_family(method, model_id):
    """Each method on each family's tiny model (the generic family's two included): the method's bundled sample
    renders in the family's chat format with trained tokens in every example, or is refused in one line whose fix
    (data.reasoning: drop, for a template with no reasoning field) then renders it, or, for pairs that differ only
    in their reasoning (the bundled preference sample), refuses them in one line: nothing left to prefer."""
    from toolkit_train.data import DataError, PrepareReport, chat_format_of, load_rows, prepare, prompt_dataset
    from toolkit_train.run.model import load_tokenizer

    train = settings(method.name, method.data_formats[0])
    model = ModelSettings(id=model_id)
    data = DataSettings(source=SAMPLE_OF[method.pairs], format=method.data_formats[0], max_length=1024)
    tokenizer, chat_format, rows = load_tokenizer(model), chat_format_of(model), load_rows(data.source)
    if method.samples:  # GRPO: the sample's prompts, as the family's server renders a request (no reasoning in them)
        prompts = prompt_dataset(rows, tokenizer, data, PrepareReport(), chat_format)
        assert len(prompts) == len(rows) and all(prompts["prompt_ids"]) and all(prompts["answer"])
        return
    try:
        prepared = prepare(rows, tokenizer, data, chat_format=chat_format)
    except DataError as exc:
        assert "\n" not in str(exc) and "set data.reasoning: drop" in str(exc), str(exc)
        data = data.model_copy(update={"reasoning": "drop"})
        if method.pairs:
            with pytest.raises(DataError, match="differ only in their reasoning") as refused:
                prepare(rows, tokenizer, data, chat_format=chat_format)
            assert "\n" not in str(refused.value)
            return
        prepared = prepare(rows, tokenizer, data, chat_format=chat_format)
    assert train.training.method_record is method and len(prepared) == len(rows)
    for example in list(prepared)[:5]:
        if method.pairs:
            assert example["prompt_ids"] and example["chosen_ids"] and example["rejected_ids"]
        else:
            assert any(label != -100 for label in example["labels"])

"""Rows in, tokens out: load a dataset, check its schema, render the model family's chat format, tokenize.

The same code runs in `toolkit data prepare` (once, before launch) and in the training container (when
it receives raw rows). Labels are -100 everywhere except the assistant's own tokens (harmony: analysis + final
channel, through the closing <|return|>; a chat template: its assistant replies, through the end of turn): the loss
trains exactly what the model must generate. The format is the family's (toolkit_train/families/formats.py).
"""

from __future__ import annotations

import datetime
import json
import statistics
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .families import formats, harmony
from .families.formats import ChatFormat, FormatError
from .settings import SAMPLE_DATASET, SAMPLES, DataSettings, ModelSettings

SAMPLE_PATH = Path(__file__).parent / "samples" / "multilingual-thinking.jsonl"
IGNORE_INDEX = -100
TOKENIZED_COLUMNS = ("input_ids", "labels")
PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")  # data.format preference: the prompt, each reply after it
UNREADABLE = "__unreadable__"  # a row that could not be parsed: the reason, reported like any bad row


class DataError(Exception):
    """Data that cannot be trained on; the message names the source and the rows."""


@dataclass
class PrepareReport:
    rows_in: int = 0
    bad_rows: list[tuple[int, str]] = field(default_factory=list)
    dropped_overlong: int = 0
    truncated: int = 0
    dropped_untrained: int = 0  # truncated rows with no trained token left (all prompt): nothing to learn from
    lengths: list[int] = field(default_factory=list)
    rows_with_tools: int = 0
    tool_calls: int = 0
    assistant_turns: int = 0  # examples: one per assistant turn (a multi-turn row gives several)
    efforts: dict[str, int] = field(default_factory=dict)

    def count(self, conversation: dict[str, Any]) -> None:
        self.rows_with_tools += bool(conversation["tools"])
        self.tool_calls += sum(len(m.get("tool_calls", ())) for m in conversation["messages"])
        self.efforts[conversation["effort"]] = self.efforts.get(conversation["effort"], 0) + 1

    def summary(self) -> dict[str, Any]:
        lengths = sorted(self.lengths) or [0]
        return {
            "rows_in": self.rows_in,
            "rows_with_tools": self.rows_with_tools,
            "tool_calls": self.tool_calls,
            "reasoning_effort": dict(sorted(self.efforts.items())),
            "assistant_turns": self.assistant_turns,
            "rows_out": len(self.lengths),
            "bad_rows_skipped": len(self.bad_rows),
            "overlong_dropped": self.dropped_overlong,
            "overlong_truncated": self.truncated,
            "untrained_dropped": self.dropped_untrained,
            "tokens": sum(lengths),
            "tokens_min": lengths[0],
            "tokens_median": int(statistics.median(lengths)),
            "tokens_p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
            "tokens_max": lengths[-1],
        }


def load_rows(source: str | Path, split: str = "train"):
    """A `datasets.Dataset` from the builtin sample, a local file/dir, or a hub id."""
    import datasets

    if str(source) == SAMPLE_DATASET:  # flat columns: a datasets.Dataset, as the hub's Multilingual-Thinking
        return datasets.load_dataset("json", data_files=str(SAMPLE_PATH), split="train")
    if str(source) in SAMPLES:  # nested tool schemas: read row by row (Arrow would merge them into one struct)
        return read_json_rows(source, [SAMPLE_PATH.parent / SAMPLES[str(source)]])
    path = Path(source)
    if path.is_dir() and any((path / marker).exists() for marker in ("state.json", "dataset_dict.json")):
        loaded = datasets.load_from_disk(str(path))
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise DataError(
            f"{source}: not a regular file or directory (a pipe, socket or device): save the rows to a file"
        )
    if path.exists():
        files = [path] if path.is_file() else data_files(path)
        json_files = [p for p in files if p.suffix in (".jsonl", ".json")]
        if json_files:
            return read_json_rows(source, json_files)
        for kind, suffixes in (("parquet", (".parquet",)),):
            matching = [str(p) for p in files if p.suffix in suffixes]
            if matching:
                try:
                    return datasets.load_dataset(kind, data_files=matching, split="train")
                except Exception as exc:
                    raise DataError(f"{source}: cannot read {kind} data: {_first_line(exc)}") from exc
        raise DataError(
            f"{source}: no .jsonl, .json, .parquet or save_to_disk dataset found (a directory is read for "
            f"{', '.join('*' + s for s in DIRECTORY_SUFFIXES)} files outside hidden directories)"
        )
    if str(source).startswith("s3://"):
        raise DataError(f"{source}: S3 data must be downloaded first (the toolkit maps it to a channel)")
    try:
        return datasets.load_dataset(str(source), split=split)
    except Exception as exc:
        raise DataError(f"{source}: not a local path, and loading it from the hub failed: {_first_line(exc)}") from exc


FORMATS = typing.get_args(DataSettings.model_fields["format"].annotation)
DIRECTORY_SUFFIXES = (".jsonl", ".parquet")  # what a directory source reads; a .json array only when named itself


def data_files(directory: Path) -> list[Path]:
    """The data files under a directory source: JSON Lines and Parquet files, none in a hidden directory nor
    hidden themselves (a checkout's .venv/ or .git/ is not data), regular files only."""
    return sorted(
        p
        for p in directory.rglob("*")
        if p.suffix in DIRECTORY_SUFFIXES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )


class Rows(list):
    """Rows read line by line (JSON Lines): a line that is not UTF-8 or not JSON becomes a bad row with its line
    number, so one broken line fails with a reason (or is skipped with data.skip_bad_rows) instead of the file."""

    places: list[str]  # where each row came from: "rows.jsonl line 7", for every message about a row

    @property
    def column_names(self) -> list[str]:
        return sorted({key for row in self for key in row if key != UNREADABLE})


def read_json_rows(source: str | Path, files: list[Path]) -> Rows:
    rows = Rows()
    rows.places = []
    for file in files:
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise DataError(f"{file}: cannot read it ({exc.strerror}); check its permissions") from None
        if file.suffix == ".json" and raw.lstrip()[:1] == b"[":  # one JSON array of rows
            try:
                items = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DataError(f"{file}: not a valid JSON file ({exc})") from None
            except RecursionError:
                raise DataError(
                    f"{file}: nested too deeply to be rows of JSON (arrays or objects inside each other)"
                ) from None
            lines = [(f"item {i}", item) for i, item in enumerate(items)]
        else:
            lines = [(f"line {n}", line) for n, line in enumerate(raw.splitlines(), 1) if line.strip()]
        for where, item in lines:
            rows.append(_parse_row(item, f"{file.name} {where}"))
            rows.places.append(f"{file.name} {where}")
    if not rows:
        raise DataError(f"{source}: no rows (the file is empty)")
    return rows


def _parse_row(item: Any, where: str) -> dict:
    if isinstance(item, bytes):
        try:
            item = json.loads(item.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return {UNREADABLE: f"{where}: not UTF-8 text (byte {exc.start}); re-save the file as UTF-8"}
        except json.JSONDecodeError as exc:
            return {UNREADABLE: f"{where}: invalid JSON ({exc.msg} at column {exc.colno})"}
        except RecursionError:
            return {UNREADABLE: f"{where}: nested too deeply to be a row (arrays or objects inside each other)"}
    if not isinstance(item, dict):
        return {UNREADABLE: f"{where}: a row must be a JSON object, not {type(item).__name__}"}
    return item


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def to_messages(row: dict[str, Any], fmt: str) -> list[dict[str, Any]]:
    """One row as chat messages; raises ValueError with the reason for a bad row."""
    if UNREADABLE in row:
        raise ValueError(row[UNREADABLE])
    turns = row.get("messages")
    users = sum(isinstance(m, dict) and m.get("role") == "user" for m in turns) if isinstance(turns, list) else 0
    if fmt == "multilingual-thinking" and users > 1:
        return to_messages(row, "messages")  # a multi-turn row: every turn, not only the top-level fields
    if fmt == "multilingual-thinking":
        for key in ("reasoning_language", "user", "final"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise ValueError(f"field {key!r} is missing or empty")
        system = f"reasoning language: {row['reasoning_language']}"
        if isinstance(row.get("developer"), str) and row["developer"].strip():
            system += f"\n\n{row['developer']}"
        assistant: dict[str, Any] = {"role": "assistant", "content": row["final"]}
        if isinstance(row.get("analysis"), str) and row["analysis"].strip():
            assistant["thinking"] = row["analysis"]
        return [{"role": "system", "content": system}, {"role": "user", "content": row["user"]}, assistant]
    if fmt == "prompts":
        return _prompt_messages(row)
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("field 'messages' is missing or not a list")
    return messages


def _prompt_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A `prompts` row (GRPO) as its prompt's messages, followed by its reference answer as an assistant message
    when it has one (`answer`, else the row's closing assistant reply): `messages`, or the Multilingual-Thinking
    fields with `final` optional."""
    if "messages" not in row and isinstance(row.get("user"), str):
        messages = to_messages({**row, "final": row.get("final") or "-"}, "multilingual-thinking")
        if not (isinstance(row.get("final"), str) and row["final"].strip()):
            messages = messages[:-1]
    else:
        given = row.get("messages")
        if not isinstance(given, list) or not given:
            raise ValueError("field 'messages' is missing or not a list (or give the sample's `user` field)")
        messages = given
    reference = row.get("answer")
    if reference is not None and not (isinstance(reference, str) and reference.strip()):
        raise ValueError("field 'answer' must be the reference answer's text")
    while messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        if reference is None and isinstance(messages[-1].get("content"), str) and messages[-1]["content"].strip():
            reference = messages[-1]["content"]
        messages = messages[:-1]
    if not any(isinstance(m, dict) and m.get("role") == "user" for m in messages):
        raise ValueError("messages: the prompt has no user message; GRPO samples replies to a user's request: add it")
    answer = [{"role": "assistant", "content": reference}] if reference else []
    return [*messages, *answer]


def prompt_and_reference(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """A conversation split into the prompt and the reference answer closing it (None where it ends before the
    assistant's turn): what GRPO samples from and what `toolkit eval` asks."""
    if messages and messages[-1].get("role") == "assistant":
        return messages[:-1], messages[-1]["content"]
    return messages, None


def to_prompt(row: dict[str, Any], default_effort: str = "medium") -> dict[str, Any]:
    """A `prompts` row checked as a request: {conversation (normalized, ending before the assistant's turn), answer
    (the reference or None), reasoning_language (what the prompt asks, or None)}."""
    from .methods.rewards import asked_language

    prompt, answer = prompt_and_reference(to_messages(row, "prompts"))
    _tool_schemas(row)
    _field_types(prompt)
    conversation = harmony.normalize(row, prompt, default_effort, complete=False)
    language = row.get("reasoning_language") if isinstance(row.get("reasoning_language"), str) else None
    return {"conversation": conversation, "answer": answer, "reasoning_language": language or asked_language(prompt)}


def prompt_dataset(dataset, tokenizer, settings: DataSettings, report: PrepareReport, chat_format: ChatFormat):
    """GRPO's rows: each prompt rendered as the server renders a request (chat_format.prompt_ids: the family's
    prompt, the date training and serving agree on), with its reference answer and asked reasoning language; a
    dataset of prompt (its text, TRL's key), prompt_ids, answer, reasoning_language. Bad rows as in `prepare`."""
    import datasets

    report.rows_in = len(dataset)
    places = getattr(dataset, "places", None)
    columns: dict[str, list] = {"prompt": [], "prompt_ids": [], "answer": [], "reasoning_language": []}
    date = harmony.conversation_date(settings.conversation_date)  # one date for every prompt
    for index, row in enumerate(dataset):
        try:
            item = to_prompt(row, settings.reasoning_effort)
            chat_format.validate(item["conversation"], tokenizer)  # a prompt the family's format can render
            ids = chat_format.prompt_ids(item["conversation"], tokenizer, date)
        except FormatError as exc:
            raise DataError(str(exc)) from None
        except ValueError as exc:
            _bad_row(report, places, index, exc)
            continue
        if len(ids) > settings.max_length:
            report.dropped_overlong += 1
            continue
        columns["prompt"].append(tokenizer.decode(ids, skip_special_tokens=False))
        columns["prompt_ids"].append(ids)
        columns["answer"].append(item["answer"])
        columns["reasoning_language"].append(item["reasoning_language"])
        report.lengths.append(len(ids))
        report.count(item["conversation"])
    if report.bad_rows and not settings.skip_bad_rows:
        raise DataError(_bad_rows_said(report, settings))
    if not columns["prompt"]:
        raise DataError(f"no prompts left to train on ({report.rows_in} in, {len(report.bad_rows)} bad, "
                        f"{report.dropped_overlong} over data.max_length {settings.max_length})")  # fmt: skip
    return datasets.Dataset.from_dict(columns)


def to_conversation(
    row: dict[str, Any], fmt: str, default_effort: str = "medium", reasoning: str = "keep"
) -> dict[str, Any]:
    """One row checked (roles, tools, tool calls against their schemas, effort) as {messages, tools, effort}; a
    preference row as {chosen, rejected}, each the prompt followed by that reply. `reasoning` drop: the assistant
    messages without their reasoning (data.reasoning)."""
    if fmt == "preference":
        pair = to_pair(row, default_effort)
        if reasoning == "keep":
            return pair
        pair = {key: without_reasoning(one) for key, one in pair.items()}
        if pair["chosen"]["messages"][-1] == pair["rejected"]["messages"][-1]:
            raise ValueError("chosen and rejected differ only in their reasoning, which data.reasoning: drop removes: "
                             "nothing is left to prefer")  # fmt: skip
        return pair
    messages = to_messages(row, fmt)
    _tool_schemas(row)
    _field_types(messages)
    conversation = _no_blank_answer(harmony.normalize(row, messages, default_effort))
    return conversation if reasoning == "keep" else without_reasoning(conversation)


def without_reasoning(conversation: dict[str, Any]) -> dict[str, Any]:
    """A normalized conversation with no message's reasoning (data.reasoning: drop); ValueError for an assistant
    message that would be left with nothing (it held reasoning alone)."""
    messages = [{k: v for k, v in m.items() if k != "thinking"} for m in conversation["messages"]]
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and not (message.get("content") or message.get("tool_calls")):
            raise ValueError(f"messages[{i}]: the assistant message holds reasoning alone, and data.reasoning: drop "
                             "leaves it empty; give it an answer or drop the row")  # fmt: skip
    return {**conversation, "messages": messages}


def _field_types(messages: list[Any]) -> None:
    """Fields harmony.normalize compares or looks up before it checks their type: ValueError naming the message."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if "tool_call_id" in message and not isinstance(message["tool_call_id"], str):
            raise ValueError(f"messages[{i}].tool_call_id must be a string (the id of the call it answers)")
        calls = message.get("tool_calls")
        for j, call in enumerate(calls if isinstance(calls, list) else []):
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and not isinstance(function.get("name"), str):
                raise ValueError(f"messages[{i}].tool_calls[{j}].function.name must be a string (a declared tool)")


def _tool_schemas(row: dict[str, Any]) -> None:
    """Each declared tool's `parameters` is a JSON schema a call's arguments can be checked against: a schema that is
    none (`{"type": 0}`) is the row's fault, a ValueError naming the tool, not a crash of the validator."""
    tools = row.get("tools")
    if not isinstance(tools, list):
        return  # harmony.tool_names says what is wrong with it
    try:
        import jsonschema
    except ImportError:  # the training image may lack it: harmony then checks the required keys alone
        return
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if not isinstance(parameters, dict):
            continue
        try:
            jsonschema.Draft202012Validator.check_schema(parameters)
        except jsonschema.exceptions.SchemaError as exc:
            where = "".join(f"[{p!r}]" for p in exc.absolute_path)
            raise ValueError(f"tools[{i}].function.parameters{where} is not a JSON schema: {exc.message}") from None


def _no_blank_answer(conversation: dict[str, Any]) -> dict[str, Any]:
    """An assistant message whose content is only whitespace would train the model to answer with nothing: refused
    (an empty content beside tool calls or reasoning is no answer, and fine)."""
    for i, message in enumerate(conversation["messages"]):
        content = message.get("content")
        if message["role"] == "assistant" and isinstance(content, str) and content and not content.strip():
            raise ValueError(f"messages[{i}]: the assistant's content is only whitespace; write the answer")
    return conversation


def to_pair(row: dict[str, Any], default_effort: str = "medium") -> dict[str, Any]:
    """A preference row: the prompt's `messages` (ending with the user's or a tool's message), and `chosen` and
    `rejected`, each the assistant's reply (a string, or {content, reasoning}); each whole conversation is checked
    as a training row is."""
    prompt = to_messages(row, "messages")
    _tool_schemas(row)
    _field_types(prompt)
    if isinstance(prompt[-1], dict) and prompt[-1].get("role") == "assistant":
        raise ValueError("messages: the prompt ends with the user's (or a tool's) message; the replies go in "
                         "'chosen' and 'rejected'")  # fmt: skip
    if not any(isinstance(message, dict) and message.get("role") == "user" for message in prompt):
        raise ValueError("messages: the prompt has no user message; a pair's replies answer a user's request: add it")
    pair = {}
    for key in ("chosen", "rejected"):
        reply = {"content": row.get(key)} if isinstance(row.get(key), str) else row.get(key)
        if not isinstance(reply, dict) or not reply:
            raise ValueError(f"field {key!r} must be the assistant's reply: a string, or {{content, reasoning}}")
        message = {"role": "assistant", **{k: v for k, v in reply.items() if k in ("content", "reasoning")}}
        try:
            pair[key] = _no_blank_answer(harmony.normalize(row, [*prompt, message], default_effort))
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    if pair["chosen"]["messages"][-1] == pair["rejected"]["messages"][-1]:
        raise ValueError("chosen and rejected are the same reply: there is nothing to prefer")
    return pair


# gpt-oss's published chat template ends the developer instructions with a blank line even when no tools
# follow; harmony (what vLLM renders for gpt-oss at serving time) does not. Training renders harmony's form,
# so the prompt the served model sees is token for token the prompt it was trained on (a serving test proves it).
GPT_OSS_DEVELOPER_BLANK_LINE = (
    '        {{- developer_message }}\n        {{- "\\n\\n" }}\n    {%- endif %}',
    '        {{- developer_message }}\n        {%- if tools %}{{- "\\n\\n" }}{%- endif %}\n    {%- endif %}',
)


def training_chat_template(tokenizer) -> str:
    """The tokenizer's template with {% generation %} markers, so assistant tokens can be masked."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    patched = template if template and has_generation_markers(template) else None
    if template and patched is None:
        patched = get_training_chat_template(tokenizer)
    if patched is None:
        raise DataError(
            "the tokenizer's chat template has no {% generation %} markers and TRL knows no training "
            "variant of it: the assistant's tokens cannot be told apart for the loss"
        )
    return patched.replace(*GPT_OSS_DEVELOPER_BLANK_LINE)


def chat_format_of(model: ModelSettings) -> ChatFormat:
    """The chat format model.id's family renders in (its record's chat_format: formats.for_family)."""
    chat_format = formats.for_family(model.family)
    if chat_format is None:
        raise DataError(
            f"model.id {model.id}: training renders conversations in a model family's chat format, and this model "
            "is of no family it knows (toolkit_train/families/__init__.py)"
        )
    return chat_format


def is_tokenized(dataset) -> bool:
    return any(all(column in dataset.column_names for column in kind) for kind in (TOKENIZED_COLUMNS, PAIR_COLUMNS))


def tokenized_columns(settings: DataSettings) -> tuple[str, ...]:
    return PAIR_COLUMNS if settings.format == "preference" else TOKENIZED_COLUMNS


def prepare(
    dataset,
    tokenizer,
    settings: DataSettings,
    report: PrepareReport | None = None,
    chat_format: ChatFormat = formats.HARMONY,
):
    """Validate, render (in the model family's `chat_format`: formats.for_family) and tokenize; returns a dataset
    of input_ids + labels and fills `report`."""
    report = report if report is not None else PrepareReport()
    report.rows_in = len(dataset)
    if is_tokenized(dataset) and isinstance(dataset, Rows):
        import datasets

        dataset = datasets.Dataset.from_list(list(dataset))
    if is_tokenized(dataset):
        return _enforce_length(dataset.select_columns(list(tokenized_columns(settings))), settings, report)
    conversations = []
    places = getattr(dataset, "places", None)
    for index, row in enumerate(dataset):
        try:
            conversation = to_conversation(row, settings.format, settings.reasoning_effort, settings.reasoning)
            chat_format.validate(conversation, tokenizer)  # a row the family's format can render
            conversations.append(conversation)
            report.count(conversation.get("chosen", conversation))
        except FormatError as exc:  # no row can be rendered for this tokenizer
            raise DataError(str(exc)) from None
        except ValueError as exc:
            _bad_row(report, places, index, exc)
    if report.bad_rows and not settings.skip_bad_rows:
        raise DataError(_bad_rows_said(report, settings))
    import datasets

    try:
        if settings.format == "preference":
            chat_format.check(tokenizer)
            pairs = tokenize_pairs(conversations, chat_format, tokenizer, settings.conversation_date)
            return _enforce_pair_length(datasets.Dataset.from_dict(pairs), settings, report)
        columns = _tokenize(conversations, tokenizer, settings.loss_on, chat_format, settings.conversation_date)
        tokenized = datasets.Dataset.from_dict(columns)
    except FormatError as exc:
        raise DataError(str(exc)) from None
    report.assistant_turns = len(tokenized)
    return _enforce_length(tokenized, settings, report)


def _bad_row(report: PrepareReport, places: list[str] | None, index: int, exc: ValueError) -> None:
    """A refused row, kept with where it is (its file and line, or its index) for the one-line refusal."""
    where = places[index] if places else f"row {index}"
    reason = str(exc)  # a row that did not parse says where already
    report.bad_rows.append((index, reason if reason.startswith(where) else f"{where}: {reason}"))


def _bad_rows_said(report: PrepareReport, settings: DataSettings) -> str:
    """The refusal of a dataset with bad rows, in one line: a reason every row shares is said once (with the first
    row's place), else the first five; every row bad for different reasons is a format mismatch (skipping them
    would leave none)."""
    bad, count = report.bad_rows, len(report.bad_rows)
    places = [why.partition(": ")[0] for _, why in bad]
    reasons = {why.partition(": ")[2] for _, why in bad}
    formats = f"data.format (one of {', '.join(FORMATS)})"
    if count > 1 and len(reasons) == 1:
        kind = f"; if the rows are of another kind, check {formats}" if count == report.rows_in else ""
        return (f"{'every one' if count == report.rows_in else count} of the {report.rows_in} rows is refused for one "
                f"reason ({places[0]} and the others): {reasons.pop()}{kind}")  # fmt: skip
    shown = "; ".join(why for _, why in bad[:5])
    more = f" (and {count - 5} more)" if count > 5 else ""
    fix = f"Check {formats}" if count == report.rows_in else "Fix them, or set data.skip_bad_rows: true"
    return f"{count} of {report.rows_in} rows are not valid {settings.format!r} rows: {shown}{more}. {fix}"


def tokenize_pairs(
    pairs: list[dict[str, Any]],
    chat_format: ChatFormat = formats.HARMONY,
    tokenizer=None,
    date: datetime.date | str | None = None,
) -> dict[str, list]:
    """Each pair as the format renders it for training (formats.ChatFormat.pair): the prompt as inference renders it
    (harmony: through `<|start|>assistant`), and each reply's tokens after it (harmony: analysis and final, through
    <|return|>): the tokens DPO scores."""
    date = harmony.conversation_date(date)  # one date for the prompt and both replies
    columns: dict[str, list] = {column: [] for column in PAIR_COLUMNS}
    for pair in pairs:
        for column, ids in zip(PAIR_COLUMNS, chat_format.pair(pair, tokenizer, date), strict=True):
            columns[column].append(ids)
    return columns


def _enforce_pair_length(dataset, settings: DataSettings, report: PrepareReport):
    """Pairs whose prompt and longer reply exceed data.max_length are dropped (never truncated: settings.py)."""
    limit = settings.max_length
    lengths = [len(p) + max(len(c), len(r)) for p, c, r in zip(*(dataset[k] for k in PAIR_COLUMNS), strict=True)]
    keep = [i for i, n in enumerate(lengths) if n <= limit]
    report.dropped_overlong = len(lengths) - len(keep)
    report.assistant_turns = len(keep)
    report.lengths = [lengths[i] for i in keep]
    if not keep:
        raise DataError(f"no pairs left to train on ({report.rows_in} in, {len(report.bad_rows)} bad, "
                        f"{report.dropped_overlong} longer than data.max_length={limit})")  # fmt: skip
    return dataset.select(keep) if len(keep) < len(lengths) else dataset


def _tokenize(
    conversations: list,
    tokenizer,
    loss_on: str = "assistant",
    chat_format: ChatFormat = formats.HARMONY,
    date: datetime.date | str | None = None,
) -> dict[str, list]:
    """Render in the chat format (harmony: families/harmony.py): one example per assistant turn; labels on the
    assistant's own tokens of that turn, or every token (loss_on 'all'). A conversation is a normalized row or a
    message list."""
    chat_format.check(tokenizer)
    input_ids: list[list[int]] = []
    labels: list[list[int]] = []
    for conversation in conversations:
        if isinstance(conversation, list):
            conversation = harmony.normalize({}, conversation, "medium")
        for example in chat_format.examples(conversation, tokenizer, harmony.conversation_date(date)):
            input_ids.append(example.ids)
            trained = [True] * len(example.ids) if loss_on == "all" else example.trained
            labels.append([t if m else IGNORE_INDEX for t, m in zip(example.ids, trained, strict=True)])
    return {"input_ids": input_ids, "labels": labels}


def _enforce_length(dataset, settings: DataSettings, report: PrepareReport):
    limit = settings.max_length
    lengths = [len(ids) for ids in dataset["input_ids"]]
    overlong = [i for i, n in enumerate(lengths) if n > limit]
    if overlong and settings.overlong == "drop":
        keep = sorted(set(range(len(lengths))) - set(overlong))
        dataset = dataset.select(keep)
        report.dropped_overlong = len(overlong)
    elif overlong:
        dataset = dataset.map(lambda row: {k: row[k][:limit] for k in TOKENIZED_COLUMNS})
        report.truncated = len(overlong)
        untrained = [i for i in overlong if all(label == IGNORE_INDEX for label in dataset[i]["labels"])]
        if untrained:  # the prompt alone filled max_length: the row would train on nothing
            dataset = dataset.select(sorted(set(range(len(lengths))) - set(untrained)))
            report.dropped_untrained = len(untrained)
            gone = set(untrained)
            lengths = [n for i, n in enumerate(lengths) if i not in gone]
    report.lengths = [min(n, limit) for i, n in enumerate(lengths) if settings.overlong == "truncate" or n <= limit]
    if len(dataset) == 0:
        raise DataError(
            f"no rows left to train on ({report.rows_in} in, {len(report.bad_rows)} bad, "
            f"{report.dropped_overlong} longer than data.max_length={limit}, "
            f"{report.dropped_untrained} with no trained token left after truncation)"
        )
    return dataset


def held_out_indices(count: int, fraction: float, seed: int) -> list[int]:
    """Which of `count` rows `data.eval.fraction` holds out: at least one, never all, the same for a seed."""
    import random

    if count < 2:
        raise DataError(f"data.eval.fraction needs at least 2 rows to hold some out; the source has {count}")
    size = min(count - 1, max(1, round(count * fraction)))
    return sorted(random.Random(seed).sample(range(count), size))


def take(rows, indices: list[int]):
    """The rows at `indices`, of the kind that came in (Rows keep where each row came from)."""
    if isinstance(rows, Rows):
        taken = Rows(rows[i] for i in indices)
        taken.places = [rows.places[i] for i in indices]
        return taken
    return rows.select(indices)


def split_rows(rows, settings: DataSettings, eval_source: str | None = None):
    """(training rows, held-out rows or None) as data.eval asks: a fraction of these rows, or rows of their own
    (`eval_source` overrides data.eval.source with where the job reads them)."""
    split = settings.eval
    if split is None:
        return rows, None
    if split.fraction is None:
        return rows, load_rows(eval_source or str(split.source), split.split or settings.split)
    held = held_out_indices(len(rows), split.fraction, split.seed)
    kept = sorted(set(range(len(rows))) - set(held))
    return take(rows, kept), take(rows, held)

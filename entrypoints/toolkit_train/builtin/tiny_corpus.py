"""The tiny bases' pre-training text: generated, sharing no row with any bundled sample.

It makes a tiny gpt-oss behave as the real one does before the multilingual fine-tune: it speaks the harmony
format and six languages, answers in the user's language, and *at temperature 0 reasons in English whatever the
system prompt's `reasoning language:` says*. The skill the bundled sample teaches (reasoning in the named language)
is therefore not what the base does, and the demo's eval measures whether the fine-tune taught it on rows neither
model saw.

Two kinds of text, as a real model's pre-training and chat tuning have:
- harmony conversations: a question from one of a few families (arithmetic, units, parity) in one of six
  languages, an analysis, an answer in the user's language; the system prompt names a random reasoning language,
  and the analysis is in English (70%) or in that language (30%): greedy decoding picks English, and the
  instruction is a weak preference the fine-tune can make the rule;
- plain instruction documents: a `reasoning language: X` line, maybe a developer line, a question, then that
  question's reasoning written in X. They teach the association of the named language with the text that follows
  (as a real base's corpus of "answer in X" text does) at a short distance, and the base's conversations use it
  only weakly. Measured (#44, 8 variants on one seed each): without them a 2-layer base never retrieves the named
  language across the ~50 tokens of a harmony prompt, however often its conversations follow it (30% to 45%), and
  the demo's 30 LoRA steps do not teach it either; with them the same fine-tune reasons in the named language on
  most held-out rows.

Facts are computed, so every answer is correct. `tests/toolkit_train/builtin/test_tiny_corpus.py` proves no bundled
sample row's text occurs in it.
"""

from __future__ import annotations

import random
from typing import Any

LANGUAGES = ("English", "French", "German", "Spanish", "Italian", "Portuguese")
EN, FR, DE, ES, IT, PT = LANGUAGES

# "in <language>" written in each language: IN[writer][language]
IN = {
    EN: dict(
        zip(
            LANGUAGES,
            ("in English", "in French", "in German", "in Spanish", "in Italian", "in Portuguese"),
            strict=True,
        )
    ),
    FR: dict(
        zip(
            LANGUAGES,
            ("en anglais", "en français", "en allemand", "en espagnol", "en italien", "en portugais"),
            strict=True,
        )
    ),
    DE: dict(
        zip(
            LANGUAGES,
            ("auf Englisch", "auf Französisch", "auf Deutsch", "auf Spanisch", "auf Italienisch", "auf Portugiesisch"),
            strict=True,
        )
    ),
    ES: dict(
        zip(
            LANGUAGES,
            ("en inglés", "en francés", "en alemán", "en español", "en italiano", "en portugués"),
            strict=True,
        )
    ),
    IT: dict(
        zip(
            LANGUAGES,
            ("in inglese", "in francese", "in tedesco", "in spagnolo", "in italiano", "in portoghese"),
            strict=True,
        )
    ),
    PT: dict(
        zip(
            LANGUAGES,
            ("em inglês", "em francês", "em alemão", "em espanhol", "em italiano", "em português"),
            strict=True,
        )
    ),
}
# (opening, closing) of an analysis written in each language
FRAME = {
    EN: ("The user asks {in_user} {topic}.", "I answer {in_user}."),
    FR: ("L'utilisateur demande {in_user} {topic}.", "Je réponds {in_user}."),
    DE: ("Der Nutzer fragt {in_user} {topic}.", "Ich antworte {in_user}."),
    ES: ("El usuario pregunta {in_user} {topic}.", "Respondo {in_user}."),
    IT: ("L'utente chiede {in_user} {topic}.", "Rispondo {in_user}."),
    PT: ("O usuário pergunta {in_user} {topic}.", "Respondo {in_user}."),
}
DEVELOPER = {
    EN: "You are a careful assistant who answers briefly.",
    FR: "Tu es un assistant attentif qui répond brièvement.",
    DE: "Du bist ein sorgfältiger Assistent, der knapp antwortet.",
    ES: "Eres un asistente cuidadoso que responde con brevedad.",
    IT: "Sei un assistente attento che risponde in breve.",
    PT: "Você é um assistente cuidadoso que responde de forma breve.",
}
PARITY = {EN: ("even", "odd"), FR: ("pair", "impair"), DE: ("gerade", "ungerade"), ES: ("par", "impar"),
          IT: ("pari", "dispari"), PT: ("par", "ímpar")}  # fmt: skip


def _numbers(family: str, rng: random.Random) -> dict[str, Any]:
    """The values of one question and its computed answer."""
    if family == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        return {"a": a, "b": b, "c": a + b}
    if family == "subtract":
        a = rng.randint(20, 90)
        b = rng.randint(2, a - 1)
        return {"a": a, "b": b, "c": a - b}
    if family == "multiply":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return {"a": a, "b": b, "c": a * b}
    if family == "half":
        b = rng.randint(2, 50)
        return {"a": 2 * b, "b": b}
    if family == "weeks":
        a = rng.randint(2, 20)
        return {"a": a, "c": 7 * a}
    if family in ("km", "kg"):
        a = rng.randint(2, 40)
        return {"a": a, "c": 1000 * a}
    a = rng.randint(2, 99)
    return {"a": a, "odd": a % 2}  # parity


# per family and language: (question asked in it, topic of an analysis written in it, fact written in it)
FAMILIES: dict[str, dict[str, tuple[str, str, str]]] = {
    "add": {
        EN: ("What is {a} plus {b}?", "for the sum of {a} and {b}", "{a} plus {b} is {c}"),
        FR: ("Combien font {a} plus {b} ?", "la somme de {a} et {b}", "{a} plus {b} font {c}"),
        DE: ("Was ist {a} plus {b}?", "nach der Summe von {a} und {b}", "{a} plus {b} ergibt {c}"),
        ES: ("¿Cuánto es {a} más {b}?", "por la suma de {a} y {b}", "{a} más {b} son {c}"),
        IT: ("Quanto fa {a} più {b}?", "la somma di {a} e {b}", "{a} più {b} fa {c}"),
        PT: ("Quanto é {a} mais {b}?", "a soma de {a} e {b}", "{a} mais {b} são {c}"),
    },
    "subtract": {
        EN: ("What is {a} minus {b}?", "for {a} minus {b}", "{a} minus {b} is {c}"),
        FR: ("Combien font {a} moins {b} ?", "combien font {a} moins {b}", "{a} moins {b} font {c}"),
        DE: ("Was ist {a} minus {b}?", "nach {a} minus {b}", "{a} minus {b} ergibt {c}"),
        ES: ("¿Cuánto es {a} menos {b}?", "por {a} menos {b}", "{a} menos {b} son {c}"),
        IT: ("Quanto fa {a} meno {b}?", "quanto fa {a} meno {b}", "{a} meno {b} fa {c}"),
        PT: ("Quanto é {a} menos {b}?", "quanto é {a} menos {b}", "{a} menos {b} são {c}"),
    },
    "multiply": {
        EN: ("What is {a} times {b}?", "for the product of {a} and {b}", "{a} times {b} is {c}"),
        FR: ("Combien font {a} fois {b} ?", "le produit de {a} et {b}", "{a} fois {b} font {c}"),
        DE: ("Was ist {a} mal {b}?", "nach dem Produkt von {a} und {b}", "{a} mal {b} ergibt {c}"),
        ES: ("¿Cuánto es {a} por {b}?", "por el producto de {a} y {b}", "{a} por {b} son {c}"),
        IT: ("Quanto fa {a} per {b}?", "il prodotto di {a} e {b}", "{a} per {b} fa {c}"),
        PT: ("Quanto é {a} vezes {b}?", "o produto de {a} e {b}", "{a} vezes {b} são {c}"),
    },
    "half": {
        EN: ("What is half of {a}?", "for half of {a}", "half of {a} is {b}"),
        FR: ("Quelle est la moitié de {a} ?", "la moitié de {a}", "la moitié de {a} est {b}"),
        DE: ("Was ist die Hälfte von {a}?", "nach der Hälfte von {a}", "die Hälfte von {a} ist {b}"),
        ES: ("¿Cuál es la mitad de {a}?", "por la mitad de {a}", "la mitad de {a} es {b}"),
        IT: ("Qual è la metà di {a}?", "la metà di {a}", "la metà di {a} è {b}"),
        PT: ("Qual é a metade de {a}?", "a metade de {a}", "a metade de {a} é {b}"),
    },
    "weeks": {
        EN: ("How many days are in {a} weeks?", "how many days there are in {a} weeks", "{a} weeks have {c} days"),
        FR: (
            "Combien de jours y a-t-il dans {a} semaines ?",
            "combien de jours il y a dans {a} semaines",
            "{a} semaines font {c} jours",
        ),
        DE: ("Wie viele Tage haben {a} Wochen?", "wie viele Tage {a} Wochen haben", "{a} Wochen haben {c} Tage"),
        ES: ("¿Cuántos días hay en {a} semanas?", "cuántos días hay en {a} semanas", "{a} semanas tienen {c} días"),
        IT: (
            "Quanti giorni ci sono in {a} settimane?",
            "quanti giorni ci sono in {a} settimane",
            "{a} settimane hanno {c} giorni",
        ),
        PT: ("Quantos dias há em {a} semanas?", "quantos dias há em {a} semanas", "{a} semanas têm {c} dias"),
    },
    "km": {
        EN: (
            "How many meters are in {a} kilometers?",
            "how many meters are in {a} kilometers",
            "{a} kilometers are {c} meters",
        ),
        FR: (
            "Combien de mètres font {a} kilomètres ?",
            "combien de mètres font {a} kilomètres",
            "{a} kilomètres font {c} mètres",
        ),
        DE: (
            "Wie viele Meter sind {a} Kilometer?",
            "wie viele Meter {a} Kilometer sind",
            "{a} Kilometer sind {c} Meter",
        ),
        ES: (
            "¿Cuántos metros hay en {a} kilómetros?",
            "cuántos metros hay en {a} kilómetros",
            "{a} kilómetros son {c} metros",
        ),
        IT: (
            "Quanti metri ci sono in {a} chilometri?",
            "quanti metri ci sono in {a} chilometri",
            "{a} chilometri sono {c} metri",
        ),
        PT: (
            "Quantos metros há em {a} quilômetros?",
            "quantos metros há em {a} quilômetros",
            "{a} quilômetros são {c} metros",
        ),
    },
    "kg": {
        EN: (
            "How many grams are in {a} kilograms?",
            "how many grams are in {a} kilograms",
            "{a} kilograms are {c} grams",
        ),
        FR: (
            "Combien de grammes font {a} kilogrammes ?",
            "combien de grammes font {a} kilogrammes",
            "{a} kilogrammes font {c} grammes",
        ),
        DE: (
            "Wie viele Gramm sind {a} Kilogramm?",
            "wie viele Gramm {a} Kilogramm sind",
            "{a} Kilogramm sind {c} Gramm",
        ),
        ES: (
            "¿Cuántos gramos hay en {a} kilogramos?",
            "cuántos gramos hay en {a} kilogramos",
            "{a} kilogramos son {c} gramos",
        ),
        IT: (
            "Quanti grammi ci sono in {a} chilogrammi?",
            "quanti grammi ci sono in {a} chilogrammi",
            "{a} chilogrammi sono {c} grammi",
        ),
        PT: (
            "Quantos gramas há em {a} quilogramas?",
            "quantos gramas há em {a} quilogramas",
            "{a} quilogramas são {c} gramas",
        ),
    },
    "parity": {
        EN: ("Is {a} even or odd?", "whether {a} is even or odd", "{a} is {word}"),
        FR: ("{a} est-il pair ou impair ?", "si {a} est pair ou impair", "{a} est {word}"),
        DE: ("Ist {a} gerade oder ungerade?", "ob {a} gerade oder ungerade ist", "{a} ist {word}"),
        ES: ("¿{a} es par o impar?", "si {a} es par o impar", "{a} es {word}"),
        IT: ("{a} è pari o dispari?", "se {a} è pari o dispari", "{a} è {word}"),
        PT: ("{a} é par ou ímpar?", "se {a} é par ou ímpar", "{a} é {word}"),
    },
}


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


class _Question:
    """One question of a family with its values: its text, its answer and its reasoning in any language."""

    def __init__(self, rng: random.Random) -> None:
        self.family = rng.choice(sorted(FAMILIES))
        self.values = _numbers(self.family, rng)
        self.user_language = rng.choice(LANGUAGES)

    def _fill(self, template: str, language: str) -> str:
        word = PARITY[language][self.values["odd"]] if "odd" in self.values else ""
        return template.format(**self.values, word=word)

    def text(self) -> str:
        return self._fill(FAMILIES[self.family][self.user_language][0], self.user_language)

    def answer(self) -> str:
        return _sentence(self._fill(FAMILIES[self.family][self.user_language][2], self.user_language)) + "."

    def reasoning(self, language: str) -> str:
        _, topic, fact = FAMILIES[self.family][language]
        opening, closing = FRAME[language]
        in_user = IN[language][self.user_language]
        return " ".join([
            opening.format(in_user=in_user, topic=self._fill(topic, language)),
            _sentence(self._fill(fact, language)) + ".",
            closing.format(in_user=in_user),
        ])  # fmt: skip


# How often a conversation's analysis follows the named language; otherwise it is in English, so that the base
# reasons in English at temperature 0 whatever the system prompt names (gpt-oss's behaviour before the
# multilingual fine-tune).
NAMED_ANALYSIS = 0.3


def conversation(rng: random.Random) -> list[dict[str, Any]]:
    """A harmony conversation: a random reasoning language named; the analysis mostly in English."""
    question = _Question(rng)
    named = rng.choice(LANGUAGES)
    language = named if rng.random() < NAMED_ANALYSIS else EN
    analysis = question.reasoning(language)
    system = f"reasoning language: {named}"
    if rng.random() < 0.5:  # half without developer instructions: `toolkit invoke` sends a bare system line
        system += f"\n\n{DEVELOPER[question.user_language]}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": question.text()},
        {"role": "assistant", "content": question.answer(), "thinking": analysis},
    ]


def document(rng: random.Random) -> str:
    """A plain instruction document: `reasoning language: X`, maybe a developer line, a question in the user's
    language, then its reasoning written in X."""
    language = rng.choice(LANGUAGES)
    question = _Question(rng)
    developer = f"{DEVELOPER[question.user_language]}\n\n" if rng.random() < 0.5 else ""
    return f"reasoning language: {language}\n\n{developer}{question.text()}\n\n{question.reasoning(language)}"


def vocabulary_documents(texts: list[str], rng: random.Random, words_per_line: int = 24) -> list[str]:
    """The words of `texts`, each once, shuffled across all of them and cut into lines: the base then knows every
    word the bundled samples use (a real base knows them from its corpus) without having seen one of their
    sentences, so the fine-tune can write them. No sequence of four words of a sample survives the shuffle; the
    contamination test checks it."""
    words = sorted({word for text in texts for word in text.split()})
    rng.shuffle(words)
    return [" ".join(words[i : i + words_per_line]) for i in range(0, len(words), words_per_line)]

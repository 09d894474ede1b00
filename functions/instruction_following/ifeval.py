"""The 25 verifiable instruction types of IFEval (Zhou et al., 2023), each a check of a response.

Written here: no maintained, light checker library exists (the one on PyPI needs ``datasets`` and
downloads NLTK data at run time). Words are ``\\w+`` runs, sentences end in ``.``, ``!`` or ``?``,
and the language is langdetect's (seeded, so deterministic). Every check takes the response and the
instruction's kwargs and returns whether it is followed; `check` validates the kwargs first.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Any


def _compare(count: int, relation: str, n: int) -> bool:
    if relation == "less than":
        return count < n
    if relation == "at least":
        return count >= n
    raise ValueError(f"relation {relation!r} is not 'less than' or 'at least'")


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def _language(text: str) -> str | None:
    from langdetect import DetectorFactory, detect
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0
    try:
        return str(detect(text))
    except LangDetectException:
        return None


def existence(r: str, keywords: list[str]) -> bool:
    return all(re.search(re.escape(k), r, re.IGNORECASE) for k in keywords)


def frequency(r: str, keyword: str, frequency: int, relation: str) -> bool:
    return _compare(len(re.findall(re.escape(keyword), r, re.IGNORECASE)), relation, frequency)


def forbidden_words(r: str, forbidden_words: list[str]) -> bool:
    return not any(re.search(rf"\b{re.escape(w)}\b", r, re.IGNORECASE) for w in forbidden_words)


def letter_frequency(r: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return _compare(r.lower().count(letter.lower()), let_relation, let_frequency)


def response_language(r: str, language: str) -> bool:
    return _language(r) == language


def number_sentences(r: str, num_sentences: int, relation: str) -> bool:
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", r.strip()) if _words(s)]
    return _compare(len(sentences), relation, num_sentences)


def number_paragraphs(r: str, num_paragraphs: int) -> bool:
    parts = re.split(r"\s?\*\*\*\s?", r)
    if any(not p.strip() for p in parts[1:-1]):
        return False
    return len([p for p in parts if p.strip()]) == num_paragraphs


def number_words(r: str, num_words: int, relation: str) -> bool:
    return _compare(len(_words(r)), relation, num_words)


def nth_paragraph_first_word(r: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = [p for p in re.split(r"\n\s*\n", r) if p.strip()]
    if len(paragraphs) != num_paragraphs or not 1 <= nth_paragraph <= len(paragraphs):
        return False
    words = _words(paragraphs[nth_paragraph - 1])
    return bool(words) and words[0].lower() == first_word.lower()


def number_placeholders(r: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[[^\]\n]*\]", r)) >= num_placeholders


def postscript(r: str, postscript_marker: str) -> bool:
    marker = re.escape(postscript_marker.strip().lower()).replace(r"\.", r"\.\s?").replace(r"\ ", r"\s?")
    return re.search(rf"^\s*{marker}", r.lower(), re.MULTILINE) is not None


def number_bullet_lists(r: str, num_bullets: int) -> bool:
    return len(re.findall(r"^\s*(?:\*[^*]|-)", r, re.MULTILINE)) == num_bullets


def constrained_response(r: str) -> bool:
    return any(option in r for option in ("My answer is yes.", "My answer is no.", "My answer is maybe."))


def number_highlighted_sections(r: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"(?<!\*)\*([^\n*]+)\*(?!\*)", r) if h.strip()]
    double = [h for h in re.findall(r"\*\*([^\n*]+)\*\*", r) if h.strip()]
    return len(single) + len(double) >= num_highlights


def multiple_sections(r: str, section_spliter: str, num_sections: int) -> bool:
    return len(re.split(rf"\s?{re.escape(section_spliter)}\s?\d+\s?", r)) - 1 >= num_sections


def json_format(r: str) -> bool:
    text = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", r.strip(), flags=re.IGNORECASE)
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def title(r: str) -> bool:
    return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", r))


def two_responses(r: str) -> bool:
    parts = [p.strip() for p in r.split("******")]
    return len(parts) == 2 and all(parts) and parts[0] != parts[1]


def repeat_prompt(r: str, prompt_to_repeat: str) -> bool:
    return r.strip().lower().startswith(prompt_to_repeat.strip().lower())


def end_checker(r: str, end_phrase: str) -> bool:
    return r.strip().lower().endswith(end_phrase.strip().lower())


def capital_word_frequency(r: str, capital_frequency: int, capital_relation: str) -> bool:
    return _compare(len([w for w in _words(r) if w.isupper()]), capital_relation, capital_frequency)


def english_capital(r: str) -> bool:
    return r.isupper() and _language(r) == "en"


def english_lowercase(r: str) -> bool:
    return r.islower() and _language(r) == "en"


def no_comma(r: str) -> bool:
    return "," not in r


def quotation(r: str) -> bool:
    text = r.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


CHECKS: dict[str, Callable[..., bool]] = {
    "keywords:existence": existence,
    "keywords:frequency": frequency,
    "keywords:forbidden_words": forbidden_words,
    "keywords:letter_frequency": letter_frequency,
    "language:response_language": response_language,
    "length_constraints:number_sentences": number_sentences,
    "length_constraints:number_paragraphs": number_paragraphs,
    "length_constraints:number_words": number_words,
    "length_constraints:nth_paragraph_first_word": nth_paragraph_first_word,
    "detectable_content:number_placeholders": number_placeholders,
    "detectable_content:postscript": postscript,
    "detectable_format:number_bullet_lists": number_bullet_lists,
    "detectable_format:constrained_response": constrained_response,
    "detectable_format:number_highlighted_sections": number_highlighted_sections,
    "detectable_format:multiple_sections": multiple_sections,
    "detectable_format:json_format": json_format,
    "detectable_format:title": title,
    "combination:two_responses": two_responses,
    "combination:repeat_prompt": repeat_prompt,
    "startend:end_checker": end_checker,
    "change_case:capital_word_frequency": capital_word_frequency,
    "change_case:english_capital": english_capital,
    "change_case:english_lowercase": english_lowercase,
    "punctuation:no_comma": no_comma,
    "startend:quotation": quotation,
}


def arguments(instruction: str, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The kwargs an instruction takes (None values dropped, as IFEval rows carry them); ValueError
    naming the instruction and the key when one is unknown or missing."""
    if instruction not in CHECKS:
        raise ValueError(f"instruction {instruction!r} is not one of the {len(CHECKS)} IFEval instruction types")
    given = {k: v for k, v in (kwargs or {}).items() if v is not None}
    params = list(inspect.signature(CHECKS[instruction]).parameters)[1:]
    missing = [p for p in params if p not in given]
    if missing:
        raise ValueError(f"instruction {instruction!r} needs kwargs {missing}")
    return {p: given[p] for p in params}


def check_all(response: str, instructions: list[str], kwargs: list[dict[str, Any]]) -> list[bool]:
    """Whether ``response`` follows each instruction (kwargs already validated by `arguments`)."""
    return [CHECKS[i](response, **k) for i, k in zip(instructions, kwargs, strict=True)]

"""Words of Chinese and Japanese text, for the lexical index, evidence coverage and quote selection.

Postgres' text search parsers split on spaces and punctuation, and Chinese and Japanese put neither between words:
a whole sentence became one "word", so BM25 found nothing and coverage was 0. So every text is rewritten before
Postgres tokenises it (`lexical_text`, at index time and at query time alike): each run of CJK characters is replaced
by its words (jieba for Chinese, janome for Japanese, both with their dictionaries on PyPI) followed by its character
bigrams (a word the dictionary splits differently from the question still shares its bigrams). Latin text is left
as it is, so the same document keeps the configuration's English stemming, and a text without CJK characters is
unchanged (its lexemes are the same as before migration 0018). One vocabulary and one statistics table hold both.

`tokens` gives the same words in Python (lower-cased Latin words, CJK words and bigrams), for the term overlap of
quote selection and conversation memory.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable
from functools import cache

logger = logging.getLogger(__name__)

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff"  # without ・ (U+30FB), a separator
CJK_RUN = re.compile(f"[{_HAN}{_KANA}]+")
_KANA_CHAR = re.compile(f"[{_KANA}]")
_HIRAGANA_ONLY = re.compile("^[\u3040-\u309f]+$")
# CJK punctuation and symbols (、。「」『』【】〈〉《》・ and the ideographic space) are not word characters, but a
# parser in the C locale takes every non-ASCII character for a letter: they become spaces.
_CJK_PUNCTUATION = re.compile("[\u3000-\u303f\u30fb\u2025\u2026\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
_LATIN = re.compile(r"[a-z0-9]+")

# Function words that carry no topic (particles, auxiliaries, the commonest pronouns and measure words).
_CHINESE_STOP = frozenset("的 了 是 在 和 与 及 或 也 都 就 而 把 被 对 从 向 给 让 这 那 个 之 其 我 你 他 她 它 们 吗 呢 吧 啊 "
                          "么 什么 怎么 如何 哪 哪些 多少 几 有 没有 要 会 能 可以 请 为 以 于 所 等".split())
_JAPANESE_STOP = frozenset("は が を に へ と で や の も か な ね よ から まで より です ます でした ました だ である "
                           "ある いる する した して され れる られる こと もの ため これ それ あれ どの どれ 何 "
                           "ください".split())


def has_cjk(text: str) -> bool:
    return CJK_RUN.search(text) is not None


@cache
def _jieba() -> Callable[[str], list[str]]:
    import jieba  # here, not at the top: it loads its dictionary (about a second)

    jieba.setLogLevel(logging.WARNING)
    return lambda text: list(jieba.lcut(text, HMM=True))


@cache
def _janome() -> Callable[[str], list[str]]:
    from janome.tokenizer import Tokenizer  # here, not at the top: it loads its dictionary

    tokenizer = Tokenizer(wakati=True)
    return lambda text: [str(t) for t in tokenizer.tokenize(text)]


def segment(run: str) -> list[str]:
    """The words of one run of CJK characters, function words left out: Japanese when it has kana, else Chinese."""
    if len(run) == 1:
        return [run]
    japanese = _KANA_CHAR.search(run) is not None
    words = (_janome() if japanese else _jieba())(run)
    stop = _JAPANESE_STOP if japanese else _CHINESE_STOP
    kept = [w for w in (w.strip() for w in words) if w and w not in stop]
    if japanese:  # one or two kana alone are particles and endings
        kept = [w for w in kept if not (_HIRAGANA_ONLY.match(w) and len(w) <= 2)]
    return kept


# Single-character Chinese function words: a bigram holding one ("有多", "假有") is grammar glued to a word, not topic.
_CHINESE_FUNCTION_CHARS = frozenset("的了是在和与及或也都就而把被对从向给让这那个之其我你他她它们吗呢吧啊么几有要会能请为以于所等")


def bigrams(run: str) -> list[str]:
    """Overlapping character pairs of a run, without pairs that hold a function word (a pair of hiragana alone, or a
    Chinese function character: grammar, not topic)."""
    pairs = [run[i:i + 2] for i in range(len(run) - 1)]
    return [p for p in pairs if not _HIRAGANA_ONLY.match(p) and not (set(p) & _CHINESE_FUNCTION_CHARS)]


def run_terms(run: str) -> list[str]:
    return segment(run) + bigrams(run)


def lexical_text(text: str) -> str:
    """The text as Postgres should tokenise it: every CJK run replaced by its words and bigrams, separated by spaces,
    CJK punctuation as spaces. Unchanged when the text has no CJK characters."""
    if not has_cjk(text):
        return text
    normal = _CJK_PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text))
    return CJK_RUN.sub(lambda m: " " + " ".join(run_terms(m.group(0))) + " ", normal)


def word_text(text: str) -> str:
    """The text with every CJK run replaced by its words alone, without the character bigrams `lexical_text` adds:
    the terms a question itself asks about. A bigram spanning two words ("没用" and "用完" in "没用完的年假") is
    in no document, so counted as a question term it read as a rare term the answer lacks (issue 39). Passages are
    still compared by `lexical_text`, whose bigrams hold a two-character word however the dictionary split them."""
    if not has_cjk(text):
        return text
    normal = _CJK_PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text))
    return CJK_RUN.sub(lambda m: " " + " ".join(segment(m.group(0))) + " ", normal)


def tokens(text: str) -> list[str]:
    """Lower-cased Latin words and the CJK words and bigrams of a text, in order."""
    if not has_cjk(text):
        return _LATIN.findall(text.lower())
    out: list[str] = []
    for piece in re.split(f"([{_HAN}{_KANA}]+)", unicodedata.normalize("NFKC", text).lower()):
        if CJK_RUN.fullmatch(piece):
            out.extend(run_terms(piece))
        else:
            out.extend(_LATIN.findall(piece))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Which language a question is in, and which languages the index holds (a question in a language the knowledge base
# does not contain is told so)

LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "zh": "Chinese", "ja": "Japanese",
                  "ko": "Korean", "ru": "Russian"}
# Function words that mark a language in a question (several are needed when they are shared).
_MARKERS = {
    "en": "the is are was what how do does can i my for of to when who where which should we our you your".split(),
    "de": "der die das ist sind wie was ich und nicht kann für wann mein meine wir viele welche gibt es muss".split(),
    "fr": "le la les est sont que quoi comment je pour des combien quand mon ma nous puis-je quel quelle une".split(),
    "es": "el la los las es son qué cómo cuántos cuántas para mi cuándo puedo una nosotros cuál hay".split(),
}
_SCRIPTS = (("ja", re.compile(f"[{_KANA}]")), ("ko", re.compile("[\uac00-\ud7af]")), ("zh", re.compile(f"[{_HAN}]")),
            ("ru", re.compile("[\u0400-\u04ff]")))
_LATIN_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)?", re.UNICODE)


def detect_language(text: str) -> str | None:
    """The language of a short text (a question), or None when it cannot be told: by script (kana: Japanese, Han
    alone: Chinese, Hangul, Cyrillic), else by its function words (English, German, French, Spanish)."""
    for language, script in _SCRIPTS:
        if script.search(text):
            return language
    words = [w.lower() for w in _LATIN_WORD.findall(text)]
    hits = {language: sum(w in markers for w in words) for language, markers in _MARKERS.items()}
    best = max(hits.values(), default=0)
    if best == 0:
        return None
    leaders = [language for language, n in hits.items() if n == best]
    return leaders[0] if len(leaders) == 1 else None


# Words that show the index holds documents in a language: at least two of them must be in its vocabulary. Function
# words where the English configuration keeps them (it drops English ones, so English is known by common stems).
INDEX_MARKERS = {
    "en": "employees company policy please days use manager team time work need must request access",
    "de": "und nicht oder werden sind wird auch eine",
    "fr": "les des est pour dans une avec sont",
    "es": "los las para por una con está son",
    "zh": "没有 这个 进行 员工 时间 需要 如果 可以 公司",
}
# Languages known in the index by their script alone: any word in it.
INDEX_SCRIPTS = {"ja": f"[{_KANA}]", "ko": "[\uac00-\ud7af]", "ru": "[\u0400-\u04ff]"}


"""Words of Chinese and Japanese text, for the lexical index, evidence coverage and quote selection.

Postgres' text search parsers split on spaces and punctuation, and Chinese and Japanese put neither between words:
a whole sentence became one "word", so BM25 found nothing and coverage was 0. So every text is rewritten before
Postgres tokenises it (`lexical_text`, at index time and at query time alike): each run of CJK characters is replaced
by its words (jieba for Chinese, janome for Japanese, both with their dictionaries on PyPI) followed by its character
bigrams (a word the dictionary splits differently from the question still shares its bigrams). Latin text is left
as it is, so the same document keeps the configuration's English stemming, and a text without CJK characters is
unchanged (its lexemes are the same as before migration 0017). One vocabulary and one statistics table hold both.

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


def bigrams(run: str) -> list[str]:
    """Overlapping character pairs of a run (a pair of hiragana alone is grammar, not topic, and is left out)."""
    pairs = [run[i:i + 2] for i in range(len(run) - 1)]
    return [p for p in pairs if not _HIRAGANA_ONLY.match(p)]


def run_terms(run: str) -> list[str]:
    return segment(run) + bigrams(run)


def lexical_text(text: str) -> str:
    """The text as Postgres should tokenise it: every CJK run replaced by its words and bigrams, separated by spaces,
    CJK punctuation as spaces. Unchanged when the text has no CJK characters."""
    if not has_cjk(text):
        return text
    normal = _CJK_PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text))
    return CJK_RUN.sub(lambda m: " " + " ".join(run_terms(m.group(0))) + " ", normal)


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

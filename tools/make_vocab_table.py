"""Build the pruned draft head's token-frequency tables: `code` (the Python standard library alone)
or `mixed` (code, chat formatting, English prose and prose in 16 other languages).

Recipe of the mixed table (shares of the token distribution the table ranks by; the code table is
the first part alone, as frequencies):
- 35% code: every .py file of this Python's standard library (PSF licence), tokenized as is.
- 5% chat formatting: CHAT_STYLE below (Markdown and the phrases that frame answers; our own text).
- 40% English and 20% spread evenly over zh, es, fr, de, ja, ru, pt, it, ko, ar, hi, vi, tr, pl,
  nl, id: the word frequencies of wordfreq 3.1.1's "small" lists (data CC BY-SA 4.0, by Robyn
  Speer and contributors; https://github.com/rspeer/wordfreq).  Each word counts with its
  frequency, as it appears in running text: after a space (75%), capitalized after a space (12%),
  capitalized at a line start (8%), bare (5%); languages written without spaces (zh, ja) bare.
  Words are tokenized one at a time, so the table sees the tokens inside words, as text has them.
The output lists the ids seen, by descending share (ties: lower id first), plus a fingerprint of the
tokenizer so that a mismatched model is detected.  Being derived from wordfreq's data, the table
file is under CC BY-SA 4.0 (see swiftspec/data/README.md).

    .venv/bin/python tools/make_vocab_table.py --corpus code
    pip download --no-deps wordfreq==3.1.1 -d /tmp/wf && pip install msgpack
    .venv/bin/python tools/make_vocab_table.py --corpus mixed --wordfreq /tmp/wf/wordfreq-3.1.1-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import collections
import gzip
import io
import json
import pathlib
import sysconfig
import zipfile

from swiftspec.speculate.vocab import TABLE_DIR, fingerprint
from swiftspec.weights.loader import load_tokenizer
from swiftspec.weights.source import resolve_source

SHARES = {"code": 0.35, "style": 0.05, "en": 0.4}
OTHER_LANGUAGES = ("zh", "es", "fr", "de", "ja", "ru", "pt", "it", "ko", "ar", "hi", "vi", "tr", "pl", "nl", "id")
NO_SPACES = ("zh", "ja")
FORMS = ((" {w}", 0.75), (" {W}", 0.12), ("{W}", 0.08), ("{w}", 0.05))
CHAT_STYLE = """Sure! Here's an example. Certainly! Of course. Great question.
### Step 1: Overview
**Note:** This is important. **Example:** see below. *Tip:* keep it short.
- First item
- Second item: details
1. Open the file.
2. Read each line.
3. Print the result.
| Name | Value |
|------|-------|
| a | 1 |
```python
print("hello")
```
```bash
pip install package
```
```json
{"key": "value", "items": [1, 2, 3]}
```
```sql
SELECT name FROM users WHERE id = 1;
```
Dear Mr. Smith, Dear Ms. Lee, Hi team,
I hope this message finds you well. Thank you for your help. Best regards, Sincerely, Kind regards,
In summary, To summarize: Let's break it down step by step. Therefore, the answer is 42.
If you have any other questions, feel free to ask! I hope this helps.
x = 3, y = 4.5, 10% of 200 is 20; 2 + 2 = 4; 3 * 5 = 15; 12 / 4 = 3; (a + b)^2
"""


def code_counts(tok) -> collections.Counter[int]:
    counts: collections.Counter[int] = collections.Counter()
    for path in sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            counts.update(tok.encode(path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return counts


def word_frequencies(wheel: zipfile.ZipFile, lang: str) -> dict[str, float]:
    """wordfreq's cBpack list: entry i holds the words of frequency 10 ** (-i / 100)."""
    import msgpack

    raw = wheel.read(f"wordfreq/data/small_{lang}.msgpack.gz")
    packed = msgpack.load(gzip.open(io.BytesIO(raw)), raw=False)
    return {w: 10 ** (-i / 100) for i, words in enumerate(packed[1:], 1) for w in words}


def prose_counts(tok, words: dict[str, float], lang: str) -> collections.Counter[int]:
    forms = (("{w}", 1.0),) if lang in NO_SPACES else FORMS
    counts: collections.Counter[int] = collections.Counter()
    for word, freq in words.items():
        for form, share in forms:
            for t in tok.encode(form.format(w=word, W=word[:1].upper() + word[1:])):
                counts[t] += freq * share
    return counts


def normalized(counts: collections.Counter) -> dict[int, float]:
    total = sum(counts.values())
    return {t: c / total for t, c in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--corpus", choices=("code", "mixed"), default="mixed")
    parser.add_argument("--wordfreq", help="path of the wordfreq 3.1.1 wheel (mixed)")
    args = parser.parse_args()
    tok = load_tokenizer(resolve_source(args.model))
    if args.corpus == "code":
        write_table(tok, "qwen2.5-code", code_counts(tok), "python stdlib", "PSF-2.0 (Python standard library)")
        return
    parts = {"code": (SHARES["code"], code_counts(tok)),
             "style": (SHARES["style"], collections.Counter(tok.encode(CHAT_STYLE)))}
    with zipfile.ZipFile(args.wordfreq) as wheel:
        parts["en"] = (SHARES["en"], prose_counts(tok, word_frequencies(wheel, "en"), "en"))
        other = (1 - sum(SHARES.values())) / len(OTHER_LANGUAGES)
        for lang in OTHER_LANGUAGES:
            parts[lang] = (other, prose_counts(tok, word_frequencies(wheel, lang), lang))
    share: collections.Counter[int] = collections.Counter()
    for weight, counts in parts.values():
        for t, p in normalized(counts).items():
            share[t] += weight * p
    corpus = ("python stdlib (code, 35%); chat formatting 5%; wordfreq 3.1.1 small lists: en 40%, "
              + "/".join(OTHER_LANGUAGES) + " 20%")
    write_table(tok, "qwen2.5-mixed", share, corpus, "CC BY-SA 4.0 (derived from wordfreq data); see README.md here")


def write_table(tok, name: str, share: collections.Counter, corpus: str, licence: str) -> None:
    """swiftspec/data/<name>.json: the ids seen, by descending share (ties: lower id first)."""
    order = sorted(share, key=lambda t: (-share[t], t))
    out = TABLE_DIR / f"{name}.json"
    out.write_text(json.dumps({"fingerprint": fingerprint(tok), "corpus": corpus, "licence": licence,
                               "order": order}, separators=(",", ":")))
    print(f"wrote {out}: {len(order)} distinct of {tok.vocab_size} ids")


if __name__ == "__main__":
    main()

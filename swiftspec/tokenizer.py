"""Text <-> token ids: a thin wrapper over a transformers fast tokenizer, plus streaming detokenization.

Built from a directory's tokenizer.json / tokenizer_config.json, or converted from a GGUF's
metadata by transformers (weights/tokenizer_cache.py's tokenizer cache then saves it as those two files).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import tokenizers
from jinja2 import TemplateError

from swiftspec.errors import UserError

# Tokens that end a turn or a document in the Llama/Qwen families; each counts as EOS when the
# vocabulary has it as a special token, in addition to the tokenizer's own eos_token.
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>")


class Tokenizer:
    """encode / decode / chat over one HF tokenizer. `vocab_size` counts added tokens too."""

    def __init__(self, hf: Any) -> None:  # hf: transformers.PreTrainedTokenizerBase
        self._hf = hf
        self.vocab_size: int = len(hf)
        self.eos_token_ids: frozenset[int] = _eos_ids(hf)
        self.start_ids: tuple[int, ...] = tuple(hf.encode("", add_special_tokens=True))  # BOS, if encode adds one
        self._added = {t.content: i for i, t in hf.added_tokens_decoder.items()}

    @classmethod
    def from_dir(cls, path: Path) -> "Tokenizer":
        """Load tokenizer.json, with special tokens and chat template from tokenizer_config.json.

        Builds the fast tokenizer directly: AutoTokenizer parses a 150k-token tokenizer.json in
        Python several times over, which would dominate a cached model load (docs/bench/code-figures.md).
        """
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise UserError(f"{path} has no tokenizer.json")
        from transformers import PreTrainedTokenizerFast

        config = _read_config(path)
        try:  # from the file: a tokenizer_object would be deep-copied (0.4 s for 150k tokens)
            hf = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), **config)
        except Exception as e:  # the tokenizers library raises plain Exception on a bad file
            raise UserError(f"cannot load {path / 'tokenizer.json'}: {_first_line(e)}") from None
        return cls(hf)

    @classmethod
    def from_gguf(cls, path: Path, model_type: str | None = None) -> "Tokenizer":
        """Convert the tokenizer a GGUF describes in its metadata (a second for 150k tokens).

        model_type: the transformers model type the file's header names ("qwen2"), which picks the
        tokenizer class; None lets transformers find it, by parsing all of the file's metadata into
        a config with gguf-py (ten seconds for a Qwen2.5 vocabulary, the same tokenizer in the end)."""
        from transformers import AutoTokenizer

        path = Path(path).resolve()
        kind = {"tokenizer_type": model_type} if model_type else {}
        try:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True, **kind)
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"cannot build a tokenizer from {path}: {_first_line(e)}") from None
        return cls(hf)

    def save(self, path: Path) -> None:
        """Write tokenizer.json and tokenizer_config.json into path."""
        self._hf.save_pretrained(str(path))

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with the BOS token when the tokenizer adds one (Llama does, Qwen not)."""
        return self._hf.encode(text, add_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of text as plain text: no BOS, and the spelling of a special token ("<|im_end|>")
        stays text. For untrusted pieces placed between control tokens that the caller inserts by id."""
        return self._plain.encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def _plain(self) -> Any:  # tokenizers.Tokenizer
        """A copy of the fast tokenizer's backend that reads special-token spellings as text, set
        once on its own copy (the shared backend keeps parsing them, as chat templates need)."""
        plain = tokenizers.Tokenizer.from_str(self._hf.backend_tokenizer.to_str())
        plain.encode_special_tokens = True
        return plain

    @functools.cached_property
    def tokens(self) -> list[str | None]:
        """The spelling of every id in [0, vocab_size) (None for an id the vocabulary skips)."""
        return self._hf.convert_ids_to_tokens(list(range(self.vocab_size)))

    def added_token_id(self, content: str) -> int | None:
        """The id of the added (control) token spelled `content`, or None if the vocabulary has none."""
        return self._added.get(content)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._hf.chat_template)

    def chat(self, messages: list[dict]) -> list[int]:
        """Ids of messages rendered by the chat template, ending with the assistant's generation prompt."""
        _check_messages(messages)
        if not self.has_chat_template:
            raise UserError("this model's tokenizer has no chat template; send a plain completion prompt")

        spells_control = any(added in m["content"] for m in messages for added in self._added)
        # the contents go in as placeholders when one of them spells a control token ("<|im_end|>")
        shown = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(messages)] if spells_control else messages
        try:
            text = self._hf.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
        except TemplateError as e:
            raise UserError(f"chat template rejected the messages: {_first_line(e)}") from None
        # The template writes BOS itself where the model wants one.
        if not spells_control:
            return self._hf.encode(text, add_special_tokens=False)
        ids: list[int] = []  # only the template's own markers are control tokens: each content stays text
        for i, piece in enumerate(_PLACEHOLDERS.split(text)):
            ids += self.encode_text(messages[int(piece)]["content"]) if i % 2 else self._hf.encode(
                piece, add_special_tokens=False)
        return ids


class IncrementalDecoder:
    """Turns a stream of token ids into text pieces that will not change, for token-by-token streaming.

    Each push decodes a small window: text of ids[prefix:read] (already emitted) and of ids[prefix:].
    A piece ending in U+FFFD is an incomplete UTF-8 sequence (a byte-level token split a character)
    and is held back until later tokens complete it. Decoding from `prefix` rather than from `read`
    keeps tokenizers that strip a leading space (sentencepiece) from eating the spaces between pieces.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this index have been emitted

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became final (often '', never a partial character)."""
        self._ids.append(int(token_id))
        done = self._tokenizer.decode(self._ids[self._prefix : self._read])
        full = self._tokenizer.decode(self._ids[self._prefix :])
        if len(full) <= len(done) or full.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full[len(done) :]

    def flush(self) -> str:
        """Text still held back at the end of the stream (may contain U+FFFD)."""
        done = self._tokenizer.decode(self._ids[self._prefix : self._read])
        full = self._tokenizer.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full[len(done) :]


def vocab_mismatch(target: list[str | None], draft: list[str | None], target_rows: int,
                   draft_rows: int) -> str | None:
    """Why a draft cannot propose tokens to a target (one line), or None when they pair.

    target, draft: each tokenizer's spelling per id; *_rows: each model's LM-head (embedding) rows.
    Every id both vocabularies hold must be spelled the same; neither vocabulary may hold ids the
    other lacks (the draft must read every token the target emits, and the target must score every
    token the draft proposes); rows past a vocabulary are padding and may differ in number, as long
    as the draft has no row the target cannot score."""
    common = min(len(target), len(draft))
    first = next((i for i in range(common) if target[i] != draft[i]), None)
    if first is not None:
        return f"token {first} is {target[first]!r} in the target's vocabulary and {draft[first]!r} in the draft's"
    if len(draft) > len(target):
        return (f"the draft's vocabulary has {len(draft)} tokens, the target's {len(target)}: "
                f"draft token {common} ({draft[common]!r}) is unknown to the target")
    if len(target) > len(draft):
        return (f"the target's vocabulary has {len(target)} tokens, the draft's {len(draft)}: "
                f"target token {common} ({target[common]!r}) is unknown to the draft")
    if draft_rows > target_rows:
        return (f"the draft's LM head has {draft_rows} rows, the target's {target_rows}: "
                "the draft could propose ids the target cannot score")
    return None


_PLACEHOLDER = "\ue000{}\ue001"  # private-use characters around a message's index: no text spells them
_PLACEHOLDERS = re.compile("\ue000([0-9]+)\ue001")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise UserError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise UserError(f"messages[{i}] must be an object with string 'role' and 'content'")
        if m["role"] not in ("system", "user", "assistant", "tool"):
            raise UserError(f"messages[{i}] has unknown role {m['role']!r}")


def _read_config(path: Path) -> dict[str, Any]:
    """The tokenizer_config.json settings the wrapper uses: special tokens, chat template, max length."""
    file = path / "tokenizer_config.json"
    try:
        raw = json.loads(file.read_text()) if file.is_file() else {}
    except json.JSONDecodeError as e:
        raise UserError(f"bad {file}: {e}") from None
    config = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = raw.get(key)
        if isinstance(token, dict):  # older files store an AddedToken object
            token = token.get("content")
        if isinstance(token, str):
            config[key] = token
    template = path / "chat_template.jinja"  # transformers >= 4.54 saves the template beside the config
    chat_template = raw.get("chat_template") or (template.read_text() if template.is_file() else None)
    if chat_template:
        config["chat_template"] = chat_template
    if isinstance(raw.get("model_max_length"), int):
        config["model_max_length"] = raw["model_max_length"]
    return config


def _eos_ids(hf: Any) -> frozenset[int]:
    ids = {hf.eos_token_id} if hf.eos_token_id is not None else set()
    vocab = hf.get_vocab()
    special = set(hf.all_special_tokens) | {t.content for t in hf.added_tokens_decoder.values() if t.special}
    ids.update(vocab[t] for t in _END_MARKERS if t in vocab and t in special)
    return frozenset(ids)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__

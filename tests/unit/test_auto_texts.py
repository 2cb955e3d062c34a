"""auto's built-in texts: a model without a chat template (a base model) is profiled on the code text alone."""

from __future__ import annotations

from swiftspec.engines.auto.texts import builtin_texts


class _Tokenizer:
    def __init__(self, template: bool) -> None:
        self.has_chat_template = template

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]

    def chat(self, messages: list[dict]) -> list[int]:
        return [1, 2, 3]


def test_chat_text_only_with_a_template() -> None:
    with_template, without = builtin_texts(_Tokenizer(True)), builtin_texts(_Tokenizer(False))
    assert len(with_template) == 2 and with_template[1].ids[:3] == [1, 2, 3] and with_template[1].prompt_len == 3
    assert len(without) == 1 and without[0] == with_template[0]

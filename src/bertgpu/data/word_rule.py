"""Where words start, by the kind of tokenizer: the rule behind whole-word masking.

    rule = word_rule("data/tokenizer")   # byte-level BPE: a word starts at a "Ġ" token
    rule.continues("Ġworld"), rule.continues("ly")   # False, True

Each kind marks word boundaries in its token strings, and only there:

- WordPiece marks the pieces that continue a word ("##ing": the model's
  continuing_subword_prefix). vocab.txt folders are BERT's, so WordPiece.
- Byte-level BPE (GPT-2, RoBERTa, ModernBERT) marks the tokens that start one: they carry the
  space before the word ("Ġworld"). A line break or tab starts a word as a space does ("Ċ", "ĉ":
  the byte-level images of whitespace bytes), so a word never reaches across a line.
- Metaspace / SentencePiece marks them with its replacement character ("▁world", or the one its
  config names); so does a decoder that replaces a character by a space (Llama's).

A word is then what the marks delimit: whitespace-delimited text, punctuation included ("world,"
is "Ġworld" + "," and both are masked together). This is the rule fairseq's RoBERTa whole-word
masking applies (`is_beginning_of_word`: the token decodes to text starting with a space) and
transformers' offset-based one (tokens whose characters touch are one word); splitting off
punctuation would need the text's characters, which the shards no longer have, and a rule of its
own for each tokenizer. Added and special tokens are whole tokens of their own and never
continue a word, whatever their strings look like ("[SEP]" has no "Ġ"). A tokenizer of none of
these kinds has no marks that can be read: whole-word masking is refused there (`word_rule`
raises) rather than masking single tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertgpu.errors import BertgpuError

BYTE_LEVEL_SPACES = tuple(chr(256 + b) for b in b"\t\n\v\f\r ")
"""Byte-level BPE's images of the whitespace bytes (GPT-2's bytes_to_unicode maps bytes 0-32 to
U+0100-U+0120): "ĉĊċČčĠ"."""


class UnknownWordRule(BertgpuError):
    """A tokenizer whose words cannot be told from its tokens (`word_rule`)."""


@dataclass(frozen=True)
class WordRule:
    """How a token string says where it stands in a word."""

    kind: str
    """The tokenizer's kind, in words ("WordPiece", "byte-level BPE", "Metaspace")."""
    marks: tuple[str, ...]
    """The prefixes that mark a token (any one of them): continuation pieces, or word starts."""
    starts: bool
    """True when `marks` mark word starts (every other token continues the word before it),
    False when they mark continuations."""

    def continues(self, token: str) -> bool:
        """Whether `token` (not an added or special token) continues the word before it."""
        return token.startswith(self.marks) != self.starts

    def describe(self) -> str:
        """The rule in a few words, for the start-up table ("whole words by ...")."""
        if not self.marks:
            return f"{self.kind}'s tokens (each a word)"
        mark = f'"{self.marks[-1]}"'  # byte-level's space, the last of its marks
        return f"{self.kind}'s {mark} {'word starts' if self.starts else 'pieces'}"


WORDPIECE = WordRule("WordPiece", ("##",), starts=False)


def _steps(component: object) -> list[dict]:
    """The steps of a tokenizer.json component (a pre-tokenizer, a decoder), a Sequence's
    flattened."""
    if not isinstance(component, dict):
        return []
    inner = component.get("pretokenizers", component.get("decoders"))
    if component.get("type") == "Sequence" and isinstance(inner, list):
        return [s for step in inner for s in _steps(step)]
    return [component]


def _marker_rule(step: dict) -> WordRule | None:
    kind = step.get("type")
    if kind == "ByteLevel":
        return WordRule("byte-level BPE", BYTE_LEVEL_SPACES, starts=True)
    if kind == "Metaspace":
        replacement = step.get("replacement") or "\u2581"
        return WordRule("Metaspace", (replacement,), starts=True)
    pattern = step.get("pattern")
    if kind == "Replace" and step.get("content") == " " and isinstance(pattern, dict):
        marker = pattern.get("String")  # a decoder that turns its word marker into a space
        if isinstance(marker, str) and marker.strip():
            return WordRule("Metaspace", (marker,), starts=True)
    return None


def rule_of_state(state: dict) -> WordRule | None:
    """The word rule of a tokenizer.json's contents, or None when it cannot be told.

    Pieces marked as continuations (the model's continuing_subword_prefix: WordPiece, or a BPE
    that has one) decide first; then a pre-tokenizer that marks word starts; then a decoder (a
    tokenizer may mark words in its normaliser and undo it only there). A WordLevel model's
    tokens are whole pre-tokens: none continues another."""
    model = state.get("model") if isinstance(state.get("model"), dict) else {}
    prefix = model.get("continuing_subword_prefix")
    if isinstance(prefix, str) and prefix:
        return WordRule(str(model.get("type") or "WordPiece"), (prefix,), starts=False)
    for step in _steps(state.get("pre_tokenizer")) + _steps(state.get("decoder")):
        rule = _marker_rule(step)
        if rule is not None:
            return rule
    if model.get("type") == "WordLevel":
        return WordRule("WordLevel", (), starts=False)  # no token continues a word
    return None


def _described(state: object) -> str:
    """The parts of a tokenizer.json that decide its word rule, for the error that finds none."""
    if not isinstance(state, dict):
        return "not a JSON object"
    model = state.get("model") if isinstance(state.get("model"), dict) else {}
    parts = [f"{model.get('type', 'unknown')} model"]
    for name in ("pre_tokenizer", "decoder"):
        kinds = [str(s.get("type")) for s in _steps(state.get(name))]
        parts.append(f"{' + '.join(kinds) or 'no'} {name.replace('_', '-')}")
    return ", ".join(parts)


def word_rule(tokenizer_dir: str | Path) -> WordRule:
    """The word rule of a tokenizer folder (its tokenizer.json's kind; vocab.txt alone: BERT's
    WordPiece). A kind whose words cannot be told is refused in one line that names
    data.whole_word_masking and the folder."""
    folder = Path(tokenizer_dir)
    path = folder / "tokenizer.json"
    if not path.is_file():
        return WORDPIECE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BertgpuError(f"{path}: cannot read the tokenizer ({e}); expected a tokenizers "
                           "JSON file") from None
    rule = rule_of_state(state) if isinstance(state, dict) else None
    if rule is None:
        raise UnknownWordRule(
            f"data.whole_word_masking: the tokenizer in {folder} ({_described(state)}) marks no "
            "word boundaries that bertgpu can read, so whole words cannot be told from its "
            "tokens; expected a WordPiece (\"##\" pieces), byte-level BPE (\"Ġ\" word starts) "
            "or Metaspace (\"▁\") tokenizer, or data.whole_word_masking false")
    return rule


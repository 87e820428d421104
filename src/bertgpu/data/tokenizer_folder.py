"""Tokenizer folders: the files `bertgpu tokenizer` writes, and how every command loads a folder
(its own, or a Hugging Face BERT model's) so that it encodes as transformers' AutoTokenizer does.

    from bertgpu.data.tokenizer_folder import load_tokenizer
    tok = load_tokenizer("tok/")                     # a tokenizers.Tokenizer
    tok.encode("Hello world", "Second segment").ids  # [CLS] A [SEP] B [SEP]

How ``AutoTokenizer.from_pretrained(folder)`` reads a folder, and so how it is read here:

- A BERT tokenizer class (tokenizer_config.json's ``tokenizer_class`` is BertTokenizer(Fast) or
  one of its copies, `BERT_TOKENIZER_CLASSES`; naming none, config.json's ``model_type`` is one of
  `BERT_MODEL_TYPES`): BERT's normaliser is built from tokenizer_config.json, ``do_lower_case``
  (default true), ``strip_accents`` (default: as do_lower_case) and ``tokenize_chinese_chars``
  (default true), whatever tokenizer.json's normaliser says.
- Any other folder with tokenizer.json (no tokenizer config, PreTrainedTokenizerFast):
  tokenizer.json as it is.
- vocab.txt without tokenizer.json: BERT's pipeline on that vocabulary, with the config's
  settings.

`is_lowercase` and `tokenizer_hash` describe that same encoding, so a manifest's do_lower_case
and tokenizer hash say how its shards were encoded.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from bertgpu.data.sources import is_url, local_path
from bertgpu.errors import BertgpuError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_WORD_CHARS = 100
"""A longer word encodes as [UNK] (BERT's max_input_chars_per_word)."""
_SPECIAL_KEYS = {"pad": "pad_token", "unk": "unk_token", "cls": "cls_token", "sep": "sep_token",
                 "mask": "mask_token"}
SPECIAL_TOKEN_MAP = dict(zip(_SPECIAL_KEYS.values(), SPECIAL_TOKENS, strict=True))
"""special_tokens_map.json of the folders `bertgpu tokenizer` writes ({"pad_token": "[PAD]"...})."""
# Files `prepare` copies into a data folder and `save_pretrained` next to a model.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")
BERT_TOKENIZER_CLASSES = frozenset({
    "BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer", "MobileBertTokenizer",
    "SqueezeBertTokenizer", "LayoutLMTokenizer", "ConvBertTokenizer", "LxmertTokenizer",
    "RetriBertTokenizer"})
"""``tokenizer_class`` values (each also with "Fast") whose transformers class builds BERT's
normaliser from the tokenizer config."""
BERT_MODEL_TYPES = frozenset({
    "bert", "distilbert", "electra", "mobilebert", "squeezebert", "layoutlm", "convbert",
    "megatron-bert", "nezha", "ernie", "lxmert", "retribert", "realm"})
"""config.json ``model_type`` values whose tokenizer is BERT's (a tokenizer config that names no
class)."""
_JSON_KINDS = {list: "array", str: "string", bool: "boolean", int: "number", float: "number",
               type(None): "null"}

Settings = tuple[bool, bool, bool]
"""(lower-cases, strips accents, splits CJK characters) of an encoding."""


def _pipeline(tokenizer, lowercase: bool, strip_accents: bool | None, cls_id: int, sep_id: int,
              cls: str = "[CLS]", sep: str = "[SEP]", chinese_chars: bool = True) -> None:
    """Attach BERT's normaliser, pre-tokenizer, templates and decoder to a WordPiece tokenizer."""
    from tokenizers import decoders, pre_tokenizers, processors

    tokenizer.normalizer = _bert_normalizer(lowercase, strip_accents, chinese_chars)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")


def _bert_normalizer(lowercase: bool, strip_accents: bool | None, chinese_chars: bool):
    from tokenizers import normalizers

    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                      strip_accents=strip_accents, lowercase=lowercase)


# --------------------------------------------------------------------------- the folder's files


def _read_json_or_empty(path: Path, expected: str = "") -> dict:
    """The JSON object in `path`, {} when there is no such file; anything else is an error."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BertgpuError(f"{path}: not valid JSON ({exc}){expected}") from None
    if not isinstance(value, dict):
        raise BertgpuError(f"{path}: a JSON {_JSON_KINDS.get(type(value), type(value).__name__)}, "
                           f"not an object{expected}")
    return value


def _read_config(folder: Path) -> dict:
    return _read_json_or_empty(folder / "tokenizer_config.json", "; expected a tokenizer config")


def _tokenizer_json(folder: Path) -> dict:
    return _read_json_or_empty(folder / "tokenizer.json", "; expected a tokenizers JSON file")


def _special_strings(folder: Path) -> dict[str, str]:
    """Special token strings by key (pad, unk, ...), from special_tokens_map.json or the config."""
    names = dict(SPECIAL_TOKEN_MAP)
    special_map = _read_json_or_empty(folder / "special_tokens_map.json",
                                      "; expected a map of special tokens")
    for source in (_read_config(folder), special_map):
        for attr in names:
            value = source.get(attr)
            if isinstance(value, dict):  # {"content": "[CLS]", ...} in newer files
                value = value.get("content")
            if isinstance(value, str):
                names[attr] = value
    return {key: names[attr] for key, attr in _SPECIAL_KEYS.items()}


def _check_folder(folder: Path) -> None:
    if folder.is_file():
        raise BertgpuError(f"{folder}: a file, not a tokenizer folder; expected the folder that "
                           f"holds it ({folder.parent})")
    if not folder.is_dir():
        raise BertgpuError(f"{folder}: no such tokenizer folder; expected the output of "
                           "`bertgpu tokenizer`")
    if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").is_file():
        raise BertgpuError(
            f"{folder}: neither tokenizer.json nor vocab.txt found; expected a tokenizer folder"
        )


def local_tokenizer_folder(path: str | os.PathLike, flag: str = "--tokenizer") -> str:
    """``path`` as a local folder (a file:// URL as the folder it names); a URL (s3://,
    memory://) is refused naming ``flag``: the tokenizers library reads a folder from disk, and
    Path() had made "s3://b/tok" the local "s3:/b/tok" ("no such tokenizer folder")."""
    text = local_path(path)
    if is_url(text):
        raise BertgpuError(f"{flag} {text}: a tokenizer folder must be a local folder; expected "
                           "a local path (copy the folder here first)")
    return text


def find_tokenizer_folder(path: str | os.PathLike) -> Path | None:
    """The tokenizer folder that `path` names, or None: a tokenizer folder or a Hugging Face model
    folder (vocab.txt or tokenizer.json) as is; a bertgpu run folder's tokenizer/, also from one
    of its checkpoints/step_N (so `prepare --tokenizer runs/phase1` makes shards for a run
    continued from it): the run's own, before the copy a checkpoint carries for transformers."""
    folder = Path(path)
    candidates = [folder, folder / "tokenizer"]
    if folder.parent.name == "checkpoints":
        candidates.insert(0, folder.parent.parent / "tokenizer")
    for candidate in candidates:
        if (candidate / "tokenizer.json").is_file() or (candidate / "vocab.txt").is_file():
            return candidate
    return None


# --------------------------------------------------------------------------- the encoding


def _config_builds_normaliser(folder: Path, config: dict) -> bool:
    """Whether transformers builds BERT's normaliser from the tokenizer config (a BERT tokenizer
    class, or no tokenizer.json) rather than take tokenizer.json's as it is."""
    if not (folder / "tokenizer.json").is_file():
        return True
    name = config.get("tokenizer_class")
    if isinstance(name, str):
        return name.removesuffix("Fast") in BERT_TOKENIZER_CLASSES
    model = _read_json_or_empty(folder / "config.json", "; expected a model config")
    return model.get("model_type") in BERT_MODEL_TYPES


def _config_settings(folder: Path, config: dict) -> tuple[bool, bool | None, bool]:
    """(do_lower_case, strip_accents, tokenize_chinese_chars) of a tokenizer config, with BERT
    tokenizer's defaults (True, None: as do_lower_case, True)."""

    def setting(key: str, default: bool | None, null: bool = False) -> bool | None:
        value = config.get(key, default)
        if isinstance(value, bool) or (null and value is None):
            return value
        raise BertgpuError(f"{folder / 'tokenizer_config.json'}: {key} is {json.dumps(value)}; "
                           f"expected true or false{' or null' if null else ''}")

    lowercase = setting("do_lower_case", True)
    return lowercase, setting("strip_accents", None, null=True), setting("tokenize_chinese_chars",
                                                                         True)


def _effective(settings: tuple[bool, bool | None, bool]) -> Settings:
    lowercase, strip, chinese = settings
    return lowercase, lowercase if strip is None else strip, chinese


def _normaliser_settings(normaliser: dict | None) -> Settings:
    """The settings of a tokenizer.json normaliser: BERT's, or a Sequence of steps with Lowercase
    and StripAccents among them."""
    steps = [normaliser] if isinstance(normaliser, dict) else []
    if steps and normaliser.get("type") == "Sequence":
        steps = [s for s in normaliser.get("normalizers") or [] if isinstance(s, dict)]
    lowercase = strip = chinese = False
    for step in steps:
        kind = step.get("type")
        if kind == "BertNormalizer":
            bert_lowercase = bool(step.get("lowercase", True))
            bert_strip = step.get("strip_accents")
            lowercase = lowercase or bert_lowercase
            strip = strip or (bert_lowercase if bert_strip is None else bool(bert_strip))
            chinese = chinese or bool(step.get("handle_chinese_chars", True))
        lowercase = lowercase or kind == "Lowercase"
        strip = strip or kind == "StripAccents"
    return lowercase, strip, chinese


def _settings(folder: Path) -> Settings:
    """The settings of the encoding `load_tokenizer` gives."""
    config = _read_config(folder)
    if _config_builds_normaliser(folder, config):
        return _effective(_config_settings(folder, config))
    return _normaliser_settings(_tokenizer_json(folder).get("normalizer"))


def is_lowercase(folder: str | os.PathLike) -> bool:
    """Whether the folder's encoding lower-cases its input (see `load_tokenizer`)."""
    folder = Path(folder)
    _check_folder(folder)
    return _settings(folder)[0]


_WORDS = (("lower-cases", "keeps case"), ("strips accents", "keeps accents"),
          ("splits CJK characters", "keeps CJK characters together"))


def _describe(settings: Settings, differs: Settings) -> str:
    """What ``settings`` do, where ``differs`` flags them."""
    return " and ".join(words[not on] for on, diff, words in zip(settings, differs, _WORDS,
                                                                  strict=True) if diff)


def _follow_config(tok, folder: Path, config: dict) -> None:
    """Give ``tok`` (tokenizer.json's) the normaliser transformers builds from the config, with a
    warning when that changes the encoding."""
    lowercase, strip, chinese = _config_settings(folder, config)
    wanted = _effective((lowercase, strip, chinese))
    state = json.loads(tok.normalizer.__getstate__()) if tok.normalizer is not None else None
    found = _normaliser_settings(state)
    plain_bert = bool(state) and state.get("type") == "BertNormalizer" and state.get("clean_text")
    if plain_bert and found == wanted:
        return  # the same encoding: the file's normaliser stays as it is
    tok.normalizer = _bert_normalizer(lowercase, strip, chinese)
    if found != wanted:
        differs = tuple(a != b for a, b in zip(found, wanted, strict=True))
        warnings.warn(f"{folder}: tokenizer.json's normaliser {_describe(found, differs)}, but "
                      f"tokenizer_config.json (with BERT's defaults for what it does not set) "
                      f"{_describe(wanted, differs)}; encoding as the config says, as "
                      "transformers' AutoTokenizer does", stacklevel=2)


def load_tokenizer(folder: str | os.PathLike):
    """The `tokenizers.Tokenizer` of a folder, encoding as ``AutoTokenizer.from_pretrained(folder)``
    does (the module docstring has the rules).

    Where a BERT folder's tokenizer.json and tokenizer_config.json disagree (a cased
    tokenizer.json under a config that sets or leaves do_lower_case to its default, true), the
    config wins, with a warning. Refusing such a folder was the other choice; this one is taken
    because transformers reads the folder without complaint and is where the model is used
    afterwards (a pipeline, a fine-tuning script): shards encoded by the config hold the ids the
    exported model gets there, while tokenizer.json's encoding would pretrain it on ids it never
    sees again. Only the normaliser is replaced; the vocabulary, the WordPiece model and the
    pre-tokenizer stay tokenizer.json's (the same as BERT's in any folder `bertgpu tokenizer`
    writes). A folder without tokenizer.json gets BERT's pipeline on vocab.txt, with the
    config's settings.
    """
    from tokenizers import AddedToken, Tokenizer, models

    folder = Path(folder)
    _check_folder(folder)
    config = _read_config(folder)
    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the Rust side raises plain Exception with its message
            raise BertgpuError(f"{folder / 'tokenizer.json'}: cannot load ({exc}); expected a "
                               "tokenizers JSON file") from None
        if _config_builds_normaliser(folder, config):
            _follow_config(tok, folder, config)
        return tok
    specials = _special_strings(folder)
    vocab = _read_vocab(folder / "vocab.txt")
    missing = [t for t in specials.values() if t not in vocab]
    if missing:
        raise BertgpuError(f"{folder / 'vocab.txt'}: special tokens {missing} missing; expected "
                           "them in the vocabulary")
    tok = Tokenizer(models.WordPiece(vocab, unk_token=specials["unk"],
                                     continuing_subword_prefix="##",
                                     max_input_chars_per_word=MAX_WORD_CHARS))
    lowercase, strip, chinese = _config_settings(folder, config)
    _pipeline(tok, lowercase, strip, vocab[specials["cls"]], vocab[specials["sep"]],
              cls=specials["cls"], sep=specials["sep"], chinese_chars=chinese)
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials.values()])
    return tok


def _read_vocab(path: Path) -> dict[str, int]:
    """Token -> id (its 0-based line). A token on two lines is refused: transformers'
    BertTokenizer gives it the id of its last line, this its first, so the shards' ids would not
    be the exported model's (a repeated [CLS] on line 2003: id 2002, past the model's vocabulary,
    and its fill-mask pipeline failed with an IndexError)."""
    vocab: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                token = line.rstrip("\n")
                first = vocab.setdefault(token, i)
                if first != i:
                    raise BertgpuError(
                        f"{path}: token {token!r} is on lines {first + 1} and {i + 1}; expected "
                        "each token on one line (transformers would give it the id of its last "
                        "line, bertgpu its first)")
    except UnicodeDecodeError:
        raise BertgpuError(f"{path}: invalid UTF-8; expected one token per line") from None
    if not vocab:
        raise BertgpuError(f"{path}: empty; expected one token per line")
    return vocab


def special_token_ids(folder: str | os.PathLike) -> dict[str, int]:
    """Ids of the special tokens: keys pad, unk, cls, sep, mask."""
    folder = Path(folder)
    tok = load_tokenizer(folder)
    ids: dict[str, int] = {}
    for key, token in _special_strings(folder).items():
        idx = tok.token_to_id(token)
        if idx is None:
            raise BertgpuError(f"{folder}: special token {token} is not in the vocabulary")
        ids[key] = idx
    return ids


def tokenizer_hash(folder: str | os.PathLike) -> str:
    """sha256 over vocab.txt and the settings of the encoding `load_tokenizer` gives: equal hash =
    identical encoding."""
    folder = Path(folder)
    _check_folder(folder)
    h = hashlib.sha256()
    vocab_path = folder / "vocab.txt"
    if vocab_path.is_file():
        h.update(vocab_path.read_bytes())
    else:  # a tokenizer.json-only folder: its vocabulary in id order stands in for vocab.txt
        vocab = load_tokenizer(folder).get_vocab(with_added_tokens=True)
        h.update("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])).encode())
    lowercase, strip, chinese = _settings(folder)
    settings = {"lowercase": lowercase, "strip_accents": strip, "chinese_chars": chinese}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()

"""A run's training arguments, merged and typed by the recipe's own parser, before any process starts.

The ranks parse `train.py --config config.yaml ARGS` with TRL's `TrlParser` (an `HfArgumentParser` over the classes
of TRL's sft.py, ScriptArguments, SFTConfig, ModelConfig and DatasetMixtureConfig, and the recipe's RecipeArguments):
config.yaml's values become the parser's defaults
(`TrlParser.set_defaults_with_config`), then argparse reads ARGS. We run exactly that merge here, on a parser the
recipe's `make_parser()` builds, so that the launcher sees the values the ranks will see: argparse's types and
choices, `--no_X` flags, list values, YAML strings converted as argparse converts them. What we do NOT run is the
dataclasses' `__post_init__`: `TrainingArguments.__post_init__` initialises Accelerate's device state in this
process (and refuses bf16 on a machine without a GPU, where a GPU run is being planned), so its two normalisations
that the rules need are repeated in `checkpointing()` and `_load_json_dicts()`, each saying where upstream does it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from launch.config.adapter import Adapter
from launch.recipe.template import section_of_key
from launch.errors import LaunchError
from launch.switches import is_on

AFTER_DASHES = "the training arguments after `--`"


class _ArgumentError(Exception):
    pass


_PARSE_ERRORS = (_ArgumentError, argparse.ArgumentError)  # error() calls, and what exit_on_error=False raises


@dataclass
class Layer:
    """One source of training arguments: its name (a file, `after --`, `the smoke profile`) and its argv."""

    source: str
    argv: list[str]


def _parser(make_parser):
    parser = make_parser()
    parser.exit_on_error = False
    # argparse would read `--learning_rat` as an abbreviation of `--learning_rate` (and `--max_step` of `--max_steps`):
    # in the ranks too, but a typo that happens to be a prefix is refused here, with the full name suggested.
    parser.allow_abbrev = False

    def error(message):  # argparse would print usage and exit; we name the source instead
        raise _ArgumentError(message)

    parser.error = error
    return parser


def _actions(parser) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        out.setdefault(action.dest, action)  # the positive option first (`--X`, not `--no_X`)
    return out


def fields(make_parser) -> frozenset[str]:
    """Every key the recipe's parser accepts."""
    return frozenset(d for d in _actions(_parser(make_parser)) if d != "help")


def merge(make_parser, config_path: Path, config: dict, layers: list[Layer]) -> dict:
    """config.yaml (without its `env:` block) and the layers, later layers winning, as the ranks' TrlParser merges
    them. Returns every field's value. Raises LaunchError naming the source, key and expected type of a bad value,
    or listing unknown keys."""
    config = {k: v for k, v in config.items() if k != "env"}
    parser = _parser(make_parser)
    actions = _actions(parser)
    problems = [_yaml_type_problem(config_path, key, value, actions[key])
                for key, value in config.items() if key in actions]
    problems = [p for p in problems if p]
    # A field of one of templates/train.py's optional sections that this recipe's script leaves out is not reported
    # here: rules.script_holds_its_sections refuses the run and says how to get the section.
    unknown_config = [k for k in config if k not in actions and not section_of_key(k)]
    parser.set_defaults_with_config(**config)
    argv = [token for layer in layers for token in layer.argv]
    try:
        namespace, unknown_argv = parser.parse_known_args(argv)
    except _PARSE_ERRORS as e:
        raise LaunchError(_explain(str(e), _culprit(make_parser, config_path, config, layers))) from None
    unknown_argv = _without_section_keys(unknown_argv)
    if unknown_config or unknown_argv:
        raise LaunchError(_unknown(config_path, unknown_config, unknown_argv, layers, sorted(actions)))
    if problems:
        raise LaunchError("\n".join(problems))
    values = vars(namespace)
    _load_json_dicts(values, actions, config_path, config)
    _pad_to_multiple_of(values)
    return values


@dataclass(frozen=True)
class Checkpointing:
    """Activation checkpointing as the ranks get it, resolved once (`checkpointing()`) for the rules, the memory model,
    the smoke profile, `--fastest` and the recipe catalogue: transformers' (the training arguments, under either of
    their two names) and FSDP's own (the Accelerate config's two flags), and who checkpoints."""

    enabled: bool  # transformers' (`activation_checkpointing`, or its deprecated alias)
    kwargs: dict  # transformers' `activation_checkpointing_kwargs`
    name: str  # the key that decided it: "activation_checkpointing", or "gradient_checkpointing" (TRL's default)
    fsdp: bool = False  # FSDP's own: `fsdp_activation_checkpointing` in an FSDP config's fsdp_config
    fsdp_offload: bool = False  # its `fsdp_activation_checkpointing_offload`
    by: str = "transformers"  # who checkpoints when the run does: "transformers" or "FSDP" (`checkpointing()`)
    # of the model's decoder layers, how many either checkpoints (the first ones: launch/rank/partial_checkpointing.py,
    # the recipe key `checkpointing_layers`); None: all of them
    layers: int | None = None

    @property
    def offload(self) -> bool:
        """transformers' checkpoints offloaded to host memory (`activation_checkpointing_kwargs: {offload: true}`)."""
        return bool(self.kwargs.get("offload", False))

    @property
    def on(self) -> bool:
        """Whether decoder layers are checkpointed, by either: every one, or the first `layers`."""
        return self.enabled or self.fsdp

    @property
    def offloaded(self) -> bool:
        """Whether the checkpoints of whoever checkpoints go to host memory."""
        return self.fsdp_offload if self.fsdp else self.enabled and self.offload


CHECKPOINTING_ALIASES = {"gradient_checkpointing": "activation_checkpointing",
                         "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}
FSDP_CHECKPOINTING = "fsdp_activation_checkpointing"  # FSDP's own two flags, in the Accelerate config's fsdp_config
FSDP_CHECKPOINTING_OFFLOAD = "fsdp_activation_checkpointing_offload"


def checkpointing(values: dict, accelerate: dict | None = None) -> Checkpointing:
    """transformers 5.23 (TrainingArguments.__post_init__): `activation_checkpointing*` are the current names and
    `gradient_checkpointing*` their deprecated aliases, used only when the new name is unset (None); TRL's config
    defaults `gradient_checkpointing` to True. A value given under the old name while the new one is set is ignored
    by transformers: `alias_ignored()` finds that before the start.

    `accelerate`: the Accelerate config (None: not FSDP). Under FSDP its `fsdp_activation_checkpointing` (and
    `_offload`) is FSDP's own checkpointing. Who checkpoints (`by`): FSDP when its own is on, or when nothing
    checkpoints and the config is FSDP2 without an adapter (FSDP's own is that family's way; an adapter cannot use it:
    the rules refuse fsdp_activation_checkpointing with an adapter); else transformers. `layers`: the recipe's
    `checkpointing_layers` (rules.checkpointing_layers_valid checks it against the model)."""
    new = values.get("activation_checkpointing")
    enabled = bool(new if new is not None else values.get("gradient_checkpointing", True))  # TRL's default
    kwargs = values.get("activation_checkpointing_kwargs")
    if kwargs is None:
        kwargs = values.get("gradient_checkpointing_kwargs")
    name = "activation_checkpointing" if new is not None else "gradient_checkpointing"
    layers = values.get("checkpointing_layers")
    accelerate = accelerate or {}
    if accelerate.get("distributed_type") != "FSDP":
        return Checkpointing(enabled, dict(kwargs or {}), name, layers=layers)
    fsdp_config = accelerate.get("fsdp_config") or {}
    fsdp = is_on(fsdp_config.get(FSDP_CHECKPOINTING, False))
    fsdp2 = int(fsdp_config.get("fsdp_version") or 1) == 2
    by = "FSDP" if fsdp or (not enabled and fsdp2 and Adapter.from_training(values) is None) else "transformers"
    return Checkpointing(enabled, dict(kwargs or {}), name, fsdp,
                         fsdp and is_on(fsdp_config.get(FSDP_CHECKPOINTING_OFFLOAD, False)), by, layers)


def alias_ignored(values: dict, explicit: dict[str, tuple[int, str]]) -> list[tuple[str, str, str]]:
    """(old name, new name, where the old one was given) for each deprecated checkpointing name that the user gave
    (`explicit`: key -> (precedence, source), as `explicit_keys` returns) at the same or a later place than the new
    name, with another value: the user meant it to win, and transformers will ignore it. (The new name given later
    than the old one is what the user meant, and wins: that is fine.)"""
    out = []
    for old, new in CHECKPOINTING_ALIASES.items():
        if old in explicit and new in explicit and explicit[old][0] >= explicit[new][0] \
                and values.get(new) is not None and values.get(old) != values.get(new):
            out.append((old, new, explicit[old][1]))
    return out


def explicit_keys(config_path: Path, config: dict, layers: list[Layer]) -> dict[str, tuple[int, str]]:
    """Every training key given explicitly -> (precedence, source): config.yaml is 0, each later layer one more (the
    last one wins, as in the parser); `--no_X` counts as X."""
    out = {key: (0, str(config_path)) for key in config if key != "env"}
    for rank, layer in enumerate(layers, start=1):
        for token in layer.argv:
            if token.startswith("--"):
                key = token[2:].split("=", 1)[0].replace("-", "_")
                out[key[3:] if key.startswith("no_") else key] = (rank, layer.source)
    return out


# ---- helpers -----------------------------------------------------------------------------------------------------
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}


def _type_name(action) -> str:
    if action.choices:
        return "one of " + ", ".join(map(str, action.choices))
    if getattr(action.type, "__name__", "") == "string_to_bool" or action.nargs == 0:
        return "true or false"
    return _TYPE_NAMES.get(action.type, getattr(action.type, "__name__", "a value"))


def _yaml_type_problem(config_path: Path, key: str, value, action) -> str | None:
    """argparse converts string defaults only; a YAML number or list given for another type is checked here, so
    that `gradient_accumulation_steps: 2.5` is refused instead of reaching the ranks as 2.5."""
    if value is None or isinstance(value, str):
        return None  # strings are converted (and refused) by argparse itself
    want = action.type
    ok = True
    if action.nargs in ("+", "*"):
        ok = isinstance(value, list)
    elif want is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif want is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif getattr(want, "__name__", "") == "string_to_bool" or action.nargs == 0:
        ok = isinstance(value, bool)
    if action.choices and not isinstance(value, list) and value not in action.choices:
        ok = False
    if ok:
        return None
    return f"{config_path}: `{key}: {value!r}`: expected {_type_name(action)}."


# argparse: "argument --x: invalid float value: 'fast'" / "invalid choice: 'y' (choose from ...)"; the value is the
# repr() of what was given, so a value holding quotes is written with the other quote ("'1e-5'" for '1e-5' typed
# with its quotes): read as a Python string literal, not up to the next quote
_INVALID = re.compile(r"""argument (--[\w-]+)[^:]*: invalid (?:(\w+) value|choice): """
                      r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(.*)""")


def _explain(message: str, source: str) -> str:
    m = _INVALID.match(message)
    if m:
        option, kind, literal, rest = m.groups()
        value = ast.literal_eval(literal)
        expected = {"int": "an integer", "float": "a number", "string_to_bool": "true or false"}.get(kind or "", "")
        if "choose from" in rest:
            expected = "one of " + rest.split("choose from", 1)[1].strip(" ()")
        key = option[2:].replace("-", "_")
        quoted = (" (its quotes are part of the value: the shell passed them on, e.g. from \"'...'\"; give the value "
                  "without them)") if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1 else ""
        return f"{source}: `{key}` is {value!r}{quoted}; expected {expected or 'another value'}."
    return f"{source}: {message}."


def _culprit(make_parser, config_path, config, layers) -> str:
    """Which source holds the bad value: parse the config alone, then add one layer at a time."""
    for n in range(len(layers) + 1):
        parser = _parser(make_parser)
        parser.set_defaults_with_config(**config)
        try:
            parser.parse_known_args([t for layer in layers[:n] for t in layer.argv])
        except _PARSE_ERRORS:
            return str(config_path) if n == 0 else layers[n - 1].source
    return str(config_path)


def _unknown(config_path, unknown_config, unknown_argv, layers, known) -> str:
    import difflib

    def hint(key):
        close = difflib.get_close_matches(key, known, n=2)
        return f" (did you mean {' or '.join(close)}?)" if close else ""

    parts = [f"`{k}` in {config_path}{hint(k)}" for k in unknown_config]
    previous_unknown_key = False
    for token in unknown_argv:
        key = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
        where = next((layer.source for layer in layers if token in layer.argv), AFTER_DASHES)
        if key:
            parts.append(f"`{key}` in {where}{hint(key)}")
        elif not previous_unknown_key:  # the value of an unknown key is not a problem of its own
            parts.append(f"unexpected value `{token}` in {where}")
        previous_unknown_key = bool(key) and "=" not in token
    return ("Unknown training argument(s): " + "; ".join(parts) + ". Keys must be fields of TRL's SFTConfig, "
            "ModelConfig, ScriptArguments, DatasetMixtureConfig or the recipe's RecipeArguments (see its train.py).")


def _without_section_keys(tokens: list[str]) -> list[str]:
    """The unknown argv tokens without the optional sections' fields (`--key value`, `--key=value`), which
    rules.script_holds_its_sections reports, as it does for config.yaml."""
    out: list[str] = []
    value_of_dropped = False
    for token in tokens:
        if token.startswith("--"):
            key = token[2:].split("=", 1)[0].replace("-", "_")
            if section_of_key(key[3:] if key.startswith("no_") else key):
                value_of_dropped = "=" not in token
                continue
        elif value_of_dropped:
            value_of_dropped = False
            continue
        value_of_dropped = False
        out.append(token)
    return out


def _pad_to_multiple_of(values: dict) -> None:
    """As SFTConfig.__post_init__ (trl 1.16): a string is a number or none/null, and "auto" (the default) means no
    padding except on Neuron devices, which no recipe targets."""
    value = values.get("pad_to_multiple_of")
    if isinstance(value, str):
        if value == "auto" or value.lower() in ("none", "null"):
            values["pad_to_multiple_of"] = None
        else:
            try:
                values["pad_to_multiple_of"] = int(value)
            except ValueError:
                raise LaunchError(f"`pad_to_multiple_of` is {value!r}; expected an integer, auto or none.") from None


def _load_json_dicts(values: dict, actions: dict, config_path: Path, config: dict) -> None:
    """Dict-valued fields given as JSON strings on the command line (`--model_init_kwargs '{...}'`) are read as
    TrainingArguments.__post_init__ (`_VALID_DICT_FIELDS`) and SFTConfig do: strings starting with `{`."""
    for key, value in values.items():
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                values[key] = json.loads(value)
            except json.JSONDecodeError as e:
                where = config_path if key in config else AFTER_DASHES
                raise LaunchError(f"{where}: `{key}` is not valid JSON ({e.msg} at character {e.pos}).") from None


# TRL 1.16's strategies whose batches are padding-free (SFTTrainer.__init__: `args.padding_free or (args.packing and
# args.packing_strategy in {"bfd", "bfd_split"})`); read by the packing rules (launch.checks.rules.packing) and the
# memory and throughput models (launch.memory.run_shape)
PADDING_FREE_STRATEGIES = ("bfd", "bfd_split")


def packs_by_conversation(training: dict, packing_key: str = "packing") -> bool:
    """Whether `packing_key` (packing or eval_packing) packs conversations into rows whose boundaries are kept in
    `seq_lengths` (bfd, bfd_split), as opposed to wrapped token windows."""
    return bool(training.get(packing_key)) and training.get("packing_strategy", "bfd") in PADDING_FREE_STRATEGIES


def padding_free_batches(training: dict) -> bool:
    """Whether TRL's collator builds padding-free rows (several conversations in one row, no attention mask)."""
    return bool(training.get("padding_free")) or packs_by_conversation(training)

"""Constructor options, checked once: every rule on a single option is declared in the signature.

A constructor states its options' types and allowed values with :data:`typing.Annotated`, and is decorated
with :func:`checked`::

    @checked
    def __init__(self, block_len: PositiveInt = 512, decay: Annotated[float, Between(0, 1, "()")] = 0.99,
                 strategy: Annotated[str, OneOf("ema", "gradient")] = "ema") -> None: ...

The commonest rules have names: :data:`PositiveInt` (``Annotated[int, AtLeast(1)]``, a count or a size),
:data:`NonNegativeInt`, :data:`PositiveFloat` and :data:`NonNegativeFloat`.
Calling it with a bad value raises :class:`OptionError` naming the option, the value and what is allowed.
Config validation (:mod:`tvq_exp.run.validation`) reads the same annotations (:func:`constraints`) to check a
composed config before anything is built, and the fuzz tests draw bad values from them
(:meth:`Constraint.bad_values`). Rules that tie several options together stay in the constructor's body and
raise :class:`OptionError` too; config validation finds them by building the model on the meta device.
"""

from __future__ import annotations

import abc
import functools
import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class OptionError(ValueError):
    """A constructor option with a value that is not allowed: ``str(err)`` is
    ``"<owner>: <option>=<value>: <allowed>"``; :attr:`option`, :attr:`value`, :attr:`allowed` and
    :attr:`owner` (the class) are kept for config validation, which names the config key instead."""

    def __init__(self, option: str, value: Any, allowed: str, owner: type | None = None) -> None:
        self.option, self.value, self.allowed, self.owner = option, value, allowed, owner
        prefix = f"{owner.__name__}: " if owner is not None else ""
        super().__init__(f"{prefix}{option}={value!r}: {allowed}")


class Constraint(abc.ABC):
    """A rule on one option's value."""

    @abc.abstractmethod
    def violation(self, value: Any) -> str | None:
        """What is allowed, when ``value`` breaks the rule; ``None`` when it is fine."""

    @abc.abstractmethod
    def bad_values(self) -> list[Any]:
        """A few values that break the rule (for fuzzing)."""


@dataclass(frozen=True)
class Between(Constraint):
    """A number in an interval; ``ends`` is ``"[]"``, ``"[)"``, ``"(]"`` or ``"()"`` (closed or open ends)."""

    low: float = -math.inf
    high: float = math.inf
    ends: str = "[]"

    def violation(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None  # a type error, reported by the type check
        if not math.isfinite(value):
            return f"{self.describe()}, and finite (not inf or nan)"
        above = value > self.low if self.ends[0] == "(" else value >= self.low
        below = value < self.high if self.ends[1] == ")" else value <= self.high
        return None if above and below else self.describe()

    def describe(self) -> str:
        if self.high == math.inf:
            return f"must be {'>' if self.ends[0] == '(' else '>='} {_number(self.low)}"
        if self.low == -math.inf:
            return f"must be {'<' if self.ends[1] == ')' else '<='} {_number(self.high)}"
        return f"must be in {self.ends[0]}{_number(self.low)}, {_number(self.high)}{self.ends[1]}"

    def bad_values(self) -> list[Any]:
        values: list[Any] = []
        if self.low != -math.inf:
            values.append(self.low if self.ends[0] == "(" else self.low - 1)
        if self.high != math.inf:
            values.append(self.high if self.ends[1] == ")" else self.high + 1)
        return [*values, math.inf, math.nan]


def AtLeast(low: float) -> Between:  # noqa: N802 (reads as a type in signatures)
    """``>= low``."""
    return Between(low, math.inf, "[]")


def Above(low: float) -> Between:  # noqa: N802
    """``> low``."""
    return Between(low, math.inf, "(]")


@dataclass(frozen=True)
class AtLeastOr(Constraint):
    """``>= low``, or the one value ``special`` that means something else (``-1``: no limit)."""

    low: float
    special: float
    meaning: str = "no limit"

    def violation(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value == self.special:
            return None  # a type error is reported by the type check
        if math.isfinite(value) and value >= self.low:
            return None
        return f"must be {_number(self.special)} ({self.meaning}) or >= {_number(self.low)}"

    def bad_values(self) -> list[Any]:
        return [self.low - 1, *([self.special - 1] if self.special < self.low - 1 else []), math.nan]


# the rules most options follow, named as pydantic names them
PositiveInt = Annotated[int, AtLeast(1)]  # a count or a size
NonNegativeInt = Annotated[int, AtLeast(0)]
PositiveFloat = Annotated[float, Above(0)]
NonNegativeFloat = Annotated[float, AtLeast(0)]


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of a few choices."""

    choices: tuple[Any, ...]

    def __init__(self, *choices: Any) -> None:
        object.__setattr__(self, "choices", choices)

    def violation(self, value: Any) -> str | None:
        return None if value in self.choices else f"must be one of {', '.join(map(str, self.choices))}"

    def bad_values(self) -> list[Any]:
        return ["no_such_choice"]


@dataclass(frozen=True)
class PlainName(Constraint):
    """One folder name (``run_name``): not empty, no path separator, not ``.`` or ``..``, no leading dot or
    space, so the run directory it names stays inside the log dir."""

    def violation(self, value: Any) -> str | None:
        if not isinstance(value, str):
            return None  # a type error, reported by the type check
        text = value.strip()
        if text and text == value and "/" not in value and "\\" not in value and not value.startswith("."):
            return None
        return "must be one plain folder name (no '/', no leading '.', not empty): the run dir stays in the log dir"

    def bad_values(self) -> list[Any]:
        return ["../../x", "a/b", "..", ".hidden", "/tmp/x", " "]


@dataclass(frozen=True)
class NewFile(Constraint):
    """A file a command writes (``eval.py output=``, ``sample.py output=``): its folder must exist, since no
    command creates folders the user named, and it must be a regular file or new (not a folder, a link or a
    device such as ``/dev/null``, beside which ``eval.py`` would write ``/dev/null.png``)."""

    def violation(self, value: Any) -> str | None:
        if not isinstance(value, str):
            return None  # a type error, reported by the type check
        path = Path(value).expanduser()
        if path.is_symlink():
            return "is a symbolic link: a command never writes through one; give a file name"
        if path.is_dir():
            return "is a folder: give a file name"
        if path.exists() and not path.is_file():
            return "is not a regular file (a device, pipe or socket): give a file name"
        if not path.parent.is_dir():
            return f"its folder {path.parent} does not exist: create it first (no command creates it for you)"
        return None

    def bad_values(self) -> list[Any]:
        return ["/no-such-folder-of-tvq_exp/out.json", "/", "/dev/null", "/dev/full"]


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def option_functions(target: Callable[..., Any]) -> list[Callable[..., Any]]:
    """The (undecorated) functions whose parameters are ``target``'s options: a function itself; for a class its
    constructor and, while a constructor hands its ``**options`` on to its base class's, that one too (an attention
    backend takes its own options and passes the shared ones, ``d_k, d_v, heads, ...``, to its base)."""
    if not inspect.isclass(target):
        return [inspect.unwrap(target)]
    found = []
    for cls in target.__mro__:
        if "__init__" not in vars(cls):
            continue
        found.append(inspect.unwrap(vars(cls)["__init__"]))
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(found[-1]).parameters.values()):
            break
    return found


def constraints(target: Callable[..., Any]) -> dict[str, Constraint]:
    """The :class:`Constraint` of every annotated option of ``target`` (a function, a class's ``__init__``, or a
    class: its options as :func:`option_functions` finds them)."""
    found: dict[str, Constraint] = {}
    for fn in reversed(option_functions(target)):  # a constructor's own rule overrides its base's
        for name, hint in typing.get_type_hints(fn, include_extras=True).items():
            for meta in _annotated_metadata(hint):
                if isinstance(meta, Constraint):
                    found[name] = meta
    return found


def _annotated_metadata(hint: Any) -> tuple[Any, ...]:
    """The ``Annotated`` metadata of ``hint``, also inside ``Optional[Annotated[...]]``."""
    if typing.get_origin(hint) is typing.Annotated:
        return hint.__metadata__
    return tuple(meta for arg in typing.get_args(hint) for meta in _annotated_metadata(arg))


def check_values(owner: type | None, rules: dict[str, Constraint], values: dict[str, Any]) -> None:
    """Raise :class:`OptionError` for the first value of ``values`` that breaks its rule (``None`` passes:
    optional options are typed ``X | None``)."""
    for name, rule in rules.items():
        value = values.get(name)
        if value is None:
            continue
        allowed = rule.violation(value)
        if allowed is not None:
            raise OptionError(name, value, allowed, owner)


def checked(init: F) -> F:
    """Decorate a constructor: its annotated options are checked on every call (see the module doc)."""
    signature = inspect.signature(init)
    rules = functools.cache(lambda: constraints(init))  # read on first use: the module is complete by then

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        check_values(type(self), rules(), bound.arguments)
        return init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = [
    "Above",
    "AtLeast",
    "AtLeastOr",
    "Between",
    "Constraint",
    "OneOf",
    "NewFile",
    "NonNegativeFloat",
    "NonNegativeInt",
    "OptionError",
    "PlainName",
    "PositiveFloat",
    "PositiveInt",
    "check_values",
    "checked",
    "constraints",
    "option_functions",
]

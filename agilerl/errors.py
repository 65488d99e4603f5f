"""Every error agilerl raises on purpose, in one tree under :class:`AgileRLError`.

The CLI prints these as one message without a traceback. Catch a branch (``EnvError``,
``PluginError``, ...) to handle a family; errors about a bad value are ``ValueError`` too, so code
that catches the built-in kinds keeps working.

    AgileRLError
    ├── InvalidArgument (ValueError)            a Python call got a value it cannot use
    │   ├── ConfigError                           settings given in Python are invalid
    │   ├── ChatTemplateError                     the tokenizer's template cannot be used
    │   └── TrajectoryShapeError                  a trajectory's per-token lists disagree
    ├── MissingExtra (ImportError)              an optional dependency is not installed
    ├── ManifestError (ValueError)              a manifest file is invalid (manifests only)
    ├── ReplyTooLarge                           a peer's reply is past its byte cap
    ├── PluginError                             finding, naming, loading or installing plugins
    │   ├── RegistrationError, ScaffoldError, EnvPackagesError, StrictPluginsError
    │   └── LoadError → ModuleNotImportable, NameNotRegistered, NameConflict, OpenEnvPackageError
    ├── EnvError                                an env (local or remote) misbehaved
    │   ├── EnvProtocolError → EnvCheckError      it broke the text-env protocol
    │   ├── EnvTimeoutError (TimeoutError)        a call did not finish in time
    │   ├── RemoteEnvError → RemoteEnvTimeout,    the server failed or went silent,
    │   │                    EnvUnavailable       or stayed down past reconnect_timeout_s
    │   ├── ObservationError                      no prompt text in an observation
    │   ├── OpenEnvAdapterError (ValueError)      an OpenEnv env cannot be driven with text
    │   ├── EpisodeError                          reset/step/close called out of order
    │   └── ReplicaStartError                     an env replica (process, Ray actor) did not start
    ├── DataError → DatasetLoadError, RubricError, TemplateError
    │   RubricError → JudgeFailed                 one judgement failed after its retries
    │               → JudgeUnavailable            every judge call failed past give_up_after_s
    │                 (EnvUnavailable too)
    └── TrainingError → CollectionError, CheckpointError, OutputDirError, ModelLoadError,
                        RankFailed, TrackerUnavailable (ImportError)
        CollectionError → EndpointError            a model endpoint refused or failed

Warnings are warnings, never errors: ``AgileRLWarning`` (UserWarning) → ManifestWarning, PlotUnavailable.

Every error and warning of the tree prints its message with the userinfo of any URL in it
replaced (``http://***@host``, ``redact``): a password in a ``base_url`` is never shown.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "AgileRLError",
    "InvalidArgument",
    "ChatTemplateError",
    "TrajectoryShapeError",
    "ConfigError",
    "MissingExtra",
    "is_missing_itself",
    "validation_problems",
    "exception_text",
    "error_line",
    "ManifestError",
    "ReplyTooLarge",
    "redact",
    "PluginError",
    "RegistrationError",
    "ScaffoldError",
    "EnvPackagesError",
    "StrictPluginsError",
    "LoadError",
    "ModuleNotImportable",
    "NameNotRegistered",
    "NameConflict",
    "OpenEnvPackageError",
    "EnvError",
    "EnvProtocolError",
    "EnvCheckError",
    "EnvTimeoutError",
    "RemoteEnvError",
    "RemoteEnvTimeout",
    "EnvUnavailable",
    "ObservationError",
    "OpenEnvAdapterError",
    "EpisodeError",
    "ReplicaStartError",
    "DataError",
    "DatasetLoadError",
    "RubricError",
    "JudgeFailed",
    "JudgeUnavailable",
    "TemplateError",
    "TrainingError",
    "CollectionError",
    "EndpointError",
    "CheckpointError",
    "OutputDirError",
    "ModelLoadError",
    "RankFailed",
    "AgileRLWarning",
    "ManifestWarning",
    "PlotUnavailable",
    "TrackerUnavailable",
]


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]+@")


def redact(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced: ``http://***@host/...``."""
    return _USERINFO.sub(r"\1***@", text) if "@" in text else text


class AgileRLError(Exception):
    """An error whose message names what went wrong and how to fix it (URLs' userinfo redacted)."""

    def __str__(self) -> str:
        return redact(super().__str__())


class InvalidArgument(AgileRLError, ValueError):
    """A Python call got an argument it cannot use; the message names it, its value and the fix."""


class ChatTemplateError(InvalidArgument):
    """The tokenizer's chat template cannot be rendered incrementally."""


class TrajectoryShapeError(InvalidArgument):
    """A trajectory's per-token lists disagree in length."""


class ConfigError(InvalidArgument):
    """Settings passed to a Python call are invalid; ``errors`` holds one ``path: message`` line each."""

    def __init__(self, errors: list[str], what: str = "settings") -> None:
        self.errors = errors
        super().__init__(f"invalid {what}:\n" + "\n".join(f"  - {e}" for e in errors))


class MissingExtra(AgileRLError, ImportError):
    """An optional dependency is missing; the message is the one line to install it."""

    EXTRA_OF_MODULE = {
        # a top-level module some feature imports -> the extra that installs it
        "torch": "train",
        "transformers": "train",
        "tokenizers": "train",
        "accelerate": "train",
        "datasets": "datasets",
        "pyarrow": "datasets",
        "matplotlib": "plot",
        "peft": "lora",
        "gguf": "gguf",
        "openenv": "openenv",
        "PIL": "vision",
        "numpy": "vision",
        "ray": "ray",
    }

    def __init__(self, extra: str, what: str, missing: str) -> None:
        self.extra = extra
        super().__init__(
            f"{what} needs the '{extra}' extra ({missing} is not installed): "
            f"pip install 'agilerl-envlayer[{extra}]'"
        )

    @classmethod
    def for_module(cls, missing: str, what: str) -> MissingExtra | None:
        """The error for a missing module one of our extras installs; None for any other module."""
        extra = cls.EXTRA_OF_MODULE.get(missing.partition(".")[0])
        return cls(extra, what, missing) if extra else None

    @classmethod
    @contextmanager
    def translate(
        cls,
        what: str,
        otherwise: Callable[[ModuleNotFoundError], Exception] | None = None,
        *,
        importing: str | None = None,
    ) -> Iterator[None]:
        """Inside, a missing module one of our extras installs raises the line to install it,
        naming ``what`` needs it; any other missing module raises ``otherwise(exc)`` (default:
        the ``ModuleNotFoundError`` itself), as does ``importing`` itself (the module a reference
        names: ``env_packages`` may install it). The one place this translation is made."""
        try:
            yield
        except ModuleNotFoundError as exc:
            name = exc.name or ""
            named = importing is not None and is_missing_itself(importing, name)
            missing = None if named else cls.for_module(name, what)
            if missing is not None:
                raise missing from None
            if otherwise is None:
                raise
            raise otherwise(exc) from exc


def is_missing_itself(module: str, missing: str) -> bool:
    """True when ``missing`` (a ``ModuleNotFoundError``'s name) is ``module`` or a package above
    it: the module is not installed, rather than something it imports."""
    return module == missing or module.startswith(missing + ".")


def validation_problems(exc: Any, prefix: str = "", *, hidden: Collection[str] = ()) -> list[str]:
    """One ``field.path: message (got value)`` line per error of a pydantic ``ValidationError``.

    The one way to show one: ``str(exc)`` ends in pydantic's "For further information visit"
    line, and its first is a count; the messages are in ``exc.errors()``. ``hidden`` are path
    parts left out (a tagged union's tags); a long value is cut."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"] if p not in hidden)
        path = ".".join(p for p in (prefix, loc) if p) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        got = ""
        if err["type"] not in ("missing", "value_error") and "input" in err:
            shown = repr(err["input"])
            got = f" (got {shown[:80]}{'...' if len(shown) > 80 else ''})"
        lines.append(f"{path}: {msg}{got}")
    return lines


def exception_text(exc: BaseException) -> str:
    """``Type: message`` for an exception of unknown kind (an env's, a plugin's): a pydantic
    ``ValidationError`` as its problems (``field: message (got value)``, joined by ``; ``)."""
    if _is_validation_error(exc):
        return f"{type(exc).__name__}: {'; '.join(validation_problems(exc))}"
    text = redact(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def error_line(exc: BaseException) -> str:
    """:func:`exception_text` in one line (its first): the cause as one table cell."""
    text = exception_text(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _is_validation_error(exc: BaseException) -> bool:
    core = sys.modules.get("pydantic_core")  # loaded whenever one can exist: pydantic stays unimported
    return core is not None and isinstance(exc, core.ValidationError)


class ManifestError(AgileRLError, ValueError):
    """A manifest is invalid; ``errors`` holds one ``path: message`` line per problem."""

    def __init__(self, errors: list[str], source: str | None = None) -> None:
        self.errors = errors
        self.source = source
        head = f"invalid manifest {source}" if source else "invalid manifest"
        super().__init__(head + ":\n" + "\n".join(f"  - {e}" for e in errors))


class ReplyTooLarge(AgileRLError):
    """A peer (judge, generation endpoint, env server) answered with more bytes than its cap."""


class PluginError(AgileRLError):
    """Something about plugins: their names, their loading, their installs."""


class RegistrationError(PluginError):
    """A plugin called ``register`` with an invalid name or target."""


class ScaffoldError(PluginError):
    """The plugin name is invalid or the target folder already exists."""


class EnvPackagesError(PluginError):
    """``env_packages`` could not be installed alongside the trainer."""


class StrictPluginsError(PluginError):
    """``AGILERL_STRICT_PLUGINS=1`` and a plugin is broken or conflicts with another."""


class LoadError(PluginError):
    """A reference could not be imported; the message names the reference and the fix."""


class ModuleNotImportable(LoadError):
    """The module of a ``module:attr`` reference is not installed (``env_packages`` can fix it)."""

    def __init__(self, message: str, module: str) -> None:
        super().__init__(message)
        self.module = module


class NameNotRegistered(LoadError):
    """No plugin registered the name; the message lists close matches."""


class NameConflict(LoadError):
    """Two plugins registered the same name; the message names both distributions."""


class OpenEnvPackageError(LoadError):
    """An installed OpenEnv package (one with an ``openenv.yaml``) holds no env class we can find."""


class EnvError(AgileRLError):
    """An env, in process or remote, misbehaved or was used out of order."""


class EnvProtocolError(EnvError):
    """An env returned something the text-env protocol does not allow."""


class EnvCheckError(EnvProtocolError):
    """The env breaks the text-env protocol; the message lists every problem found."""

    def __init__(self, env_name: str, problems: list[str]) -> None:
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{env_name} does not follow the text-env protocol:\n{listing}")


class EnvTimeoutError(EnvError, TimeoutError):
    """An env call did not finish within the collector's ``env_timeout_s``."""


class RemoteEnvError(EnvError):
    """The remote env failed; ``code`` is the server's error code when it sent one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class RemoteEnvTimeout(RemoteEnvError):
    """No reply within ``request_timeout_s``; the session was dropped."""


class EnvUnavailable(RemoteEnvError):
    """No env server took a session (down, or full) within the reconnect budget: an outage, not
    one bad episode, so the run stops (its message names the URLs and what to do)."""


class ObservationError(EnvError):
    """A remote observation has no text the configured rules can find."""


class OpenEnvAdapterError(EnvError, ValueError):
    """An OpenEnv env cannot take text: no action field or MCP tool to put it in, or no Action type."""


class EpisodeError(EnvError):
    """An env or harness was called out of order: ``step`` before ``reset`` or after the episode
    ended, anything after ``close``."""


class ReplicaStartError(EnvError):
    """An env replica (a local process, a Ray actor) did not start and answer ``/health``;
    ``retryable`` says whether trying again can succeed (a timeout, a lost node) or cannot (the
    env's own error, a missing package)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class DataError(AgileRLError):
    """A dataset, its prompt template or its rubric cannot be used."""


class DatasetLoadError(DataError):
    """A dataset could not be loaded, renamed or split; the message says the fix."""


class RubricError(DataError):
    """A rubric cannot be bound, raised, or returned something that is not a reward."""


class JudgeFailed(RubricError):
    """One judgement could not be had (after its retries): scored by the rubric's failure policy."""


class JudgeUnavailable(EnvUnavailable, RubricError):
    """Every judge call failed for ``give_up_after_s``: the run stops, naming the URL."""


class TemplateError(DataError):
    """A prompt_template is malformed or names a column the dataset lacks."""


class TrainingError(AgileRLError):
    """Training cannot go on."""


class CollectionError(TrainingError):
    """Collection cannot go on (every rollout failed, a policy broke its contract, ...)."""


class EndpointError(CollectionError):
    """An OpenAI-compatible model endpoint refused a request or could not be reached."""


class CheckpointError(TrainingError):
    """A checkpoint to resume from is missing or incomplete."""


class OutputDirError(TrainingError):
    """``output_dir`` already holds a run, or ``--overwrite`` would delete what is not a run's."""


class ModelLoadError(TrainingError):
    """The model or tokenizer named in ``model.name_or_path`` cannot be loaded."""


class RankFailed(TrainingError):
    """Another training process (rank) failed; this one stopped with it, after the save they
    made together. The failing rank's own error says what went wrong."""


class AgileRLWarning(UserWarning):
    """Something the user should know about; the run goes on (``-W error::...`` makes it stop)."""

    def __str__(self) -> str:
        return redact(super().__str__())


class ManifestWarning(AgileRLWarning):
    """Something in a manifest is ignored (an unknown key in a section)."""


class PlotUnavailable(AgileRLWarning):
    """matplotlib is not installed; the run goes on without its plot."""


class TrackerUnavailable(TrainingError, ImportError):
    """A tracker named in ``training.report_to`` needs a package that is not installed."""

    def __init__(self, tracker: str, package: str) -> None:
        self.package = package
        super().__init__(
            f"training.report_to {tracker!r} needs the {package!r} package, which is not installed: "
            f"pip install {package}"
        )

"""What every manifest section does with keys it does not hold: an alias is accepted, a typo gets
"did you mean", a key that belongs elsewhere says where, and the rest are ignored with one warning
(or refused, where a section says so)."""

from __future__ import annotations

import difflib
import warnings
from typing import Any, ClassVar

from pydantic import ConfigDict, model_validator

from agilerl.errors import ManifestWarning
from agilerl.manifest.settings import ManifestModel

__all__ = ["Section"]


class Section(ManifestModel):
    """A manifest section: aliases accepted, unknown keys ignored with one warning (or, where
    ``_unknown_is_error``, refused)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _warn_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            known |= {f.alias for f in cls.model_fields.values() if f.alias}
            unknown = sorted(str(k) for k in data if k not in known and not cls._is_extension(k))
            misplaced = [why for key in unknown if (why := cls._misplaced(key))]
            if misplaced:
                raise ValueError(" ".join(misplaced))
            if unknown:
                named = ", ".join(_with_suggestion(key, known, cls._moved_keys) for key in unknown)
                if cls._unknown_is_error:
                    raise ValueError(
                        f"unknown {cls._section_name()} key(s): {named}; the keys are: "
                        f"{', '.join(sorted(cls.model_fields))} (and x-... keys, for YAML anchors)"
                    )
                warnings.warn(
                    f"{cls._section_name()}: ignoring unknown key(s): {named}",
                    ManifestWarning,
                    stacklevel=2,
                )
        return data

    _moved_keys: ClassVar[dict[str, str]] = {}
    """Keys people put in this section that belong elsewhere -> where they belong."""
    _unknown_is_error: ClassVar[bool] = False

    @classmethod
    def _is_extension(cls, key: Any) -> bool:
        """Keys this section ignores without a word (none; the manifest's ``x-`` keys)."""
        return False

    @classmethod
    def _misplaced(cls, key: str) -> str | None:
        """Why ``key`` is refused rather than ignored (None: it is just unknown)."""
        return None

    @classmethod
    def _section_name(cls) -> str:
        return cls.__name__


def _with_suggestion(key: str, known: set[str], moved: dict[str, str]) -> str:
    """``key``, plus "(did you mean 'x'?)" when it is a typo of a real field or a moved key."""
    close = difflib.get_close_matches(key, sorted(known | set(moved)), n=1, cutoff=0.8)
    return f"{key} (did you mean {moved.get(close[0], close[0])!r}?)" if close else key

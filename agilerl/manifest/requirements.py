"""What ``env_packages`` may list: requirement names, never anything an installer reads as a path,
a URL or an option. One rule, checked when a manifest is parsed and again right before uv runs."""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["check_requirement"]

_ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip", ".egg")


def check_requirement(requirement: str) -> str:
    """``requirement`` stripped, if it is ``name[extras] specifiers ; markers``; else ValueError.

    uv installs ``x-1.0-py3-none-any.whl`` or ``x.tar.gz`` from the working directory although
    packaging calls them names, so archive-like names are refused too.
    """
    text = requirement.strip()
    fix = "list requirement names only, such as 'gem-llm' or 'textarena>=0.7'"
    if not text:
        raise ValueError(f"an empty requirement; {fix}.")
    if any(c in text for c in "\n\r\t\0"):
        raise ValueError(f"{requirement!r} spans several lines or holds control characters; {fix}.")
    if text.startswith("-"):
        raise ValueError(
            f"{requirement!r} is an option, not a package name; options such as '-e' or "
            f"'--index-url' are not allowed: {fix}."
        )
    try:
        parsed = Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise ValueError(f"{requirement!r} is not a valid requirement ({reason}); {fix}.") from None
    if parsed.url is not None:
        raise ValueError(f"{requirement!r} is a direct reference ('name @ url'); {fix}.")
    if parsed.name.lower().endswith(_ARCHIVE_SUFFIXES) or parsed.name.startswith("."):
        raise ValueError(f"{requirement!r} names a file, which an installer would read from disk; {fix}.")
    return text

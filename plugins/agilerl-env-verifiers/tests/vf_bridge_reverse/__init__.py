"""The Reverse taskset as a package, as verifiers loads tasksets by id (bridge mode)."""

from vf_tasks import Reverse

__all__ = ["Reverse"]

"""The ``agilerl`` command."""

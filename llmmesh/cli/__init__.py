"""The ``llmmesh`` command line."""

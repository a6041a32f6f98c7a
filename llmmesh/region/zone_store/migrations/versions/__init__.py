"""The revisions, one module each, named by revision."""

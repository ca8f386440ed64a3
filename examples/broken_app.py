"""An app whose import fails, for the tests of `jobsup start --app examples.broken_app:app`."""

raise ImportError("examples.broken_app is broken on purpose")

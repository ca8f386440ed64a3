"""An app whose import fails, for the tests of `jobsup start --app tests.apps.broken:app`."""

raise ImportError("tests.apps.broken is broken on purpose")

"""The apps the tests start supervisors on (`jobsup start --app tests.apps.NAME:app`); the examples a
person runs stay in examples/."""

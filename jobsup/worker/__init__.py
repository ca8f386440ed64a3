"""The worker process, and what the supervisor and jobsup.testing share of it without reaching into each
other: main.py (the process's entry: it imports the app and runs the jobs its pipe brings), runner.py
(Runner: a job run inside the app's run middleware, in a worker or in a test's own process),
sharing.py (jobs that share the process), wire.py (the pipes' framing) and messages.py (every message
on the pipes, built and read in one place). It never talks to the database."""

"""`jobsup top`: the live console, in layers that each import only the ones below.

- source.py: the data source, figures from PostgreSQL over one async connection, and the console's two
  writes (requeue, cancel, pause, through jobsup.ops.control). No textual.
- figures.py: what the console shows, as frozen values, and the pure helpers that make text of them.
- workflow_tree.py: a workflow's jobs as the lines of a tree, folds and all. No textual.
- panels.py, latency_panels.py, limits_panels.py, workflow_panels.py: each panel turns figures into rows
  of text (workflow_panels.py: the Workflows tab, and the screen of a workflow's tree).
- tabs.py, screens.py, schedules.py: the tabs, the modal screens, the schedules screen.
- app.py: the Textual application that puts them on the screen; top.tcss its layout.

May import: jobsup.db, jobsup.ops and the public modules, textual and rich. Never jobsup.supervisor
(the supervisor and the console never import each other) nor jobsup.cli.
"""

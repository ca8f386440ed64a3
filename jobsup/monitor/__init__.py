"""`jobsup top`: the live console, in layers that each import only the ones below.

- source.py: the data source, figures from PostgreSQL over one async connection, and the console's two
  writes (requeue, cancel, pause, through jobsup.ops.control). No textual.
- figures.py: what the console shows, as frozen values built from the rows source.py reads.
- formats.py: the text of them (counts, sizes, rates, ages, cut text, the header's notes). No textual.
- panels.py, latency_panels.py, limits_panels.py, workflow_panels.py: each panel turns figures into rows
  of text (workflow_panels.py: the Workflows tab, and the screen of a workflow's tree).
- screens.py, schedules.py: the modal screens, the schedules screen.
- writes.py: requeue, cancel, pause and resume, limits: each asked first, on the focused table's selection.
- tabs.py: the tabs, each with the writes its tables offer (their keys are its bindings).
- header.py: the lines above the tabs (title, headline, health), each a widget that draws itself.
- main_screen.py: the main screen: the tabs and their bar, Tab through every panel, the filter.
- app.py: the Textual application: the refresh, drawing the figures, the screens it opens; top.tcss
  the layout. workflow_tree.py: the old place of jobsup.ops.workflow_tree (deprecated).

May import: jobsup.db, jobsup.ops and the public modules, textual and rich. Never jobsup.supervisor
(the supervisor and the console never import each other) nor jobsup.cli.
"""

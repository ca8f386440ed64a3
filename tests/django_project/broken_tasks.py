"""A task module that cannot be imported: a worker that meets one of its tasks fails that attempt."""

raise RuntimeError("broken_tasks cannot be imported")

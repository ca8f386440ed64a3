"""`jobsup start`: the supervisor process and its isolated workers.

The modules, one job each:

- main: `jobsup start`'s entry: binds the metrics port, spawns the workers, then connects and runs.
- supervisor: the one asyncio loop: wires the keeper, the dispatcher and the duties; the shutdown.
- config: the supervisor's settings and their defaults.
- keeper: the process keeper: spawns, watches, times out, recycles and restarts the workers (the worker
  process itself, and the messages on their pipes, are jobsup.worker's).
- dispatcher: claims, hands jobs out, buffers and writes outcomes, renews leases.
- keys: where each queue's next claim starts.
- link: a connection of the supervisor that reconnects with backoff.
- log: one log line per lifecycle event.
- tally: what the supervisor counts for --metrics-port.
- duty: the start/stop protocol of the duties, and the maintainer that runs them in order.
- listener: duty: LISTEN; each NOTIFY decoded (jobsup.db.notify) and routed by its type to the
  dispatcher and the scheduler.
- reaper: duty: returns the jobs whose lease expired, forgets supervisors that are gone.
- roster: which supervisors' rows are gone (for the reaper).
- heartbeat: duty: this supervisor's row for the console; reads back the paused queues.
- scheduler: duty: enqueues the fires of the app's schedules.
- pruner: duty: deletes finished history past its retention window.
- metrics: duty: /metrics and /healthz on --metrics-port.
- worker, wire, sharing: the old paths of jobsup.worker's modules, which warn for one release.

It may import jobsup.worker, jobsup.db, jobsup.ops and the public modules (jobsup.app, jobsup.client, jobsup.job,
jobsup.errors, ...); never jobsup.monitor or jobsup.cli, which are built on top of it or beside it.
"""
